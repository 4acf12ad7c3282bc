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
All of this must happen before oneCCL is loaded, which is why registration, not the
environment, owns it. ``STUDY_CCL_DEBUG=1`` makes the backend log every collective.

Standard library only at import time (torch is imported inside :func:`register`).

    from workflow_scripts.rank.distributed import ccl
    ccl.register()                      # then: dist.init_process_group("ccl", ...)
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import sysconfig
from pathlib import Path

MODULE = "study_ccl"
BACKEND = "ccl"
DIR_ENV = "STUDY_CCL_DIR"
# Defaults for oneCCL, applied only where the variable is unset (see the docstring).
CCL_DEFAULTS = {"CCL_WORKER_OFFLOAD": "0", "CCL_ATL_SHM": "1"}
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
        return Path(json.loads((folder / "BUILD.json").read_text())["ccl_prefix"])
    except (OSError, ValueError, KeyError):
        return Path(sys.prefix)


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
    if impl not in IMPLS:
        raise ValueError(f"unknown ccl implementation {impl!r} (choose from {', '.join(IMPLS)})")
    if _registered is not None:
        if not _registered.startswith(impl):
            raise RuntimeError(f"the ccl backend is already registered here as: {_registered}")
        return _registered

    if impl == "intel":
        try:
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
    if not path.exists():
        raise CCLUnavailable(
            f"the study ccl backend is not built: {path} does not exist (looked in "
            f"lib_dir, else ${DIR_ENV}, else {default_dir()}); build it with this "
            f"environment's Python: {BUILD_HINT}"
        )
    for name, value in CCL_DEFAULTS.items():
        os.environ.setdefault(name, value)
    prepare_libfabric(ccl_prefix(folder))

    import torch.distributed as dist

    module = _load_study_module(path)
    dist.Backend.register_backend(BACKEND, module.create, devices=["cpu"])
    _registered = f"study ccl backend from {module.__file__} (oneCCL {module.library_version()})"
    return _registered
