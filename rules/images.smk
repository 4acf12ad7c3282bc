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
    run:
        images.wheelhouse_rule(input, output, log)


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
    run:
        images.build_rule(input, output, params, wildcards, log, SETTINGS)
