"""Container runtime: image lineage, runtime resolution, and the quick preset run in
podman images built by the workflow (tests/run.sh installs podman, runc, mmdebstrap).

The quick preset's text-model runs that take the same image, mounts and launcher as
another run of it (a tiny BERT or GPT-2 instead of the CNN) run locally in
test_workflow, not again here: every image, launcher (Accelerate's mpirun included),
data mount and process group still runs in a container."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import REPO
from tests.test_workflow import copy_workflow, dry_run_jobs, experiments_run
from workflow_scripts import images, runtimes, study
from workflow_scripts.runtimes import container
from workflow_scripts.runtimes.container import engine_env

# Shared across test runs and workflow copies: the wheelhouse (8+ GB of wheels) and the
# engine's storage (a rebuild of unchanged images is a layer-cache hit).
WHEELHOUSE = os.environ.get(
    "STUDY_WHEELHOUSE", os.path.expanduser("~/.cache/cpu-train-study/wheelhouse")
)
# This kind of CI host needs the opt-in containers.conf (runc, no default ulimits);
# set STUDY_CONTAINERS_CONF= (empty) on a machine where podman's defaults work.
ENGINE_CONF = os.environ.get(
    "STUDY_CONTAINERS_CONF", str(REPO / "containers/engine/containers.conf")
)
PODMAN = shutil.which("podman") is not None
#: quick-preset experiments whose container path another one already takes (the same
#: image, launcher and data: a text model in place of the CNN)
SAME_PATH = (
    "bert-tiny", "gpt2-tiny-ipex", "infer-bert-tiny", "bert-tiny-accelerate", "acc-text",
    "bert-tiny-ipex-compile", "bert-tiny-inductor-dynamic",
)  # fmt: skip
#: quick-preset sweeps likewise (the accuracy's weak-scaling arm: acc's image and launcher)
SAME_PATH_SWEEPS = ("acc-weak",)


def containers_study(wd) -> Path:
    """The part of the quick preset this test runs in images, as a config file (which
    wins over the preset's own experiments)."""
    quick = study.read_config(wd / "config.yaml")["presets"]["quick"]
    path = wd / "containers-study.yaml"
    experiments = [e for e in quick["experiments"] if e["id"] not in SAME_PATH]
    sweeps = [s for s in quick["sweeps"] if s.get("name") not in SAME_PATH_SWEEPS]
    path.write_text(yaml.safe_dump({"experiments": experiments, "sweeps": sweeps}))
    return path


def container_config(*extra: str) -> list[str]:
    config = [
        # (noise reruns are the trial policy's, tested on their own: here they would only
        # add minutes on a shared machine)
        "preset=quick", "runtime=podman", "noise_retries=0",
        # the default image names: the base image (reused by its settings' hash) and
        # the layer cache are shared with the user's own runs
        f"containers={{wheelhouse: {WHEELHOUSE}}}",
    ]  # fmt: skip
    if ENGINE_CONF:
        config.append(f"container_engine_conf={ENGINE_CONF}")
    return [*config, *extra]


def test_lineage_and_locks():
    assert images.lineage("oneccl") == ["os", "common", "eager", "inductor", "oneccl"]
    assert images.lineage("xla") == ["os", "common", "xla"]
    # inductor adds a toolchain to eager: one copy of torch, the same lock
    assert images.locks_of("inductor") == ["upstream"]
    assert images.locks_of("oneccl") == ["upstream", "oneccl"]
    assert [images.image_env(i) for i in ("os", "eager", "inductor", "oneccl")] == [
        None,
        "upstream",
        "upstream",
        "oneccl",  # upstream's lock + oneCCL, over upstream's /opt/venv
    ]
    assert [images.env_image(e) for e in ("upstream", "ipex", "xla", "oneccl")] == [
        "eager", "ipex", "xla", "oneccl"
    ]  # fmt: skip
    for name, (parent, lock) in images.IMAGES.items():
        if parent:
            assert (REPO / "containers" / name / "Containerfile").is_file()
        if lock:
            assert (REPO / "envs" / f"{lock}.txt").is_file()


def test_each_experiment_runs_in_its_backends_image():
    s = study.load_study(study.read_config(REPO / "config.yaml"))
    where = {spec["id"]: images.image_for(spec) for spec in s.experiments}
    assert where["baseline"] == "eager" and where["runcpu-tcmalloc"] == "eager"
    assert where["inductor-fp32"] == where["inductor-bf16-cl"] == "inductor"
    assert where["ipex-optimize-fp32"] == where["ipex-compile-bf16"] == "ipex"
    assert where["xla-fp32"] == "xla"
    for spec in s.experiments:
        assert images.image_env(where[spec["id"]]) == spec["env"]


def resolve(runtime: str, path: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path}
    cmd = [sys.executable, "-m", "workflow_scripts.images", "resolve", runtime]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_auto_without_an_engine_falls_back_to_local_and_says_so(tmp_path):
    proc = resolve("auto", str(tmp_path))  # a PATH with no podman and no docker
    assert proc.returncode == 0, proc.stderr
    runtime, note = proc.stdout.split("\n", 1)
    assert runtime == "local"
    assert "podman not found" in note and "docker not found" in note and "locally" in note


def test_an_explicit_engine_that_does_not_work_is_an_error(tmp_path):
    proc = resolve("docker", str(tmp_path))
    assert proc.returncode == 1
    assert "runtime docker requested, but docker not found" in proc.stderr


@pytest.mark.parametrize(
    "containers, message",
    [
        ({"base": {"source": "registry"}}, "needs an image, pinned by digest"),
        ({"base": {"source": "registry", "image": "debian:bookworm"}}, "pinned by digest"),
        ({"shm_size": "lots"}, "2g"),
        ({"prefix": "Has/Upper"}, "lower-case"),
    ],
)
def test_bad_container_settings(containers, message):
    with pytest.raises(study.StudyConfigError, match=message):
        study.load_study({"containers": containers, "experiments": [{"id": "a"}]})


def test_runtime_must_be_known():
    with pytest.raises(study.StudyConfigError, match="singularity"):
        study.load_study({"runtime": "singularity", "experiments": [{"id": "a"}]})


@pytest.mark.skipif(not PODMAN, reason="podman is installed by tests/run.sh")
def test_dry_run_builds_every_image_parents_first(tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    jobs = dry_run_jobs(wd, *container_config())
    builds = [j["wildcards"].split("=", 1)[1] for j in jobs if j["rule"] == "build_image"]
    assert set(builds) == set(images.IMAGES)
    runs = [j for j in jobs if j["rule"] == "run_experiment"]
    assert runs and not [j for j in jobs if j["rule"] == "build_env"]
    for job in runs:
        assert "results/images/" in job["input"]


def image_records(wd) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (wd / "results/images").glob("*.json")}


def snakemake(wd, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", *args]
    cmd += ["--configfile", str(containers_study(wd)), "--config", *container_config()]
    proc = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=5400)
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.skipif(not PODMAN, reason="podman is installed by tests/run.sh")
def test_quick_preset_in_podman_images_and_rebuild_only_what_changed(tmp_path):
    wd = copy_workflow(tmp_path / "wf")

    # 1. every image is built, every experiment runs in its backend's image
    first = snakemake(wd)
    built = image_records(wd)
    assert set(built) == set(images.IMAGES)
    for name, rec in built.items():
        assert rec["image_id"].startswith("sha256:") and rec["image_digest"].startswith("sha256:")
        parent = images.IMAGES[name][0]
        if parent:
            assert rec["parent"]["image_id"] == built[parent]["image_id"]
    # layers are shared where the pins are: inductor = eager + the toolchain (< 1 GB)
    assert built["inductor"]["size_bytes"] - built["eager"]["size_bytes"] < 1e9
    summary = pd.read_csv(wd / "results/summary.csv").set_index("experiment")
    failed = summary[summary["status"] != "ok"]
    assert failed.empty, failed[["status", "error"]].to_string()
    assert (summary["runtime"] == "podman").all()
    for _, row in summary.iterrows():
        rec = built[row["image"]]
        assert row["image_id"] == rec["image_id"] and row["image_digest"] == rec["image_digest"]
    assert not set(SAME_PATH) & set(summary.index)
    assert not summary.index.str.startswith(SAME_PATH_SWEEPS).any()
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
    # the accuracy experiments read the digits mounted read-only into the container
    acc = summary[summary["epochs"] > 0]
    assert len(acc) >= 2 and (acc["test_accuracy"] > 0.3).all()
    command = json.loads((wd / f"results/records/{acc.index[0]}/trial0.json").read_text())[
        "provenance"
    ]["command"]
    assert f"{wd / 'resources/digits'}:{wd / 'resources/digits'}:ro" in command
    for variant in ("gloo", "ccl-shm"):
        result = json.loads((wd / f"results/collectives/{variant}.json").read_text())
        assert result["status"] == "ok", result.get("error")
        assert result["runtime"] == "podman"
    assert summary.loc["ipex-optimize-fp32", "ipex_version"].startswith("2.8")
    assert "tcmalloc" in summary.loc["runcpu-tcmalloc", "ld_preload"]
    assert summary["compile_cache_fresh"].all()
    record = json.loads((wd / "results/records/folder/trial0.json").read_text())
    command = record["provenance"]["command"]
    assert command[:2] == ["podman", "run"] and "--network" in command
    assert command[command.index("--network") + 1] == "none"
    assert f"{wd}:{wd}:ro" in command  # sources read-only, results writable
    # files written as the invoking user
    assert (wd / "results/records/folder/trial0.json").stat().st_uid == os.getuid()
    html = (wd / "results/report/index.html").read_text()
    assert built["xla"]["image_digest"] in html
    # torch loads from the bytecode compiled into every image (the images set
    # PYTHONDONTWRITEBYTECODE: without it each trial compiled torch's sources again)
    code = "import os, torch; print(os.path.isfile(torch.__cached__))"
    for name in ("eager", "ipex", "xla", "oneccl"):
        cmd = ["podman", "run", "--rm", "--network", "none", built[name]["image_id"],
               "/opt/venv/bin/python", "-c", code]  # fmt: skip
        proc = subprocess.run(cmd, env=engine_env(ENGINE_CONF or None), capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        assert proc.stdout.strip() == "True", (name, proc.stdout, proc.stderr[-2000:])

    # 2. an unchanged tree rebuilds nothing
    again = snakemake(wd)
    assert "Nothing to be done" in again.stdout + again.stderr
    assert image_records(wd) == built

    # 3. one Containerfile edited: that image is rebuilt, only its experiments rerun
    xla_file = wd / "containers/xla/Containerfile"
    xla_file.write_text(xla_file.read_text() + 'LABEL study.test="rebuilt"\n')
    records = wd / "results/records"
    before = {str(p): p.stat().st_mtime_ns for p in records.rglob("*.json")}
    third = snakemake(wd)
    after = image_records(wd)
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
    assert experiments_run(first)  # the first run did run the study

    # 4. a trial beyond its container's memory limit (containers.memory) is oom, not a
    # crash: the engine cannot always tell (cgroup v1), the limit's own cgroup can
    config = {"experiments": [{"id": "big", "batch_size": 64, "probe_size": 0, "steps": 1}]}
    spec = study.load_study(config).spec_json("big")  # ResNet-50 at 224 px: several GB
    out = tmp_path / "oom" / "big" / "trial0.json"
    args = [f"--spec-json={spec}", f"--env-json={wd / 'results/images/eager.json'}"]
    args += [f"--out={out}", f"--log={tmp_path / 'oom.log'}", "--memory=1g", "--max-retries=0"]
    proc = subprocess.run(
        [sys.executable, "-m", "workflow_scripts.trial", *args],
        cwd=wd, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["status"] == "oom", record.get("error")
    assert "out-of-memory killer" in record["error"]["message"]
    assert "--cgroup-parent" in record["provenance"]["command"] or "--memory" in str(
        record["provenance"]["command"]
    )


def test_the_base_image_takes_the_hosts_debian_mirror(tmp_path):
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    assert images.host_debian_mirror([str(apt)]) is None
    (apt / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# a comment\nURIs: http://mirror.example.internal/debian/\n"
        "Suites: bookworm\n\nTypes: deb\nURIs: http://mirror.example.internal/debian-security\n"
    )
    assert images.host_debian_mirror([str(apt)]) == "http://mirror.example.internal/debian"
    (apt / "sources.list").write_text(
        "# old style\ndeb [arch=amd64] http://other.example.internal/debian bookworm main\n"
    )
    assert images.host_debian_mirror([str(apt)]) == "http://other.example.internal/debian"
    # the base image's tag follows the mirror a build would use
    base = {"source": "mmdebstrap", "suite": "bookworm", "mirror": None, "image": None}
    host = images.host_debian_mirror()
    assert images.base_key(base) == images.base_key({**base, "mirror": host})


def test_auto_is_resolved_once_per_invocation(tmp_path, monkeypatch):
    from workflow_scripts import runtimes

    monkeypatch.delenv(runtimes.RESOLVED_VAR, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no engine: auto falls back to local
    assert runtimes.resolve("auto")[0] == "local"
    # a job process inherits the answer and does not ask the engines again, even
    # where one would now be found
    fake = tmp_path / "podman"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    assert runtimes.resolve("auto") == ("local", None)
    monkeypatch.delenv(runtimes.RESOLVED_VAR)
    assert runtimes.resolve("auto") == ("podman", None)


@pytest.mark.skipif(not PODMAN, reason="podman is installed by tests/run.sh")
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
