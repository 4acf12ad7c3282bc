"""Build one backend's Python environment from a pinned, hashed requirements file.

Environments are content-addressed: ``<root>/<name>-<sha12>`` where ``sha12`` is
the first 12 hex digits of the requirements file's SHA-256 (and the Python
version). A second build of the same file reuses the finished environment, so
several checkouts (or test copies) of the workflow can share one root. Any edit
to the file gives a new hash and a fresh environment.

Installs go through ``uv pip install --require-hashes`` (uv hard-links from its
cache, so a rebuild of a known set costs seconds, not gigabytes) or, with
``--installer pip``, through ``pip install --require-hashes``. Nothing inside
the installed libraries is patched. Debian's versioned allocator libraries are
linked into ``<prefix>/lib`` under the names ``torch.backends.xeon.run_cpu``
looks for (it searches only the environment's ``lib`` folder).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from . import backends, launchers
from .commands import Arg, Command
from .util import read_json

COMPLETE_MARKER = ".complete.json"
REPO_ROOT = Path(__file__).resolve().parent.parent

# Compiled extensions an environment gets when its lock holds their library, declared
# by the launchers that use them (name -> requirement, build script, sources, folder).
EXTENSIONS = {name: ext for la in launchers.all_launchers() for name, ext in la.extensions.items()}

# Names run_cpu looks for, and where Debian/Ubuntu/Fedora put the real files.
ALLOCATOR_LIBS = {
    "libjemalloc.so": ["libjemalloc.so.2", "libjemalloc.so"],
    "libtcmalloc.so": ["libtcmalloc.so.4", "libtcmalloc_minimal.so.4", "libtcmalloc.so"],
}
SYSTEM_LIB_DIRS = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
]

# What an environment's versions are read from: torch's stack and each backend's library.
VERSION_MODULES = {
    "torch": "torch",
    "torchvision": "torchvision",
    **backends.version_modules(),
    "numpy": "numpy",
    "PIL": "pillow",
}
PROBE = r"""
import importlib, json, sys
out = {"python": sys.version.split()[0]}
for mod, key in json.loads(sys.argv[1]).items():
    try:
        m = importlib.import_module(mod)
        out[key] = getattr(m, "__version__", "unknown")
    except ImportError:
        pass
    except Exception as exc:  # an installed package that fails to import is an error
        out[key] = "IMPORT FAILED: %s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""


def requirements_hash(requirements: Path, python_version: str) -> str:
    h = hashlib.sha256()
    h.update(requirements.read_bytes())
    h.update(f"\npython={python_version}\n".encode())
    return h.hexdigest()


def python_version(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def find_system_lib(candidates: list[str], dirs: list[str] = SYSTEM_LIB_DIRS) -> str | None:
    for d in dirs:
        for name in candidates:
            p = Path(d) / name
            if p.exists():
                return str(p.resolve())
    return None


def missing_allocators(experiments, dirs: list[str] = SYSTEM_LIB_DIRS) -> str | None:
    """For a study run in virtualenvs here (the images install both allocators): one
    warning naming the experiments that ask run_cpu to preload an allocator this
    machine lacks, and what to install; None where nothing is missing. Such a run is
    recorded as failed (``run_cpu.verify``) and the study goes on: the warning says so
    before the hours the study takes, not after."""
    from .launchers import run_cpu

    wanted: dict[str, list[str]] = {}
    for spec in experiments:
        allocator = spec.get("allocator")
        if spec.get("launcher") == run_cpu.LAUNCHER.name and allocator not in (None, "default"):
            wanted.setdefault(str(allocator), []).append(str(spec["id"]))
    missing = {
        a: ids for a, ids in sorted(wanted.items())
        if find_system_lib(ALLOCATOR_LIBS.get(f"lib{a}.so", []), dirs) is None
    }  # fmt: skip
    if not missing:
        return None
    ids = [i for group in missing.values() for i in group]
    hints = " and ".join(run_cpu.HINTS[f"lib{a}"] for a in missing if f"lib{a}" in run_cpu.HINTS)
    return (
        f"warning: {', '.join(ids)} ask run_cpu to preload {' and '.join(missing)}, which "
        f"this machine lacks: they will be recorded as failed and the rest of the study "
        f"runs; to measure them, install {hints} before the environments are built (they "
        "link the allocators when they are built)"
    )


def link_allocators(prefix: Path) -> dict[str, str | None]:
    """Make Debian's versioned allocators visible to run_cpu; return what is in place."""
    lib = prefix / "lib"
    lib.mkdir(exist_ok=True)
    found: dict[str, str | None] = {}
    for link_name, candidates in ALLOCATOR_LIBS.items():
        target = lib / link_name
        if target.exists() and not target.is_symlink():
            found[link_name] = str(target)  # shipped by a wheel: keep it
            continue
        real = find_system_lib(candidates)
        if target.is_symlink():
            target.unlink()
        if real:
            target.symlink_to(real)
        found[link_name] = real
    iomp = lib / "libiomp5.so"
    found["libiomp5.so"] = str(iomp) if iomp.exists() else None
    return found


def _run(cmd: list[str], log) -> None:
    print("+ " + " ".join(cmd), file=log, flush=True)
    subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)


def install(prefix: Path, requirements: Path, python: str, installer: str, log) -> None:
    env = dict(os.environ)
    if installer == "uv":
        uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
        _run([uv, "venv", "--quiet", "--python", python, str(prefix)], log)
        _run(
            [
                uv,
                "pip",
                "install",
                "--python",
                str(prefix / "bin" / "python"),
                "--require-hashes",
                "--no-progress",
                "-r",
                str(requirements),
            ],
            log,
        )
    elif installer == "pip":
        _run([python, "-m", "venv", str(prefix)], log)
        # The pinned set decides; a host-wide find-links (e.g. a local +cpu torch
        # wheel) would otherwise win and fail the hash check.
        env["PIP_FIND_LINKS"] = ""
        cmd = [
            str(prefix / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--no-cache-dir",
            "--require-hashes",
            "-r",
            str(requirements),
        ]
        print("+ " + " ".join(cmd), file=log, flush=True)
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    else:
        raise ValueError(f"unknown installer {installer!r} (allowed: uv, pip)")


def compile_bytecode(prefix: Path, log) -> str:
    """Byte-compile the environment's Python files once, at build time.

    ``uv`` installs no ``.pyc`` files, and where ``PYTHONDONTWRITEBYTECODE`` is set
    (CI machines, the study's images) no process writes them either: every trial then
    compiled torch's sources again (``import torch`` 4.9 s instead of 2.4 s here, and
    ``FlopCounterMode``'s first use, which imports ``torch._dynamo``, 7.2 s instead of
    1.9 s). A file that does not compile (some packages ship Python 2 examples) is left
    as it is; the count of such files is in the log.
    """
    cmd = [str(prefix / "bin" / "python"), "-m", "compileall", "-q", "-j0", str(prefix / "lib")]
    print("+ " + " ".join(cmd), file=log, flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    errors = proc.stdout.count("*** Error compiling")
    print(proc.stdout[-4000:], file=log, flush=True)
    return "compiled" if proc.returncode == 0 else f"compiled ({errors} files failed to compile)"


def probe(prefix: Path) -> dict[str, str]:
    out = subprocess.run(
        [str(prefix / "bin" / "python"), "-c", PROBE, json.dumps(VERSION_MODULES)],
        check=True,
        capture_output=True,
        text=True,
    )
    versions = json.loads(out.stdout.strip().splitlines()[-1])
    broken = {k: v for k, v in versions.items() if str(v).startswith("IMPORT FAILED")}
    if broken:
        raise RuntimeError(f"environment {prefix} installed but does not import: {broken}")
    return versions


def extensions_of(requirements: Path) -> list[str]:
    """The extensions an environment of this lock gets."""
    text = Path(requirements).read_text()
    return [name for name, (needs, *_) in EXTENSIONS.items() if needs in text]


def extension_sources(requirements: Path) -> list[str]:
    """The files whose change rebuilds the environment's extensions (repository paths)."""
    return [src for name in extensions_of(requirements) for src in EXTENSIONS[name][2]]


def _sources_sha256(sources) -> str:
    h = hashlib.sha256()
    for src in sources:
        h.update(src.encode() + b"\0" + (REPO_ROOT / src).read_bytes())
    return h.hexdigest()


def build_extensions(prefix: Path, requirements: Path, log) -> dict[str, dict]:
    """Build (or keep, when its sources are unchanged) each extension of the lock into
    the environment; return their BUILD.json records."""
    built = {}
    for name in extensions_of(requirements):
        _, script, sources, where = EXTENSIONS[name]
        out = prefix / where
        digest = _sources_sha256(sources)
        stamp = out / "SOURCES.sha256"
        if not (stamp.exists() and stamp.read_text().strip() == digest):
            shutil.rmtree(out, ignore_errors=True)
            try:
                _run([str(prefix / "bin" / "python"), str(REPO_ROOT / script), "--out", str(out)],
                     log)  # fmt: skip
                stamp.write_text(digest + "\n")
            except subprocess.CalledProcessError as exc:
                # Not fatal: the environment serves every other experiment; the ones that
                # need the extension fail with the reason (BUILD.json), and the next
                # build of the environment tries again (no stamp).
                print(f"extension {name} not built (exit {exc.returncode}): the experiments "
                      "that need it will fail with the reason", file=log, flush=True)  # fmt: skip
        else:
            print(f"extension {name}: {out} is up to date", file=log, flush=True)
        try:
            record = read_json((out / "BUILD.json"), want=None)
        except (OSError, ValueError):
            record = {"status": "failed", "error": f"{script} wrote no BUILD.json (see the log)"}
        built[name] = {"dir": str(out), "sources_sha256": digest, **record}
    return built


@contextlib.contextmanager
def locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build(name: str, requirements: Path, root: Path, python: str, installer: str, log) -> dict:
    pyver = python_version(python)
    digest = requirements_hash(requirements, pyver)
    prefix = (root / f"{name}-{digest[:12]}").absolute()
    marker = prefix / COMPLETE_MARKER
    with locked(root / f".{name}-{digest[:12]}.lock"):
        if marker.exists():
            info = read_json(marker, want=None)
            if not info.get("bytecode"):  # an environment built before byte-compiling
                info["bytecode"] = compile_bytecode(prefix, log)
                marker.write_text(json.dumps(info, indent=2) + "\n")
            # System allocators may have been installed since: link again (idempotent).
            info["libs"] = link_allocators(prefix)
            info["extensions"] = build_extensions(prefix, requirements, log)
            info["reused"] = True
            print(f"reusing {prefix} (built {info.get('built_at')})", file=log, flush=True)
            return info
        if prefix.exists():
            print(f"removing incomplete environment {prefix}", file=log, flush=True)
            shutil.rmtree(prefix)
        install(prefix, requirements, python, installer, log)
        allocators = link_allocators(prefix)
        bytecode = compile_bytecode(prefix, log)
        versions = probe(prefix)
        info = {
            "name": name,
            "requirements": str(requirements),
            "requirements_sha256": digest,
            "prefix": str(prefix),
            "python": str(prefix / "bin" / "python"),
            "python_version": pyver,
            "installer": installer,
            "versions": versions,
            "libs": allocators,
            "bytecode": bytecode,
            "built_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        }
        marker.write_text(json.dumps(info, indent=2) + "\n")
        info["extensions"] = build_extensions(prefix, requirements, log)
        info["reused"] = False
        return info


#: The build_env rule's entry point.
COMMAND = Command(
    __doc__.splitlines()[0],
    (
        Arg("name", "wildcards.env"),
        Arg("requirements", "input.requirements", type=Path),
        Arg("root", "params.root", type=Path),
        Arg("python", "params.python", default=sys.executable),
        Arg("installer", "params.installer", default="uv", choices=["uv", "pip"]),
        Arg("out", "output.env", type=Path, help="JSON file describing the environment"),
        Arg("log", "log", type=Path, default=None, help="installer output (default: stderr)"),
    ),
)


def main(argv: list[str] | None = None) -> int:
    args = COMMAND.parse(argv)
    if args.log:
        args.log.parent.mkdir(parents=True, exist_ok=True)
    with open(args.log, "a") if args.log else contextlib.nullcontext(sys.stderr) as log:
        try:
            info = build(args.name, args.requirements, args.root, args.python, args.installer, log)
        except (subprocess.CalledProcessError, RuntimeError) as exc:
            where = f"; see {args.log}" if args.log else ""
            raise SystemExit(f"building environment {args.name!r} failed: {exc}{where}") from None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    print(
        f"environment {args.name}: {info['prefix']} torch {info['versions'].get('torch')}"
        f"{' (reused)' if info['reused'] else ''}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
