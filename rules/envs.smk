# One Python environment per backend family, built from its pinned, hashed
# requirements in envs/. Editing envs/<env>.txt rebuilds that environment and
# reruns only the experiments that use it.


rule build_env:
    input:
        requirements="envs/{env}.txt",
    output:
        env="results/envs/{env}.json",
    log:
        "logs/envs/{env}.log",
    params:
        root=SETTINGS["envs_root"],
        installer=SETTINGS["installer"],
        python=env_python(),
    threads: 1
    shell:
        "{PYTHON} -m workflow_scripts.envs --name {wildcards.env}"
        " --requirements {input.requirements} --root {params.root}"
        " --installer {params.installer} --python {params.python}"
        " --out {output.env} 2> {log}"


rule image_folder:
    output:
        directory(IMAGE_FOLDER),
    log:
        "logs/image_folder.log",
    params:
        classes=SETTINGS["image_folder"]["classes"],
        per_class=SETTINGS["image_folder"]["images_per_class"],
        size=SETTINGS["image_folder"]["size"],
    shell:
        "{PYTHON} -m workflow_scripts.imagefolder --out {output} --classes {params.classes}"
        " --per-class {params.per_class} --size {params.size} > {log} 2>&1"
