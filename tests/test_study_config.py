"""Fast tests of the study's definition: config.yaml's shape (the machine's settings, then
the study by groups, presets that state what they change) and the loader's ``groups``
(no torch, no Snakemake)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import yaml

from tests.conftest import error_of
from workflow_scripts.study import build_schema, load_study
from workflow_scripts.study.config import flat_study, is_sweep, study_runs

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config.yaml"


@pytest.fixture(scope="module")
def shipped() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def studies(config: dict) -> list[tuple[str, dict]]:
    """config.yaml's study and each preset's own one (where a preset gives one)."""
    out = [("config.yaml", config)]
    for name, preset in config["presets"].items():
        if any(key in preset for key in ("groups", "experiments", "sweeps")):
            out.append((f"presets.{name}", preset))
    return out


def specs(config: dict, **kwargs) -> list[dict]:
    return load_study(config, **kwargs).experiments


# ---------------------------------------------------------------------------
# the shipped config


def test_config_yaml_stays_readable():
    """A definition a person reads: the machine's settings first, then the study; the
    whole file well under the 1,040 lines it had when every run restated its group."""
    text = CONFIG.read_text()
    assert len(text.splitlines()) < 700
    top = [line.split(":")[0] for line in text.splitlines() if line and line[0].isalpha()]
    assert top.index("runtime") < top.index("trials") < top.index("defaults")
    assert top.index("defaults") < top.index("groups") < top.index("presets")
    assert "an hour per trial" not in text  # a trial takes minutes; snakemake -n says


def test_the_shipped_studies_are_written_as_groups(shipped):
    """Each group's runs in one place: config.yaml and its presets write their studies
    as groups alone, never a run with a `group:` of its own in experiments or sweeps."""
    for where, section in studies(shipped):
        assert set(section) & {"experiments", "sweeps"} == set(), where
        assert section["groups"], where


def test_a_value_every_run_of_a_group_shares_is_stated_once(shipped):
    """No run restates a value of its group's `shared`, and no field has the same single
    value in every run of a group of several (it belongs in `shared`)."""
    for where, section in studies(shipped):
        for name, group in section["groups"].items():
            shared = group.get("shared", {})
            runs = group["runs"]
            for i, run in enumerate(runs):
                again = {k for k, v in shared.items() if k in run and run[k] == v}
                assert not again, f"{where}.groups.{name}.runs[{i}] restates {again}"
            if len(runs) > 1:
                # (a list is a sweep's own: shared values are single)
                common = set.intersection(
                    *({_key(k, v) for k, v in r.items() if not isinstance(v, list)} for r in runs)
                )
                common -= {_key("name", r.get("name")) for r in runs}
                assert not common, f"{where}.groups.{name}: every run sets {common}"


def _key(field: str, value) -> tuple[str, str]:
    return field, json.dumps(value, sort_keys=True)


def test_no_sweep_exists_only_to_make_an_id(shipped):
    """Every sweep expands to several experiments (or over the CPUs' layouts); a
    one-value list never leads a sweep's lists: a single run states its id, and a
    sweep's leading tag is part of its name. One stays only where its tag sits between
    other swept values' (infer-resnet50-bs1-fp32)."""
    for where, section in studies(shipped):
        for run in study_runs(section, f"{where}."):
            if not run.is_sweep:
                continue
            lists = [v for v in run.fields.values() if isinstance(v, list)]
            assert "layouts" in run.fields or math.prod(map(len, lists)) > 1, run.where
            assert not lists or len(lists[0]) > 1, f"{run.where}: a leading one-value list"


def test_the_groups_expand_to_their_runs_written_out_flat(shipped):
    """The groups give exactly the experiments their runs give written out as plain
    experiments and sweeps (group and shared fields on each), each group's experiments
    together, in the order written."""
    for preset in ("default", "quick"):
        config = {**shipped, "preset": preset}
        section = shipped if preset == "default" else shipped["presets"][preset]
        grouped = specs(config)
        flat = specs(config, cli=flat_study(section))
        assert sorted(grouped, key=lambda s: s["id"]) == sorted(flat, key=lambda s: s["id"])
        order = [key for key, _ in itertools.groupby(s["group"] for s in grouped)]
        assert order == list(section["groups"]), preset  # each group's runs together
        first = {s["group"]: s["id"] for s in reversed(grouped)}
        for name, group in section["groups"].items():
            run = group["runs"][0]  # the group's baseline is its first run's
            assert first[name] == run.get("id") or first[name].startswith(run["name"])


# ---------------------------------------------------------------------------
# groups


def test_a_groups_runs_get_its_name_and_its_shared_values_their_own_win():
    config = {
        "groups": {
            "serve": {
                "shared": {"mode": "inference", "batch_size": 1, "steps": 5},
                "runs": [
                    {"id": "a"},
                    {"id": "b", "batch_size": 4},  # its own value wins
                    {"name": "s", "precision": ["fp32", "bf16"], "steps": [2, 3]},
                ],
            }
        }
    }
    got = {s["id"]: s for s in specs(config)}
    assert list(got) == ["a", "b", "s-fp32-steps2", "s-fp32-steps3", "s-bf16-steps2",
                         "s-bf16-steps3"]  # fmt: skip
    assert {s["group"] for s in got.values()} == {"serve"}
    assert {s["mode"] for s in got.values()} == {"inference"}
    assert [got[i]["batch_size"] for i in ("a", "b", "s-bf16-steps3")] == [1, 4, 1]
    assert [got[i]["steps"] for i in ("a", "s-fp32-steps2", "s-bf16-steps3")] == [5, 2, 3]


def test_a_group_run_is_what_it_would_be_in_experiments_or_sweeps():
    """Byte for byte: a group's run expands as the same run written in experiments or
    sweeps with its group and the shared fields."""
    shared = {"model": "bert-tiny", "seq_len": 32, "lr": 0.001}
    grouped = {
        "groups": {
            "g": {
                "shared": shared,
                "runs": [
                    {"id": "one", "precision": "bf16"},
                    {},  # its id derived from the fields
                    {"name": "sw", "launcher": "torchrun", "layouts": "all"},
                ],
            }
        }
    }
    flat = {
        "experiments": [
            {"id": "one", "group": "g", **shared, "precision": "bf16"},
            {"group": "g", **shared},
        ],
        "sweeps": [
            {"name": "sw", "group": "g", **shared, "launcher": "torchrun", "layouts": "all"}
        ],  # fmt: skip
    }
    assert specs(grouped) == specs(flat)
    assert flat_study(grouped) == flat
    assert specs(grouped)[1]["id"] == "bert-tiny-fp32-bs16-seq32"  # derived


def test_the_study_expands_experiments_then_sweeps_then_the_groups_in_order():
    """Single runs and sweeps of a group in one list: the order written is the order of
    the study (a group's first run is its baseline, a single run or a sweep)."""
    config = {
        "experiments": [{"id": "e"}],
        "sweeps": [{"name": "s", "batch_size": [8, 16]}],
        "groups": {
            "z": {"runs": [{"name": "z", "threads": [1, 2]}, {"id": "z-single"}]},
            "a": {"runs": [{"id": "a-single"}, {"name": "a", "seed": [0, 1]}]},
        },
    }
    assert [s["id"] for s in specs(config)] == [
        "e", "s-bs8", "s-bs16", "z-t1", "z-t2", "z-single", "a-single", "a-seed0", "a-seed1",
    ]  # fmt: skip
    assert [run.where for run in study_runs(config)] == [
        "experiments[0]", "sweeps[0]", "groups.z.runs[0]", "groups.z.runs[1]",
        "groups.a.runs[0]", "groups.a.runs[1]",
    ]  # fmt: skip


def test_a_run_is_a_sweep_with_a_name_layouts_or_a_list():
    assert not is_sweep({"id": "a", "env_vars": {"A": "1"}})
    assert is_sweep({"name": "a", "batch_size": [8]})
    assert is_sweep({"layouts": "all"})
    assert is_sweep({"precision": ["fp32", "bf16"]})
    # a name and no list: a sweep of nothing, refused with what to write instead
    out = error_of({"groups": {"g": {"runs": [{"id": "a"}, {"name": "b", "steps": 2}]}}})
    assert out == (
        "config error at groups.g.runs[1]: a sweep needs at least one field with a list of "
        "values (e.g. batch_size: [8, 32]) or layouts; a single run takes an id, not a name"
    )


def test_errors_name_the_run_the_value_and_what_is_allowed():
    config = {
        "groups": {
            "inference": {
                "shared": {"mode": "inference"},
                "runs": [
                    {"id": "a"},
                    {"name": "b", "batch_size": [1, "two"]},
                    {"id": "c", "batch_size": "big"},
                    {"id": "d", "precision": "fp16"},
                ],
            }
        }
    }
    assert error_of(config).splitlines() == [
        "config error at groups.inference.runs[1].batch_size[1]: 'two' is a string; "
        "allowed: an integer >= 1",
        "config error at groups.inference.runs[2].batch_size: 'big' is a string; allowed: "
        "an integer >= 1",
        "config error at groups.inference.runs[3].precision: 'fp16' is not allowed; "
        "allowed: fp32, bf16, int8",
    ]
    preset = {"preset": "p", "presets": {"p": config}}
    assert "config error at presets.p.groups.inference.runs[2].batch_size: 'big'" in (
        error_of(preset)
    )
    # a combination the checks refuse names the run and its id
    bad = {"groups": {"g": {"shared": {"backend": "eager"}, "runs": [{"compile": "ipex"}]}}}
    assert error_of(bad).startswith("config error at groups.g.runs[0] (id ")


def test_unknown_and_misplaced_keys_are_refused():
    config = {
        "groups": {
            "g": {
                "shared": {"mdoel": "cnn", "id": "x", "group": "h", "precision": ["bf16"]},
                "runs": [{"id": "a", "group": "g"}, {"id": "b", "batch_size": [8, 16]}],
                "experiments": [],
            },
            "empty": {"shared": {}},
        }
    }
    lines = error_of(config).splitlines()
    assert lines[0] == "config error at groups.empty: missing required field 'runs'"
    assert (
        "config error at groups.g.experiments: unknown field 'experiments'; allowed: shared, runs"
    ) in lines
    assert (
        "config error at groups.g.runs[0].group: the runs of a group get its name ('g') as "
        "their group; remove 'group' here"
    ) in lines
    assert (
        "config error at groups.g.runs[1].id: a sweep cannot have an explicit id (all its "
        "experiments would share it); set 'name' instead: ids become <name>-<swept values>"
    ) in lines
    typo = "config error at groups.g.shared.mdoel: unknown field 'mdoel' (did you mean "
    assert any(
        line.startswith(typo + "'model'?); allowed: claim_speedup, backend, ") for line in lines
    )
    assert (
        "config error at groups.g.shared.id: an id names one experiment: set it on each run "
        "(a sweep: its name)"
    ) in lines
    assert (
        "config error at groups.g.shared.group: the runs of a group get its name ('g') as "
        "their group; remove 'group' here"
    ) in lines
    assert (
        'config error at groups.g.shared.precision: ["bf16"] is a list; shared values are '
        "single (a run that sets a list of values is a sweep)"
    ) in lines
    assert error_of({"groups": [{"id": "a"}]}) == (
        'config error at groups: [{"id": "a"}] is a list; allowed: a mapping'
    )
    assert error_of({"groups": {"g": {"runs": "a"}}}) == (
        "config error at groups.g.runs: 'a' is a string; allowed: a list"
    )


def test_duplicate_ids_across_groups_name_both_runs():
    config = {"groups": {"a": {"runs": [{"id": "x"}]}, "b": {"runs": [{"id": "x"}]}}}
    assert error_of(config) == (
        "config error: duplicate experiment id 'x' (groups.a.runs[0] and groups.b.runs[0]); "
        "give one of them an explicit id"
    )


def test_a_groups_sweeps_count_toward_the_limit_before_they_expand():
    config = {
        "limits": {"experiments": 5},
        "groups": {"g": {"runs": [{"id": "a"}, {"name": "s", "seed": list(range(9))}]}},
    }
    assert error_of(config).startswith(
        "config error at limits.experiments: the study asks for 10 experiments (1 listed, "
        "the rest from 1 sweeps), more than the limit of 5"
    )


def test_a_command_line_or_preset_with_a_study_of_its_own_drops_the_configs_groups():
    """experiments and sweeps come each from the first of the command line, the preset
    and config.yaml that gives it (as before groups); groups from the first that gives
    any of the three: `--config experiments=[...] sweeps=[]` runs those alone."""
    config = {
        "experiments": [{"id": "top"}],
        "sweeps": [{"name": "s", "threads": [1, 2]}],
        "groups": {"g": {"runs": [{"id": "from-config"}]}},
        "presets": {
            "mine": {"groups": {"p": {"runs": [{"id": "from-preset"}]}}},
            "nosweep": {"sweeps": []},
            "longer": {"defaults": {"steps": 20}},
        },
    }

    def ids(preset: str = "default", **cli) -> list[str]:
        return [s["id"] for s in specs({**config, "preset": preset}, cli=cli)]

    assert ids() == ["top", "s-t1", "s-t2", "from-config"]
    assert ids("longer") == ["top", "s-t1", "s-t2", "from-config"]  # no study of its own
    assert ids("mine") == ["top", "s-t1", "s-t2", "from-preset"]
    assert ids("nosweep") == ["top"]
    mine = {"experiments": [{"id": "cli"}], "sweeps": []}
    assert ids(**mine) == ids("mine", **mine) == ["cli"]
    assert ids(experiments=[{"id": "cli"}]) == ["cli", "s-t1", "s-t2"]
    assert ids("mine", groups={"c": {"runs": [{"id": "cli"}]}}) == ["top", "s-t1", "s-t2", "cli"]
    # --config groups='{...}' reaches the loader as text
    assert ids(groups="{c: {runs: [{id: text}]}}", experiments="[]", sweeps="[]") == ["text"]
    assert "has no experiments (give experiments, sweeps or groups)" in error_of(
        config, cli={"experiments": [], "sweeps": []}
    )


def test_the_schema_declares_groups_top_level_and_in_presets():
    schema = build_schema()
    assert schema["properties"]["groups"]["additionalProperties"] == {"$ref": "#/$defs/study_group"}
    assert "groups" in schema["$defs"]["preset"]["properties"]
    group = schema["$defs"]["study_group"]
    assert set(group["properties"]) == {"shared", "runs"} and group["required"] == ["runs"]
    shared = schema["$defs"]["group_shared"]["properties"]
    assert "id" not in shared and "group" not in shared and "model" in shared
