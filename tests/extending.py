"""A throwaway backend and a throwaway knob, each added to a temporary copy of the
workflow (:func:`add_toy_backend`, :func:`add_knob`), and how the tests of extending the
study look into that copy (:func:`python`, :func:`study`, :func:`snapshot`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.runs import copy_workflow

TOY_BACKEND = '''
"""A throwaway backend: eager PyTorch whose optimizer never moves (lr 0)."""

from .base import Backend


class Toy(Backend):
    name = "toy"
    env = "toy"
    image = "toy"
    image_lock = "toy"
    owns = {}
    order = 50

    def check(self, spec):
        return ["backend 'toy' needs precision 'fp32'"] if spec["precision"] != "fp32" else []

    def prepare(self, model, optimizer, spec):
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        return model, optimizer


BACKEND = Toy()
'''

TOY_CONTAINERFILE = """ARG PARENT
FROM ${PARENT}
COPY --from=wheelhouse locks/toy.txt /opt/study/locks/toy.txt
RUN --mount=type=bind,from=wheelhouse,target=/wheelhouse install-env /opt/study/locks/toy.txt
"""

KNOB = """        Field(
            "label_smoothing",
            {"type": "number", "minimum": 0, "maximum": 1},
            0.0,
            "label smoothing of the cross-entropy loss",
            tag=lambda v: f"ls{v:g}",
            column=True,
            label="label smoothing",
        ),
"""


def python(wd: Path, code: str, *args: str, exe: str = sys.executable) -> str:
    env = {**os.environ, "PYTHONPATH": str(wd)}
    proc = subprocess.run(
        [exe, "-c", code, *args], cwd=wd, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def study(wd: Path, config: dict) -> subprocess.CompletedProcess:
    (wd / "t.yaml").write_text(json.dumps(config))
    cmd = [sys.executable, "-m", "workflow_scripts.study", "--config", "t.yaml", "--json"]
    return subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=120)


def changed_files(wd: Path, before: dict) -> set[str]:
    now = {str(p.relative_to(wd)): p.read_bytes() for p in wd.rglob("*") if p.is_file()}
    return {k for k in now.keys() | before.keys() if now.get(k) != before.get(k)}


def snapshot(wd: Path) -> dict:
    return {str(p.relative_to(wd)): p.read_bytes() for p in wd.rglob("*") if p.is_file()}


def add_toy_backend(tmp_path: Path) -> Path:
    """A copy of the workflow with the toy backend added: one module, one lock, one
    Containerfile."""
    wd = copy_workflow(tmp_path / "wf")
    before = snapshot(wd)
    (wd / "workflow_scripts/backends/toy.py").write_text(TOY_BACKEND)
    (wd / "envs/toy.txt").write_bytes((wd / "envs/upstream.txt").read_bytes())
    (wd / "containers/toy").mkdir()
    (wd / "containers/toy/Containerfile").write_text(TOY_CONTAINERFILE)
    assert changed_files(wd, before) == {
        "workflow_scripts/backends/toy.py", "envs/toy.txt", "containers/toy/Containerfile",
    }  # fmt: skip
    return wd


def add_knob(wd: Path) -> Path:
    """The knob's declaration, and the one line of the trainer that applies it."""
    fields = wd / "workflow_scripts/spec/fields.py"
    text = fields.read_text()
    anchor = '        Field(\n            "env_vars",'
    assert anchor in text
    fields.write_text(text.replace(anchor, KNOB + anchor, 1))
    harness = wd / "workflow_scripts/rank/trainer.py"
    text = harness.read_text()
    line = "self.loss_fn = torch.nn.CrossEntropyLoss()"
    assert text.count(line) == 1
    applied = "self.loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=spec['label_smoothing'])"
    harness.write_text(text.replace(line, applied))
    return wd
