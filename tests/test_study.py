"""Fast tests of the study configuration loader (no torch, no Snakemake)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import error_of

# the repository root, for a pytest run without the project's pythonpath setting
from workflow_scripts import launchers, workloads
from workflow_scripts.study import (
    BUILTIN_DEFAULTS,
    FIELD_NAMES,
    StudyConfigError,
    build_schema,
    load_study,
    main,
    parse_cpus,
    read_config,
)
from workflow_scripts.sysinfo import allowed_cpus

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config.yaml"
SPEC_KEYS = set(FIELD_NAMES) | {"env", "preset"}


def machine_splits(batch: int) -> list[tuple[int, int]]:
    """``layouts: all`` on this machine: (ranks, threads) over all its CPUs, ranks
    dividing the global batch."""
    n = len(allowed_cpus())
    return [(r, n // r) for r in range(1, n + 1) if n % r == 0 and batch % r == 0]


@pytest.fixture(scope="module")
def shipped() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def ids(config: dict) -> list[str]:
    return [spec["id"] for spec in load_study(config).experiments]


# ---------------------------------------------------------------------------
# the shipped config


@pytest.mark.parametrize("preset", ["default", "quick", "paper"])
def test_shipped_config_loads(shipped, preset):
    study = load_study({**shipped, "preset": preset}, base_dir=ROOT)
    assert study.experiments
    assert len(study.by_id) == len(study.experiments)  # ids unique
    for spec in study.experiments:
        assert set(spec) == SPEC_KEYS
        assert spec["preset"] == preset
    assert study.settings["preset"] == preset
    assert set(study.settings) >= {
        "preset",
        "runtime",
        "trials",
        "envs_root",
        "installer",
        "python",
        "prices",
        "image_folder",
        "noise_threshold",
        "noise_retries",
        "margin",
        "collectives",
    }
    assert study.envs == sorted({s["env"] for s in study.experiments})


def test_shipped_default_study(shipped):
    study = load_study(shipped)
    ladder = [s["id"] for s in study.experiments if s["group"] == "ladder"]
    assert ladder == [
        "baseline",
        "bf16",
        "bf16-cl",
        "inductor-fp32",
        "inductor-bf16-cl",
        "runcpu-tcmalloc",
        "runcpu-jemalloc",
        "ipex-baseline",
        "ipex-optimize-fp32",
        "ipex-optimize-bf16-cl",
        "ipex-compile-bf16",
        "xla-fp32",
    ]
    claims = {s["id"]: s["claim_speedup"] for s in study.experiments if s["claim_speedup"]}
    assert claims == {
        "bf16": 2.67,
        "bf16-cl": 4.16,
        "inductor-fp32": 1.27,
        "runcpu-tcmalloc": 4.28,
        "ipex-optimize-bf16-cl": 4.46,
    }
    # every ranks x threads split of this machine's CPUs that shares the batch evenly
    splits = machine_splits(16)
    multi = [f"r{r}-t{t}" for r, t in splits if r > 1]
    assert study.ids[len(ladder) :] == [
        "image-folder-nw1",
        *(f"bert-base{x}" for x in ("", "-bf16", "-inductor", "-ipex-optimize-fp32")),
        "bert-base-ipex-optimize-bf16",
        "bert-base-ipex-compile",
        "bert-base-ipex-compile-eager-attn",
        "bert-base-xla",
        "gpt2",
        "gpt2-bf16",
        "bert-base-dynamic",
        "bert-base-inductor-dynamic",
        *(f"bert-base-accelerate{x}" for x in ("", "-bf16", "-legacy", "-legacy-ipex")),
        "bert-base-accelerate-legacy-ipex-bf16",
        *(
            f"serve-{d}-{x}"
            for d in ("digits", "keywords")
            for x in ("fp32", "int8-inductor", "int8-ipex")
        ),
        "batch-bs8",
        "batch-bs16",
        "batch-bs32",
        "workers-nw0",
        "workers-nw1",
        "workers-nw2",
        "threads-t1",
        "threads-t2",
        *(
            f"infer-{m}-bs{b}-{p}"
            for b in (1, 16)
            for m in ("resnet50", "bert-base")
            for p in ("fp32", "bf16")
        ),
        *(f"infer-{kind}-{m}" for kind in ("compiled", "ipex") for m in ("resnet50", "bert-base")),
        # the serving rungs: batch 1 (with max-autotune), then batch 16
        *(
            x
            for b in (1, 16)
            for m in ("resnet50", "bert-base")
            for x in (
                *(f"{r}-{m}-bs{b}-{p}" for r in ("frozen", "ipex-jit") for p in ("fp32", "bf16")),
                *(f"int8-{stack}-{m}-bs{b}" for stack in ("inductor", "ipex")),
                *((f"autotune-{m}-fp32", f"autotune-{m}-bf16") if b == 1 else ()),
            )
        ),
        "int8-inductor-gpt2-bs1",
        "int8-ipex-gpt2-bs1",
        "infer-gpt2-bs1",
        *(
            f"bert-opt-{o}-opt{i}"
            for o in ("adamw", "sgd")
            for i in ("default", "foreach", "fused")
        ),
        "bert-opt-ipex-adamw",
        "bert-opt-ipex-sgd",
        *(f"ddp-{pg}-r{r}-t{t}" for pg in ("gloo", "ccl") for r, t in machine_splits(16)),
        *(f"ddp-ccl-tcp-{x}" for x in multi),
        *(f"ddp-ccl-cclworker-{x}" for x in multi),
        *(f"ddp-ccl-commcpu-r{r}-t{t}" for r, t in splits if r > 1 and t > 1),
        *(f"bert-seq-seq{n}" for n in (64, 128, 256, 512)),
        "bert-batch-bs8",
        "bert-batch-bs32",
        *(
            f"bert-ddp-{launcher}-{pg}-{x}"
            for launcher in ("torchrun", "accelerate")
            for pg in ("gloo", "ccl")
            for x in multi
        ),
        *(
            f"acc-{pg}-{p}-seed{seed}-r{r}-t{t}"
            for pg in ("gloo", "ccl")
            for p in ("fp32", "bf16")
            for seed in (0, 1, 2)
            for r, t in machine_splits(32)
        ),
        *(
            f"acc-weak-{pg}-seed{seed}-r{r}-t{t}"
            for pg in ("gloo", "ccl")
            for seed in (0, 1, 2)
            for r, t in machine_splits(16)
        ),
        *(
            f"acc-text-{launcher}-{p}-seed{seed}"
            for launcher in ("nolauncher", "accelerate")
            for p in ("fp32", "bf16")
            for seed in (0, 1, 2)
        ),
    ]
    # batch-1 inference times 100 steps: enough for a p99 latency
    infer = {s["id"]: s for s in study.experiments if s["group"] == "inference"}
    assert all(s["steps"] == (100 if s["batch_size"] == 1 else 4) for s in infer.values())
    assert study.envs == ["ipex", "oneccl", "upstream", "xla"]
    # the transformers at the Accelerate example's and GPT-2 fine-tuning's shapes
    text = {s["id"]: s for s in study.experiments if s["group"] == "transformers"}
    assert {(s["model"], s["seq_len"], s["batch_size"]) for s in text.values()} == {
        ("bert-base", 128, 16),
        ("gpt2", 256, 8),
    }
    assert all(s["image_size"] is None for s in text.values())
    # ... trained as Hugging Face's examples train: AdamW, the linear schedule with warm-up
    assert {(s["optimizer"], s["lr"], s["lr_schedule"], s["lr_warmup_steps"])
            for s in text.values()} == {("adamw", 2e-5, "linear", 100)}  # fmt: skip
    assert {s["attention"] for s in text.values()} == {"sdpa", "eager"}
    assert {s["padding"] for s in text.values()} == {"fixed", "dynamic"}
    # Accelerate at the plain loop's settings: current (upstream), legacy 1.7.0 +- IPEX
    accelerate = {(s["backend"], s["env"], s["accelerate_ipex"], s["precision"])
                  for s in text.values() if s["launcher"] == "accelerate"}  # fmt: skip
    assert accelerate == {
        ("eager", "upstream", False, "fp32"),
        ("eager", "upstream", False, "bf16"),
        ("ipex", "ipex", False, "fp32"),
        ("ipex", "ipex", True, "fp32"),
        ("ipex", "ipex", True, "bf16"),
    }
    bert_ddp = [s for s in study.experiments if s["group"] == "transformers-ddp"]
    assert {s["env"] for s in bert_ddp if s["launcher"] == "accelerate"} == {"oneccl"}
    ddp = [s for s in study.experiments if s["group"] == "ddp"]
    assert {s["launcher"] for s in ddp} == {"torchrun"}
    assert {s["env"] for s in ddp if s["dist_backend"] == "ccl"} == {"oneccl"}
    assert all(s["ranks"] * s["threads"] == len(allowed_cpus()) for s in ddp)
    acc = [s for s in study.experiments if s["group"] == "accuracy"]
    assert {(s["data"], s["epochs"], s["time_budget_s"], s["model"]) for s in acc} == {
        ("digits", 10, None, "cnn")
    }
    assert study.settings["collectives"]["variants"] == ["gloo", "ccl-shm", "ccl-tcp",
                                                         "ccl-shm-offload"]  # fmt: skip
    assert study.settings["collectives"]["sizes_kb"][0] == 1
    assert study.settings["collectives"]["sizes_kb"][-1] == 100 * 1024
    assert {s["time_budget_s"] for s in study.experiments if not s["epochs"]} == {120}
    assert study.by_id["batch-bs32"]["precision"] == "fp32"  # input sweeps on the baseline
    assert study.by_id["ipex-compile-bf16"]["compile"] == "ipex"
    assert study.by_id["inductor-fp32"]["compile"] == "inductor"
    assert study.by_id["baseline"]["compile"] == "none"
    assert [p["usd_per_hour"] for p in study.settings["prices"]] == [0.1027, 0.357]
    assert study.settings["image_folder"] == {"images_per_class": 32, "classes": 10, "size": 256}
    assert study.settings["trials"] == 2


def test_shipped_quick_preset(shipped):
    study = load_study({**shipped, "preset": "quick"})
    assert {s["backend"] for s in study.experiments} == {"eager", "inductor", "ipex", "xla"}
    assert study.settings["trials"] == 1
    assert study.settings["image_folder"] == {"images_per_class": 4, "classes": 3, "size": 48}
    assert study.by_id["baseline"]["model"] == "cnn"
    assert study.by_id["resnet18"]["image_size"] == 64
    assert study.by_id["folder"]["group"] == "data"
    splits = [f"r{r}-t{t}" for r, t in machine_splits(8)]
    assert [s["id"] for s in study.experiments if s["group"] == "ddp"] == [
        *(f"ddp-gloo-{x}" for x in splits),
        *(f"ddp-ccl-{x}" for x in splits),
    ]
    acc = [s["id"] for s in study.experiments if s["group"] == "accuracy"]
    multi = [f"acc-bf16-r{r}-t{t}" for r, t in machine_splits(32) if r > 1]
    assert acc == [
        *(f"acc-{pg}-r{r}-t{t}" for pg in ("gloo", "ccl") for r, t in machine_splits(32)),
        *multi,
    ]
    assert study.settings["collectives"]["variants"] == ["gloo", "ccl-shm"]
    assert study.settings["collectives"]["ranks"] == "all"  # the top level's, kept
    weak = {s["id"]: (s["batch_size"], s["lr"]) for s in study.experiments
            if s["group"] == "accuracy-weak"}  # fmt: skip
    assert weak == {f"acc-weak-r{r}-t{t}": (16 * r, pytest.approx(0.01 * r))
                    for r, t in machine_splits(16)}  # fmt: skip
    # every launcher, and Accelerate's three paths: one process, mpirun ranks over both
    # process groups, the legacy ipex_config
    assert {s["launcher"] for s in study.experiments} == set(launchers.names())
    accelerate = {(s["ranks"], s["dist_backend"], s["backend"], s["accelerate_ipex"])
                  for s in study.experiments if s["launcher"] == "accelerate"}  # fmt: skip
    assert accelerate == {
        (1, "gloo", "eager", False),
        (2, "gloo", "eager", False),
        (2, "ccl", "eager", False),
        (1, "gloo", "ipex", True),
    }
    assert all(s["timeout_s"] == 600 for s in study.experiments)


def test_shipped_paper_preset_inherits_experiments(shipped):
    default = load_study(shipped)
    paper = load_study({**shipped, "preset": "paper"})
    assert paper.ids == default.ids
    assert paper.by_id["baseline"]["batch_size"] == 128
    assert paper.by_id["baseline"]["steps"] == 90
    assert paper.by_id["baseline"]["data"] == "per_sample"
    assert paper.by_id["image-folder-nw1"]["data"] == "image_folder"  # explicit wins
    assert paper.by_id["batch-bs8"]["batch_size"] == 8


def test_schema_lists_every_field():
    schema = build_schema()
    single = set(schema["$defs"]["group_experiment"]["properties"])
    assert single == set(FIELD_NAMES) - {"group"}  # a run's group is its group's name
    sweep = set(schema["$defs"]["group_sweep"]["properties"])
    assert sweep == (set(FIELD_NAMES) - {"id", "group"}) | {"name", "layouts"}
    assert set(schema["$defs"]["defaults"]["properties"]) == set(FIELD_NAMES) - {
        "id",
        "group",
        "claim_speedup",
        "weights_from",
    }

    def keywords(node):
        if isinstance(node, dict):
            for key, value in node.items():
                yield key
                yield from keywords(value)
        elif isinstance(node, list):
            for value in node:
                yield from keywords(value)

    # no `default` keywords: snakemake's validate(set_default=True) would fill them in
    assert "default" not in set(keywords(schema["$defs"])) - {"defaults"}
    assert "default" not in schema["properties"]["preset"]


# ---------------------------------------------------------------------------
# resolution, sweeps, ids


def test_builtin_defaults_fill_every_field():
    (spec,) = load_study({"groups": {"g": {"runs": [{}]}}}).experiments
    assert spec["id"] == "resnet50-fp32-bs16"
    assert spec["group"] == "g"
    assert spec["env"] == "upstream"
    assert spec["compile"] == "none"
    assert spec["preset"] == "default"
    # the training knobs left to the model (null) are its family's: vision trains as the
    # article (SGD, lr 0.01, constant), text as Hugging Face's examples
    family = workloads.TRAINING_DEFAULTS["vision"]
    assert family == {
        "optimizer": "sgd", "lr": 0.01, "lr_schedule": "constant", "lr_warmup_steps": 0,
    }  # fmt: skip
    for field in FIELD_NAMES:
        if field in family:
            assert BUILTIN_DEFAULTS[field] is None and spec[field] == family[field]
        elif field not in ("id", "group", "compile"):
            assert spec[field] == BUILTIN_DEFAULTS[field]
    (text,) = load_study({"groups": {"g": {"runs": [{"model": "bert-tiny"}]}}}).experiments
    assert {k: text[k] for k in family} == {
        "optimizer": "adamw", "lr": 2e-5, "lr_schedule": "linear", "lr_warmup_steps": 100,
    }  # fmt: skip
    assert text["attention"] == "sdpa" and spec["attention"] is None


def test_sweep_cartesian_product_in_field_order():
    config = {
        "groups": {
            "g": {"runs": [
                {"id": "first"},
                {"precision": ["fp32", "bf16"], "batch_size": [8, 32], "channels_last": True},
            ]},
            "thr": {"runs": [{"name": "thr", "threads": [1, 2]}]},
        },
    }  # fmt: skip
    study = load_study(config)
    got = [(s["precision"], s["batch_size"]) for s in study.experiments[1:5]]
    assert got == [("fp32", 8), ("fp32", 32), ("bf16", 8), ("bf16", 32)]
    assert study.ids == [
        "first",
        "resnet50-fp32-cl-bs8",
        "resnet50-fp32-cl-bs32",
        "resnet50-bf16-cl-bs8",
        "resnet50-bf16-cl-bs32",
        "thr-t1",
        "thr-t2",
    ]
    assert all(s["channels_last"] for s in study.experiments[1:5])
    assert study.by_id["resnet50-fp32-cl-bs8"]["group"] == "g"  # a run's group is its group's
    assert study.by_id["thr-t1"]["group"] == "thr"


def test_sweep_named_tags():
    config = {
        "groups": {
            "g": {
                "runs": [
                    {
                        "name": "mix",
                        "backend": "ipex",
                        "compile": [None, "ipex"],
                        "channels_last": [False, True],
                        "allocator": ["tcmalloc"],
                        "launcher": "run_cpu",
                        "steps": [5],
                    }
                ]
            }
        }
    }
    study = load_study(config)
    assert study.ids == [
        "mix-compile-none-nocl-tcmalloc-steps5",
        "mix-compile-none-cl-tcmalloc-steps5",
        "mix-compile-ipex-nocl-tcmalloc-steps5",
        "mix-compile-ipex-cl-tcmalloc-steps5",
    ]
    assert {s["group"] for s in study.experiments} == {"g"}


def test_unnamed_sweep_appends_fields_the_id_does_not_show():
    study = load_study({"groups": {"g": {"runs": [{"steps": [5, 20], "seed": [1]}]}}})
    assert study.ids == ["resnet50-fp32-bs16-steps5-seed1", "resnet50-fp32-bs16-steps20-seed1"]


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"precision": "bf16", "channels_last": True, "batch_size": 32}, "resnet50-bf16-cl-bs32"),
        ({"backend": "inductor"}, "resnet50-inductor-fp32-bs16"),
        (
            {"backend": "ipex", "ipex_optimize": True, "precision": "bf16", "channels_last": True},
            "resnet50-ipex-ipexopt-bf16-cl-bs16",
        ),
        ({"backend": "ipex", "compile": "ipex"}, "resnet50-ipex-compile-ipex-fp32-bs16"),
        ({"backend": "ipex", "compile": "inductor"}, "resnet50-ipex-compile-inductor-fp32-bs16"),
        (
            {"backend": "inductor", "compile_mode": "max-autotune"},
            "resnet50-inductor-max-autotune-fp32-bs16",
        ),
        ({"data": "per_sample", "num_workers": 2}, "resnet50-fp32-persample-nw2-bs16"),
        ({"data": "image_folder"}, "resnet50-fp32-folder-bs16"),
        ({"threads": 1}, "resnet50-fp32-t1-bs16"),
        (
            {"launcher": "run_cpu", "allocator": "jemalloc", "openmp": "intel"},
            "resnet50-fp32-runcpu-jemalloc-iomp-bs16",
        ),
        ({"model": "cnn", "image_size": 64}, "cnn-fp32-bs16-px64"),
        ({"id": "mine", "precision": "bf16"}, "mine"),
    ],
)
def test_derived_ids(fields, expected):
    assert ids({"groups": {"g": {"runs": [fields]}}}) == [expected]


def test_measurement_fields_and_settings():
    (spec,) = load_study({"groups": {"g": {"runs": [{}]}}}).experiments
    assert spec["probe_size"] == 1024 and spec["warm_compile_cache"] is False
    settings = load_study({"groups": {"g": {"runs": [{}]}}}).settings
    assert settings["noise_threshold"] == 0.85 and settings["noise_retries"] == 2
    # --config hands them over as strings
    config = {"groups": {"g": {"runs": [{}]}}, "noise_threshold": "0.9", "noise_retries": "0"}
    settings = load_study(config).settings
    assert settings["noise_threshold"] == 0.9 and settings["noise_retries"] == 0
    assert (
        load_study({"groups": {"g": {"runs": [{}]}}, "noise_threshold": 1}).settings[
            "noise_threshold"
        ]
        == 1
    )


def test_measurement_fields_do_not_change_ids():
    config = {"groups": {"g": {"runs": [{"probe_size": 0, "warm_compile_cache": True}]}}}
    assert ids(config) == ["resnet50-fp32-bs16"]
    assert ids({"defaults": {"probe_size": 256}, "groups": {"g": {"runs": [{}]}}}) == [
        "resnet50-fp32-bs16"
    ]


def test_swept_measurement_fields_are_tagged():
    config = {
        "groups": {
            "g": {
                "runs": [
                    {"name": "p", "probe_size": [0, 512]},
                    {"warm_compile_cache": [False, True]},
                ]
            }
        }
    }
    assert ids(config) == [
        "p-probe0",
        "p-probe512",
        "resnet50-fp32-bs16-coldcache",
        "resnet50-fp32-bs16-warmcache",
    ]


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {"groups": {"g": {"runs": [{"probe_size": -1}]}}},
            "groups.g.runs[0].probe_size: -1 is not allowed; allowed: an integer >= 0",
        ),
        (
            {"groups": {"g": {"runs": [{"warm_compile_cache": "yes"}]}}},
            "groups.g.runs[0].warm_compile_cache: 'yes' is a string; allowed: true or false",
        ),
        (
            {"groups": {"g": {"runs": [{}]}}, "noise_threshold": 0},
            "at noise_threshold: 0 is not allowed; allowed: a number > 0 and <= 1",
        ),
        (
            {"groups": {"g": {"runs": [{}]}}, "noise_threshold": 1.5},
            "at noise_threshold: 1.5 is not allowed; allowed: a number > 0 and <= 1",
        ),
        (
            {"groups": {"g": {"runs": [{}]}}, "margin": 0},
            "at margin: 0 is not allowed; allowed: a number > 0 and <= 1",
        ),
        (
            {"groups": {"g": {"runs": [{}]}}, "margin": "3 %"},
            "at margin: '3 %' is a string; allowed: a number > 0 and <= 1",
        ),
        (
            {"groups": {"g": {"runs": [{}]}}, "noise_retries": -1},
            "at noise_retries: -1 is not allowed; allowed: an integer >= 0",
        ),
        (
            {"groups": {"g": {"runs": [{}]}}, "noise_retries": 1.5},
            "at noise_retries: 1.5 is a number; allowed: an integer >= 0",
        ),
    ],
)
def test_measurement_field_errors(config, message):
    assert message in error_of(config)


def test_px_tag_relative_to_resolved_defaults():
    config = {"defaults": {"image_size": 64}, "groups": {"g": {"runs": [{}, {"image_size": 224}]}}}
    assert ids(config) == ["resnet50-fp32-bs16", "resnet50-fp32-bs16-px224"]


def test_integral_floats_become_ints():
    (spec,) = load_study({"groups": {"g": {"runs": [{"batch_size": 8.0}]}}}).experiments
    assert spec["batch_size"] == 8 and isinstance(spec["batch_size"], int)
    assert spec["id"] == "resnet50-fp32-bs8"


# ---------------------------------------------------------------------------
# presets and overrides


BASE = {
    "trials": 2,
    "image_folder": {"classes": 5},
    "defaults": {"batch_size": 4, "steps": 7},
    "groups": {"g": {"runs": [{"id": "top"}, {"name": "s", "threads": [1, 2]}]}},
    "presets": {
        "small": {"defaults": {"steps": 2}, "image_folder": {"size": 32}},
        "other": {
            "trials": 5,
            "groups": {"g": {"runs": [{"id": "only"}]}},
        },
    },
}


def test_preset_default_is_top_level():
    study = load_study(BASE)
    assert study.ids == ["top", "s-t1", "s-t2"]
    assert study.settings["trials"] == 2
    assert study.by_id["top"]["steps"] == 7
    assert study.settings["image_folder"] == {"images_per_class": 32, "classes": 5, "size": 256}


def test_preset_defaults_merge_key_by_key():
    study = load_study({**BASE, "preset": "small"})
    assert study.ids == ["top", "s-t1", "s-t2"]
    spec = study.by_id["top"]
    assert (spec["batch_size"], spec["steps"], spec["preset"]) == (4, 2, "small")
    assert study.settings["image_folder"] == {"images_per_class": 32, "classes": 5, "size": 32}
    assert study.settings["trials"] == 2


def test_preset_lists_and_trials_replace():
    study = load_study({**BASE, "preset": "other"})
    assert study.ids == ["only"]
    assert study.settings["trials"] == 5


def test_preset_named_default_in_presets_is_applied():
    config = copy.deepcopy(BASE)
    config["presets"]["default"] = {"trials": 3}
    assert load_study(config).settings["trials"] == 3


def test_unknown_preset():
    msg = error_of({**BASE, "preset": "quik"})
    assert msg == (
        "config error at preset: 'quik' is not a preset; available: default, other, small"
    )


def test_config_style_overrides(shipped):
    # snakemake --config preset=quick trials=2: top-level keys; values may be strings
    study = load_study({**shipped, "preset": "quick", "trials": "3"})
    assert study.settings["preset"] == "quick"
    assert study.settings["trials"] == 1  # the preset's trials win
    study = load_study({**shipped, "trials": "3", "installer": "pip"})
    assert study.settings["trials"] == 3
    assert study.settings["installer"] == "pip"
    study = load_study({**shipped, "defaults": "{steps: 4}"})
    assert study.by_id["baseline"]["steps"] == 4


def test_read_config_sets(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("groups: {g: {runs: [{}]}}\n")
    config = read_config(path, ["preset=quick", "trials=2", "python=null"])
    assert config == {
        "groups": {"g": {"runs": [{}]}},
        "preset": "quick",
        "trials": 2,
        "python": None,
    }
    with pytest.raises(StudyConfigError, match="expected key=value"):
        read_config(path, ["trials"])
    with pytest.raises(StudyConfigError, match="cannot read"):
        read_config(tmp_path / "missing.yaml")


def test_specs_do_not_share_mutable_values():
    study = load_study({"groups": {"g": {"runs": [{"id": "a"}, {"id": "b"}]}}})
    study.by_id["a"]["env_vars"]["X"] = "1"
    assert study.by_id["b"]["env_vars"] == {}
    assert BUILTIN_DEFAULTS["env_vars"] == {}


def test_load_study_does_not_mutate_input(shipped):
    before = copy.deepcopy(shipped)
    load_study({**shipped, "trials": "2"})
    load_study(shipped)
    assert shipped == before


# ---------------------------------------------------------------------------
# errors


def test_unknown_field_nested_path():
    msg = error_of({"groups": {"g": {"runs": [{"id": "a"}, {"presicion": "bf16"}]}}})
    assert msg.startswith("config error at groups.g.runs[1].presicion: unknown field 'presicion'")
    assert "did you mean 'precision'?" in msg
    assert "allowed: id, claim_speedup, backend" in msg


def test_unknown_field_in_preset_and_top_level():
    msg = error_of({"frob": 1, "presets": {"q": {"defaults": {"stepz": 2}}}})
    assert "config error at frob: unknown field 'frob'; allowed: preset, runtime" in msg
    assert "config error at presets.q.defaults.stepz: unknown field 'stepz'" in msg


def test_wrong_type():
    msg = error_of({"groups": {"g": {"runs": [{"batch_size": "16"}]}}})
    assert msg == (
        "config error at groups.g.runs[0].batch_size: '16' is a string; allowed: an integer >= 1"
    )
    msg = error_of({"groups": {"g": {"runs": [{"threads": True}]}}})
    assert "groups.g.runs[0].threads: true is a boolean; allowed: an integer >= 1 or null" in msg
    msg = error_of({"groups": {"g": {"runs": [{"env_vars": {"X": 1}}]}}})
    assert "groups.g.runs[0].env_vars.X: 1 is an integer; allowed: a string" in msg


def test_bad_enum_value():
    msg = error_of({"groups": {"g": {"runs": [{}, {}, {"precision": "fp16"}]}}})
    assert msg == (
        "config error at groups.g.runs[2].precision: 'fp16' is not allowed; allowed: fp32, "
        "bf16, int8"
    )
    msg = error_of({"runtime": "singularity", "groups": {"g": {"runs": [{}]}}})
    assert msg == (
        "config error at runtime: 'singularity' is not allowed; "
        "allowed: auto, local, podman, docker"
    )


def test_out_of_range_values():
    msg = error_of({"groups": {"g": {"runs": [{"batch_size": 0, "lr": 0}]}}, "trials": 0})
    assert "groups.g.runs[0].batch_size: 0 is not allowed; allowed: an integer >= 1" in msg
    assert "groups.g.runs[0].lr: 0 is not allowed; allowed: a number > 0" in msg
    assert "at trials: 0 is not allowed; allowed: an integer >= 1" in msg


def test_a_value_refused_by_its_pattern_is_told_what_is_allowed_in_words():
    """Every string the schema checks by a pattern says in words what it takes (its
    description), never the pattern: a user reads "a duration ... such as 45min", not
    a regular expression."""
    schema = build_schema()

    def patterns(node, where="$"):
        if isinstance(node, dict):
            if "pattern" in node:
                yield where, node
            for key, value in node.items():
                yield from patterns(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                yield from patterns(value, f"{where}[{i}]")

    found = list(patterns(schema))
    assert len(found) >= 10
    for where, node in found:
        assert node.get("description"), where
    for bad in ("1d", "-1h", "2hours", "1 h", 3600):
        msg = error_of({"budget": bad, "groups": {"g": {"runs": [{}]}}})
        assert msg.startswith("config error at budget: "), msg
        assert "such as 45min, 1.5h or 5400s" in msg and "^" not in msg, msg


def test_max_trials_below_trials_is_warned_about():
    """max_trials below trials turns the adaptive rounds off: legal, said at plan time."""
    runs = {"groups": {"g": {"runs": [{}]}}}
    low = load_study({**runs, "trials": 5, "max_trials": 3})
    said = [w for w in low.warnings if w.startswith("config warning at max_trials")]
    assert said == [
        "config warning at max_trials: 3 is below trials (5): every experiment runs 5 "
        "trials and no adaptive round (a max_trials above trials lets an undecided "
        "comparison run more)"
    ]
    for fine in ({"trials": 2, "max_trials": 4}, {"trials": 3, "max_trials": 3},
                 {"trials": 2, "max_trials": None}):  # fmt: skip
        assert not [w for w in load_study({**runs, **fine}).warnings if "max_trials" in w]


def test_sweep_value_errors_name_the_list_item():
    msg = error_of(
        {
            "groups": {
                "g": {"runs": [{"batch_size": [8, "x"], "precision": ["fp16"], "threads": []}]}
            }
        }
    )
    assert "groups.g.runs[0].batch_size[1]: 'x' is a string; allowed: an integer >= 1" in msg
    assert "groups.g.runs[0].precision[0]: 'fp16' is not allowed; allowed: fp32, bf16" in msg
    assert "groups.g.runs[0].threads: an empty list is not allowed" in msg


def test_a_list_makes_a_run_a_sweep_and_defaults_take_single_values():
    assert ids({"groups": {"g": {"runs": [{"batch_size": [8, 16]}]}}}) == [
        "resnet50-fp32-bs8", "resnet50-fp32-bs16",
    ]  # fmt: skip
    msg = error_of({"defaults": {"precision": ["fp32"]}, "groups": {"g": {"runs": [{}]}}})
    assert 'defaults.precision: ["fp32"] is a list; defaults take single values' in msg


def test_sweep_rules():
    msg = error_of({"groups": {"g": {"runs": [{"name": "s", "batch_size": 8}]}}})
    assert msg.startswith(
        "config error at groups.g.runs[0]: a sweep needs at least one field with a list"
    )
    msg = error_of({"groups": {"g": {"runs": [{"id": "x", "batch_size": [8]}]}}})
    assert "groups.g.runs[0].id: a sweep cannot have an explicit id" in msg
    assert "set 'name' instead" in msg
    msg = error_of({"groups": {"g": {"runs": [{"weights_from": ["a"], "batch_size": [8]}]}}})
    assert "groups.g.runs[0].weights_from: [\"a\"] is a list; 'weights_from' cannot be swept" in msg


def test_defaults_cannot_hold_per_experiment_fields():
    msg = error_of({"defaults": {"id": "x"}, "groups": {"g": {"runs": [{}]}}})
    assert (
        msg == "config error at defaults.id: 'id' cannot have a default; set it on each experiment"
    )


def test_missing_required_price_field():
    msg = error_of({"prices": [{"name": "x"}], "groups": {"g": {"runs": [{}]}}})
    assert msg == "config error at prices[0]: missing required field 'usd_per_hour'"


def test_duplicate_ids():
    msg = error_of({"groups": {"g": {"runs": [{"batch_size": 16}, {"batch_size": [8, 16]}]}}})
    assert msg == (
        "config error: duplicate experiment id 'resnet50-fp32-bs16' "
        "(groups.g.runs[0] and groups.g.runs[1] value batch_size=16); give one of them an "
        "explicit id"
    )
    msg = error_of(
        {
            "groups": {
                "g": {"runs": [{"name": "a", "threads": [1]}, {"name": "a", "threads": [1, 2]}]}
            }
        }
    )
    assert (
        "duplicate experiment id 'a-t1' (groups.g.runs[0] value threads=1 and "
        "groups.g.runs[1] value" in msg
    )
    assert "give the sweeps different names" in msg


def test_bad_ids():
    msg = error_of({"groups": {"g": {"runs": [{"id": "has space"}]}}})
    assert "groups.g.runs[0].id: 'has space' is not allowed; allowed: 1-100 letters" in msg
    msg = error_of({"groups": {"g": {"runs": [{"name": "x" * 99, "batch_size": [8]}]}}})
    assert "is not allowed; allowed: 1-100 letters" in msg


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"compile": "ipex"},
            (
                "(id resnet50-compile-ipex-fp32-bs16): compile 'ipex' needs backend 'ipex' "
                "(got backend 'eager')"
            ),
        ),
        ({"ipex_optimize": True}, "ipex_optimize true needs backend 'ipex' (got backend 'eager')"),
        (
            {"backend": "inductor", "compile": "none"},
            (
                "backend 'inductor' means torch.compile with inductor (got compile 'none'); "
                "use backend 'eager' for no compile"
            ),
        ),
        (
            {"compile": "inductor"},
            "backend 'eager' means no torch.compile (got compile 'inductor')",
        ),
        (
            {"backend": "xla", "compile": "inductor"},
            "backend 'xla' needs compile 'none' (got compile 'inductor')",
        ),
        (
            {"backend": "xla", "precision": "bf16"},
            "backend 'xla' needs precision 'fp32' (got precision 'bf16')",
        ),
        ({"backend": "xla", "channels_last": True}, "backend 'xla' needs channels_last false"),
        (
            {"backend": "xla", "ipex_optimize": True},
            "ipex_optimize true needs backend 'ipex' (got backend 'xla')",
        ),
        (
            {"allocator": "jemalloc"},
            "allocator 'jemalloc' needs launcher 'run_cpu' (got launcher 'none')",
        ),
        ({"openmp": "intel"}, "openmp 'intel' needs launcher 'run_cpu' (got launcher 'none')"),
        ({"num_workers": 2}, "num_workers 2 needs data 'per_sample' or 'image_folder'"),
        ({"data_dir": "imgs"}, "data_dir 'imgs' needs data 'image_folder' (got data 'synthetic')"),
        ({"image_size": 16}, "model 'resnet50' needs image_size >= 32 (got image_size 16)"),
        ({"model": "resnet18", "image_size": 31}, "model 'resnet18' needs image_size >= 32"),
        ({"cpus": "3-1"}, "cpus '3-1' is not a CPU list (range '3-1' runs backwards)"),
        ({"compile_mode": "max-autotune"}, "compile_mode 'max-autotune' needs a compile"),
        ({"epochs": 3}, "epochs 3 needs data 'digits' or 'keywords' (a data set with a held-out"),
        ({"data": "keywords"}, "data 'keywords' needs a text classifier (got model 'resnet50'"),
        (
            {"data": "keywords", "model": "gpt2-tiny", "image_size": None},
            "data 'keywords' (a text-classification task) needs a sequence-classification model",
        ),
        (
            {"data": "digits", "epochs": 3, "time_budget_s": 60},
            "time_budget_s 60 would cut a training of epochs 3 short",
        ),
        (
            {"data": "digits", "batch_size": 2048, "model": "cnn"},
            "batch_size 2048 is larger than the 1437 training images of data 'digits'",
        ),
    ],
)
def test_impossible_combinations(fields, message):
    msg = error_of({"groups": {"g": {"runs": [{"id": "x"}, fields]}}})
    assert msg.startswith("config error at groups.g.runs[1] (id ")
    assert message in msg


def test_combination_error_in_sweep_names_sweep_and_id():
    msg = error_of({"groups": {"g": {"runs": [{"compile": "ipex", "batch_size": [8]}]}}})
    assert msg == (
        "config error at groups.g.runs[0] (id resnet50-compile-ipex-fp32-bs8): "
        "compile 'ipex' needs backend 'ipex' (got backend 'eager')"
    )


def test_combination_error_in_preset_names_preset_path():
    config = {
        "groups": {"g": {"runs": [{}]}},
        "presets": {"p": {"groups": {"g": {"runs": [{"num_workers": 1}]}}}},
    }
    assert load_study(config).ids == ["resnet50-fp32-bs16"]  # presets not selected: fine
    msg = error_of({**config, "preset": "p"})
    assert msg.startswith("config error at presets.p.groups.g.runs[0] (id resnet50-fp32-nw1-bs16)")


def test_valid_combinations():
    config = {
        "groups": {
            "g": {
                "runs": [
                    {"data": "image_folder", "data_dir": "/data/imgs", "num_workers": 2},
                    {"model": "cnn", "image_size": 8},
                    {"launcher": "run_cpu", "allocator": "tcmalloc", "openmp": "intel"},
                    {"backend": "ipex", "compile": "inductor", "compile_mode": "max-autotune"},
                    {"cpus": "0-3,6", "threads": 2},
                ]
            }
        }
    }
    assert len(load_study(config).experiments) == 5


def test_parse_cpus():
    assert parse_cpus("0-3,6") == [0, 1, 2, 3, 6]
    assert parse_cpus("5") == [5]
    with pytest.raises(ValueError):
        parse_cpus("2-1")


def test_empty_study():
    assert "has no experiments" in error_of({})


# ---------------------------------------------------------------------------
# spec_json


def test_spec_json_changes_exactly_with_the_spec():
    base = {"groups": {"g": {"runs": [{"id": "a"}, {"id": "b", "precision": "bf16"}]}}}
    study = load_study(base)
    a, b = study.spec_json("a"), study.spec_json("b")
    assert json.loads(a) == study.by_id["a"]
    assert a == load_study(copy.deepcopy(base)).spec_json("a")  # deterministic
    # the same spec written differently (explicit defaults, other field order)
    same = {
        "groups": {
            "g": {
                "runs": [
                    {"steps": 10, "id": "a", "backend": "eager", "compile": None},
                    {"id": "b", "precision": "bf16", "steps": 10},
                ]
            }
        }
    }
    assert load_study(same).spec_json("a") == a
    # an unrelated change (other experiment, prices, trials) leaves it alone
    other = {
        **base,
        "groups": {"g": {"runs": [{"id": "a"}, {"id": "b", "precision": "fp32"}]}},
        "trials": 4,
        "prices": [{"name": "x", "usd_per_hour": 1}],
    }
    changed = load_study(other)
    assert changed.spec_json("a") == a
    assert changed.spec_json("b") != b
    # any field change of the spec itself changes it
    for fields in ({"steps": 11}, {"env_vars": {"X": "1"}}, {"seed": 1}):
        assert load_study({"groups": {"g": {"runs": [{"id": "a", **fields}]}}}).spec_json("a") != a
    assert load_study({"groups": {"h": {"runs": [{"id": "a"}]}}}).spec_json("a") != a
    assert load_study({**base, "defaults": {"lr": 0.1}}).spec_json("a") != a


# ---------------------------------------------------------------------------
# command line


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "workflow_scripts.study", *args],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_quick():
    proc = run_cli("--set", "preset=quick")
    assert proc.returncode == 0, proc.stderr
    n = len(load_study({**yaml.safe_load(CONFIG.read_text()), "preset": "quick"}).ids)
    assert proc.stdout.startswith(
        f"preset quick: {n} experiments, envs ipex, oneccl, upstream, xla"
    )
    lines = proc.stdout.splitlines()
    assert any(line.split()[:4] == ["xla-fp32", "xla", "xla", "ladder"] for line in lines)
    assert any(line.startswith("workers-nw1 ") and "num_workers=1" in line for line in lines)


def test_cli_invalid(tmp_path):
    proc = run_cli("--set", "preset=nope")
    assert proc.returncode == 1
    assert (
        "config error at preset: 'nope' is not a preset; "
        "available: default, paper, preflight, quick" in proc.stderr
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups:\n  g:\n    runs:\n      - precision: fp16\n")
    proc = run_cli("--config", str(bad))
    assert proc.returncode == 1
    assert "groups.g.runs[0].precision: 'fp16' is not allowed; allowed: fp32, bf16" in proc.stderr


def test_main_json(capsys):
    assert main(["--config", str(CONFIG), "--set", "preset=quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["settings"]["preset"] == "quick"
    assert out["experiments"][0]["id"] == "baseline"


def test_layouts_split_the_cpus_and_share_the_batch():
    """layouts: all, on the sweep's cpus (6 here, on any machine): 1x6 and 2x3; 3x2
    and 6x1 cannot split a global batch of 32 evenly and are left out."""
    sweep = {"name": "d", "launcher": "torchrun", "cpus": "0-5", "batch_size": 32}
    study = load_study(
        {"groups": {"g": {"runs": [{**sweep, "layouts": "all", "dist_backend": ["gloo", "ccl"]}]}}}
    )
    assert study.ids == ["d-gloo-r1-t6", "d-gloo-r2-t3", "d-ccl-r1-t6", "d-ccl-r2-t3"]
    assert {s["group"] for s in study.experiments} == {"g"}
    study = load_study(
        {"groups": {"g": {"runs": [{**sweep, "batch_size": 36, "layouts": "multi"}]}}}
    )
    assert [(s["ranks"], s["threads"]) for s in study.experiments] == [(2, 3), (3, 2), (6, 1)]
    # the layouts are the only swept thing: no list needed
    assert load_study({"groups": {"g": {"runs": [{**sweep, "layouts": "all"}]}}}).ids == [
        "d-r1-t6",
        "d-r2-t3",
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"ranks": 2}, "layouts 'all' sets ranks and threads itself; remove ranks"),
        ({"cpus": "0", "layouts": "multi"}, "layouts 'multi': 1 CPU(s) cannot hold 2 ranks"),
        ({"layouts": "every"}, "'every' is not allowed; allowed: all, multi"),
    ],
)
def test_layouts_errors(extra, message):
    sweep = {"name": "d", "launcher": "torchrun", "layouts": "all", **extra}
    assert message in error_of({"groups": {"g": {"runs": [sweep]}}})


def test_a_sweep_over_folders_of_the_same_name_gets_distinct_ids():
    """Two data_dirs ending in the same folder name: each id gets a short hash of its
    path; a third one keeps its plain tag."""
    sweep = {"name": "f", "data": "image_folder", "data_dir": ["/a/imgs", "/b/imgs", "/c/x"]}
    ids = load_study({"groups": {"g": {"runs": [sweep]}}}).ids
    assert len(set(ids)) == 3 and ids[2] == "f-dir-x"
    assert all(i.startswith("f-dir-imgs-") and len(i) == len("f-dir-imgs-") + 6 for i in ids[:2])
    assert load_study({"groups": {"g": {"runs": [sweep]}}}).ids == ids  # the same ids every time


def test_batch_norm_at_1x1_is_refused_for_training_only():
    """A ResNet at 32 px ends in 1x1 feature maps: at batch 1, training's batch norm has
    one value per channel; inference (eval mode) uses the running statistics."""
    fields = {"model": "resnet18", "image_size": 32, "batch_size": 1}
    assert "batch_size 1 with image_size 32" in error_of({"groups": {"g": {"runs": [fields]}}})
    assert ids({"groups": {"g": {"runs": [{**fields, "mode": "inference"}]}}}) == [
        "resnet18-infer-fp32-bs1-px32"
    ]


def test_the_preflight_preset_is_the_default_study_shortened(shipped):
    """The pre-flight: every experiment of the study at its real size, the fewest steps."""
    from workflow_scripts.plan import preflight

    default = load_study(shipped)
    shapes = load_study({**shipped, "preset": "preflight"})
    assert shapes.ids == default.ids
    real = ("model", "batch_size", "image_size", "seq_len", "precision", "backend", "compile",
            "launcher", "ranks", "threads", "nodes", "dist_backend", "data", "mode")  # fmt: skip
    for full, pre in zip(default.experiments, shapes.experiments):
        assert preflight.matches(full, pre), full["id"]
        assert {k: pre[k] for k in real} == {k: full[k] for k in real}
        assert pre["warmup_steps"] == 1 and pre["time_budget_s"] is None
        if full["epochs"]:
            assert pre["epochs"] == 1 and pre["max_steps"] == preflight.EPOCH_STEPS
        else:
            assert pre["steps"] == 1 and pre["max_steps"] is None
    assert not preflight.matches(default.experiments[0], {**shapes.experiments[0], "batch_size": 1})
    assert shapes.settings["trials"] == 1 and shapes.settings["noise_retries"] == 0
    assert shapes.settings["collectives"]["iterations"] == preflight.COLLECTIVE_ITERATIONS
    assert (shapes.results, shapes.logs) == ("results/preflight", "logs/preflight")
    assert (default.results, default.logs) == ("results", "logs")
    # any preset has its pre-flight
    quick = load_study({**shipped, "preset": "quick"})
    pre_quick = load_study({**shipped, "preset": "quick", "preflight": True})
    assert pre_quick.ids == quick.ids and pre_quick.results == "results/preflight"


def test_dropout_is_a_transformers_knob_on_in_the_default_study(shipped):
    study = load_study(shipped)
    text = [s for s in study.experiments if workloads.get(s["model"]).text]
    vision = [s for s in study.experiments if not workloads.get(s["model"]).text]
    assert text and all(s["dropout"] for s in text)
    # an image model has none either way: its spec says so
    assert vision and not any(s["dropout"] for s in vision)
    quick = load_study({**shipped, "preset": "quick"})
    assert not any(s["dropout"] for s in quick.experiments)
    # the checked first step runs in eval mode: a compiled run compiles again at its
    # second, which must be a warm-up step
    base = {"id": "b", "model": "bert-tiny", "dropout": True, "backend": "inductor"}
    message = error_of({"groups": {"g": {"runs": [{**base, "warmup_steps": 1}]}}})
    assert "dropout with compile 'inductor' needs warmup_steps 2 at least (got 1)" in message
    assert load_study({"groups": {"g": {"runs": [{**base, "warmup_steps": 2}]}}}).experiments
    assert load_study({"groups": {"g": {"runs": [{**base, "warmup_steps": 1, "dropout": False}]}}})
    # a sweep over it names its runs apart
    sweep = {"name": "d", "model": "bert-tiny", "dropout": [True, False]}
    names = ids({"groups": {"g": {"runs": [sweep]}}})
    assert len(set(names)) == 2, names
