"""What a trial's processes run with: their environment variables, the compile cache
(a fresh, empty one per attempt unless ``warm_compile_cache``; a later trial of a
compiled run: a copy of its first trial's, carry.py) and the folders a container run
mounts."""

from __future__ import annotations

import getpass
import os
import re
import shutil
import tempfile
from pathlib import Path

from ..backends.base import HEADERS_VAR
from ..rank import initial_weights, references
from ..rank.inference import weights_path


def default_inductor_cache_dir(env: dict[str, str]) -> str:
    """Where TorchInductor caches when TORCHINDUCTOR_CACHE_DIR is unset (as torch computes it)."""
    try:
        user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    except Exception:  # noqa: BLE001 - no user name: torch falls back the same way
        user = "unknown"
    tmp = env.get("TMPDIR") or tempfile.gettempdir()
    return os.path.join(tmp, f"torchinductor_{user}")


def headers_folder() -> Path:
    """This machine's folder of the images' precompiled headers (in its own temporary
    folder: a header is compiled for this CPU, ``-march=native``, and is no use on
    another node)."""
    return Path(tempfile.gettempdir()) / f"study-inductor-headers-{os.getuid()}"


def compile_cache(
    spec: dict,
    env: dict[str, str],
    label: str,
    container: bool = False,
    plan: dict | None = None,
) -> tuple[dict, Path | None]:
    """Point the run's compile caches at a fresh temporary folder (unless the spec keeps
    them warm, or sets TORCHINDUCTOR_CACHE_DIR itself); return what was used and the
    folder to remove afterwards. ``plan`` (carry.compile_cache_plan): ``keep``, the
    folder to compile into, emptied first and kept (a first trial's); ``warm_from``, the
    folder whose copy the run starts from (a later trial's), beside it and removed after.
    Both are beside the record, which a container run mounts at its own path.

    A compiled run in a container also gets the machine's precompiled headers
    (``headers``, :func:`headers_folder`): TorchInductor compiles its C++ prelude once
    per machine into its default cache folder, not the run's cache (``/tmp`` locally,
    shared by every run there), and a container's ``/tmp`` starts empty (3-11 s of a
    compiled quick-preset trial here; every trial of a frozen graph compiles). What the
    header holds is keyed by its preprocessed text, the compiler and its flags, so each
    image has its own."""
    cache, folder = _compile_cache(spec, env, label, container, plan)
    if container and spec.get("compile", "none") != "none":
        headers = headers_folder()
        try:
            headers.mkdir(parents=True, exist_ok=True)
        except OSError:
            return cache, folder  # (the run compiles its header itself, as before)
        env[HEADERS_VAR] = str(headers)
        cache["headers"] = str(headers)
    return cache, folder


def _compile_cache(
    spec: dict, env: dict[str, str], label: str, container: bool, plan: dict | None
) -> tuple[dict, Path | None]:
    own = "TORCHINDUCTOR_CACHE_DIR" in (spec.get("env_vars") or {})
    if spec.get("warm_compile_cache") or own:
        where = env.get("TORCHINDUCTOR_CACHE_DIR") or default_inductor_cache_dir(env)
        return {"dir": where, "fresh": False}, None
    plan = plan or {}
    keep, warm_from = plan.get("keep"), plan.get("warm_from")
    if keep is not None and _emptied(keep := Path(keep).resolve()):
        _point(env, keep)
        return {"dir": str(keep), "fresh": True, "kept": True}, None
    if warm_from is not None:
        warm_from = Path(warm_from).resolve()
        folder = warm_from.with_name(f"{warm_from.name}-{label}")
        shutil.rmtree(folder, ignore_errors=True)
        try:
            shutil.copytree(warm_from, folder)
        except OSError:  # unreadable: a cold compile in a fresh folder, as below
            shutil.rmtree(folder, ignore_errors=True)
        else:
            _point(env, folder)
            return {"dir": str(folder), "fresh": False, "from": "trial 0"}, folder
    if container:
        # every container starts from the image: its /tmp is fresh and goes with it
        env["TORCHINDUCTOR_CACHE_DIR"] = "/tmp/torchinductor-cache"
        env["TRITON_CACHE_DIR"] = "/tmp/torchinductor-cache/triton"
        return {"dir": "/tmp/torchinductor-cache (in the container)", "fresh": True}, None
    folder = Path(tempfile.mkdtemp(prefix=f"compile-cache-{label}-"))
    _point(env, folder)
    return {"dir": str(folder), "fresh": True}, folder


def _point(env: dict[str, str], folder: Path) -> None:
    env["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    env["TRITON_CACHE_DIR"] = str(folder / "triton")


def _emptied(folder: Path) -> bool:
    """``folder``, empty (created or emptied): False when what is in it cannot be removed
    (e.g. written by a container as another user), so the run compiles elsewhere."""
    shutil.rmtree(folder, ignore_errors=True)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return not any(folder.iterdir())
    except OSError:
        return False


def beside(folder: Path, out: Path) -> bool:
    """Whether ``folder`` is in the record's folder (which a container run mounts)."""
    return folder.resolve().is_relative_to(out.parent.resolve())


def absolute_path(path: str | None) -> str | None:
    return str(Path(path).resolve()) if path else None


def run_mounts(
    out: Path,
    data_path: str | None,
    cache: dict,
    weights_from: str | None = None,
    shares_references: bool = False,
) -> list[tuple[str, str]]:
    """What a container run sees of the host besides the sources, each at its own path:
    the record's folder writable, the data (image folder or digits) read-only, the
    folder of the run whose trained weights it serves read-only, a warm compile
    cache if the spec keeps one (a later trial's copy of its first trial's is beside
    the record already), the machine's precompiled headers for a compiled run
    (:func:`compile_cache`), the study's initial weights (rank/initial_weights.py) and
    the gradient check's shared references (``shares_references``: rank/references.py)
    writable."""
    mounts = [(str(out.parent.resolve()), "rw")]
    shared = [initial_weights.folder(out)] + ([references.folder(out)] if shares_references else [])
    for where in shared:
        try:
            where.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass  # (the run draws its weights, makes its references, itself)
        else:
            mounts.append((str(where.resolve()), "rw"))
    if data_path:
        mounts.append((absolute_path(data_path), "ro"))
    if weights_from:
        mounts.append((str(weights_path(out, weights_from).parent.resolve()), "ro"))
    if not cache["fresh"] and not beside(Path(cache["dir"]), out):
        Path(cache["dir"]).mkdir(parents=True, exist_ok=True)
        mounts.append((cache["dir"], "rw"))
    if cache.get("headers"):
        mounts.append((cache["headers"], "rw"))
    return mounts
