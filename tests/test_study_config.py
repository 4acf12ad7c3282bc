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
from workflow_scripts.study.config import is_block, is_sweep, study_runs

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config.yaml"


@pytest.fixture(scope="module")
def shipped() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def studies(config: dict) -> list[tuple[str, dict]]:
    """config.yaml's study and each preset's own one (where a preset gives one)."""
    out = [("config.yaml", config)]
    for name, preset in config["presets"].items():
        if "groups" in preset:
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
    """Each group's runs in one place: config.yaml and each preset with a study of its
    own write it as groups, the only way there is."""
    for where, section in studies(shipped):
        assert section["groups"], where


def test_a_value_every_run_of_a_group_shares_is_stated_once(shipped):
    """No run restates a value of its group's (or its block's) `shared`, and no field has
    the same single value in every run of a group or block of several (it belongs in
    `shared`); a block's runs share something beyond the group's."""
    for where, section in studies(shipped):
        for name, group in section["groups"].items():
            _stated_once(f"{where}.groups.{name}", group.get("shared", {}), group["runs"])
            for i, block in enumerate(group["runs"]):
                if is_block(block):
                    at, inner = f"{where}.groups.{name}.runs[{i}]", block.get("shared", {})
                    assert set(inner) - set(group.get("shared", {})), f"{at} shares nothing more"
                    _stated_once(at, {**group.get("shared", {}), **inner}, block["runs"])


def _stated_once(where: str, shared: dict, runs: list[dict]) -> None:
    for i, run in enumerate(runs):
        again = {k for k, v in shared.items() if k in run and run[k] == v}
        assert not again, f"{where}.runs[{i}] restates {again}"
    runs = [r for r in runs if not is_block(r)]
    if len(runs) > 1:
        # (a list is a sweep's own: shared values are single)
        common = set.intersection(
            *({_key(k, v) for k, v in r.items() if not isinstance(v, list)} for r in runs)
        )
        common -= {_key("name", r.get("name")) for r in runs}
        assert not common, f"{where}: every run sets {common}"


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


def test_the_groups_expand_in_the_order_written(shipped):
    """Each group's experiments together, the groups in the order written, each group's
    baseline its first run's."""
    for preset in ("default", "quick"):
        section = shipped if preset == "default" else shipped["presets"][preset]
        grouped = specs({**shipped, "preset": preset})
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


def test_a_block_of_runs_shares_more_values_in_its_place():
    """A block (an entry of a group's runs with runs of its own) gives its runs its shared
    values over the group's (a run's own still win), in the block's place, in its group;
    errors name the run's path inside the block."""
    config = {
        "groups": {
            "serve": {
                "shared": {"mode": "inference", "steps": 5},
                "runs": [
                    {"id": "a"},
                    {"shared": {"batch_size": 1, "steps": 9},
                     "runs": [{"id": "b"}, {"id": "c", "steps": 3},
                              {"name": "s", "precision": ["fp32", "bf16"]}]},
                    {"id": "d"},
                ],
            }
        }
    }  # fmt: skip
    got = {s["id"]: s for s in specs(config)}
    assert list(got) == ["a", "b", "c", "s-fp32", "s-bf16", "d"]
    assert {s["group"] for s in got.values()} == {"serve"}
    assert {s["mode"] for s in got.values()} == {"inference"}
    assert [got[i]["steps"] for i in got] == [5, 9, 3, 9, 9, 5]
    assert [got[i]["batch_size"] for i in got] == [16, 1, 1, 1, 1, 16]
    assert [run.where for run in study_runs(config)] == [
        "groups.serve.runs[0]", "groups.serve.runs[1].runs[0]", "groups.serve.runs[1].runs[1]",
        "groups.serve.runs[1].runs[2]", "groups.serve.runs[2]",
    ]  # fmt: skip
    bad = {"groups": {"g": {"runs": [
        {"shared": {"group": "h", "id": "x", "bach_size": 1}, "runs": [
            {"id": "a", "group": "g", "precision": "fp16"}, {"runs": []}]},
    ]}}}  # fmt: skip
    lines = error_of(bad).splitlines()
    assert "config error at groups.g.runs[0].runs[0].precision: 'fp16' is not allowed" in (
        "\n".join(lines)
    )
    for line in (
        "config error at groups.g.runs[0].shared.group: the runs of a group get its name "
        "('g') as their group; remove 'group' here",
        "config error at groups.g.runs[0].shared.id: an id names one experiment: set it on "
        "each run (a sweep: its name)",
        "config error at groups.g.runs[0].runs[0].group: the runs of a group get its name "
        "('g') as their group; remove 'group' here",
    ):
        assert line in lines, lines
    assert any(
        x.startswith(
            "config error at groups.g.runs[0].shared.bach_size: unknown "
            "field 'bach_size' (did you mean 'batch_size'?)"
        )
        for x in lines
    )
    # one level: a block inside a block is refused
    assert any(x.startswith("config error at groups.g.runs[0].runs[1].runs: unknown field")
               for x in lines), lines  # fmt: skip


def test_a_groups_shared_fields_are_what_each_run_would_state_itself():
    """Byte for byte: a group's shared fields give each run what the run would give
    stating them itself."""
    shared = {"model": "bert-tiny", "seq_len": 32, "lr": 0.001}
    runs = [
        {"id": "one", "precision": "bf16"},
        {},  # its id derived from the fields
        {"name": "sw", "launcher": "torchrun", "layouts": "all"},
    ]
    grouped = {"groups": {"g": {"shared": shared, "runs": runs}}}
    stated = {"groups": {"g": {"runs": [{**shared, **run} for run in runs]}}}
    assert specs(grouped) == specs(stated)
    assert specs(grouped)[1]["id"] == "bert-tiny-fp32-bs16-seq32"  # derived


def test_the_study_expands_the_groups_in_order():
    """Single runs and sweeps of a group in one list: the order written is the order of
    the study (a group's first run is its baseline, a single run or a sweep)."""
    config = {
        "groups": {
            "z": {"runs": [{"name": "z", "threads": [1, 2]}, {"id": "z-single"}]},
            "a": {"runs": [{"id": "a-single"}, {"name": "a", "seed": [0, 1]}]},
        },
    }
    assert [s["id"] for s in specs(config)] == [
        "z-t1", "z-t2", "z-single", "a-single", "a-seed0", "a-seed1",
    ]  # fmt: skip
    assert [run.where for run in study_runs(config)] == [
        "groups.z.runs[0]", "groups.z.runs[1]", "groups.a.runs[0]", "groups.a.runs[1]",
    ]  # fmt: skip


def test_a_study_written_before_groups_is_refused_saying_how_to_write_it():
    """Top-level (or a preset's) experiments and sweeps are no longer read: one line
    each, naming where, what to write instead, and every other error beside them."""
    msg = error_of({"experiments": [{"id": "a"}], "sweeps": [], "trials": 0})
    lines = msg.splitlines()
    for key in ("experiments", "sweeps"):
        (line,) = [x for x in lines if x.startswith(f"config error at {key}:")]
        assert "a study is written as groups: groups: {<name>: {runs: [...]}}" in line
    assert any(x.startswith("config error at trials:") for x in lines)
    msg = error_of({"groups": {"g": {"runs": [{}]}}, "presets": {"p": {"sweeps": []}}})
    assert msg.startswith("config error at presets.p.sweeps: a study is written as groups")


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
    """The groups come from the first of the command line, the preset and config.yaml
    that gives them: `--config groups=...` (or a --configfile's) runs those alone."""
    config = {
        "groups": {"g": {"runs": [{"id": "top"}, {"name": "s", "threads": [1, 2]}]}},
        "presets": {
            "mine": {"groups": {"p": {"runs": [{"id": "from-preset"}]}}},
            "longer": {"defaults": {"steps": 20}},
        },
    }

    def ids(preset: str = "default", **cli) -> list[str]:
        return [s["id"] for s in specs({**config, "preset": preset}, cli=cli)]

    assert ids() == ["top", "s-t1", "s-t2"]
    assert ids("longer") == ["top", "s-t1", "s-t2"]  # no study of its own
    assert ids("mine") == ["from-preset"]
    mine = {"groups": {"c": {"runs": [{"id": "cli"}]}}}
    assert ids(**mine) == ids("mine", **mine) == ["cli"]
    # --config groups='{...}' reaches the loader as text
    assert ids(groups="{c: {runs: [{id: text}]}}") == ["text"]
    assert "has no experiments (give groups: {name: {runs: [...]}})" in error_of(
        config, cli={"groups": {}}
    )


def test_the_schema_declares_groups_top_level_and_in_presets():
    schema = build_schema()
    assert schema["properties"]["groups"]["additionalProperties"] == {"$ref": "#/$defs/study_group"}
    assert "groups" in schema["$defs"]["preset"]["properties"]
    group = schema["$defs"]["study_group"]
    assert set(group["properties"]) == {"shared", "runs"} and group["required"] == ["runs"]
    shared = schema["$defs"]["group_shared"]["properties"]
    assert "id" not in shared and "group" not in shared and "model" in shared
