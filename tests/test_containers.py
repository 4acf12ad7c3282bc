"""Container runtime (workflow_scripts/runtimes/container.py, images.py): image lineage,
which image each experiment runs in, runtime resolution and the container settings,
without an engine. (In podman for real: tests/test_containers_slow.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runs import REPO
from workflow_scripts import images, study


def test_the_builds_install_with_the_uv_the_workflow_pins():
    """install-env installs each environment with uv from the wheelhouse (envs/uv.txt, a
    lock of its own, filled like the environments'): the version and hashes the
    workflow's own environment pins, so bumping one without the other is caught here."""
    from workflow_scripts.util import lock_pins

    installer = lock_pins(REPO / "envs" / f"{images.INSTALLER_LOCK}.txt")
    workflow = {name: (version, hashes) for name, version, hashes in
                lock_pins(REPO / "envs/workflow.txt")}  # fmt: skip
    assert installer and len(installer) == 1, installer
    name, version, hashes = installer[0]
    assert name == "uv" and workflow["uv"] == (version, hashes), (installer, workflow["uv"])
    script = (REPO / "containers/common/install-env").read_text()
    assert f"/wheelhouse/locks/{images.INSTALLER_LOCK}.txt" in script


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
        study.load_study({"containers": containers, "groups": {"g": {"runs": [{"id": "a"}]}}})


def test_runtime_must_be_known():
    with pytest.raises(study.StudyConfigError, match="singularity"):
        study.load_study({"runtime": "singularity", "groups": {"g": {"runs": [{"id": "a"}]}}})


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


def _waits_while_held(
    lock_file: Path, argv: list, log: Path, says: str, unwritten: Path | None = None
) -> subprocess.Popen:
    """Hold ``lock_file`` (as another process would), start ``python -c argv...``, see
    it say ``says`` in its log and still wait half a second later, ``unwritten`` not
    written yet, then let it go: the process, running on."""
    import fcntl
    import time

    with open(lock_file, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = subprocess.Popen([sys.executable, "-c", *argv], cwd=REPO,
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 60
        while says not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None and time.monotonic() < deadline, "it did not wait"
            time.sleep(0.05)
        time.sleep(0.5)
        assert proc.poll() is None  # still waiting
        assert unwritten is None or not unwritten.exists()
    return proc


def test_one_fill_of_a_wheelhouse_at_a_time(tmp_path):
    """The wheelhouse jobs of several locks run beside each other (``--cores all``) and
    download many of the same wheels into one folder, where two pips replace each
    other's files (seen: pip's FileNotFoundError on a fresh machine). A fill waits for
    the one holding the wheelhouse (another process here), says so, then runs."""
    house = tmp_path / "wheelhouse"
    house.mkdir()
    wheel = house / "tiny_pkg-1.0-py3-none-any.whl"
    wheel.write_bytes(b"a wheel's bytes")
    lock = tmp_path / "a.txt"
    lock.write_text(f"tiny-pkg==1.0 \\\n    --hash=sha256:{images.sha256_file(wheel)}\n")
    log, out = tmp_path / "a.log", house / "locks" / "a.txt"
    code = (
        "import sys; from pathlib import Path; from workflow_scripts import images; "
        "print(images.fill_wheelhouse(*map(Path, sys.argv[1:5]))['downloaded'])"
    )
    says = "waiting for another fill"
    fill = _waits_while_held(
        house / images.FILL_LOCK, [code, lock, house, out, log], log, says, out
    )
    assert fill.communicate(timeout=60)[0].strip() == "False" and fill.returncode == 0
    assert out.read_text() == lock.read_text() and "nothing to download" in log.read_text()


def test_a_lock_whose_wheels_are_in_the_wheelhouse_asks_pip_nothing(tmp_path, monkeypatch):
    """The wheelhouse rule reruns whenever a lock is newer than its copy (a fresh
    checkout): where every pin is there already, as a wheel this interpreter installs
    with a hash the lock allows, pip is not run (no index, no download); where one is
    missing, of another platform or of another hash, pip is (here with no index: it
    fails, and says so)."""
    house, out, log = (
        tmp_path / "wheelhouse",
        tmp_path / "wheelhouse/locks/a.txt",
        tmp_path / "a.log",
    )
    house.mkdir()
    wheel = house / "tiny_pkg-1.0-py3-none-any.whl"
    wheel.write_bytes(b"a wheel's bytes")
    other = house / "other-2.0-cp311-cp311-win_amd64.whl"  # not this machine's
    other.write_bytes(b"another platform")
    lock = tmp_path / "a.txt"

    def write_lock(*pins: tuple[str, Path]) -> None:
        lock.write_text("".join(
            f"{name} \\\n    --hash=sha256:{images.sha256_file(path)} \\\n"
            f"    --hash=sha256:{'0' * 64}\n    # via -r a.in\n"
            for name, path in pins
        ))  # fmt: skip

    write_lock(("Tiny.Pkg==1.0", wheel))
    info = images.fill_wheelhouse(lock, house, out, log)
    assert info["downloaded"] is False and out.read_text() == lock.read_text()
    assert "nothing to download" in log.read_text() and "pip download" not in log.read_text()
    assert (house / ".sha256" / wheel.name).exists()  # its hash, kept for the next time

    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip finds nothing, offline
    for pins in ([("Tiny.Pkg==1.0", wheel), ("other==2.0", other)],  # a Windows wheel
                 [("tiny-pkg==1.1", wheel)]):  # another version  # fmt: skip
        write_lock(*pins)
        log.unlink()
        with pytest.raises(images.ImageError, match="pip exit"):
            images.fill_wheelhouse(lock, house, out, log)
        assert "pip download" in log.read_text()
    # the same file rewritten: its kept hash is not trusted, the lock's no longer holds
    write_lock(("tiny-pkg==1.0", wheel))
    wheel.write_bytes(b"other bytes, another hash")
    assert images.fetched_already(lock, house) is None
    # a lock with more than pins (a marker): pip reads it
    lock.write_text(f'tiny-pkg==1.0 ; python_version > "3" --hash=sha256:{"0" * 64}\n')
    assert images.lock_pins(lock) is None


def test_one_image_build_at_a_time(tmp_path):
    """Two backend images built side by side ran out of disk on CI (each writes its layer
    whole twice more as the engine commits it): a build waits for the one holding
    this host's build lock (another process here), says so in its log, then runs; it
    knows how long it waited (an image's record keeps it apart from ``build_s``)."""
    log = tmp_path / "image.log"
    code = (
        "import sys; from pathlib import Path; from workflow_scripts import images\n"
        "with images.building(Path(sys.argv[1])) as waited:\n    print('built', waited)"
    )
    build = _waits_while_held(
        images.build_lock(), [code, log], log, "waiting for another image build"
    )
    said, waited = build.communicate(timeout=60)[0].split()
    assert said == "built" and build.returncode == 0 and float(waited) >= 0.5
    # with nobody holding it: no wait
    free = subprocess.run([sys.executable, "-c", code, str(log)], cwd=REPO, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert free.stdout.split()[0] == "built" and float(free.stdout.split()[1]) < 0.5


def test_a_build_that_fills_the_disk_says_so(tmp_path):
    """An engine's "no space left on device" (its output, deep in the build's log) is
    named in the error with the folder, its free space now and what to do."""
    log = tmp_path / "image.log"
    full = tmp_path / "storage123"
    line = f"Error: committing container: writing blob: write {full}/1: no space left on device"
    cmd = [sys.executable, "-c", f"print('Installing ...'); print({line!r}); raise SystemExit(125)"]
    with pytest.raises(images.ImageError) as err:
        images._run_logged(cmd, log, dict(os.environ), "podman build of image ipex")
    text = str(err.value)
    assert text.startswith("podman build of image ipex failed (exit 125): the disk filled up")
    assert f"({tmp_path} has " in text and "GB free now" in text and "free space" in text
    assert text.endswith(f"see its log {log}")
    # any other failure keeps its plain message
    with pytest.raises(images.ImageError) as err:
        images._run_logged(
            [sys.executable, "-c", "raise SystemExit(3)"], log, dict(os.environ), "x"
        )
    assert str(err.value) == f"x failed (exit 3); see its log {log}"
