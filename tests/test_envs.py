"""Environment builds (workflow_scripts/envs.py): byte-compiled once, so no trial compiles
a library's sources again. (torch in a real built environment: tests/test_envs_slow.py.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from workflow_scripts import envs

TAG = sys.implementation.cache_tag  # e.g. cpython-311


def fake_environment(root: Path, lock: Path) -> Path:
    """A finished environment as an older build left it: the marker, no bytecode."""
    pyver = envs.python_version(sys.executable)
    prefix = root / f"tiny-{envs.requirements_hash(lock, pyver)[:12]}"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python").symlink_to(sys.executable)
    pkg = prefix / "lib" / "site" / "tinypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 42\n")
    (pkg / "py2_example.py").write_text("print 'python 2'\n")  # does not compile
    marker = {"name": "tiny", "prefix": str(prefix), "built_at": "2026-01-01T00:00:00+00:00"}
    (prefix / envs.COMPLETE_MARKER).write_text(json.dumps(marker))
    return prefix


def test_a_reused_environment_without_bytecode_is_compiled_once(tmp_path, monkeypatch):
    lock = tmp_path / "tiny.txt"
    lock.write_text("# nothing to install\n")
    root = tmp_path / "envs"
    prefix = fake_environment(root, lock)
    pyc = prefix / "lib" / "site" / "tinypkg" / "__pycache__" / f"__init__.{TAG}.pyc"
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")  # as on CI hosts and in the images
    with open(tmp_path / "build.log", "w") as log:
        info = envs.build("tiny", lock, root, sys.executable, "uv", log)
    assert info["reused"] is True
    assert pyc.exists()
    # a file that does not compile is counted, not fatal
    assert info["bytecode"] == "compiled (1 files failed to compile)"
    marker = json.loads((prefix / envs.COMPLETE_MARKER).read_text())
    assert marker["bytecode"] == info["bytecode"]  # remembered: the next reuse compiles nothing
    stamp = pyc.stat().st_mtime_ns
    with open(tmp_path / "build2.log", "w") as log:
        envs.build("tiny", lock, root, sys.executable, "uv", log)
    assert pyc.stat().st_mtime_ns == stamp
    assert "compileall" not in (tmp_path / "build2.log").read_text()


def test_a_study_run_here_is_told_which_runs_lack_their_allocator(tmp_path):
    from workflow_scripts import study

    default = study.load_study(study.read_config(Path(envs.REPO_ROOT) / "config.yaml"))
    wanting = sorted(
        s["id"] for s in default.experiments
        if s["launcher"] == "run_cpu" and s["allocator"] != "default"
    )  # fmt: skip
    assert wanting  # the default study measures both allocators
    lib = tmp_path / "lib"
    lib.mkdir()
    # neither library on this machine: every such run is named, with what to install
    text = envs.missing_allocators(default.experiments, dirs=[str(lib)])
    assert all(i in text for i in wanting), text
    assert "libjemalloc2" in text and "libgoogle-perftools4" in text
    assert "recorded as failed and the rest of the study runs" in text
    # Debian's jemalloc (its versioned name) is found: only tcmalloc's runs are named
    (lib / "libjemalloc.so.2").write_bytes(b"")
    text = envs.missing_allocators(default.experiments, dirs=[str(lib)])
    assert "tcmalloc" in text and "jemalloc" not in text, text
    assert all(i in text for i in wanting if "tcmalloc" in i)
    (lib / "libtcmalloc_minimal.so.4").write_bytes(b"")
    assert envs.missing_allocators(default.experiments, dirs=[str(lib)]) is None
