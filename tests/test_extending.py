"""Extending the study: a throwaway backend (one module, one lock, one Containerfile) and
a throwaway knob (one field declaration plus the line that applies it), each added to a
temporary copy of the workflow by the test itself, are picked up everywhere else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.extending import (
    KNOB,
    TOY_BACKEND,
    add_knob,
    add_toy_backend,
    changed_files,
    python,
    snapshot,
    study,
)
from tests.runs import copy_workflow


@pytest.fixture
def toy_backend(tmp_path) -> Path:
    return add_toy_backend(tmp_path)


@pytest.fixture
def toy_knob(tmp_path) -> Path:
    return add_knob(copy_workflow(tmp_path / "wf"))


def test_a_backend_is_one_module_one_lock_one_containerfile(toy_backend):
    wd = toy_backend
    out = python(
        wd,
        "import json\n"
        "from workflow_scripts import backends, images\n"
        "from workflow_scripts.summary import records\n"
        "from workflow_scripts.report.stats import BACKEND_ORDER\n"
        "from workflow_scripts.study import build_schema\n"
        "print(json.dumps({'names': backends.names(), 'image': images.IMAGES['toy'],\n"
        "  'lineage': images.lineage('toy'), 'env_image': images.env_image('toy'),\n"
        "  'enum': build_schema()['$defs']['backend']['enum'],\n"
        "  'order': list(BACKEND_ORDER)}))",
    )
    got = json.loads(out)
    assert got["names"] == ["eager", "inductor", "ipex", "xla", "toy"]
    assert got["enum"] == got["names"] and got["order"] == got["names"]
    assert got["image"] == ["common", "toy"] and got["lineage"] == ["os", "common", "toy"]
    assert got["env_image"] == "toy"
    # the loader resolves its environment and applies its combination rule
    proc = study(wd, {"groups": {"g": {"runs": [{"id": "t", "backend": "toy"}]}}})
    assert proc.returncode == 0, proc.stderr
    (spec,) = json.loads(proc.stdout)["experiments"]
    assert spec["env"] == "toy" and spec["compile"] == "none"
    proc = study(
        wd, {"groups": {"g": {"runs": [{"id": "t", "backend": "toy", "precision": "bf16"}]}}}
    )
    assert proc.returncode == 1
    assert "groups.g.runs[0] (id t): backend 'toy' needs precision 'fp32'" in proc.stderr
    # the workflow builds its environment and runs its experiment (a dry run)
    cmd = [sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--config", "runtime=local"]
    cmd += ["preset=default", "groups={g: {runs: [{id: t, backend: toy}]}}"]
    proc = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "results/envs/toy.json" in proc.stdout and "calibration/toy.json" in proc.stdout
    assert "results/records/t/trial0.json" in proc.stdout


def test_a_knob_is_one_declaration(toy_knob):
    wd = toy_knob
    runs = [{"id": "a", "label_smoothing": 0.1}, {"name": "s", "label_smoothing": [0.0, 0.2]}]
    config = {"groups": {"g": {"runs": runs}}}
    proc = study(wd, config)
    assert proc.returncode == 0, proc.stderr
    specs = json.loads(proc.stdout)["experiments"]
    assert [(s["id"], s["label_smoothing"]) for s in specs] == [
        ("a", 0.1), ("s-ls0", 0.0), ("s-ls0.2", 0.2),
    ]  # fmt: skip
    proc = study(wd, {"groups": {"g": {"runs": [{"label_smoothing": 2}, {"label_smothing": 0.1}]}}})
    assert proc.returncode == 1
    assert "groups.g.runs[0].label_smoothing: 2 is not allowed; allowed: a number >= 0" in (
        proc.stderr
    )
    assert "did you mean 'label_smoothing'?" in proc.stderr
    out = python(
        wd,
        "import json\n"
        "from workflow_scripts.summary import records\n"
        "from workflow_scripts.study import BUILTIN_DEFAULTS, build_schema\n"
        "row = records.flatten({'spec': {'label_smoothing': 0.3}, 'status': 'ok'})\n"
        "print(json.dumps({'default': BUILTIN_DEFAULTS['label_smoothing'],\n"
        "  'column': 'label_smoothing' in records.COLUMNS, 'value': row['label_smoothing'],\n"
        "  'defaults': 'label_smoothing' in build_schema()['$defs']['defaults']['properties']}))",
    )
    assert json.loads(out) == {"default": 0.0, "column": True, "value": 0.3, "defaults": True}


REPORT_RUN = """
import json, sys
from workflow_scripts.summary import records as rec
from workflow_scripts.report import compare, quality, stats as st
records = rec.load_records(sys.argv[1:])
frame = st.enrich(rec.summary_frame(records), records)
stats = st.experiment_stats(frame)
matrix, order = compare.backend_matrix(stats)
check = quality.loss_check(stats, frame, st.loss_curves(frame, records))
base = stats.set_index("experiment")
print(json.dumps({
    "order": order,
    "rows": matrix[["config", "variant", "experiment"]].values.tolist(),
    "references": dict(zip(check["experiment"], check["reference"])),
    "differences": compare.differences(base.loc["eager-ls0"], base.loc["eager-ls3"]),
}))
"""


def report_view(wd: Path, tmp_path: Path, runs: list[tuple[str, float, dict]]) -> dict:
    """Fixture records of ``runs`` (id, spec fields) through the copy's report code: the
    backend head-to-head rows, each loss curve's reference, a pair's differences."""
    from tests.fixture_records import make, write

    records = []
    for exp, sps, spec in runs:
        r = make(exp, 0, sps, **spec)
        r["losses"] = [2.3, 2.2, 2.1, 2.0, 1.9, 1.8]
        records.append(r)
    paths = write(tmp_path / "view", records)
    return json.loads(python(wd, REPORT_RUN, *map(str, paths)))


def test_the_report_compares_by_the_registry(tmp_path):
    """A knob added as docs/extending.md says separates the backend head-to-head's rows and the
    loss check's pairs, and is named where two runs differ in it; a backend added as the
    docs/extending.md says is a column of the head-to-head (its own knobs its variant)."""
    wd = add_knob(copy_workflow(tmp_path / "knob"))
    backend = json.loads(
        python(
            wd,
            "import json; from workflow_scripts.spec import fields; "
            "print(json.dumps(fields.FIELDS['label_smoothing'].role))",
        )  # fmt: skip
    )
    assert backend == "setting"
    view = report_view(wd, tmp_path / "k", [
        # (the fastest eager run is the one a head-to-head that ignored the knob would take)
        ("eager-ls0", 30.0, {"label_smoothing": 0.0}),
        ("eager-ls3", 10.0, {"label_smoothing": 0.3}),
        ("inductor-ls3", 12.0, {"label_smoothing": 0.3, "backend": "inductor",
                                "compile": "inductor"}),
        ("bf16-ls3", 20.0, {"label_smoothing": 0.3, "precision": "bf16"}),
    ])  # fmt: skip
    # inductor is compared with eager at the same label smoothing only
    pairs = {(v, e) for _, v, e in view["rows"]}
    assert pairs == {("eager", "eager-ls3"), ("inductor", "inductor-ls3")}, view["rows"]
    # bf16's curve is checked against fp32 eager with the same label smoothing
    assert view["references"]["bf16-ls3"] == "eager-ls3", view["references"]
    assert view["differences"] == ["label_smoothing 0→0.3"], view["differences"]

    wd = copy_workflow(tmp_path / "wf")
    (wd / "workflow_scripts/backends/toy.py").write_text(TOY_BACKEND.replace("owns = {}", (
        "owns = {'toy_fast': False}")))  # fmt: skip
    fields_py = wd / "workflow_scripts/spec/fields.py"
    anchor = '        Field(\n            "env_vars",'
    knob = KNOB.replace("label_smoothing", "toy_fast").replace(
        '{"type": "number", "minimum": 0, "maximum": 1},\n            0.0', '{"type": "boolean"},\n'
        "            False").replace('tag=lambda v: f"ls{v:g}"', 'tag=lambda v: "fast" if v else ""'
    ).replace('label="label smoothing"', 'label="toy.fast", compare="variant"')  # fmt: skip
    fields_py.write_text(fields_py.read_text().replace(anchor, knob + anchor, 1))
    view = report_view(wd, tmp_path / "b", [
        ("eager-ls0", 10.0, {}),
        ("eager-ls3", 11.0, {"seed": 1}),
        ("toy", 12.0, {"backend": "toy", "env": "toy"}),
        ("toy-fast", 13.0, {"backend": "toy", "env": "toy", "toy_fast": True}),
    ])  # fmt: skip
    assert view["order"] == ["eager", "toy", "toy + toy.fast"], view
    assert {v for _, v, _ in view["rows"]} == {"eager", "toy", "toy + toy.fast"}


FIGURE = """        Result(
            "data_wait_s",
            "number",
            m,
            "s",
            "time the steps waited for their batches",
            ("metrics", "data_wait_s"),
            stat="median",
            label="data wait",
        ),
"""


def add_figure(wd: Path) -> Path:
    """A measured figure's one declaration, at the end of the measurement columns."""
    path = wd / "workflow_scripts/summary/results.py"
    text = path.read_text()
    anchor = '        Result("recompiles", "integer", m, help="recompiles after the first step"),\n'
    assert text.count(anchor) == 1
    path.write_text(text.replace(anchor, anchor + FIGURE))
    return wd


def test_a_result_figure_is_one_declaration(tmp_path):
    """A figure declared once in results.py is a typed column of summary.csv (after the
    measurement columns it joins), a median over the used trials in the report's
    experiment tables with its label and unit, and a column of the full summary."""
    from tests.fixture_records import make, write

    wd = copy_workflow(tmp_path / "wf")
    before = snapshot(wd)
    add_figure(wd)
    assert changed_files(wd, before) == {"workflow_scripts/summary/results.py"}
    records = []
    for trial, (sps, wait) in enumerate([(10.0, 0.25), (11.0, 0.75), (10.5, 0.5)]):
        r = make("waits", trial, sps, group="data-loading")
        r["metrics"]["data_wait_s"] = wait
        records.append(r)
    records.append(make("no-wait", 0, 12.0, group="data-loading"))  # an older record
    paths = write(tmp_path / "run", records)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "workflow_scripts.report", "--records", *map(str, paths)]
    cmd += ["--summary", str(out / "summary.csv"), "--html", str(out / "index.html")]
    cmd += ["--plots-dir", str(out)]
    env = {**os.environ, "PYTHONPATH": str(wd)}
    proc = subprocess.run(cmd, cwd=wd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    import pandas as pd

    summary = pd.read_csv(out / "summary.csv")
    columns = list(summary.columns)
    assert columns.index("data_wait_s") == columns.index("recompiles") + 1
    assert summary["data_wait_s"].tolist()[:3] == [0.25, 0.75, 0.5]
    assert pd.isna(summary["data_wait_s"].iloc[3]) and summary["data_wait_s"].dtype == float
    # the report: the group's experiment table has it (the median of 3 trials: 0.50),
    # in the row of its experiment; the full summary has the column, every trial's value
    from tests.fixture_records import html_tables

    tables = html_tables((out / "index.html").read_text())
    (group,) = [t for t in tables if "data wait (s)" in t.columns]
    medians = dict(zip(group["experiment"], group["data wait (s)"], strict=True))
    assert medians == {"waits": "0.50", "no-wait": ""}
    (full,) = [t for t in tables if "data_wait_s" in t.columns]
    assert full["data_wait_s"].tolist() == ["0.25", "0.75", "0.5", ""]


TRIAL_OPTION = """        Arg("warm_start", "params.warm_start", default="",
            help="a checkpoint to start from"),
"""


def test_a_trial_option_is_one_declaration(tmp_path):
    """A new trial option is one Arg in the trial's COMMAND (plus the rule's param it
    names): the rule's command line (jobs.run) carries it, the entry point's parser reads
    it, with its help; nothing else changes."""
    wd = copy_workflow(tmp_path / "wf")
    before = snapshot(wd)
    entry = wd / "workflow_scripts/trial/entry.py"
    text = entry.read_text()
    anchor = '        Arg("trial", "wildcards.trial", type=int, default=0),\n'
    assert text.count(anchor) == 1
    entry.write_text(text.replace(anchor, anchor + TRIAL_OPTION))
    assert changed_files(wd, before) == {"workflow_scripts/trial/entry.py"}
    out = python(
        wd,
        "import json\n"
        "from types import SimpleNamespace as NS\n"
        "from workflow_scripts.trial import COMMAND\n"
        "job = ({'env': 'e.json'}, NS(record='r.json'), NS(spec='{}', data_path='', "
        "warm_start='ckpt.pt'), NS(trial=1), ['t.log'])\n"
        "settings = {'containers': {'shm_size': '2g'}, 'noise_retries': 1, "
        "'noise_threshold': 0.8}\n"
        "argv = COMMAND.argv(*job, settings=settings)\n"
        "args = COMMAND.parse(argv)\n"
        "print(json.dumps({'argv': argv, 'warm_start': args.warm_start, 'trial': args.trial,\n"
        "  'help': COMMAND.parser().format_help()}))",
    )
    got = json.loads(out)
    assert "--warm-start=ckpt.pt" in got["argv"] and got["warm_start"] == "ckpt.pt"
    assert got["trial"] == 1 and "a checkpoint to start from" in got["help"]
