"""Bad configurations through the real ``snakemake`` command: every mistake is reported
before any job runs, all at once, with the field path, the value and what is allowed;
nothing is created under results/. Suspicious but legal values get a warning."""

from __future__ import annotations

import os
import re

import pytest

from tests.runs import BUDGET_PART, dry_run, failed, jobs
from workflow_scripts import study

pytestmark = pytest.mark.slow  # a Snakemake dry run each (a few seconds)


def test_every_mistake_at_once(wd):
    study = {
        "trials": 0,
        "groups": {
            "g": {
                "runs": [
                    {"id": "a", "presicion": "bf16"},
                    {"id": "b", "batch_size": "big", "backend": "tpu"},
                    {"id": "c", "compile": "ipex"},
                ]
            }
        },
    }
    out = failed(dry_run(wd, study=study))
    for needle in (
        "config error at trials: 0 is not allowed; allowed: an integer >= 1",
        "groups.g.runs[0].presicion: unknown field 'presicion' (did you mean 'precision'?)",
        "groups.g.runs[1].batch_size: 'big' is a string; allowed: an integer >= 1",
        "groups.g.runs[1].backend: 'tpu' is not allowed; allowed: eager, inductor, ipex, xla",
    ):
        assert needle in out, out[-3000:]
    assert len(out) < 4000  # the messages, not a dump of the schema and the config


def test_a_yaml_syntax_error_names_its_line(wd):
    config = wd / "config.yaml"
    text = config.read_text()
    try:
        config.write_text(text.replace("trials: 2\n", "trials: [2\n", 1))
        out = failed(dry_run(wd))
        assert "config.yaml is not valid YAML at line" in out and "column" in out
    finally:
        config.write_text(text)


def test_whole_number_floats_and_nested_overrides(wd):
    assert jobs(dry_run(wd, "trials=2.0", study={"groups": {"g": {"runs": [{"id": "a"}]}}})) == 2
    # nested values from the command line arrive as strings: read as YAML again
    proc = dry_run(wd, "preset=quick", "defaults={batch_size: 4, steps: 2}")
    config = {**study.read_config(wd / "config.yaml"), "preset": "quick"}
    over = {"defaults": {"batch_size": 4, "steps": 2}}
    n = len(study.load_study(config, cli=over).experiments)  # its layouts: this machine's
    assert n >= 14 and jobs(proc) == n
    # the command line wins over the preset (far_stop null: with it, a trial after the
    # first waits for the first round, whose far runs stop there; no seed sweep here)
    n = len(study.load_study(config).experiments)
    nofar = "defaults={far_stop: null}"
    assert jobs(dry_run(wd, "preset=quick", "trials=3", nofar)) == 3 * n
    assert jobs(dry_run(wd, "preset=quick", "trials=3")) == n  # the first round's
    # ... also where it says what config.yaml says (trials 2), which the preset changes
    assert study.read_config(wd / "config.yaml")["trials"] == 2
    assert jobs(dry_run(wd, "preset=quick", "trials=2", nofar)) == 2 * n
    # ... and a --configfile wins over it as well, under --config
    proc = dry_run(
        wd, "preset=quick", study={"trials": 2, "groups": {"g": {"runs": [{"id": "a"}]}}}
    )
    assert jobs(proc) == 2
    # nested strings the schema takes stay strings: an id of digits, a CPU list
    proc = dry_run(wd, "groups={g: {runs: [{id: '007', cpus: '0', steps: 2}]}}")
    assert jobs(proc) == 2 and "results/records/007/trial1.json" in proc.stdout


@pytest.mark.parametrize(
    "experiment, message",
    [
        ({"threads": 4096}, "experiment x.threads: 4096 is more than the"),
        ({"cpus": "4000-4001"}, "experiment x.cpus: '4000-4001' names CPUs 4000-4001"),
        (
            {"data": "image_folder", "data_dir": "/nonexistent/imgs"},
            "experiment x.data_dir: '/nonexistent/imgs' does not exist here",
        ),
        (
            {"data": "image_folder", "batch_size": 100000},
            "experiment x.batch_size: 100000 is more than the generated folder's",
        ),
        (
            {"env_vars": {"OMP_NUM_THREADS": "7", "KMP_AFFINITY": "compact"}},
            "env_vars.OMP_NUM_THREADS is set by the study itself (use threads)",
        ),
        (
            {"backend": "ipex", "compile": "ipex", "compile_mode": "max-autotune"},
            "compile_mode 'max-autotune' needs compile 'inductor' (compile 'ipex' ignores it)",
        ),
        (
            {"model": "resnet18", "image_size": 32, "batch_size": 1},
            "batch_size 1 with image_size 32",
        ),
        ({"ranks": 2}, "ranks 2 needs launcher 'torchrun' or 'accelerate' (got launcher 'none')"),
        (
            {"max_steps": 2, "warmup_steps": 2},
            "max_steps 2 leaves no timed step after warmup_steps 2",
        ),
        ({"launcher": "accelerate", "nodes": 2}, "nodes 2 needs launcher 'torchrun'"),
        (
            {"launcher": "accelerate", "backend": "xla"},
            "launcher 'accelerate' runs in an environment with Accelerate: backend 'eager' or",
        ),
        ({"accelerate_ipex": True}, "accelerate_ipex true needs launcher 'accelerate'"),
        (
            {"launcher": "accelerate", "accelerate_ipex": True},
            "accelerate_ipex (Accelerate 1.7.0's ipex_config) needs backend 'ipex'",
        ),
        (
            {"launcher": "accelerate", "backend": "ipex", "ranks": 2},
            "ranks 2 with launcher 'accelerate' needs backend 'eager'",
        ),
        (
            {"launcher": "accelerate", "compile": "inductor"},
            "compile 'inductor' with launcher 'accelerate'",
        ),
        (
            {"launcher": "torchrun", "ranks": 2, "batch_size": 7},
            "batch_size 7 (the global batch) does not split evenly over ranks 2",
        ),
        (
            {"launcher": "torchrun", "dist_backend": "ccl", "backend": "ipex"},
            "dist_backend 'ccl' runs in the oneccl environment",
        ),
        (
            {"launcher": "torchrun", "ccl_transport": "tcp"},
            "ccl_transport 'tcp' needs dist_backend 'ccl'",
        ),
        (
            {"launcher": "torchrun", "ranks": 4096, "batch_size": 4096},
            "experiment x.ranks: 4096 ranks x 1 thread(s) need 4096 CPUs",
        ),
    ],
)
def test_problems_known_at_plan_time(wd, experiment, message):
    out = failed(dry_run(wd, study={"groups": {"g": {"runs": [{"id": "x", **experiment}]}}}))
    assert message in out, out[-3000:]


def test_a_missing_interpreter(wd):
    out = failed(
        dry_run(wd, "python=/nonexistent/python3", study={"groups": {"g": {"runs": [{}]}}})
    )
    assert "config error at python: '/nonexistent/python3' does not exist" in out


def test_suspicious_values_warn_and_run(wd):
    """A legal value that probably does not do what the user wants is a warning; a
    memory estimate beyond the machine's is refused unless asked for on purpose."""
    huge = {"groups": {"g": {"runs": [{"id": "huge", "batch_size": 8192}]}}}
    refused = failed(dry_run(wd, study=huge))
    assert "config error at experiment huge.batch_size: batch 8192 of resnet50" in refused
    assert "refused (limits: {over_memory: true} runs it anyway)" in refused
    proc = dry_run(wd, "noise_threshold=1.0", "limits={over_memory: true}", study=huge)
    assert jobs(proc) == 2
    assert "config warning at noise_threshold: 1 reruns" in proc.stderr
    assert "config warning at experiment huge.batch_size: batch 8192 of resnet50" in proc.stderr
    assert os.path.exists(wd / "config.yaml")


def test_a_dry_run_prints_the_studys_expected_time(wd):
    """Before anything runs, the expected wall time on this machine, once, per group."""
    proc = dry_run(
        wd,
        study={
            "trials": 3,
            "groups": {
                "ladder": {"runs": [{"id": "small", "model": "cnn", "image_size": 32}]},
                "models": {"runs": [{"id": "big", "model": "resnet18", "image_size": 64}]},
            },
        },
    )
    assert jobs(proc) == 6
    lines = [line for line in proc.stderr.splitlines() if line.startswith("[estimate]")]
    assert len([x for x in lines if "this study will take about" in x]) == 1, proc.stderr
    assert "of trials (6 trials: 3 per experiment)" in lines[0]
    assert any("ladder:" in x and "(3 trials)" in x for x in lines)
    assert any("models:" in x and "(3 trials)" in x for x in lines)
    # no calibration yet: a quick measurement and the CPU's flags
    assert "basis: quick measurement (fp32 matmul) and CPU flags" in lines[-1]


def test_a_budget_caps_the_adaptive_rounds_and_says_what_it_buys(wd):
    """--config budget=...: the rounds that fit in it, in the worst case, and the
    precision they buy, before anything runs; a budget below the minimum says so."""
    part = {
        "trials": 2,
        "max_trials": 5,
        "defaults": {"far_stop": None},  # (far from "small", "bf16" would run 1 trial)
        "groups": {
            "g": {
                "runs": [
                    {"id": "small", "model": "cnn", "image_size": 32},
                    {"id": "bf16", "model": "cnn", "image_size": 32, "precision": "bf16"},
                ]
            }
        },
    }
    roomy = dry_run(wd, "budget=10000h", study=part)
    assert jobs(roomy) == 4, roomy.stderr[-2000:]  # the rounds every experiment runs
    lines = [x for x in roomy.stderr.splitlines() if x.startswith("[budget]")]
    assert lines[0].startswith("[budget] 10000h: 2 to 5 trials per experiment fit"), lines
    assert "with 2 trials each a comparison's 95 % interval is about ±" in lines[1], lines
    assert "assumed: no run measured one yet" in lines[1]
    assert lines[2].startswith("[budget] at most: with 5 trials each")
    tight = dry_run(wd, "budget=1s", study=part)
    assert jobs(tight) == 4
    assert "[budget] 1s does not cover the 2 trials every experiment runs" in tight.stderr
    for bad in ("1 hour", "-1h", "2d"):
        out = failed(dry_run(wd, f"budget={bad}", study=part))
        assert "config error at budget" in out, out[-2000:]


def test_a_budget_below_the_minimum_runs_the_question_first_and_says_what_it_leaves_out(wd):
    """A budget that does not cover every experiment's minimum trials keeps the study's
    order (the question first: plan/order.py) as far as the estimate fits, and says
    which experiments it leaves out, by group, before anything runs."""
    part = BUDGET_PART
    tight = dry_run(wd, "budget=1s", study=part)
    assert jobs(tight) == 6  # 2 trials of the question's 3: base, bf16, o-base
    planned = re.findall(r"experiment=([\w-]+), trial=\d", tight.stdout)
    assert sorted(set(planned)) == ["base", "bf16", "o-base"]
    said = [x for x in tight.stderr.splitlines() if x.startswith("[budget]")]
    assert "runs the first 3 of its 6 experiments in its order, the question first" in said[0]
    assert said[0].endswith("leaves out 3: other (3)"), said
    assert said[1].startswith("[budget] what it runs: about ")
    # the question alone is past a second: the clock, not the plan, holds the study to it
    assert said[2].startswith("[budget] that is more than 1s (the question alone, "), said
    assert "a trial that would end past its deadline (" in said[2]
    roomy = dry_run(wd, "budget=10000h", study=part)
    assert jobs(roomy) == 12 and "leaves out" not in roomy.stderr
