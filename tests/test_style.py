"""The code is formatted and linted as the project asks (ruff, snakefmt, snakemake --lint)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "cmd",
    [
        [str(BIN / "ruff"), "check", "."],
        [str(BIN / "ruff"), "format", "--check", "."],
        [str(BIN / "snakefmt"), "--check", "Snakefile", "rules", "profiles/slurm/Snakefile"],
        [sys.executable, "-m", "snakemake", "--lint"],
    ],
    ids=["ruff-check", "ruff-format", "snakefmt", "snakemake-lint"],
)
def test_clean(cmd):
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    if "--lint" in cmd:
        assert "Congratulations" in proc.stdout + proc.stderr
