"""The report's view per workload family (``workloads.FAMILIES``: vision, text): one
ladder per family side by side, each run against the plain fp32 eager run of its own
workload (same model, mode, image size or sequence length), in samples/s and, for
text, tokens/s; the headline's line per family; and the inference section (the
forward pass alone: batch-1 latency and throughput)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import pandas as pd

from .. import workloads
from .compare import config_text, differences, is_reference, norm_setting, same_workload
from .formatting import fmt_num, percentile_text
from .html import table_html
from .uncertainty import Comparison, between
from .values import isnan

Section = tuple[str, str, str]

FAMILY_TITLE = {"vision": "Vision (images)", "text": "Text (tokens)"}


def family(row) -> str:
    w = workloads.WORKLOADS.get(str(row.get("model")))
    return w.family if w is not None else "other"


def _inference(row) -> bool:
    return str(row.get("mode")) == "inference"


def _accuracy(row) -> bool:
    return not isnan(row.get("epochs")) and float(row.get("epochs") or 0) > 0


def tokens_per_s(row) -> float:
    """Throughput in tokens: a text model's samples x its real tokens per sample (its
    sequence length, unless dynamically padded)."""
    tokens = row.get("tokens_per_sample")
    if isnan(tokens):
        tokens = row.get("seq_len")
    if family(row) != "text" or isnan(tokens) or isnan(row.get("sps_median")):
        return float("nan")
    return float(row["sps_median"]) * float(tokens)


def gradients_text(row) -> str:
    """The gradient check: the parameter tensors the run's step trained, of all."""
    trained, total = row.get("grad_params_trained"), row.get("grad_params")
    if isnan(total) or isnan(trained):
        return ""
    return f"{int(trained)}/{int(total)}"


def throughput_text(row) -> str:
    """The run's samples/s, or why it has none (no ok trial: ``incorrect`` when its step
    did not train what eager trains, failed, crashed, ...)."""
    if not int(row.get("n_ok") or 0):
        return f"none: {row.get('statuses') or 'no trial'} (see Failures)"
    return fmt_num(row.get("sps_median"))


def shape_text(row) -> str:
    """``bert-base, 128 tokens, batch 16`` / ``resnet50 at 224 px, batch 16``."""
    model = str(row.get("model"))
    if family(row) == "text" and not isnan(row.get("seq_len")):
        dynamic = str(row.get("padding")) == "dynamic"
        model += f", {'up to ' if dynamic else ''}{int(row['seq_len'])} tokens"
        model += ", dynamically padded" if dynamic else ""
    elif not isnan(row.get("image_size")):
        model += f" at {int(row['image_size'])} px"
    if not isnan(row.get("batch_size")):
        model += f", batch {int(row['batch_size'])}"
    return model


def plain_reference(
    stats: pd.DataFrame, row, baseline: str | None, same_batch: bool = False
) -> pd.Series | None:
    """The plain fp32 eager run of ``row``'s workload: one process, no launcher, every
    optimization knob off (``compare.is_reference``); the ladder baseline first, then
    one of the row's batch size. ``same_batch``: only one of its batch size."""
    if not len(stats):
        return None
    plain = [
        r
        for _, r in stats.iterrows()
        if same_workload(r, row)
        and is_reference(r)
        and norm_setting("launcher", r.get("launcher")) in ("", "none")
        and norm_setting("ranks", r.get("ranks")) in ("", "1")
        and (not same_batch or r.get("batch_size") == row.get("batch_size"))
    ]
    if not plain:
        return None
    return min(
        plain,
        key=lambda r: (r["experiment"] != baseline, r.get("batch_size") != row.get("batch_size")),
    )


def against_reference(
    stats: pd.DataFrame, baseline: str | None, rows: pd.DataFrame, same_batch: bool = False
) -> list[tuple[str | None, Comparison | None, list[str]]]:
    """Per row: (its fp32 eager reference's id or None, the comparison with it (ratio,
    interval, verdict; :mod:`uncertainty`), what differs from the reference beyond the
    workload). ``same_batch``: the reference has the row's batch size too (inference:
    latency and throughput depend on it)."""
    out = []
    for _, r in rows.iterrows():
        ref = plain_reference(stats, r, baseline, same_batch)
        if ref is None or isnan(ref.get("sps_median")) or isnan(r.get("sps_median")):
            out.append((None if ref is None else ref["experiment"], None, []))
            continue
        out.append((ref["experiment"], between(ref, r, "reference"), differences(ref, r)))
    return out


def reference_comparisons(stats: pd.DataFrame, baseline: str | None) -> list[Comparison]:
    """Every training and inference run against its fp32 eager reference."""
    found = [c for _, c, _ in against_reference(stats, baseline, training_rows(stats)) if c]
    inference = against_reference(stats, baseline, inference_rows(stats), same_batch=True)
    return found + [c for _, c, _ in inference if c]


def _ratio(c: Comparison | None) -> float:
    return float("nan") if c is None else c.ratio


def _vs_text(ref, c: Comparison | None, diff) -> str:
    if ref is None:
        return "n/a (no fp32 eager run of this workload)"
    if c is None or isnan(c.ratio):
        return f"n/a (vs {ref})"
    return f"{c.ratio:.2f}× vs {ref} ({c.qualifier()})"


def family_table(stats: pd.DataFrame, baseline: str | None, rows: pd.DataFrame, text: bool):
    cells = []
    for (_, r), (ref, c, diff) in zip(
        rows.iterrows(), against_reference(stats, baseline, rows), strict=True
    ):
        row = {
            "experiment": r["experiment"],
            "workload": shape_text(r),
            "configuration": config_text(r),
            "samples/s": throughput_text(r),
            "parameters trained": gradients_text(r),
        }
        if text:
            row["tokens/s"] = fmt_num(tokens_per_s(r))
        row["% of ceiling"] = fmt_num(r.get("pct_of_peak"), 1)
        row["vs fp32 eager"] = _vs_text(ref, c, diff)
        cells.append(row)
    return pd.DataFrame(cells)


def training_rows(stats: pd.DataFrame) -> pd.DataFrame:
    if not len(stats):
        return stats
    keep = [not _inference(r) and not _accuracy(r) for _, r in stats.iterrows()]
    return stats[keep]


def families_section(stats: pd.DataFrame, baseline: str | None) -> Section:
    """One ladder per family, side by side."""
    train = training_rows(stats)
    fams = [f for f in (*workloads.FAMILIES, "other") if (train.apply(family, axis=1) == f).any()]
    if not fams:
        return ("families", "Ladders per workload family", '<p class="empty">No training runs.</p>')
    columns = []
    for fam in fams:
        rows = train[train.apply(family, axis=1) == fam]
        title = FAMILY_TITLE.get(fam, fam)
        columns.append(
            f'<div class="family"><h3>{html.escape(title)}</h3>'
            + table_html(family_table(stats, baseline, rows, fam == "text"))
            + "</div>"
        )
    note = (
        '<p class="note">Every training run (accuracy runs are in Distributed training), '
        "by the family of its model, divided by the plain fp32 eager run of its own "
        "workload (same model, sequence length or image size, mode): a ratio across "
        "models means nothing, so each family has its own reference. Text throughput is "
        "also in tokens/s (samples × real tokens per sample). % of ceiling: the share of "
        "the machine's calibrated dense ceiling (matmul or convolution, same dtype and "
        "threads) the run computed. "
        "Parameters trained: the parameter tensors that got a usable gradient in the first "
        "steps, of all (the gradient check; a run whose step lost some, or whose gradients "
        "are further from fp64 eager's than eager's own at its precision, is "
        "<b>incorrect</b> and has no throughput).</p>"
    )
    return (
        "families",
        "Ladders per workload family",
        note + '<div class="families">' + "".join(columns) + "</div>",
    )


def picked(stats: pd.DataFrame, scored: list) -> tuple[Comparison, pd.Series, Any, int]:
    """The largest ratio of ``scored`` ((comparison, row, reference id) each) and how
    many candidates it was picked from (the references themselves not counted), its
    comparison at the confidence simultaneous over them (``uncertainty.between``): the
    fastest of k is not tested as if it were the only one."""
    c, row, ref = max(scored, key=lambda s: s[0].ratio)
    k = max(1, sum(1 for _, r, f in scored if r["experiment"] != f))
    base = stats[stats["experiment"] == ref]
    if k > 1 and row["experiment"] != ref and len(base):
        c = between(base.iloc[0], row, c.kind, candidates=k)
    return c, row, ref, k


def family_picks(stats: pd.DataFrame, baseline: str | None, diverging: Sequence[str]) -> list:
    """Per family, its fastest training run against its own fp32 eager run (diverging
    runs left out): (family, comparison, the run's row, the fp32 eager run's id, the
    number of candidates it is the fastest of: :func:`picked`)."""
    train = training_rows(stats)
    picks = []
    for fam in workloads.FAMILIES:
        rows = train[train.apply(family, axis=1) == fam] if len(train) else train
        rows = rows[~rows["experiment"].isin(list(diverging))] if len(rows) else rows
        scored = [
            (c, r, ref)
            for (_, r), (ref, c, _) in zip(
                rows.iterrows(), against_reference(stats, baseline, rows), strict=True
            )
            if not isnan(_ratio(c))
        ]
        if scored:
            picks.append((fam, *picked(stats, scored)))
    return picks


def family_lines(picks: list) -> list[str]:
    """The headline's line per family: its fastest training run against its own fp32
    eager run (``picks``: :func:`family_picks`)."""
    lines = []
    for fam, c, best, ref, k in picks:
        tokens = tokens_per_s(best)
        rate = f"{fmt_num(best['sps_median'])} samples/s"
        if not isnan(tokens):
            rate += f", {fmt_num(tokens)} tokens/s"
        lines.append(
            f"{html.escape(FAMILY_TITLE[fam])}: the fastest training run is "
            f"<b>{html.escape(str(best['experiment']))}</b> "
            f"({html.escape(shape_text(best))}; {html.escape(config_text(best))}) at {rate}, "
            f"<b>{c.ratio:.2f}×</b> its fp32 eager run ({html.escape(str(ref))}; "
            f"{html.escape(c.qualifier(k))})."
        )
    return lines


def inference_rows(stats: pd.DataFrame) -> pd.DataFrame:
    if not len(stats):
        return stats
    return stats[[_inference(r) for _, r in stats.iterrows()]]


def _ms(value) -> float:
    return float("nan") if isnan(value) else float(value) * 1000.0


def inference_table(stats: pd.DataFrame, baseline: str | None) -> pd.DataFrame:
    rows = inference_rows(stats)
    cells = []
    for (_, r), (ref, c, _diff) in zip(
        rows.iterrows(), against_reference(stats, baseline, rows, same_batch=True), strict=True
    ):
        batch1 = not isnan(r.get("batch_size")) and int(r["batch_size"]) == 1
        latency = {
            f"latency {name} (ms)": percentile_text(_ms(r.get(col)), name, r, 2)
            if batch1
            else "n/a (batch > 1)"
            for name, col in (
                ("p50", "step_time_median_s"),
                ("p90", "step_time_p90_s"),
                ("p99", "step_time_p99_s"),
            )
        }
        cells.append(
            {
                "experiment": r["experiment"],
                "workload": shape_text(r),
                "configuration": config_text(r),
                **latency,
                "samples/s": fmt_num(r.get("sps_median")),
                "tokens/s": fmt_num(tokens_per_s(r)) if family(r) == "text" else "",
                "% of ceiling": fmt_num(r.get("pct_of_peak"), 1),
                "INT8 kernels": int8_text(r),
                "vs fp32 eager": _vs_text(ref, c, _diff)
                if ref is None or ref != r["experiment"]
                else "reference",
            }
        )
    return pd.DataFrame(cells)


def int8_text(row) -> str:
    """An INT8 run's kernels: the share of the model's weight layers oneDNN ran in INT8,
    and the CPU feature they ran on; empty for a float run."""
    if str(row.get("precision")) != "int8":
        return ""
    share = row.get("int8_share")
    if isnan(share):
        return "n/a (not recorded)"
    isa = row.get("int8_isa")
    isa = f", {isa}" if isinstance(isa, str) and isa else ""
    return f"{100 * float(share):.0f} % of weight layers{isa}"


def agreement_text(row) -> str:
    """The served model's logits against the fp32 eager model's on the same batch."""
    cos = row.get("logits_cosine")
    if isnan(cos):
        return "n/a"
    text = f"cosine {float(cos):.6f}"
    rel = row.get("logits_rel_diff")
    if not isnan(rel):
        text += f", largest difference {100 * float(rel):.2g} % of the largest logit"
    top1 = row.get("top1_agreement")
    if not isnan(top1):
        text += f", arg-max agrees {100 * float(top1):.0f} %"
    return text


def accuracy_text(row) -> str:
    """A served model's held-out accuracy against the same weights' in fp32 eager."""
    served, reference = row.get("test_accuracy"), row.get("reference_accuracy")
    if isnan(served) or isnan(reference):
        return ""
    change = 100 * (float(served) - float(reference))
    return (
        f"{100 * float(served):.1f} % (fp32 eager {100 * float(reference):.1f} %, "
        f"{change:+.1f} pts)"
    )


def served_table(stats: pd.DataFrame) -> pd.DataFrame:
    """What each served model computes against the fp32 eager model it came from: its
    INT8 kernels, its logits' agreement, and (a model the run trained) its held-out
    accuracy."""
    rows = inference_rows(stats)
    cells = [
        {
            "experiment": r["experiment"],
            "workload": shape_text(r),
            "configuration": config_text(r),
            "INT8 kernels": int8_text(r),
            "logits vs fp32 eager": agreement_text(r),
            "held-out accuracy": accuracy_text(r),
        }
        for _, r in rows.iterrows()
        if not isnan(r.get("logits_cosine"))
    ]
    return pd.DataFrame(cells)


def inference_picks(stats: pd.DataFrame, baseline: str | None) -> list:
    """Per family, the fastest served run at batch 1 and at the largest batch, each
    against its fp32 eager run of the same model and batch: (family, batch, comparison,
    the run's row, the fp32 eager run's id, the number of candidates at that batch it
    is the fastest of: :func:`picked`)."""
    rows = inference_rows(stats)
    picks = []
    for fam in workloads.FAMILIES:
        mine = rows[rows.apply(family, axis=1) == fam] if len(rows) else rows
        if not len(mine):
            continue
        speed = mine[[not _accuracy(r) for _, r in mine.iterrows()]]
        mine = speed if len(speed) else mine  # the accuracy runs' models only where alone
        scored = [
            (c, r, ref)
            for (_, r), (ref, c, _) in zip(
                mine.iterrows(), against_reference(stats, baseline, mine, True), strict=True
            )
            if not isnan(_ratio(c)) and not isnan(r.get("batch_size"))
        ]
        batches = sorted({int(r["batch_size"]) for _, r, _ in scored})
        for batch in dict.fromkeys([b for b in batches if b == 1] + batches[-1:]):
            at = [s for s in scored if int(s[1]["batch_size"]) == batch]
            picks.append((fam, batch, *picked(stats, at)))
    return picks


def inference_lines(picks: list) -> list[str]:
    """The headline's lines for inference, per family: the fastest served run at batch 1
    (its p50 latency) and at the largest batch (its throughput), each against its fp32
    eager run of the same model and batch (``picks``: :func:`inference_picks`); an INT8
    winner with what it did to the logits or the accuracy."""
    lines = []
    for fam in workloads.FAMILIES:
        parts = []
        for _, batch, c, best, ref, k in (p for p in picks if p[0] == fam):
            if batch == 1:
                rate = f"p50 {fmt_num(_ms(best.get('step_time_median_s')))} ms"
            else:
                rate = f"{fmt_num(best['sps_median'])} samples/s"
            extra = ""
            if str(best.get("precision")) == "int8":
                said = accuracy_text(best) or agreement_text(best)
                extra = f"; INT8: {html.escape(int8_text(best))}, {html.escape(said)}"
            parts.append(
                f"at batch {batch} <b>{html.escape(str(best['experiment']))}</b> "
                f"({html.escape(shape_text(best))}; {html.escape(config_text(best))}), {rate}, "
                f"<b>{c.ratio:.2f}×</b> its fp32 eager run "
                f"({html.escape(str(ref))}; {html.escape(c.qualifier(k))}){extra}"
            )
        if parts:
            lines.append(
                f"{html.escape(FAMILY_TITLE[fam])}, inference: the fastest served run "
                + "; ".join(parts)
                + "."
            )
    return lines


def inference_section(stats: pd.DataFrame, baseline: str | None) -> Section:
    table = inference_table(stats, baseline)
    if not len(table):
        return (
            "inference",
            "Inference",
            '<p class="empty">No inference runs (mode: inference).</p>',
        )
    note = (
        '<p class="note">The forward pass alone, in eval mode under torch.inference_mode, '
        "one process. At batch 1 the step time is the latency (p50: the median; p90 needs "
        "10 timed steps, p99 100: the default study times 100 at batch 1, fewer where they "
        "would take over its time budget); a larger batch gives the throughput. Each run "
        "is divided by the "
        "fp32 eager inference run of the same model and batch. INT8 kernels: the share of "
        "the model's weight layers (linear, convolution) that oneDNN ran with 8-bit "
        "weights, and the CPU feature its kernels name (VNNI, AMX; a kernel outside "
        "oneDNN is not seen, so a layer the quantizer left in fp32 lowers the share).</p>"
    )
    served = served_table(stats)
    if len(served):
        note_served = (
            '<h3>What the served model computes</h3><p class="note">Each served model '
            "against the fp32 eager model it was made from (the same weights): the cosine "
            "of their logits on the run's first batch, their largest difference against the "
            "largest fp32 logit, and how often their arg-max agrees; "
            "for a model the run trained first (digits, keywords), its accuracy on the "
            "held-out split, served and in fp32 eager. INT8: static post-training "
            "quantization calibrated on 4 batches of the run's own data (IPEX: "
            "ipex.quantization, TorchScript; upstream: PT2E with X86InductorQuantizer, "
            "inductor with freezing).</p>"
        )
        return (
            "inference",
            "Inference",
            note + table_html(table) + note_served + table_html(served),
        )
    return ("inference", "Inference", note + table_html(table))
