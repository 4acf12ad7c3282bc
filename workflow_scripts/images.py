"""Container images: the engine, the wheelhouse, the image builds, the run command.

Images (containers/<name>/Containerfile, each built FROM its parent's image ID):

    os       Debian minbase, from mmdebstrap (no registry needed) or a registry
             image pinned by digest (config ``containers.base``)
    common   + python3, venv, jemalloc, tcmalloc: what every backend needs
    eager    + /opt/venv from envs/upstream.txt
    inductor + g++ and the Python headers TorchInductor compiles its kernels with
    ipex     + /opt/venv from envs/ipex.txt (and g++ for compile(backend="ipex"))
    xla      + /opt/venv from envs/xla.txt
    oneccl   + envs/oneccl.txt (the oneCCL library) on top of inductor

pip inside a build reaches no index: a rule downloads every locked wheel on the
host, with the host's pip settings, into one flat wheelhouse (shared by all
sets: a wheel pinned by two locks is stored once), and the builds install
``--no-index --require-hashes`` from it through a build-time bind mount
(``--build-context wheelhouse=...``), so no wheel lands in an image layer.

Every image's record (results/images/<name>.json) holds its ID and digest;
experiments run by ID, never by a moving tag.

    python -m workflow_scripts.images wheelhouse --lock envs/upstream.txt \
        --wheelhouse resources/wheelhouse --out resources/wheelhouse/locks/upstream.txt --log L
    python -m workflow_scripts.images build --image eager --engine podman \
        --parent-json results/images/common.json --out results/images/eager.json --log L
    python -m workflow_scripts.images resolve auto

The image table is derived: ``os`` and ``common`` here, one image per backend
(``workflow_scripts/backends``), and ``oneccl`` for the distributed runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import backends, launchers
from .commands import Arg, Command
from .runtimes import ENGINES, RUNTIMES, RuntimeUnavailable, engine_env, resolve
from .runtimes.container import image_exists
from .util import lock_pins, read_json

REPO_ROOT = Path(__file__).resolve().parent.parent
CONTAINERS = REPO_ROOT / "containers"
VENV = "/opt/venv"

# name -> (parent image, envs/ lock it installs or None): the root, what every backend
# needs, one image per backend, and the launchers' own (oneCCL's, for distributed runs).
IMAGES: dict[str, tuple[str | None, str | None]] = {
    "os": (None, None),
    "common": ("os", None),
    **{b.image: (b.image_parent, b.image_lock) for b in backends.all_backends()},
    **{name: image for la in launchers.all_launchers() for name, image in la.images.items()},
}


#: the lock of the installer the builds install each environment with (envs/uv.txt:
#: containers/common/install-env takes it from the wheelhouse like the environment's)
INSTALLER_LOCK = "uv"


class ImageError(RuntimeError):
    pass


def image_for(spec: dict) -> str:
    """The image an experiment runs in: its backend's (or its launcher's, as oneccl)."""
    return launchers.get(spec["launcher"]).image(spec, backends.get(spec["backend"]))


def lineage(image: str) -> list[str]:
    """The image and its ancestors, root first."""
    chain = []
    while image is not None:
        chain.append(image)
        image = IMAGES[image][0]
    return chain[::-1]


def locks_of(image: str) -> list[str]:
    return [IMAGES[i][1] for i in lineage(image) if IMAGES[i][1]]


def image_env(image: str) -> str | None:
    """The Python environment in an image: the last lock of its lineage (oneccl's lock
    is upstream's plus oneCCL, installed over upstream's /opt/venv)."""
    return next(iter(reversed(locks_of(image))), None)


def env_image(env: str) -> str:
    """The image that installs an environment: the smallest one holding it (where its
    reference probe runs)."""
    return next(name for name, (_, lock) in IMAGES.items() if lock == env)


# ---------------------------------------------------------------- base image


def host_debian_mirror(sources_dirs=("/etc/apt",)) -> str | None:
    """The first Debian archive URI of the host's apt sources (deb822 ``*.sources`` or
    one-line ``sources.list``), so that a host behind a company mirror builds its
    images from that mirror; None when the host has no apt sources."""
    files: list[Path] = []
    for d in map(Path, sources_dirs):
        files += [d / "sources.list", *sorted((d / "sources.list.d").glob("*.list"))]
        files += sorted((d / "sources.list.d").glob("*.sources"))
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            m = re.match(r"^URIs:\s*(\S+)", line) or re.match(
                r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+", line
            )
            if m and "security" not in m.group(1):
                return m.group(1).rstrip("/")
    return None


def resolve_runtime(requested: str, engine_conf: str | None = None) -> tuple[str, str | None]:
    """The runtime ``auto`` (or a named engine) gives here; see runtimes.resolve."""
    try:
        return resolve(requested, engine_conf)
    except RuntimeUnavailable as exc:
        raise ImageError(str(exc)) from None


# ---------------------------------------------------------------- wheelhouse


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def known_sha256(path: Path) -> str:
    """``sha256_file``, kept beside the wheelhouse (``.sha256/<name>``) for as long as the
    file keeps its size and mtime: a lock's wheels are gigabytes (torch and its CUDA
    libraries, ~12 s to hash here), and the builds check every hash again anyway."""
    st = path.stat()
    key = f"{st.st_size} {st.st_mtime_ns}"
    kept = path.parent / ".sha256" / path.name
    try:
        size_mtime, digest = kept.read_text().rsplit(" ", 1)
        if size_mtime == key:
            return digest
    except (OSError, ValueError):
        pass
    digest = sha256_file(path)
    kept.parent.mkdir(exist_ok=True)
    tmp = kept.with_name(f".{kept.name}.{os.getpid()}")
    tmp.write_text(f"{key} {digest}")
    tmp.replace(kept)  # whole or not at all: the wheelhouse jobs of other locks run beside
    return digest


def fetched_already(lock: Path, wheelhouse: Path) -> int | None:
    """How many pins of ``lock`` the wheelhouse holds already, each as a wheel this
    interpreter installs (its tags, as ``pip download`` picks) with a hash the lock
    allows; None where one is missing or the lock is more than pins (pip runs then)."""
    from packaging.tags import sys_tags
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
    from packaging.version import InvalidVersion, Version

    pins = lock_pins(lock)
    if not pins:
        return None
    tags = set(sys_tags())
    wheels: dict[tuple, list[Path]] = {}
    for path in wheelhouse.glob("*.whl"):
        try:
            name, version, _, wheel_tags = parse_wheel_filename(path.name)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if wheel_tags & tags:
            wheels.setdefault((name, version), []).append(path)
    for name, version, hashes in pins:
        try:
            found = wheels.get((canonicalize_name(name), Version(version)), [])
        except InvalidVersion:
            return None
        if not any(known_sha256(path) in hashes for path in found):
            return None
    return len(pins)


#: the file whose lock one fill of a wheelhouse holds while it checks and downloads
FILL_LOCK = ".fill.lock"


@contextlib.contextmanager
def _one_at_a_time(lock_file: Path, log: Path, waiting: str):
    """Hold ``lock_file`` (an exclusive ``flock``) for the block; a second holder waits,
    and says ``waiting`` in its log first. The lock ends with the file's closing, also
    when the process is killed. Gives the seconds it waited."""
    with open(lock_file, "a") as held:
        t0 = time.perf_counter()
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with open(log, "a") as logf:
                print(waiting, file=logf, flush=True)
            fcntl.flock(held, fcntl.LOCK_EX)
        yield time.perf_counter() - t0


@contextlib.contextmanager
def filling(wheelhouse: Path, log: Path):
    """Hold the wheelhouse for one fill: the wheelhouse jobs of several locks (and of
    several workflow copies sharing it) download many of the same wheels, and two
    ``pip download`` into one folder replace each other's files as they write them
    (``FileNotFoundError`` in pip's copy). A second fill waits, and says so in its log."""
    with _one_at_a_time(
        wheelhouse / FILL_LOCK, log, f"waiting for another fill of {wheelhouse} to end"
    ):
        yield


def build_lock() -> Path:
    """The file whose lock one image build holds, one per user and host (the engine's
    storage and temporary folder are the host's disk, whichever workflow copy builds)."""
    return Path(tempfile.gettempdir()) / f"cpu-train-study-image-builds-{os.getuid()}.lock"


@contextlib.contextmanager
def building(log: Path):
    """One image build at a time on this host. A backend image installs several GB of
    wheels, and the engine then writes the new layer whole twice more (a blob in its
    temporary folder, /var/tmp, then a layer in its storage): two such builds side by
    side (``--cores all`` runs the images' jobs together, as it may any two jobs) need
    twice the disk at their peak (CI, 2026-12-04, about 48 GB free: "no space left on
    device" in the ipex image's commit, another image building beside it). A second
    build waits, and says so in its log."""
    with _one_at_a_time(
        build_lock(), log, "waiting for another image build on this host to end"
    ) as waited:
        yield waited


#: what an engine or installer prints when the disk fills (ENOSPC's text)
_NO_SPACE = re.compile(r"(?:write |open |)(/\S+?)?:? no space left on device", re.IGNORECASE)


def no_space_hint(text: str) -> str:
    """Where a failed command's output (a build, an import, a save) says the disk
    filled: which folder, how much is free there now, and what to do; else ''."""
    found = _NO_SPACE.search(text)
    if not found:
        return ""
    where = Path(found.group(1) or tempfile.gettempdir())
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free / 1e9
    return (
        f": the disk filled up ({where} has {free:.1f} GB free now; an image build needs "
        "about three times its image's size: docs/containers.md): free space there "
        "(podman image prune, or remove what else fills the disk) and run again"
    )


def fill_wheelhouse(lock: Path, wheelhouse: Path, out: Path, log: Path) -> dict:
    """Download every wheel of a hashed lock into the wheelhouse (the host's pip and
    settings; wheels already there are checked and kept), then copy the lock to
    ``out`` (the builds read the lock from the wheelhouse). A lock whose every wheel is
    there already (``fetched_already``: a checkout's newer lock, a wheelhouse shared
    by several workflow copies) asks pip nothing: no index, no download. One fill at a
    time (:func:`filling`)."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
        "--no-cache-dir",  # the wheelhouse is the cache: no second copy
        "--require-hashes", "--no-deps", "--only-binary=:all:",
        "-r", str(lock), "-d", str(wheelhouse),
    ]  # fmt: skip
    with filling(wheelhouse, log):
        t0 = time.perf_counter()
        present = fetched_already(lock, wheelhouse)
        with open(log, "a") as logf:
            if present:
                print(f"every wheel of {lock} is in {wheelhouse} with a hash it allows "
                      f"({present} pins): nothing to download", file=logf)  # fmt: skip
                rc = 0
            else:
                print(f"$ {' '.join(cmd)}", file=logf, flush=True)
                rc = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise ImageError(f"filling the wheelhouse from {lock} failed (pip exit {rc}); see {log}")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(lock, out)
    info = {
        "lock": str(lock),
        "lock_sha256": sha256_file(lock),
        "wheelhouse": str(wheelhouse),
        "download_s": round(time.perf_counter() - t0, 1),
        "downloaded": not present,
    }
    with open(log, "a") as logf:
        print(json.dumps(info), file=logf)
    return info


# ---------------------------------------------------------------- builds


def _run_logged(cmd: list[str], log: Path, env: dict[str, str], what: str) -> None:
    with open(log, "a") as logf:
        print(f"$ {' '.join(cmd)}", file=logf, flush=True)
        start = logf.tell()
        rc = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        with open(log, "rb") as logf:
            logf.seek(start)
            hint = no_space_hint(logf.read()[-20000:].decode(errors="replace"))
        raise ImageError(f"{what} failed (exit {rc}){hint}; see its log {log}")


def inspect(engine: str, ref: str, env: dict[str, str]) -> dict:
    out = subprocess.run([engine, "image", "inspect", ref], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise ImageError(f"{engine} image inspect {ref}: {out.stderr.strip()[:300]}")
    data = json.loads(out.stdout)[0]
    image_id = data["Id"] if data["Id"].startswith("sha256:") else "sha256:" + data["Id"]
    digest = data.get("Digest") or ""
    return {
        "image_id": image_id,
        # podman computes a manifest digest for local images; docker has none before a
        # push, so the ID (the config's digest) stands in.
        "image_digest": digest or image_id,
        "size_bytes": data.get("Size") or data.get("VirtualSize"),
        "created": data.get("Created"),
    }


def resolved_base(base: dict) -> dict:
    """The base settings with the mirror the build uses (the host's when unset)."""
    if base.get("source", "mmdebstrap") == "mmdebstrap" and not base.get("mirror"):
        return {**base, "mirror": host_debian_mirror()}
    return dict(base)


def base_key(base: dict) -> str:
    """The root image's tag: a hash of the base settings (the mirror as resolved)."""
    base = resolved_base(base)
    text = json.dumps({k: base.get(k) for k in sorted(base)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def build_os(engine: str, base: dict, name: str, log: Path, env: dict[str, str]) -> None:
    """The root image: a registry image pinned by digest, or Debian minbase from
    mmdebstrap imported as a single layer."""
    if base["source"] == "registry":
        _run_logged([engine, "pull", base["image"]], log, env, f"pulling {base['image']}")
        _run_logged([engine, "tag", base["image"], name], log, env, "tagging the base image")
        return
    if shutil.which("mmdebstrap") is None:
        raise ImageError("containers.base.source is mmdebstrap, but mmdebstrap is not installed")
    mirror = resolved_base(base)["mirror"]
    if not mirror:
        raise ImageError(
            "no Debian mirror for the base image: the host has no apt sources; "
            "set containers.base.mirror"
        )
    with tempfile.TemporaryDirectory(prefix="study-os-") as tmp:
        tar = Path(tmp) / "rootfs.tar"
        cmd = [
            "mmdebstrap", "--variant=minbase", "--mode=auto", "--format=tar",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            "--dpkgopt=path-include=/usr/share/locale/locale.alias",
            "--", base["suite"], str(tar), mirror,  # (no value of the config is an option)
        ]  # fmt: skip
        _run_logged(cmd, log, env, "mmdebstrap of the base image")
        _run_logged(
            [engine, "import", "--change", "CMD [\"/bin/bash\"]", str(tar), name],
            log, env, f"{engine} import of the base image",
        )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Source:
    """What one image is built from: its name's prefix, its parent's record, the
    wheelhouse its Containerfile installs from, and (the ``os`` image) the base settings."""

    image: str
    prefix: str  # (the rule's; the command line's default)
    parent_json: Path | None = None
    wheelhouse: Path | None = None
    base: dict | None = None


def build(
    source: Source, engine: str, out: Path, log: Path, engine_conf: str | None = None
) -> dict:
    """Build one image (with the engine's layer cache) and write its record."""
    image, prefix, base, wheelhouse = source.image, source.prefix, source.base, source.wheelhouse
    env = engine_env(engine_conf)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    name = f"{prefix}-{image}:latest"
    parent = read_json(source.parent_json, want=None) if source.parent_json else None
    t0, waited = time.perf_counter(), 0.0
    try:
        if image == "os":
            # Content-addressed: the tag is the base settings' hash, and an image with
            # that tag is reused. Building again would give a new ID (a new rootfs
            # timestamp) and so miss the layer cache of every image above it.
            name = f"{prefix}-os:{base_key(base or {})}"
            if image_exists(engine, name, env):
                with open(log, "a") as logf:
                    print(f"reusing {name} (remove it to build the base again)", file=logf)
            else:
                with building(log) as waited:
                    build_os(engine, base or {}, name, log, env)
        else:
            context = CONTAINERS / image
            cmd = [engine, "build", "-f", str(context / "Containerfile"), "-t", name]
            cmd += ["--build-arg", f"PARENT={parent['image_id']}"]
            if IMAGES[image][1]:
                cmd += ["--build-context", f"wheelhouse={Path(wheelhouse).resolve()}"]
            with building(log) as waited:
                _run_logged([*cmd, str(context)], log, env, f"{engine} build of image {image}")
        info = inspect(engine, name, env)
    except ImageError as exc:
        raise ImageError(f"image {image}: {exc}") from None
    lock = image_env(image)
    record = {
        "image": image,
        "name": name,
        "engine": engine,
        "engine_conf": env.get("CONTAINERS_CONF") if engine_conf else None,
        **info,
        "parent": parent and {"image": parent["image"], "image_id": parent["image_id"]},
        "locks": {n: sha256_file(REPO_ROOT / "envs" / f"{n}.txt") for n in locks_of(image)},
        "env": lock,
        "python": f"{VENV}/bin/python" if lock else None,
        "prefix": VENV if lock else None,
        "requirements_sha256": (sha256_file(REPO_ROOT / "envs" / f"{lock}.txt") if lock else None),
        # the build's own time: not the wait for another build on this host to end
        "build_s": round(time.perf_counter() - t0 - waited, 1),
        "waited_s": round(waited, 1),
        "built_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    with open(log, "a") as logf:
        print(json.dumps(record), file=logf)
    return record


def save_archive(image_json: Path, out: Path, log: Path) -> dict:
    """Save a built image (by its ID) into an archive on the filesystem the cluster's
    nodes share, for a node whose engine storage lacks it (``runtimes.container``
    loads it there before the node's first run in it). Written under another name and
    renamed: a half-written archive is never there to load."""
    rec = read_json(Path(image_json), want=None)
    env = engine_env(rec.get("engine_conf"))
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    part.unlink(missing_ok=True)
    t0 = time.perf_counter()
    cmd = [rec["engine"], "save", "-o", str(part), rec["image_id"]]
    _run_logged(cmd, log, env, f"{rec['engine']} save of image {rec['image']}")
    part.replace(out)
    saved = {"image": rec["image"], "image_id": rec["image_id"], "archive": str(out),
             "bytes": out.stat().st_size, "save_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
    with open(log, "a") as logf:
        print(json.dumps(saved), file=logf)
    return saved


# ---------------------------------------------------------------- rules


def build_line(rec: dict) -> str:
    return (
        f"[image] {rec['image']}: {rec['image_id'][:19]} "
        f"{(rec['size_bytes'] or 0) / 1e9:.2f} GB in {rec['build_s']} s"
        + (f", after {rec['waited_s']} s waiting for another build" if rec.get("waited_s") else "")
    )


# ---------------------------------------------------------------- CLI


def _path_or_none(text: str) -> Path | None:
    return Path(text) if text else None


def _str_or_none(text: str) -> str | None:
    return text or None


def _wheelhouse_of(lock: str | None) -> Path | None:
    """The wheelhouse a lock's copy is in: ``<wheelhouse>/locks/<lock>.txt``."""
    return Path(lock).parent.parent if lock else None


#: The image rules' entry points, subcommands of this module's command line. The
#: engine's containers.conf is a host setting, not an input of the image: read from the
#: settings, so changing it rebuilds nothing.
WHEELHOUSE = Command(
    "download a lock's wheels into the wheelhouse",
    (
        Arg("lock", "input.lock", type=Path),
        Arg("wheelhouse", lambda job: _wheelhouse_of(job.output.lock), type=Path),
        Arg("out", "output.lock", type=Path),
        Arg("log", "log", type=Path),
    ),
    sub="wheelhouse",
)
BUILD = Command(
    "build one image",
    (
        Arg("image", "wildcards.image", choices=list(IMAGES)),
        Arg("engine", "params.engine", choices=ENGINES),
        Arg("out", "output.image", type=Path),
        Arg("log", "log", type=Path),
        Arg("prefix", "params.prefix", default="localhost/cpu-train-study"),
        Arg("parent_json", "input.parent", type=_path_or_none, default=None),
        Arg("wheelhouse", lambda job: _wheelhouse_of(job.input.get("lock")),
            type=_path_or_none, default=None),
        Arg("base_json", "params.base", default='{"source": "mmdebstrap", "suite": "bookworm"}'),
        Arg("engine_conf", lambda job: job.settings.get("container_engine_conf") or None,
            type=_str_or_none, default=None),
    ),
    sub="build",
)  # fmt: skip
ARCHIVE = Command(
    "save a built image into an archive (for other nodes)",
    (
        Arg("image_json", "input.image", type=Path),
        Arg("out", "output.archive", type=Path),
        Arg("log", "log", type=Path),
    ),
    sub="archive",
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for command in (WHEELHOUSE, BUILD, ARCHIVE):
        command.add_arguments(sub.add_parser(command.sub, help=command.description))
    r = sub.add_parser("resolve", help="which runtime `auto` gives here")
    r.add_argument("runtime", choices=RUNTIMES)
    r.add_argument("--engine-conf", type=_str_or_none)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "wheelhouse":
            fill_wheelhouse(args.lock, args.wheelhouse, args.out, args.log)
        elif args.cmd == "build":
            source = Source(args.image, args.prefix, args.parent_json, args.wheelhouse,
                            json.loads(args.base_json))  # fmt: skip
            rec = build(source, args.engine, args.out, args.log, args.engine_conf)
            print(build_line(rec))
        elif args.cmd == "archive":
            saved = save_archive(args.image_json, args.out, args.log)
            print(f"[image] {saved['image']}: saved to {saved['archive']} "
                  f"({saved['bytes'] / 1e9:.2f} GB in {saved['save_s']} s)")  # fmt: skip
        else:
            runtime, note = resolve_runtime(args.runtime, args.engine_conf)
            print(runtime if not note else f"{runtime}\n{note}")
    except ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
