"""The report per workload family: a ladder per family side by side, each run divided
by the plain fp32 eager run of its own workload; the headline's line per family; and
the inference section (batch-1 latency, throughput), from fixture records."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.fixture_records import html_tables, make, section, served, trial, write
from workflow_scripts import report
from workflow_scripts.summary import records as rec

BERT = {"model": "bert-base", "image_size": None, "seq_len": 128, "group": "transformers"}
INFER = {**BERT, "mode": "inference", "group": "inference"}

#: a ratio of one trial each: no spread to make an interval from (uncertainty.py)
NO_INTERVAL = " (undecided: one trial each, no interval)"


def records() -> list[dict]:
    return [
        trial("baseline", sps=10.0, group="ladder"),
        trial("bf16", sps=25.0, group="ladder", precision="bf16"),
        trial("bert", sps=4.0, **BERT),
        trial("bert-accelerate", sps=4.4, launcher="accelerate", **BERT),
        ok_check(trial("bert-ipex", sps=6.0, backend="ipex", ipex_optimize=True, **BERT), 201),
        # 2 ranks: divided by the one-process run, never by another layout
        trial("bert-ddp", sps=5.0, launcher="accelerate", ranks=2, threads=1, **BERT),
        trial(
            "gpt2",
            sps=2.0,
            model="gpt2",
            image_size=None,
            seq_len=256,
            batch_size=8,
            group="transformers",
        ),  # fmt: skip
        incorrect("bert-ipex-compile", backend="ipex", compile="ipex", **BERT),
        trial("infer-bs1", sps=50.0, batch_size=1, **INFER),
        trial(
            "infer-bs1-ipex", sps=80.0, batch_size=1, backend="ipex", ipex_optimize=True, **INFER
        ),  # fmt: skip
        trial("infer-bs16", sps=100.0, batch_size=16, **INFER),
    ]


def incorrect(exp: str, **spec) -> dict:
    """A run whose step lost gradients: the harness's record of it (the gradient check's
    verdict, its figures kept apart, none as a throughput)."""
    r = make(exp, sps=None, status="incorrect", **spec)
    r["error"] = {
        "type": "IncorrectStep",
        "message": "the step trained 4 of 201 parameter "
        "tensors (197 got no gradient: bert.embeddings.word_embeddings.weight)",
    }
    r["gradient_check"] = {
        "ok": False, "received": {"parameters": 201, "with_gradient": 4}, "check_s": 3.0,
        "comparison": {"max_rel_error": 1.0, "eager_median_rel_error": 1e-6},
    }  # fmt: skip
    r["unchecked_metrics"] = {"samples_per_s": 11.0}
    return r


def ok_check(r: dict, params: int) -> dict:
    r["gradient_check"] = {
        "ok": True, "received": {"parameters": params, "with_gradient": params}, "check_s": 1.0,
        "comparison": {"max_rel_error": 2e-6, "eager_median_rel_error": 1e-6},
    }  # fmt: skip
    return r


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("families")
    loaded = rec.load_records(write(tmp / "records", records()))  # through files, as the rule
    report.build_report(
        loaded, report.Outputs(tmp / "summary.csv", tmp / "index.html", tmp / "plots")
    )
    return (tmp / "index.html").read_text()


def test_one_ladder_per_family_side_by_side(page):
    part = section(page, "families")
    assert part.index("Vision (images)") < part.index("Text (tokens)")
    assert part.count('<div class="family">') == 2
    vision, text = html_tables(part)
    assert list(vision["experiment"]) == ["baseline", "bf16"]
    assert "tokens/s" not in vision and "tokens/s" in text
    # inference and other families' rows are not in the training ladders
    assert "infer-bs1" not in set(vision["experiment"]) | set(text["experiment"])
    by = text.set_index("experiment")
    assert by.loc["bert-accelerate", "vs fp32 eager"] == "1.10× vs bert" + NO_INTERVAL
    assert by.loc["bert-ipex", "vs fp32 eager"] == "1.50× vs bert" + NO_INTERVAL
    assert by.loc["bert-ddp", "vs fp32 eager"] == "1.25× vs bert" + NO_INTERVAL
    # each model against its own reference; tokens = samples x sequence length
    assert by.loc["gpt2", "vs fp32 eager"] == "1.00× vs gpt2" + NO_INTERVAL
    assert by.loc["bert-accelerate", "tokens/s"] == "563"
    assert by.loc["gpt2", "tokens/s"] == "512"
    assert by.loc["bert", "workload"] == "bert-base, 128 tokens, batch 16"
    # the gradient check: what each step trained; an incorrect run has no throughput, and
    # its samples/s never reaches a ratio or the headline
    assert by.loc["bert-ipex", "parameters trained"] == "201/201"
    assert by.loc["bert-ipex-compile", "samples/s"] == "none: incorrect (see Failures)"
    assert by.loc["bert-ipex-compile", "parameters trained"] == "4/201"
    assert by.loc["bert-ipex-compile", "vs fp32 eager"] == "n/a (vs bert)"
    assert by.loc["bert-ipex-compile", "tokens/s"] == ""
    failures = section(page, "failures")
    assert "bert-ipex-compile (trial 0) — incorrect" in failures
    assert "the step trained 4 of 201 parameter tensors" in failures


def test_the_headline_covers_each_family(page):
    head = page[
        page.index('class="headline"') : page.index("</div>", page.index('class="headline"'))
    ]
    assert "Vision (images): the fastest training run is <b>bf16</b>" in head
    assert "<b>2.50×</b> its fp32 eager run (baseline; undecided: one trial each" in head
    assert "Text (tokens): the fastest training run is <b>bert-ipex</b>" in head
    assert "768 tokens/s" in head and "<b>1.50×</b> its fp32 eager run (bert; undecided" in head


def test_inference_has_its_own_section(page):
    (table,) = html_tables(section(page, "inference"))
    by = table.set_index("experiment")
    assert list(by.index) == ["infer-bs1", "infer-bs1-ipex", "infer-bs16"]
    # batch 1: latency is the step time (1 / 80 samples/s = 12.5 ms)
    assert by.loc["infer-bs1-ipex", "latency p50 (ms)"] == "12.50"
    assert by.loc["infer-bs1-ipex", "vs fp32 eager"] == "1.60× vs infer-bs1" + NO_INTERVAL
    assert by.loc["infer-bs16", "latency p50 (ms)"] == "n/a (batch > 1)"
    # a throughput batch is compared at its own batch size only: it is its own reference
    assert by.loc["infer-bs16", "vs fp32 eager"] == "reference"
    assert by.loc["infer-bs1", "vs fp32 eager"] == "reference"
    assert by.loc["infer-bs16", "tokens/s"] == "12,800"


def test_a_text_run_is_never_divided_by_an_image_runs_throughput(page):
    other = section(page, "other")
    assert "n/a (model resnet50→bert-base, image_size 224→none, seq_len none→128)" in other


def test_without_a_ladder_the_headline_picks_a_training_run(tmp_path):
    """An inference run's samples/s is no training throughput: with no ladder baseline
    the headline's fastest configuration is one of the first training run's workload."""
    recs = [r for r in records() if r["spec"]["group"] in ("transformers", "inference")]
    loaded = rec.load_records(write(tmp_path / "records", recs))
    report.build_report(
        loaded, report.Outputs(tmp_path / "s.csv", tmp_path / "index.html", tmp_path / "p")
    )
    page = (tmp_path / "index.html").read_text()
    assert '<b id="hl-best">bert-ipex</b>' in page


def test_int8_side_by_side_with_what_it_did_to_the_model(tmp_path):
    """Each stack's INT8 run beside fp32 eager: the share of weight layers that ran in
    INT8 and on what, the logits' agreement, the accuracy change of a model the study
    trained; and the headline's inference line per family."""
    digits = {"model": "cnn", "image_size": 32, "data": "digits", "epochs": 2,
              "batch_size": 32, "mode": "inference", "group": "inference-accuracy"}  # fmt: skip
    int8 = {"precision": "int8", **INFER, "batch_size": 1}
    recs = [
        served(trial("infer-bs1", sps=50.0, batch_size=1, **INFER), 1.0),
        served(
            trial(
                "int8-inductor",
                sps=150.0,
                backend="inductor",
                compile="inductor",
                compile_freezing=True,
                **int8,
            ),
            0.9991,
            int8=74,
        ),  # fmt: skip
        served(
            trial("int8-ipex", sps=160.0, backend="ipex", ipex_torchscript=True, **int8),
            0.9989,
            int8=1,
        ),  # fmt: skip
        served(
            trial("digits-fp32", sps=1000.0, **digits), 1.0, layers=5, accuracy=(0.9, 0.9)
        ),  # fmt: skip
        served(
            trial(
                "digits-int8",
                sps=3000.0,
                backend="ipex",
                ipex_torchscript=True,
                precision="int8",
                weights_from="digits-fp32",
                **digits,
            ),
            0.9999,
            int8=5,
            layers=5,
            accuracy=(0.88, 0.9),
        ),  # fmt: skip
    ]
    loaded = rec.load_records(write(tmp_path / "records", recs))
    report.build_report(
        loaded, report.Outputs(tmp_path / "s.csv", tmp_path / "index.html", tmp_path / "p")
    )
    page = (tmp_path / "index.html").read_text()
    speed, computes = html_tables(section(page, "inference"))
    by = speed.set_index("experiment")
    assert by.loc["int8-inductor", "INT8 kernels"] == "100 % of weight layers, AVX512-VNNI"
    # a layer left in fp32 (GPT-2's Conv1D) is no INT8 kernel: the share says so
    assert by.loc["int8-ipex", "INT8 kernels"] == "1 % of weight layers, AVX512-VNNI"
    assert by.loc["infer-bs1", "INT8 kernels"] == ""  # a float run: empty
    assert by.loc["int8-ipex", "vs fp32 eager"] == "3.20× vs infer-bs1" + NO_INTERVAL
    assert by.loc["digits-int8", "vs fp32 eager"] == "3.00× vs digits-fp32" + NO_INTERVAL
    what = computes.set_index("experiment")
    assert what.loc["int8-inductor", "logits vs fp32 eager"] == (
        "cosine 0.999100, largest difference 2.5 % of the largest logit, arg-max agrees 88 %"
    )
    assert what.loc["digits-int8", "held-out accuracy"] == "88.0 % (fp32 eager 90.0 %, -2.0 pts)"
    assert what.loc["digits-int8", "configuration"] == "ipex, int8, TorchScript"
    assert what.loc["int8-inductor", "configuration"] == (
        "inductor, int8, torch.compile(inductor), frozen"
    )
    summary = pd.read_csv(tmp_path / "s.csv").set_index("experiment")
    assert summary.loc["digits-int8", "accuracy_change"] == pytest.approx(-0.02)
    assert summary.loc["int8-ipex", "int8_share"] == pytest.approx(1 / 74)
    head = page[
        page.index('class="headline"') : page.index("</ul>", page.index('class="headline"'))
    ]
    assert "Text (tokens), inference: the fastest served run at batch 1 <b>int8-ipex</b>" in head
    assert (
        "<b>3.20×</b> its fp32 eager run (infer-bs1; " + NO_INTERVAL[2:-1] + "); INT8: 1 % of "
        "weight layers" in head
    )
    assert "Vision (images), inference: the fastest served run at batch 32 <b>digits-int8</b>" in (
        head
    )
    assert "INT8: 100 % of weight layers, AVX512-VNNI, 88.0 % (fp32 eager 90.0 %, -2.0 pts)" in head
