"""A built backend environment (workflow_scripts/envs.py; tests/test_envs.py has its fast
tests) for real: torch loads from the bytecode the build compiled."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.torch]


def test_torch_imports_from_bytecode_in_the_built_environment(upstream_env):
    """The environment's torch has its .pyc files, and a process that may not write
    bytecode (PYTHONDONTWRITEBYTECODE, as on CI hosts and in the images) loads them."""
    assert upstream_env["bytecode"].startswith("compiled")
    python = upstream_env["python"]
    code = "import torch._dynamo.symbolic_convert as m; print(m.__cached__)"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()  # fmt: skip
    assert Path(out).is_file(), out
