# Container images (runtime podman or docker): one rule per image, each built FROM
# its parent's image ID, from containers/<image>/ and the lock it installs. Editing
# a Containerfile or an envs/ lock rebuilds that image and its children and reruns
# only the experiments that run in them. The builds install from a wheelhouse that
# the host fills with its own pip settings (builds need no network for Python).


rule wheelhouse:
    input:
        lock="envs/{lock}.txt",
    output:
        lock=f"{WHEELHOUSE}/locks/{{lock}}.txt",
    log:
        "logs/wheelhouse/{lock}.log",
    priority: SETUP_PRIORITY
    resources:
        cpus_per_task=WHEELHOUSE_RESOURCES["cpus_per_task"],
        mem_mb=WHEELHOUSE_RESOURCES["mem_mb"],
        runtime=WHEELHOUSE_RESOURCES["runtime"],
    run:
        jobs.run("workflow_scripts.images:WHEELHOUSE", input, output, params, wildcards, log)


rule build_image:
    input:
        unpack(image_inputs),
    output:
        image="results/images/{image}.json",
    log:
        "logs/images/{image}.log",
    priority: SETUP_PRIORITY
    localrule: BUILDS_LOCAL
    resources:
        cpus_per_task=BUILD_IMAGE_RESOURCES["cpus_per_task"],
        mem_mb=BUILD_IMAGE_RESOURCES["mem_mb"],
        runtime=BUILD_IMAGE_RESOURCES["runtime"],
    params:
        engine=RUNTIME,
        prefix=CONTAINERS["prefix"],
        base=base_image_json(),
    run:
        jobs.run(
            "workflow_scripts.images:BUILD",
            input,
            output,
            params,
            wildcards,
            log,
            settings=SETTINGS,
        )


# On a cluster (containers.archive set): each runnable image saved into the shared
# folder, from which a node whose engine lacks it loads it (runtimes/container.py).
if ARCHIVES:

    rule image_archive:
        input:
            image=ancient(image_json("{image}")),
        output:
            archive=f"{ARCHIVES}/{{image}}.tar",
        log:
            "logs/images/{image}.archive.log",
        priority: SETUP_PRIORITY
        localrule: BUILDS_LOCAL
        resources:
            cpus_per_task=BUILD_IMAGE_RESOURCES["cpus_per_task"],
            mem_mb=BUILD_IMAGE_RESOURCES["mem_mb"],
            runtime=BUILD_IMAGE_RESOURCES["runtime"],
        run:
            jobs.run("workflow_scripts.images:ARCHIVE", input, output, params, wildcards, log)
