"""Register the "ccl" torch.distributed backend (oneCCL, CPU) in this process.

Two implementations answer to the name "ccl":

* ``study`` (the default): the project's own backend, ``containers/oneccl/ccl_backend.cpp``,
  compiled ahead of time by ``containers/oneccl/build_ccl.py`` into the extension module
  ``study_ccl`` against the oneCCL library from PyPI (``oneccl-cpu-devel``, installed into
  ``<prefix>/lib`` and ``<prefix>/include``).
* ``intel``: Intel's bindings (``oneccl_bindings_for_pytorch``), which register "ccl"
  themselves when imported. They are not on PyPI and end with torch 2.8, so they are
  usually absent.

For the study backend, :func:`register` also makes oneCCL's bundled libfabric usable
without any variable set at process start: it points ``CCL_OFI_LIBRARY_PATH`` at the
bundled ``libfabric.so.1`` and ``FI_PROVIDER_PATH`` at its providers (without them,
oneCCL stops with "could not initialize any transport library"). It sets
``CCL_WORKER_OFFLOAD=0`` (oneCCL's default worker thread per rank made small allreduces
~12 ms on 2 cores; the backend drives progress itself) and ``CCL_ATL_SHM=1`` (shared
memory between ranks on one host, the fastest transport measured) where they are unset.
For a launch without an MPI process manager it sets oneCCL's launcher variables
(:func:`launcher_environment`). All of this must happen before oneCCL is loaded, which
is why registration, not the environment, owns it. :func:`effective_config` is what a
trial records, with the libfabric providers oneCCL opened: oneCCL names them only in
its log, at level info, so registration sets ``CCL_LOG_LEVEL=info`` where it is unset
and the process group starts inside :func:`ccl_output`, which reads them
(:func:`read_providers`) and passes every other line on to stdout as it comes (oneCCL
logs at info only then, 173 lines, none per collective, and 2 when it ends, which the
log keeps).
``STUDY_CCL_DEBUG=1`` makes the backend log every collective.

Standard library only at import time (torch is imported inside :func:`register`).

    from workflow_scripts.rank.distributed import ccl
    ccl.register()                      # then: dist.init_process_group("ccl", ...)
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import sysconfig
import threading
from pathlib import Path

from ...util import read_json

MODULE = "study_ccl"
BACKEND = "ccl"
DIR_ENV = "STUDY_CCL_DIR"
# Defaults for oneCCL, applied only where the variable is unset (see the docstring).
CCL_DEFAULTS = {"CCL_WORKER_OFFLOAD": "0", "CCL_ATL_SHM": "1"}
#: oneCCL's log level that names the providers it opens (set where unset: its lines are
#: then the study's to read, not the log's)
PROVIDER_LOG_LEVEL = "info"
#: says that ``CCL_LOG_LEVEL`` is the study's, not the user's (a process that inherits
#: both from one that registered ccl filters oneCCL's info lines too)
RAISED_VAR = "STUDY_CCL_LOG_LEVEL_RAISED"
IMPLS = ("study", "intel")
BUILD_HINT = "python containers/oneccl/build_ccl.py --out DIR"

_registered: str | None = None  # what register() registered in this process


class CCLUnavailable(ImportError):
    """The requested "ccl" implementation is not installed or not built."""


def default_dir() -> Path:
    """Where the environment keeps the built module: ``<sys.prefix>/lib/study-ccl``."""
    return Path(sys.prefix) / "lib" / "study-ccl"


def module_dir(lib_dir: str | os.PathLike | None = None) -> Path:
    """The folder to load ``study_ccl`` from: ``lib_dir``, else ``$STUDY_CCL_DIR``, else
    :func:`default_dir`."""
    if lib_dir:
        return Path(lib_dir)
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    return default_dir()


def module_path(folder: Path) -> Path:
    return folder / f"{MODULE}{sysconfig.get_config_var('EXT_SUFFIX')}"


def ccl_prefix(folder: Path) -> Path:
    """The prefix oneCCL was built against (from BUILD.json), else this environment's."""
    try:
        return Path(read_json((folder / "BUILD.json"), want=None)["ccl_prefix"])
    except (OSError, ValueError, KeyError):
        return Path(sys.prefix)


def build_failure(folder: Path) -> str | None:
    """Why the module in ``folder`` could not be built (its BUILD.json), else None."""
    try:
        info = read_json((folder / "BUILD.json"), want=None)
    except (OSError, ValueError):
        return None
    return info.get("error") if info.get("status") == "failed" else None


def prepare_libfabric(prefix: Path) -> None:
    """Point oneCCL at its bundled libfabric and the providers next to it.

    libccl 2021.14 dlopens the unversioned name ``libfabric.so`` unless
    ``CCL_OFI_LIBRARY_PATH`` names the library, so preloading ``libfabric.so.1`` would
    not help (the loader matches a loaded library by its soname, ``libfabric.so.1``);
    without a path it would take ``LD_LIBRARY_PATH`` set before the process started.
    Only unset variables are set; nothing happens where the files are absent (a oneCCL
    installed elsewhere, e.g. with its own ``setvars.sh``).
    """
    fabric = prefix / "lib" / "libfabric"
    if (fabric / "prov").is_dir():
        os.environ.setdefault("FI_PROVIDER_PATH", str(fabric / "prov"))
    if (fabric / "libfabric.so.1").exists():
        os.environ.setdefault("CCL_OFI_LIBRARY_PATH", str(fabric / "libfabric.so.1"))


#: variables an MPI process manager sets in each rank (then oneCCL's own launcher
#: detection, hydra by default, is right), and srun too on a site whose MpiDefault is
#: pmi2 or pmix
MPI_RANK_VARS = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID")
#: what says how a rank was started, for the record: the study's launch, SLURM's MPI
#: plugin (srun's ``--mpi``/``MpiDefault``), the process manager's rank variables
LAUNCH_VARS = ("STUDY_RANKS_FROM", "SLURM_MPI_TYPE", *MPI_RANK_VARS, "PMI_SIZE", "PMI_FD",
               "PMIX_NAMESPACE")  # fmt: skip


def launcher_environment(env) -> dict:
    """Set what oneCCL's documentation asks of a launch without an MPI process manager
    (torchrun, srun): ``CCL_PROCESS_LAUNCHER=none`` and the rank's place on its node,
    ``CCL_LOCAL_RANK`` and ``CCL_LOCAL_SIZE`` (from torch's ``LOCAL_RANK`` and
    ``LOCAL_WORLD_SIZE``); without them oneCCL guesses ("could not get local_idx/count
    from environment variables"). With oneCCL's worker thread on
    (``CCL_WORKER_OFFLOAD=1``), its worker is pinned to the last CPU of this rank's own
    block (``CCL_WORKER_AFFINITY``), not to oneCCL's default, the node's last CPUs, which
    belong to the last rank. Only unset variables are set; returns what was set."""
    set_here = {}

    def default(name, value):
        if name not in env and value is not None:
            env[name] = set_here[name] = str(value)

    # ranks that srun started for the study (STUDY_RANKS_FROM=slurm) are not an MPI
    # launch even where SLURM's pmi2/pmix plugin adds PMI variables to them: oneCCL
    # would then take them for Hydra's and guess its local rank
    by_srun = env.get("STUDY_RANKS_FROM") == "slurm"
    by_mpi = not by_srun and any(v in env for v in MPI_RANK_VARS)
    if not by_mpi and "LOCAL_RANK" in env:
        default("CCL_PROCESS_LAUNCHER", "none")
        default("CCL_LOCAL_RANK", env.get("LOCAL_RANK"))
        default("CCL_LOCAL_SIZE", env.get("LOCAL_WORLD_SIZE"))
    if env.get("CCL_WORKER_OFFLOAD") == "1":
        try:
            default("CCL_WORKER_AFFINITY", max(os.sched_getaffinity(0)))
        except (AttributeError, OSError):
            pass
    return set_here


def effective_config(env=None) -> dict:
    """oneCCL's configuration as this process runs it: every ``CCL_*`` variable and the
    libfabric ones it reads, and how the study backend waits (for the record)."""
    env = os.environ if env is None else env
    config = {k: v for k, v in sorted(env.items()) if k.startswith(("CCL_", "FI_"))}
    config["launch"] = {k: env[k] for k in LAUNCH_VARS if k in env}
    module = sys.modules.get(MODULE)
    if module is not None and hasattr(module, "wait_policy"):
        config["study_ccl_wait"] = module.wait_policy()
    return config


def raise_log_level(env) -> bool:
    """Set oneCCL's log level to the one that names its providers, where it is unset or
    was set so by the study in the process this one inherited it from (``env``: before
    oneCCL loads, which reads it once). False: a level of the user's, left as it is."""
    if "CCL_LOG_LEVEL" in env and env.get(RAISED_VAR) != "1":
        return False
    env["CCL_LOG_LEVEL"] = PROVIDER_LOG_LEVEL
    env[RAISED_VAR] = "1"
    return True


#: a line of oneCCL's log: ``2026:11:26-06:42:28:(32681) |CCL_INFO| provider: shm``
_CCL_LINE = re.compile(r"^\S+:\(\s*\d+\) \|CCL_(\w+)\| (.*)$")


def read_providers(text: str) -> dict | None:
    """What oneCCL's log at info says of its transport (rank 0 says it): the libfabric
    providers it opened, in its order (the first ``network_first`` of them for ranks on
    this node, shm; the rest for the network; with ``CCL_ATL_SHM=0`` one provider for
    both), their NICs, and libfabric's version. None: no provider line (another rank,
    or a log level that hides them)."""
    found = {"providers": [], "nics": []}
    for line in text.splitlines():
        m = _CCL_LINE.match(line.strip())
        body = m.group(2).strip() if m and m.group(1) == "INFO" else line.strip()
        if body.startswith("provider: "):
            found["providers"].append(body.removeprefix("provider: ").strip())
        elif body.startswith("nic: { name "):
            found["nics"].append(body.removeprefix("nic: { name ").split(",")[0].strip())
        elif body.startswith("libfabric version: "):
            found["libfabric"] = body.removeprefix("libfabric version: ").strip()
        elif body.startswith("nw_prov_first_idx: "):
            found["network_first"] = int(body.removeprefix("nw_prov_first_idx: "))
    return found if found["providers"] else None


class _Passed:
    """Which lines of oneCCL's output go on to the log, one line at a time: with the
    study's own log level, not its info lines (nor the lines of their multi-line values:
    braces and indented lines after one) nor its note that the level changed; with a
    level the user set, every line."""

    def __init__(self) -> None:
        self.in_info = False

    def keep(self, line: str) -> bool:
        if os.environ.get(RAISED_VAR) != "1":  # a level of the user's: all of it
            return True
        m = _CCL_LINE.match(line.strip())
        if m:
            self.in_info = m.group(1) == "INFO" or m.group(2).startswith("value of CCL_LOG_LEVEL")
            return not self.in_info
        return not (self.in_info and (line.strip() in ("{", "}", "") or line[:1].isspace()))


@contextlib.contextmanager
def ccl_output():
    """Read this process's stdout (oneCCL writes its log there) while oneCCL starts:
    yields a dict that holds the ``text`` afterwards. What the study did not ask for
    goes on to stdout as it comes, line by line (a start that hangs until the process
    is killed keeps its warnings in the log)."""
    captured: dict = {}
    lines: list[str] = []
    sys.stdout.flush()
    saved = os.dup(1)
    read_end, write_end = os.pipe()

    def forward() -> None:
        passed = _Passed()
        with os.fdopen(read_end, "rb") as pipe:
            for raw in pipe:
                line = raw.decode(errors="replace")
                lines.append(line)
                if passed.keep(line):
                    os.write(saved, raw)

    reader = threading.Thread(target=forward, name="ccl-output", daemon=True)
    reader.start()
    os.dup2(write_end, 1)
    os.close(write_end)
    try:
        yield captured
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)  # (the pipe's last write end closes: the reader sees its end)
        reader.join(timeout=10)
        if not reader.is_alive():  # (else a child holds the pipe: the reader keeps its fd)
            os.close(saved)
        captured["text"] = "".join(lines)


def _load_study_module(path: Path):
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    spec = importlib.util.spec_from_file_location(MODULE, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[MODULE] = module
    return module


def register(impl: str = "study", lib_dir: str | None = None) -> str:
    """Register the "ccl" process-group backend for CPU tensors; returns what was registered.

    ``impl`` is ``"study"`` (the project's backend, loaded from ``lib_dir``, else
    ``$STUDY_CCL_DIR``, else ``<sys.prefix>/lib/study-ccl``) or ``"intel"`` (Intel's
    ``oneccl_bindings_for_pytorch``). Calling it again is harmless. Raises
    :class:`CCLUnavailable` (an ImportError) when the implementation is missing.
    """
    global _registered
    from ... import shm

    shm.register()  # oneCCL's shm transport leaves segments after a kill: the run removes them
    if impl not in IMPLS:
        raise ValueError(f"unknown ccl implementation {impl!r} (choose from {', '.join(IMPLS)})")
    if _registered is not None:
        if not _registered.startswith(impl):
            raise RuntimeError(f"the ccl backend is already registered here as: {_registered}")
        return _registered

    if impl == "intel":
        try:
            if importlib.util.find_spec("oneccl_bindings_for_pytorch") is not None:
                raise_log_level(os.environ)
            import oneccl_bindings_for_pytorch  # noqa: F401  (registers "ccl" on import)
        except ImportError as exc:
            raise CCLUnavailable(
                "Intel's ccl bindings (oneccl_bindings_for_pytorch) are not installed in "
                f"{sys.prefix}: they are not on PyPI and end with torch 2.8; use "
                f"impl='study' (the project's backend) instead ({exc})"
            ) from exc
        version = getattr(oneccl_bindings_for_pytorch, "__version__", "unknown version")
        _registered = f"intel ccl backend (oneccl_bindings_for_pytorch {version})"
        return _registered

    folder = module_dir(lib_dir)
    path = module_path(folder)
    failed = build_failure(folder)
    if failed and not path.exists():
        raise CCLUnavailable(f"the study ccl backend could not be built here: {failed}")
    if not path.exists():
        raise CCLUnavailable(
            f"the study ccl backend is not built: {path} does not exist (looked in "
            f"lib_dir, else ${DIR_ENV}, else {default_dir()}); build it with this "
            f"environment's Python: {BUILD_HINT}"
        )
    for name, value in CCL_DEFAULTS.items():
        os.environ.setdefault(name, value)
    raise_log_level(os.environ)
    launcher_environment(os.environ)
    prepare_libfabric(ccl_prefix(folder))

    import torch.distributed as dist

    module = _load_study_module(path)
    dist.Backend.register_backend(BACKEND, module.create, devices=["cpu"])
    _registered = f"study ccl backend from {module.__file__} (oneCCL {module.library_version()})"
    return _registered
