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
    params:
        wheelhouse=WHEELHOUSE,
    run:
        images.main(
            [
                "wheelhouse",
                f"--lock={input.lock}",
                f"--wheelhouse={params.wheelhouse}",
                f"--out={output.lock}",
                f"--log={log[0]}",
            ]
        )


rule build_image:
    input:
        unpack(image_inputs),
    output:
        image="results/images/{image}.json",
    log:
        "logs/images/{image}.log",
    priority: SETUP_PRIORITY
    params:
        engine=RUNTIME,
        prefix=CONTAINERS["prefix"],
        base=base_image_json(),
        wheelhouse=WHEELHOUSE,
    run:
        rc = images.main(
            [
                "build",
                f"--image={wildcards.image}",
                f"--engine={params.engine}",
                f"--out={output.image}",
                f"--log={log[0]}",
                f"--prefix={params.prefix}",
                f"--parent-json={input.get('parent', '')}",
                f"--wheelhouse={params.wheelhouse}",
                f"--base-json={params.base}",
                # host settings, not an input of the image: never a rerun reason
                f"--engine-conf={SETTINGS['container_engine_conf'] or ''}",
            ]
        )
        if rc:
            raise WorkflowError(f"building image {wildcards.image} failed; see {log[0]}")
