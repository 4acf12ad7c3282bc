"""Build the project's "ccl" process-group backend (ccl_backend.cpp) ahead of time.

Compiles ``ccl_backend.cpp`` (next to this script) with g++ into the Python
extension module ``study_ccl`` against the torch and the oneCCL library of the
running interpreter's environment, so nothing is compiled when a training job
starts (no ninja, no setuptools, no JIT). Run it with that environment's Python:

    <env>/bin/python containers/oneccl/build_ccl.py --out <env>/lib/study-ccl

oneCCL comes from the ``oneccl-cpu-devel`` wheel, which installs into
``<prefix>/lib`` and ``<prefix>/include`` rather than site-packages (its ``ccl.pc``
asks for SYCL, so plain ``-I``/``-L`` flags are used). The module gets rpaths to
oneCCL, its bundled libfabric and torch's libraries. ``DIR/BUILD.json`` records
the source's SHA-256, the torch version, the compiler, its version and command. When
the module cannot be built (no C++ compiler, no Python or oneCCL headers), the script
exits non-zero and ``DIR/BUILD.json`` says ``"status": "failed"`` with what to
install; the ccl backend's registration repeats it. Standard library and torch only.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "ccl_backend.cpp"
MODULE = "study_ccl"


def pybind11_abi_flags() -> list[str]:
    """The pybind11 ABI defines torch was built with, so that the returned Backend
    converts to torch's registered Python type (empty for pybind11 >= 3, which
    derives them itself)."""
    import torch
    from torch.utils import cpp_extension

    getter = getattr(cpp_extension, "_get_pybind11_abi_build_flags", None)
    if getter is not None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return list(getter())
    flags = []
    for name in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
        value = getattr(torch._C, f"_PYBIND11_{name}", None)
        if value is not None:
            flags.append(f'-DPYBIND11_{name}="{value}"')
    return flags


def cxx_standard(include_dirs: list[str]) -> str:
    """``c++17`` as torch 2.x extensions used to need, or ``c++20`` when torch's headers
    demand it (torch >= 2.10's ATen/ATen.h stops with "C++20 or later compatible
    compiler is required to use ATen" under -std=c++17)."""
    for folder in include_dirs:
        header = Path(folder) / "ATen" / "ATen.h"
        if header.exists():
            return "c++20" if "C++20" in header.read_text(errors="replace") else "c++17"
    return "c++17"


def compile_command(source: Path, target: Path, ccl_prefix: Path, cxx: str) -> list[str]:
    import torch
    from torch.utils import cpp_extension

    torch_lib = Path(torch.__file__).resolve().parent / "lib"
    ccl_lib = ccl_prefix / "lib"
    includes = cpp_extension.include_paths()
    cmd = [cxx, "-O2", f"-std={cxx_standard(includes)}", "-shared", "-fPIC"]
    cmd += [f"-DTORCH_EXTENSION_NAME={MODULE}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    cmd += [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    cmd += pybind11_abi_flags()
    cmd += [f"-I{p}" for p in includes]
    cmd += [f"-I{sysconfig.get_paths()['include']}", f"-I{ccl_prefix / 'include'}"]
    cmd += [str(source), "-o", str(target)]
    cmd += [f"-L{ccl_lib}", "-lccl"]
    cmd += [f"-L{torch_lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    for rpath in (ccl_lib, ccl_lib / "libfabric", torch_lib):
        cmd.append(f"-Wl,-rpath,{rpath}")
    return cmd


#: what to install when the module cannot be built
NEEDS = (
    "a C++17 compiler (Debian/Ubuntu: apt install g++; or set CXX) and this Python's "
    "headers (Debian/Ubuntu: apt install python3-dev)"
)


class BuildFailed(Exception):
    """The module cannot be built here; the message says why and what to install."""


def compiler_version(cxx: str) -> str:
    """The first line of ``cxx --version``; BuildFailed when it cannot run."""
    try:
        proc = subprocess.run(
            [cxx, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildFailed(f"cannot run the C++ compiler {cxx!r} ({exc}); install {NEEDS}") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise BuildFailed(f"the C++ compiler {cxx!r} does not run (exit {proc.returncode})")
    return lines[0]


def build(out: Path, ccl_prefix: Path, cxx: str = "g++") -> dict:
    """Compile the module into ``out``; returns what BUILD.json records. Raises
    BuildFailed (with what to install) when it cannot be built here."""
    import torch

    if not (ccl_prefix / "include" / "oneapi" / "ccl.hpp").exists():
        raise BuildFailed(
            f"oneCCL headers not found under {ccl_prefix}/include (install oneccl-cpu-devel "
            "into this environment, or pass --ccl-prefix)"
        )
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.exists():
        raise BuildFailed(f"{headers} is missing: install {NEEDS}")
    version = compiler_version(cxx)
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{MODULE}{sysconfig.get_config_var('EXT_SUFFIX')}"
    partial = target.with_name(target.name + ".partial")
    cmd = compile_command(SOURCE, partial, ccl_prefix, cxx)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        partial.unlink(missing_ok=True)
        sys.stderr.write(proc.stdout)
        raise BuildFailed(
            f"compiling {SOURCE.name} with {version} failed (exit {proc.returncode}); it needs "
            f"{NEEDS}: {shlex.join(cmd)}"
        )
    os.replace(partial, target)  # a half-written module is never importable
    info = {
        "status": "ok",
        "compiler": {"command": cxx, "version": version},
        "module": MODULE,
        "file": target.name,
        "source": str(SOURCE),
        "source_sha256": hashlib.sha256(SOURCE.read_bytes()).hexdigest(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "ccl_prefix": str(ccl_prefix),
        "command": shlex.join(cmd).replace(partial.name, target.name),
        "compiler_output": proc.stdout[-4000:],
        "built_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    (out / "BUILD.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for the module and BUILD.json")
    ap.add_argument(
        "--ccl-prefix",
        type=Path,
        default=Path(sys.prefix),
        help="where oneCCL is installed (lib/libccl.so, include/oneapi); default: this "
        "interpreter's environment",
    )
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"), help="C++ compiler")
    args = ap.parse_args(argv)
    out = args.out.absolute()
    try:
        info = build(out, args.ccl_prefix.absolute(), args.cxx)
    except BuildFailed as exc:
        # the module's folder says why it is missing (registration repeats it)
        out.mkdir(parents=True, exist_ok=True)
        failed = {"status": "failed", "module": MODULE, "error": str(exc),
                  "source_sha256": hashlib.sha256(SOURCE.read_bytes()).hexdigest(),
                  "built_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}  # fmt: skip
        (out / "BUILD.json").write_text(json.dumps(failed, indent=2) + "\n")
        print(f"cannot build {MODULE}: {exc}", file=sys.stderr)
        return 1
    print(f"built {args.out / info['file']} (torch {info['torch']}, {info['compiler']['version']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
