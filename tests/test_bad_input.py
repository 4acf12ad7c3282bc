"""Bad input, second round, through the real ``snakemake -n`` (under a 4 GiB address
space limit, timed): every number finite and in its range, only plain values, a
duplicate key named with both lines, a templated file refused, folders that are folders,
one message per cause, the file bounded before it is parsed (the check command), and a
study whose trials could never finish refused; each a clean refusal (non-zero exit, no
traceback, at most 40 lines, within seconds, nothing written), and unusual but valid
values still planned."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.runs import REFUSE_WITHIN_S, failed, limited_dry_run
from workflow_scripts.study.causes import MOST_LINES, one_per_cause

pytestmark = pytest.mark.slow  # a Snakemake dry run each (a few seconds)


def refused(proc, took: float) -> str:
    """The output of a clean refusal: non-zero, no traceback, a screenful, in seconds."""
    out = failed(proc)
    errors = [line for line in out.splitlines() if line.startswith("config error")]
    assert errors and len(errors) <= MOST_LINES, out[-3000:]
    assert len(out.splitlines()) <= MOST_LINES + 10, out[-3000:]
    assert took < REFUSE_WITHIN_S, took
    return out


def configfile(wd, text: str, name: str = "case.yaml") -> list[str]:
    (wd / name).write_text(text)
    return ["--configfile", name]


# ------------------------------------------------------------------ every number finite


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("margin=.nan", "config error at margin: nan is not a finite number"),
        ("noise_threshold=.inf", "config error at noise_threshold: inf is not a finite number"),
        (
            "defaults={step_precision: .nan, far_stop: -.inf}",
            "config error at defaults.far_stop: -inf is not a finite number",
        ),
        (
            "defaults={time_budget_s: .inf}",
            "config error at defaults.time_budget_s: inf is not a finite number",
        ),
        ("budget=0h", "config error at budget: '0h' is no time; allowed: a positive duration"),
        ("budget=0.000s", "config error at budget: '0.000s' is no time"),
    ],
)
def test_a_number_that_is_not_finite_or_no_time_is_refused(wd, override, expected):
    out = refused(*limited_dry_run(wd, override))
    assert expected in out, out[-2000:]


def test_a_json_configfile_with_nan_is_refused(wd):
    """(Python's JSON reader, Snakemake's first try, takes NaN and Infinity.)"""
    args = configfile(wd, json.dumps({"margin": float("nan")}), "case.json")
    out = refused(*limited_dry_run(wd, *args))
    assert "config error at margin: nan is not a finite number" in out, out[-2000:]


def test_trials_that_could_never_finish_are_refused_with_the_reason(wd):
    endless = "defaults={steps: 100000000, time_budget_s: null, step_precision: null}"
    out = refused(*limited_dry_run(wd, endless))
    line = next(x for x in out.splitlines() if x.startswith("config error"))
    assert "100000000 steps take more than 4x timeout_s" in line, out[-2000:]
    assert "every trial would be killed before it records" in line


# ------------------------------------------------------------------ only plain values


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("report: {name: 2026-01-01}\n", 'report.name: a date ("2026-01-01") is not a plain'),
        ("groups: !!set {a, b}\n", "config error at groups: a set"),
        ("python: !!binary aGVsbG8=\n", "config error at python: binary data"),
        ("prices: [{name: x, usd_per_hour: 1, 2026-01-01: x}]\n", "is not text; a key is text"),
    ],
)
def test_a_value_that_is_not_plain_data_is_refused_with_its_path(wd, text, expected):
    out = refused(*limited_dry_run(wd, *configfile(wd, text)))
    assert expected in out, out[-2000:]


def test_a_key_given_twice_is_refused_with_both_lines(wd):
    text = "trials: 2\nmargin: 0.05\n# the file's owner changed it\ntrials: 5\n"
    out = refused(*limited_dry_run(wd, *configfile(wd, text)))
    assert "case.yaml sets 'trials' twice in one mapping, at line 1 and line 4" in out, out
    # and in config.yaml itself
    original = (wd / "config.yaml").read_text()
    try:
        (wd / "config.yaml").write_text(original + "\nmargin: 0.2\n")
        out = refused(*limited_dry_run(wd))
    finally:
        (wd / "config.yaml").write_text(original)
    assert "config.yaml sets 'margin' twice in one mapping" in out, out[-2000:]


def test_a_templated_configfile_is_refused_and_said_to_have_run(wd):
    text = "__use_yte__: true\ntrials: ?1+1\n"
    out = refused(*limited_dry_run(wd, *configfile(wd, text)))
    assert "uses Snakemake's YAML templating (__use_yte__), which ran its Python" in out, out


def test_a_look_alike_letter_is_shown_as_an_escape(wd):
    text = 'groups: {x: {runs: [{id: "b\u0430seline"}]}}\n'
    out = refused(*limited_dry_run(wd, *configfile(wd, text)))
    assert "'b\\u0430seline' is not allowed" in out, out[-2000:]


# ------------------------------------------------------------------ folders


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("envs_root=/dev/zero", "envs_root: '/dev/zero' is a character device"),
        ("envs_root=/proc/self", "envs_root: '/proc/self' is on the kernel's proc filesystem"),
        (
            "containers={wheelhouse: /sys/kernel/wheels}",
            "containers.wheelhouse: '/sys/kernel/wheels' would be on the kernel's sysfs",
        ),
        ("containers={archive: /dev/null}", "containers.archive: '/dev/null' is a character"),
        (
            "report={machines: [{name: x, results: /dev/zero}]}",
            "report.machines[0].results: '/dev/zero' is a character device",
        ),
        (
            "report={machines: [{name: x, results: /proc}]}",
            "report.machines[0].results: '/proc' is on the kernel's proc filesystem",
        ),
        (
            "groups={g: {runs: [{id: a, data: image_folder, data_dir: /proc/self}]}}",
            "experiment a.data_dir: '/proc/self' is on the kernel's proc filesystem",
        ),
    ],
)
def test_a_folder_setting_that_is_no_folder_of_data_is_refused(wd, override, expected):
    out = refused(*limited_dry_run(wd, override))
    assert f"config error at {expected}" in out, out[-2000:]


def test_a_folder_setting_that_can_be_made_is_planned(wd, tmp_path):
    proc, _ = limited_dry_run(
        wd, f"envs_root={tmp_path}/new/envs", f"containers={{archive: {tmp_path}/archive}}"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


# ------------------------------------------------------------------ one message per cause


def test_a_default_wrong_for_every_experiment_is_one_line(wd):
    out = refused(*limited_dry_run(wd, 'defaults={cpus: "0-99999999999", num_workers: 100000}'))
    errors = [line for line in out.splitlines() if line.startswith("config error")]
    assert len(errors) == 2, out
    cpus = next(line for line in errors if "cpus" in line)
    assert cpus.startswith("config error at defaults.cpus: cpus '0-99999999999' is not a CPU")
    assert cpus.endswith("experiments)") and "(all " in cpus
    workers = next(line for line in errors if "num_workers" in line)
    assert workers.startswith("config error at defaults.num_workers:") and " more)" in workers


def test_many_causes_fit_a_screen():
    lines = [f"config error at experiment e{i}.batch_size: {i} is too big" for i in range(100)]
    out = one_per_cause(lines, [f"e{i}" for i in range(100)], {"batch_size"}, 100)
    assert len(out) == MOST_LINES and out[-1] == "config error: and 61 more like those above"


def test_one_cause_of_several_experiments_names_them():
    lines = [f"config error at groups.g.runs[{i}] (id r{i}): cpus '9' is outside" for i in range(7)]
    lines.append("config error at margin: 2 is not allowed")
    out = one_per_cause(lines, [f"r{i}" for i in range(9)], set(), 9)
    assert out == [
        "config error at cpus: cpus '9' is outside (7 experiments: r0, r1, r2, r3, r4 and 2 more)",
        "config error at margin: 2 is not allowed",
    ]


# ------------------------------------------------------------------ the file itself


def check(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [sys.executable, "-m", "workflow_scripts.study", *args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return proc, time.monotonic() - t0


def test_the_check_command_refuses_a_hostile_file_in_seconds_with_one_line(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("margin: " + "[" * 5000 + "]" * 5000 + "\n")
    big = tmp_path / "big.yaml"
    big.write_text("# padding\n" * 200_000 + "trials: 2\n")
    indented = tmp_path / "indented.yaml"
    indented.write_text("a:\n" + "".join(" " * (2 * i) + f"k{i}:\n" for i in range(1, 300)))
    for path, expected in (
        (deep, "deep.yaml nests deeper than 32 levels (line 1): refused before reading it"),
        (big, "big.yaml is 1.9 MiB, more than a config's 1 MiB: refused before reading it"),
        (indented, "indented.yaml nests deeper than 32 levels"),
    ):
        proc, took = check("--check", str(path))
        assert proc.returncode == 1 and took < 20, (proc.stderr, took)
        assert proc.stderr.strip().count("\n") == 0 and expected in proc.stderr, proc.stderr
    # a plain file passes and prints the study it gives (as snakemake would load it)
    fine = tmp_path / "fine.yaml"
    fine.write_text("trials: 3\nreport: {name: 'markup <b>shown as text</b>'}\n")
    proc, _ = check("--check", str(fine), "--set", "preset=quick")
    assert proc.returncode == 0 and "trials 3" in proc.stdout, proc.stderr


def test_unusual_but_valid_values_are_planned(wd):
    text = (
        "report: {name: 'CPU <b>study</b> & \"co\" (2026-01-01)'}\n"
        "margin: 1.0e-1\nbudget: 90min\nnoise_threshold: 0.5\n"
    )
    proc, took = limited_dry_run(wd, *configfile(wd, text))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert took < REFUSE_WITHIN_S
