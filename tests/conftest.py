"""Shared fixtures: real backend environments and fully resolved experiment specs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from workflow_scripts import envs, study

REPO = Path(__file__).resolve().parents[1]
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
def ipex_env(tmp_path_factory) -> dict:
    return build_env("ipex", tmp_path_factory)


@pytest.fixture(scope="session")
def oneccl_env(tmp_path_factory) -> dict:
    """upstream + oneCCL, with the study's ccl backend compiled into it."""
    return build_env("oneccl", tmp_path_factory)


def spec_of(**fields) -> dict:
    """A fully resolved spec (through the real config loader) for a tiny model."""
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
        "experiments": [fields],
    }
    return json.loads(study.load_study(config).spec_json(fields["id"]))


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
