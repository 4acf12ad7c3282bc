"""Containers in podman for real (tests/test_containers.py has the fast tests of the
container runtime): the quick preset in the podman images the workflow builds (its one
run a session, tests.runs.QuickStudy: every image built by its rule, every experiment,
launcher, data mount and process group in its backend's image); an edited Containerfile
rebuilds its image alone, a trial beyond its container's memory is oom, and a node
without an image loads it from the shared archive. (tests/components.py installs
podman, runc and mmdebstrap where they are missing.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from tests.runs import (
    ENGINE_CONF,
    container_config,
    copy_workflow,
    dry_run_jobs,
    experiments_run,
    read_folder,
    snakemake_in_podman,
)
from workflow_scripts import images, runtimes, study
from workflow_scripts.runtimes import container
from workflow_scripts.runtimes.container import engine_env
from workflow_scripts.trial.environment import headers_folder

pytestmark = [pytest.mark.slow, pytest.mark.podman]


def test_dry_run_builds_every_image_parents_first(tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    jobs = dry_run_jobs(wd, *container_config())
    builds = [j["wildcards"].split("=", 1)[1] for j in jobs if j["rule"] == "build_image"]
    assert set(builds) == set(images.IMAGES)
    runs = [j for j in jobs if j["rule"] == "run_experiment"]
    assert runs and not [j for j in jobs if j["rule"] == "build_env"]
    for job in runs:
        assert "results/images/" in job["input"]


def test_every_image_is_built_by_its_rule_on_its_parent(quick_study):
    built = quick_study.images
    assert set(built) == set(images.IMAGES)
    for name, rec in built.items():
        assert rec["image_id"].startswith("sha256:") and rec["image_digest"].startswith("sha256:")
        parent = images.IMAGES[name][0]
        if parent:
            assert rec["parent"]["image_id"] == built[parent]["image_id"]
    # layers are shared where the pins are: inductor = eager + the toolchain (< 1 GB)
    assert built["inductor"]["size_bytes"] - built["eager"]["size_bytes"] < 1e9
    assert built["xla"]["image_digest"] in quick_study.html


def test_every_experiment_ran_in_its_backends_image(quick_study):
    built = quick_study.images
    summary = quick_study.summary.set_index("experiment")
    assert (summary["runtime"] == "podman").all()
    for _, row in summary.iterrows():
        rec = built[row["image"]]
        assert row["image_id"] == rec["image_id"] and row["image_digest"] == rec["image_digest"]
    assert summary.loc["inductor-fp32", "image"] == "inductor"
    # Accelerate in images: mpirun's two ranks in the oneccl image, 1.7.0 in the ipex one
    for pg in ("gloo", "ccl"):
        assert summary.loc[f"bert-tiny-accelerate-{pg}", "image"] == "oneccl"
        assert summary.loc[f"bert-tiny-accelerate-{pg}", "dist_backend"] == pg
    legacy = summary.loc["bert-tiny-accelerate-legacy-ipex"]
    assert legacy["image"] == "ipex" and legacy["accelerate_version"] == "1.7.0"
    assert summary.loc["xla-fp32", "image"] == "xla"
    # every layout with the study's ccl backend, built into the oneccl image
    ccl = summary[summary["dist_backend"] == "ccl"]
    assert len(ccl) >= 2 and (ccl["image"] == "oneccl").all()
    n = len(os.sched_getaffinity(0))  # the most ranks that split the CPUs and batch 8
    assert ccl["ranks"].max() == max(r for r in range(1, n + 1) if n % r == 0 and 8 % r == 0)
    for variant in ("gloo", "ccl-shm"):
        assert quick_study.collectives[variant]["runtime"] == "podman"
    assert summary.loc["ipex-optimize-fp32", "ipex_version"].startswith("2.8")
    assert "tcmalloc" in summary.loc["runcpu-tcmalloc", "ld_preload"]


def test_data_is_mounted_read_only_and_results_are_the_users(quick_study):
    wd = quick_study.wd
    # the accuracy experiments read the digits mounted read-only into the container
    summary = quick_study.summary.set_index("experiment")
    acc = summary[summary["epochs"] > 0]
    assert len(acc) >= 2 and (acc["test_accuracy"] > 0.3).all()
    command = quick_study.records[acc.index[0]]["provenance"]["command"]
    assert f"{wd / 'resources/digits'}:{wd / 'resources/digits'}:ro" in command
    command = quick_study.records["folder"]["provenance"]["command"]
    assert command[:2] == ["podman", "run"] and "--network" in command
    assert command[command.index("--network") + 1] == "none"
    assert f"{wd}:{wd}:ro" in command  # sources read-only, results writable
    # files written as the invoking user
    assert (wd / "results/records/folder/trial0.json").stat().st_uid == os.getuid()
    # the gradient check's reference steps, shared between images of one environment
    # (rank/references.py): bf16 (eager image) and inductor-fp32 (inductor image) ask for
    # the same fp64 step; whichever ran second read the first's, through its mount
    refs = wd / "results/gradcheck-references"
    pair = {"bf16": "inductor-fp32", "inductor-fp32": "bf16"}
    shared = {e: quick_study.records[e]["gradient_check"]["comparison"].get("shared_references")
              for e in pair}  # fmt: skip
    reader = next(e for e, got in shared.items() if got)
    assert shared[reader] == {"fp64": pair[reader]} and not shared[pair[reader]], shared
    assert f"{refs}:{refs}:rw" in quick_study.records[reader]["provenance"]["command"]
    # a model's initial weights, drawn once per environment's torch and read back by the
    # later builds of the same model and seed, through their mount (rank/initial_weights.py)
    weights = wd / "results/initial-weights"
    said = {e: r["metrics"].get("initial_weights") for e, r in quick_study.records.items()
            if r["status"] == "ok"}  # fmt: skip
    readers = sorted(e for e, got in said.items() if got == "read")
    assert len(readers) > len(said) / 2 and set(said.values()) == {"drawn", "read"}, said
    assert f"{weights}:{weights}:rw" in quick_study.records[readers[0]]["provenance"]["command"]
    assert any(weights.glob("*.bin"))


def test_compiled_runs_share_this_machines_precompiled_headers(quick_study):
    """Inductor compiles its kernels' prelude into a precompiled header in its default
    cache folder, which a container's fresh /tmp lacks: a compiled run in an image gets
    this machine's folder of them (mounted, linked where Inductor looks), so each image
    builds a header there once and its later compiled runs find it. The quick study
    starts without any (tests.runs.QuickStudy)."""
    headers = headers_folder()
    compiled = {e: r for e, r in quick_study.records.items() if r["spec"]["compile"] != "none"}
    images_of = {r["provenance"]["image_id"] for r in compiled.values()}
    assert len(compiled) > len(images_of) >= 1, sorted(compiled)
    for experiment, record in quick_study.records.items():
        cache, command = record["provenance"]["compile_cache"], record["provenance"]["command"]
        if experiment in compiled:
            assert cache["headers"] == str(headers), (experiment, cache)
            assert f"{headers}:{headers}:rw" in command, experiment
        else:
            assert "headers" not in cache and not any(str(headers) in c for c in command)
    # written there by the images' runs, once each: fewer than the compiled runs
    built = sorted(headers.glob("*.gch"))
    assert 1 <= len(built) < len(compiled), (built, sorted(compiled))


def test_torch_loads_from_the_bytecode_built_into_every_image(quick_study):
    """The images set PYTHONDONTWRITEBYTECODE: without the bytecode compiled into them,
    each trial compiled torch's sources again."""
    code = "import os, torch; print(os.path.isfile(torch.__cached__))"
    for name in ("eager", "ipex", "xla", "oneccl"):
        cmd = ["podman", "run", "--rm", "--network", "none", quick_study.images[name]["image_id"],
               "/opt/venv/bin/python", "-c", code]  # fmt: skip
        proc = subprocess.run(cmd, env=engine_env(ENGINE_CONF or None), capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        assert proc.stdout.strip() == "True", (name, proc.stdout, proc.stderr[-2000:])


def test_an_edited_containerfile_rebuilds_its_image_alone(quick_study):
    wd = quick_study.wd
    built = quick_study.images
    # an unchanged tree rebuilds nothing
    again = snakemake_in_podman(wd)
    assert "Nothing to be done" in again.stdout + again.stderr
    assert read_folder(wd / "results/images") == built

    # one Containerfile edited: that image is rebuilt, only its experiments rerun
    xla_file = wd / "containers/xla/Containerfile"
    xla_file.write_text(xla_file.read_text() + 'LABEL study.test="rebuilt"\n')
    records = wd / "results/records"
    before = {str(p): p.stat().st_mtime_ns for p in records.rglob("*.json")}
    third = snakemake_in_podman(wd)
    after = read_folder(wd / "results/images")
    assert after["xla"]["image_id"] != built["xla"]["image_id"]
    assert {k: v["image_id"] for k, v in after.items() if k != "xla"} == {
        k: v["image_id"] for k, v in built.items() if k != "xla"
    }
    assert experiments_run(third) == ["xla-fp32"]
    assert "[image] xla" in third.stdout + third.stderr
    changed = {
        p.parent.name for p in records.rglob("*.json") if before.get(str(p)) != p.stat().st_mtime_ns
    }
    assert changed == {"xla-fp32"}
    summary = pd.read_csv(wd / "results/summary.csv").set_index("experiment")
    assert summary.loc["xla-fp32", "image_id"] == after["xla"]["image_id"]


def test_a_trial_beyond_its_containers_memory_is_oom(quick_study, tmp_path):
    """containers.memory: oom, not a crash; the engine cannot always tell (cgroup v1),
    the limit's own cgroup can."""
    config = {
        "groups": {"g": {"runs": [{"id": "big", "batch_size": 64, "probe_size": 0, "steps": 1}]}}
    }
    spec = study.load_study(config).spec_json("big")  # ResNet-50 at 224 px: several GB
    out = tmp_path / "oom" / "big" / "trial0.json"
    eager = quick_study.wd / "results/images/eager.json"
    args = [f"--spec-json={spec}", f"--env-json={eager}"]
    args += [f"--out={out}", f"--log={tmp_path / 'oom.log'}", "--memory=1g", "--max-retries=0"]
    proc = subprocess.run(
        [sys.executable, "-m", "workflow_scripts.trial", *args],
        cwd=quick_study.wd, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["status"] == "oom", record.get("error")
    assert "out-of-memory killer" in record["error"]["message"]
    assert "--cgroup-parent" in record["provenance"]["command"] or "--memory" in str(
        record["provenance"]["command"]
    )


def test_a_node_without_the_image_loads_it_from_the_shared_archive(tmp_path):
    """containers.archive: the submit host saves a built image into the shared folder;
    a node whose engine storage lacks it loads it there before its run (a tiny image
    made here, removed from the storage between the two, as on another node)."""
    env = engine_env(ENGINE_CONF or None)
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc" / "study-archive-test").write_text(str(tmp_path))  # a unique image
    tarball = tmp_path / "rootfs.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], check=True)
    made = subprocess.run(["podman", "import", str(tarball)], env=env, capture_output=True,
                          text=True, timeout=300, check=True)  # fmt: skip
    image_id = made.stdout.strip().splitlines()[-1].removeprefix("sha256:")
    record = {"image": "tiny", "name": "tiny", "engine": "podman", "image_id": image_id,
              "engine_conf": ENGINE_CONF or None}  # fmt: skip
    image_json = tmp_path / "images" / "tiny.json"
    image_json.parent.mkdir()
    image_json.write_text(json.dumps(record))
    archives = tmp_path / "shared"
    try:
        assert images.main(["archive", f"--image-json={image_json}",
                            f"--out={archives / 'tiny.tar'}",
                            f"--log={tmp_path / 'archive.log'}"]) == 0  # fmt: skip
        assert (archives / "tiny.tar").stat().st_size > 0
        assert not list(archives.glob("*.part"))
        subprocess.run(["podman", "rmi", "-f", image_id], env=env, capture_output=True,
                       timeout=300, check=True)  # fmt: skip
        node = runtimes.for_env({**record, "image_archives": str(archives)})
        assert node.missing() is None  # loaded from the archive
        assert container.image_exists("podman", image_id, env)
        # without an archive, the message says where it looked
        subprocess.run(["podman", "rmi", "-f", image_id], env=env, capture_output=True,
                       timeout=300, check=True)  # fmt: skip
        (archives / "tiny.tar").unlink()
        why = node.missing()
        assert why and "is not in podman's storage" in why and "no archive at" in why
    finally:
        subprocess.run(["podman", "rmi", "-f", image_id], env=env, capture_output=True,
                       timeout=300)  # fmt: skip


def test_auto_takes_podman_only_where_it_starts_a_container(quick_study, monkeypatch):
    """`runtime: auto` takes podman where it starts a container of the images it holds,
    not where it only answers: on a host without CAP_SYS_RESOURCE, podman's default
    ulimits stop every container at its start (runc: "error setting rlimits"), and
    every trial of the README's command was a crash (seen: 37 of 37 in the quick
    preset). There auto runs locally and says why, and what to give."""
    env_conf = os.environ.pop("CONTAINERS_CONF", None)  # podman's own defaults below
    try:
        assert container.engine_works("podman", ENGINE_CONF or None) == (True, "ok")
        ok, why = container.engine_works("podman", None)
        monkeypatch.setenv(runtimes.RESOLVED_VAR, "")  # (restored after: resolve sets it)
        monkeypatch.delenv(runtimes.RESOLVED_VAR)
        runtime, note = runtimes.resolve("auto", None)
    finally:
        if env_conf is not None:
            os.environ["CONTAINERS_CONF"] = env_conf
    if ok:  # an ordinary host: podman's defaults start containers
        assert why == "ok" and runtime == "podman" and note is None
    else:  # a host of this kind: the start's own failure, the settings to give
        assert "starts no container here" in why and container.START_FAILURE.search(why), why
        assert "container_engine_conf" in why, why
        assert runtime != "podman" and "container_engine_conf" in (note or ""), note
