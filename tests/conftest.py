"""Shared fixtures: real backend environments and fully resolved experiment specs.

Slow tests are marked one way: a test file is fast or slow as a whole, and a slow one
says so once, at its top, ``pytestmark = pytest.mark.slow`` (with the components that
all its tests need, e.g. ``[pytest.mark.slow, pytest.mark.torch]``); no test is marked
slow on its own. Where a module has tests of both kinds, they are two files: the slow
ones are in ``test_<name>_slow.py`` beside ``test_<name>.py`` (or in a file named after
what they test, e.g. test_accelerate_launch.py). A test that needs a component
(torch, podman, slurm, browser: its marker, or a fixture below that gives it) in a file
not marked slow is an error at collection (pytest_collection_modifyitems), so that
``-m "not slow"`` never builds an environment, starts a container, a cluster or a
browser. Markers are declared in pyproject.toml; tests/README.md lists the files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests import components, runs
from tests.runs import REPO
from workflow_scripts import envs, study
from workflow_scripts.experiment import Spec

# Backend environments are content-addressed, so every test (and every temporary
# copy of the workflow) can share one root; set STUDY_ENVS_ROOT to move it.
ENVS_ROOT = Path(os.environ.get("STUDY_ENVS_ROOT", REPO / ".venvs")).absolute()


def build_env(name: str, tmp_path_factory) -> dict:
    log_path = tmp_path_factory.mktemp(f"env-{name}") / "build.log"
    with open(log_path, "w") as log:
        try:
            requirements = REPO / "envs" / f"{name}.txt"
            return envs.build(name, requirements, ENVS_ROOT, sys.executable, "uv", log)
        except Exception:
            print(log_path.read_text()[-5000:])
            raise


@pytest.fixture(scope="session")
def upstream_env(tmp_path_factory) -> dict:
    return build_env("upstream", tmp_path_factory)


@pytest.fixture(scope="session")
def upstream_calibration(upstream_env, tmp_path_factory) -> runs.Calibrated:
    """The upstream environment's calibration of this machine (runtime local), made once
    by what the calibrate job runs, for the local studies that do not test that job
    (``runs.local_study``'s ``calibrated``): each would otherwise spend 17-22 s on its
    own."""
    from workflow_scripts import calibration
    from workflow_scripts.rank import probe

    folder = tmp_path_factory.mktemp("calibration")
    out = folder / "upstream.json"
    made = calibration.calibrate(upstream_env, out, folder / "upstream.log", [probe.DEFAULT_SIZE])
    assert made["entries"] and not made.get("error"), made
    return runs.Calibrated("upstream", upstream_env, out)


@pytest.fixture(scope="session")
def ipex_env(tmp_path_factory) -> dict:
    return build_env("ipex", tmp_path_factory)


@pytest.fixture(scope="session")
def oneccl_env(tmp_path_factory) -> dict:
    """upstream + oneCCL, with the study's ccl backend compiled into it."""
    return build_env("oneccl", tmp_path_factory)


@pytest.fixture(scope="session")
def podman() -> str:
    """podman, runc and mmdebstrap (the images' base), installed when missing."""
    return components.program("podman", "podman")


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium, installed when missing: its path."""
    return components.program("browser", "chromium", "chromium-browser")


@pytest.fixture(scope="session")
def allocators(upstream_env) -> None:
    """Debian's jemalloc and tcmalloc (run_cpu's allocators), installed when missing, and
    linked into the upstream environment where run_cpu looks for them: an environment
    built earlier in the session, before they were installed, has no link yet (its
    next reuse links them, as here: envs.link_allocators)."""
    components.install("allocators")
    envs.link_allocators(Path(upstream_env["prefix"]))


@pytest.fixture(scope="session")
def quick_study(tmp_path_factory, podman) -> runs.QuickStudy:
    """The quick preset, run once a session in the podman images the workflow builds."""
    return runs.QuickStudy.run(runs.copy_workflow(tmp_path_factory.mktemp("quick") / "wf"))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A running two-node SLURM cluster on this machine (tests/slurm/cluster.sh), for the
    tests of one module; its state folder (logs, jobcomp.log)."""
    state = tmp_path_factory.mktemp("slurm")
    started = components.cluster("start", state)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield state
    finally:
        stopped = components.cluster("stop", state)
        print(stopped.stdout, stopped.stderr)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        # what it made is gone: its namespaces, its bridge, its node names
        assert not set(components.NODES) & set(Path("/etc/hosts").read_text().split())
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert "studyslurm" not in netns
        # nor a process of its jobs (one that its step's tracking lost: cluster.sh job_pids)
        assert not components.cluster_processes(), components.cluster_processes()


#: what each component's fixture gives: the markers of the tests that use it
FIXTURE_MARKERS = {
    "upstream_env": ("torch",), "upstream_calibration": ("torch",), "ipex_env": ("torch",),
    "oneccl_env": ("torch",),
    "podman": ("podman",), "chromium": ("browser",), "slurm": ("slurm",),
    "quick_study": ("podman", "torch"),
}  # fmt: skip
#: and what each marker gets: the fixture a test that carries it uses
MARKER_FIXTURES = {"podman": "podman", "browser": "chromium", "slurm": "slurm"}


def pytest_collection_modifyitems(items):
    """A test that uses a component's fixture carries its marker (`-m podman` etc.
    selects by component), and one that needs a component (torch, podman, slurm,
    browser) must be in a slow file: `-m "not slow"` is the fast path, with none of
    them."""
    fast = []
    for item in items:
        for fixture, markers in FIXTURE_MARKERS.items():
            for marker in markers if fixture in item.fixturenames else ():
                if not item.get_closest_marker(marker):
                    item.add_marker(marker)
        needs = [m for m in COMPONENTS if item.get_closest_marker(m)]
        if needs and not item.get_closest_marker("slow"):
            fast.append(f"{item.nodeid} (needs {', '.join(needs)})")
    if fast:
        raise pytest.UsageError(
            "tests that need a component, in a file not marked slow (put them in a file "
            "with `pytestmark = pytest.mark.slow`, see tests/conftest.py): " + "; ".join(fast)
        )


# Where the slow tests write gigabytes: the backend environments (about 26 GB for
# four), the images (about 22 GB, and a build holds a second copy of its largest layer
# while it commits it), the wheelhouse (8 GB), pytest's temporary folders. A run that
# fills the disk fails far from the cause, so the free space is printed at the start
# and at the end of every run.
DISK_PATHS = {
    "environments": ENVS_ROOT,
    "wheelhouse": Path(runs.WHEELHOUSE),
    "temporary files": Path(os.environ.get("TMPDIR", "/tmp")),
    "podman images": Path("/var/lib/containers"),
}


def free_disk() -> str:
    """Free space on each filesystem the slow tests write to (one line)."""
    seen: dict[int, list[str]] = {}
    free: dict[int, int] = {}
    for what, path in DISK_PATHS.items():
        while not path.exists() and path != path.parent:
            path = path.parent
        st = os.statvfs(path)
        dev = os.stat(path).st_dev
        seen.setdefault(dev, []).append(what)
        free[dev] = st.f_bavail * st.f_frsize
    return "; ".join(f"{free[d] / 1e9:.0f} GB free for {', '.join(w)}" for d, w in seen.items())


def pytest_report_header(config) -> str:
    return f"disk: {free_disk()}"


def pytest_terminal_summary(terminalreporter) -> None:
    terminalreporter.write_line(f"disk at the end: {free_disk()}")


COMPONENTS = ("torch", "podman", "slurm", "browser")


@pytest.fixture(autouse=True)
def _components_of_markers(request):
    """A test marked with a component gets it, whatever order the tests run in."""
    for marker, fixture in MARKER_FIXTURES.items():
        if request.node.get_closest_marker(marker) and fixture not in request.fixturenames:
            request.getfixturevalue(fixture)


def error_of(config: dict, **kwargs) -> str:
    """The message of the configuration error the real loader raises for ``config``."""
    with pytest.raises(study.StudyConfigError) as info:
        study.load_study(config, **kwargs)
    return str(info.value)


def env_python(env: dict, code: str, *args: str, cwd: Path = REPO, timeout: int = 900) -> str:
    """Run ``code`` with a backend environment's interpreter (the workflow's package on
    its path); its standard output."""
    proc = subprocess.run(
        [env["python"], "-c", code, *args], capture_output=True, text=True, timeout=timeout,
        cwd=cwd, env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin", "HOME": "/tmp"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def spec_of(**fields) -> Spec:
    """A fully resolved spec (through the real config loader) for a tiny model, as a
    trial's entry holds it (the rule's JSON, read into a frozen :class:`Spec`)."""
    fields.setdefault("id", "t")
    config = {
        "defaults": {
            "model": "cnn",
            "image_size": 32,
            "batch_size": 4,
            "warmup_steps": 2,
            "steps": 3,
            "timeout_s": 300,
        },
        "groups": {"g": {"runs": [fields]}},
    }
    return Spec(json.loads(study.load_study(config).spec_json(fields["id"])))


@pytest.fixture
def make_spec():
    """A fully resolved spec (through the real config loader) for a tiny model."""
    return spec_of


@pytest.fixture(scope="session", autouse=True)
def no_shm_segment_left_behind():
    """After the whole suite, /dev/shm holds no new oneCCL/libfabric segment of a process
    that is gone (runs remove their own; tests that start ranks themselves remove theirs)."""
    from workflow_scripts import shm

    def segments() -> set[str]:
        try:
            return {p.name for p in shm.SHM.iterdir() if shm.SEGMENT.match(p.name)}
        except OSError:
            return set()

    before = segments()
    yield
    left = sorted(
        n for n in segments() - before if not shm.alive(int(shm.SEGMENT.match(n).group(1)))
    )
    assert not left, f"the tests left shared-memory segments in {shm.SHM}: {left}"


@pytest.fixture(scope="session", autouse=True)
def no_gradient_check_folder_left_behind():
    """After the whole suite, the temporary folder holds no new first-step folder of a
    gradient check whose process is gone, of any host (a killed rank's: the run that
    launched it removes it, on every node of its job: workflow_scripts/shm.py)."""
    from workflow_scripts import shm

    root = Path(tempfile.gettempdir())

    def folders() -> set[str]:
        return {p.name for p in root.glob(f"{shm.SCRATCH_PREFIX}*-*-*")}

    before = folders()
    yield
    left = [
        name
        for name in sorted(folders() - before)
        if (pid := shm.scratch_pid(name)) is None or not shm.alive(pid)
    ]
    assert not left, f"the tests left gradient checks' first-step folders in {root}: {left}"


@pytest.fixture(scope="module")
def wd(tmp_path_factory) -> Path:
    """A copy of the workflow for a module's dry runs (tests/runs.py: dry_run)."""
    return runs.copy_workflow(tmp_path_factory.mktemp("cfg") / "wf")
