# One Python environment per backend family, built from its pinned, hashed
# requirements in envs/. Editing envs/<env>.txt rebuilds that environment and
# reruns only the experiments that use it. An environment whose lock brings oneCCL
# also gets the ccl process-group backend, compiled from containers/oneccl/ at build
# time (again when its source changes).


rule build_env:
    input:
        unpack(env_inputs),
    output:
        env="results/envs/{env}.json",
    log:
        "logs/envs/{env}.log",
    priority: SETUP_PRIORITY
    localrule: BUILDS_LOCAL
    threads: 1
    resources:
        cpus_per_task=BUILD_ENV_RESOURCES["cpus_per_task"],
        mem_mb=BUILD_ENV_RESOURCES["mem_mb"],
        runtime=BUILD_ENV_RESOURCES["runtime"],
    params:
        root=SETTINGS["envs_root"],
        installer=SETTINGS["installer"],
        python=env_python(),
    run:
        jobs.run("workflow_scripts.envs", input, output, params, wildcards, log)


rule image_folder:
    output:
        directory(IMAGE_FOLDER),
    log:
        "logs/image_folder.log",
    priority: SETUP_PRIORITY
    resources:
        cpus_per_task=DATA_RESOURCES["cpus_per_task"],
        mem_mb=DATA_RESOURCES["mem_mb"],
        runtime=DATA_RESOURCES["runtime"],
    params:
        classes=SETTINGS["image_folder"]["classes"],
        per_class=SETTINGS["image_folder"]["images_per_class"],
        size=SETTINGS["image_folder"]["size"],
    run:
        jobs.run("workflow_scripts.imagefolder", input, output, params, wildcards, log)


# scikit-learn's digits, exported once from the workflow's environment (where
# scikit-learn is) with a fixed, stratified train/test split, for data: digits.
rule digits:
    output:
        directory(DIGITS),
    log:
        "logs/digits.log",
    priority: SETUP_PRIORITY
    resources:
        cpus_per_task=DATA_RESOURCES["cpus_per_task"],
        mem_mb=DATA_RESOURCES["mem_mb"],
        runtime=DATA_RESOURCES["runtime"],
    run:
        jobs.run("workflow_scripts.digits", input, output, params, wildcards, log)
