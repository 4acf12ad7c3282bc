"""HTML building blocks: tables and their display frames, plot captions and figures,
the stylesheet and the page around the sections."""

from __future__ import annotations

import dataclasses
import html
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ..plan.order import PROVISIONAL
from ..spec.fields import labels
from ..summary import results
from .compare import config_text
from .figures import inline_svg
from .formatting import (
    fmt_cv,
    fmt_int,
    fmt_num,
    fmt_speedup,
    fmt_spread,
    fmt_text,
    percentile_text,
    steps_text,
    trials_text,
    used_count,
)
from .stats import incorrect, left_out, trial_counts
from .uncertainty import Comparison, compared_cell
from .values import isnan

# The settings' column names are the fields' report labels (spec/fields.py).
LABEL = labels()

CAPTIONS_DIR = Path(__file__).parent.parent / "captions"


def caption(name: str, **values) -> str:
    """A section's prose from the captions folder (``captions/<name>``), its
    named fields filled from ``values`` (numbers and escaped text)."""
    return (CAPTIONS_DIR / name).read_text().format(**values)


def group_note(sub: pd.DataFrame, baseline: str | None) -> str:
    if not len(sub):
        return ""
    first = html.escape(str(sub["group_baseline"].iloc[0]))
    base = html.escape(str(baseline)) if baseline else "none"
    return (
        f'<p class="note">"speedup vs baseline" is relative to the ladder baseline ({base}); '
        f'"vs first in group" to this group\'s first experiment ({first}), naming what '
        "else differs; a ratio between different models or image sizes means nothing, "
        "and reads n/a.</p>"
    )


def table_html(df: pd.DataFrame, css: str = "") -> str:
    if not len(df):
        return '<p class="empty">No rows.</p>'
    classes = ["data"] + ([css] if css else [])
    table = df.to_html(index=False, escape=True, na_rep="", classes=classes, border=0)
    return f'<div class="wide">{table}</div>'


def _steps_cells(r) -> dict[str, str]:

    return {
        "timed steps": steps_text(r),
        "step median (s)": fmt_num(r["step_time_median_s"], 3),
        "step p90 (s)": percentile_text(r["step_time_p90_s"], "p90", r),
        "step p99 (s)": percentile_text(r["step_time_p99_s"], "p99", r),
    }


def _step_cell(r) -> str:
    parent = r.get("step_parent")
    if parent is None or isnan(parent):
        return "—"
    compared = r.get("step_compared")
    stated = isinstance(compared, Comparison) and not isnan(compared.ratio)
    # (with its interval: the comparison's ratio, the statistic the interval bounds)
    speed = fmt_speedup(compared.ratio if stated else r.get("step_speedup")) or "n/a"
    text = f"{speed} over {parent}: {r.get('step_change')}"
    if stated:
        text += f" ({compared.qualifier()})"
    return text


def _compared_cell(r) -> str:
    """The speedup over the baseline with its interval and verdict (uncertainty.py)."""
    return compared_cell(r, "compared", "speedup")


def ladder_display(ladder: pd.DataFrame) -> pd.DataFrame:

    rows = []
    for _, r in ladder.iterrows():
        rows.append(
            {
                "experiment": r["experiment"],
                "configuration": config_text(r),
                "in effect (checked)": fmt_text(r.get("in_effect")),
                "ok trials": trials_text(r),
                "samples/s": fmt_spread(r["sps_median"], r["sps_min"], r["sps_max"], used_count(r)),
                "speedup": _compared_cell(r),
                "over the step it builds on": _step_cell(r),
                "article's claim": fmt_speedup(r["claim_speedup"]),
                "CV over trials": fmt_cv(r["sps_cv"]) or "n/a (1 trial)",
                "step-time CV within a trial": fmt_cv(r.get("step_time_cv")) or "n/a",
                **_steps_cells(r),
            }
        )
    return pd.DataFrame(rows)


def generic_display(stats: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, r in stats.iterrows():
        rows.append(
            {
                "experiment": r["experiment"],
                LABEL["backend"]: fmt_text(r["backend"]),
                LABEL["model"]: fmt_text(r["model"]),
                LABEL["data"]: fmt_text(r["data"]),
                LABEL["precision"]: fmt_text(r["precision"]),
                LABEL["batch_size"]: fmt_int(r["batch_size"]),
                LABEL["num_workers"]: fmt_int(r["num_workers"]),
                LABEL["threads"]: fmt_int(r["threads"]),
                "ok trials": trials_text(r),
                "samples/s": fmt_spread(r["sps_median"], r["sps_min"], r["sps_max"], used_count(r)),
                "CV over trials": fmt_cv(r["sps_cv"]) or "n/a (1 trial)",
                "step-time CV within a trial": fmt_cv(r.get("step_time_cv")) or "n/a",
                "speedup vs baseline": r.get("speedup_text", fmt_speedup(r.get("speedup"))),
                "vs first in group": r.get("group_text", fmt_speedup(r.get("group_speedup"))),
                "timed steps": _steps_cells(r)["timed steps"],
                "step median (s)": fmt_num(r["step_time_median_s"], 3),
                "first step (s)": fmt_num(r["time_to_first_step_s"], 2),
                "peak RSS (MB)": fmt_num(r["peak_rss_mb"], 0),
                **declared_cells(r),
            }
        )
    return pd.DataFrame(rows)


def declared_cells(r: pd.Series) -> dict[str, str]:
    """The figures summary/results.py gives a report label: their statistic, with its unit."""
    cells = {}
    for result in results.labelled():
        value = r.get(result.name)
        unit = f" ({result.unit})" if result.unit else ""
        cells[result.label + unit] = fmt_text(value) if result.text else fmt_num(value)
    return cells


def ceiling_display(roof: pd.DataFrame) -> pd.DataFrame:
    pct = [
        f"n/a: {err}" if err else fmt_num(v, 1)
        for v, err in zip(roof["pct_of_peak"], roof["measurement_error"])
    ]
    return pd.DataFrame(
        {
            "experiment": roof["experiment"],
            "dtype": roof["dtype"],
            "GFLOP per sample": [fmt_num(v / 1e9, 3) for v in roof["flops_per_sample"]],
            "samples/s": [fmt_num(v) for v in roof["samples_per_s"]],
            "achieved GFLOP/s": [fmt_num(v) for v in roof["achieved_gflops"]],
            "ceiling GFLOP/s (same dtype)": [fmt_num(v) for v in roof["peak_gflops"]],
            "ceiling from": roof["ceiling_source"],
            "% of the ceiling": pct,
        }
    )


def caption_text(name: str) -> str:
    """The plot's caption file as plain text (reST literals and roles stripped)."""
    path = CAPTIONS_DIR / f"{name}.rst"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return ""
    text = re.sub(r":\w+:`([^`]*)`", r"\1", text)
    text = text.replace("``", "").replace("`", "").replace("*", "")
    return " ".join(text.split())


def figure_html(name: str, svg: str) -> str:
    cap = caption_text(name)
    caption = f"<figcaption>{html.escape(cap)}</figcaption>" if cap else ""
    return f'<figure id="fig-{name}">{inline_svg(svg, name)}{caption}</figure>'


CSS = """
body{font-family:-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
 color:#222;max-width:1200px;margin:2em auto;padding:0 1.5em;line-height:1.45}
h1{font-size:1.7em;margin-bottom:.2em}h2{margin-top:2em;border-bottom:1px solid #ddd;
 padding-bottom:.2em}h3{margin-bottom:.3em}
nav ol{columns:3;font-size:.95em}
.headline{background:#f2f7fc;border:1px solid #c9dcef;border-radius:6px;padding:.8em 1.2em;
 margin:1em 0 1.5em}
.headline .lead{font-size:1.15em;margin:.2em 0 .6em}.headline ul{margin:.2em 0;padding-left:1.2em}
.headline li{margin:.25em 0}
table.data{border-collapse:collapse;font-size:.85em;margin:.6em 0 1.2em}
table.data th,table.data td{border:1px solid #ddd;padding:3px 7px;text-align:left;
 vertical-align:top}
table.data thead th{background:#f3f5f7;position:sticky;top:0}
table.data tbody tr:nth-child(even){background:#fafafa}
table.kv th{width:14em}
.scroll{overflow:auto;max-height:70vh;border:1px solid #ddd}.wide{overflow-x:auto}
.families{display:flex;flex-wrap:wrap;gap:1.5em}.family{flex:1 1 100%;min-width:0}
.scroll table.data{margin:0;white-space:nowrap}
figure{margin:1em 0}figure svg{display:block}figcaption{font-size:.9em;color:#555;max-width:70em}
pre{background:#f6f8fa;border:1px solid #e1e4e8;padding:.6em;overflow:auto;max-height:24em;
 font-size:.8em;white-space:pre-wrap}
.note{color:#555;font-size:.9em}.warn{color:#8a4b00}.fail h3{color:#b00020;font-size:1em}
.counts b{font-size:1.1em}.empty{color:#777;font-style:italic}
"""

HOW_TO_READ = (
    "Each experiment trains a model for a number of timed steps after a warm-up (or, for "
    "the accuracy runs, a number of epochs) and reports throughput in samples per second "
    "(higher is better); a time budget may stop the timed steps early, and the tables say "
    "where it did. When an experiment ran several trials the report shows the median, "
    "with the min–max spread in parentheses and the coefficient of variation over the "
    "trials (CV: standard deviation / mean), over the trials not marked noisy (see "
    "Measurement noise); the step-time CV within a trial is shown beside it. Speedups are "
    "ratios of median throughput to the baseline experiment ({baseline}), and only "
    "between runs of the same model and image size; each ladder step is also compared "
    "with the step it builds on, naming what differs. The article's claimed speedups "
    "were measured on a different, much larger machine, so compare the direction and "
    "rough size of each step rather than absolute numbers; results here depend on this "
    "machine's CPU, core count and ISA extensions (listed below). Failed trials are "
    "listed near the end with their errors."
)


def baseline_label(baseline: str | None) -> str:
    return baseline if baseline is not None else "none found"


@dataclasses.dataclass(frozen=True)
class Page:
    """What the page shows besides its counts: its title, the run's baseline, the
    sections, each an (id, heading, HTML content) triple, the headline, the run's
    provenance, the sweeps this preset did not run and the experiments a budget's plan
    left out (its HTML list: ``headline.left_out_by_plan``)."""

    title: str
    baseline: str | None
    sections: Sequence[tuple[str, str, str]]
    headline: str = ""
    provenance: str = ""
    not_run: Sequence[str] = ()
    left_out: str = ""

    @property
    def provisional(self) -> bool:
        """A report of the trials so far while the study goes on (rules/common.smk's
        round and stage titles): what has not run may run yet."""
        return self.title.startswith(PROVISIONAL)


def page_html(page: Page, frame: pd.DataFrame, n_experiments: int) -> str:
    """The whole page: title, the headline, contents, what was not run, how to read,
    counts (of the trials in ``frame``, of ``n_experiments``), provenance, and the
    sections."""
    title, baseline, sections, not_run = page.title, page.baseline, page.sections, page.not_run
    headline, provenance = page.headline, page.provenance
    n, n_ok, n_failed = trial_counts(frame)
    n_left = left_out(frame)
    left = f", <b>{n_left}</b> left out by the budget's clock" if n_left else ""
    n_incorrect = incorrect(frame)
    wrong = f", <b>{n_incorrect}</b> incorrect" if n_incorrect else ""
    status_counts = frame["status"].value_counts(sort=False)
    counts = ", ".join(f"{k}: {v}" for k, v in status_counts.items())
    nav = "".join(
        f'<li><a href="#{sid}">{html.escape(heading)}</a></li>' for sid, heading, _ in sections
    )
    nav += '<li><a href="#provenance">Run provenance</a></li>'
    body = "\n".join(
        f'<section id="{sid}"><h2>{html.escape(heading)}</h2>\n{content}</section>'
        for sid, heading, content in sections
    )
    how = HOW_TO_READ.format(baseline=html.escape(str(baseline_label(baseline))))
    # (a provisional report's: the study goes on, and may run them yet)
    not_yet = "Not run yet" if page.provisional else "Not run in this preset"
    skipped = (
        f'<p class="note" id="not-run">{not_yet}: {html.escape(", ".join(not_run))}.</p>'
        if not_run
        else ""
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{CSS}</style>
</head>
<body>
<header>
<h1>{html.escape(title)}</h1>
{headline}
<nav><ol>{nav}</ol></nav>
{skipped}{page.left_out}
<p>{how}</p>
<p class="counts"><b>{n}</b> trials of <b>{n_experiments}</b> experiments: <b>{n_ok}</b> ok{wrong},
<b>{n_failed}</b> failed{left} ({html.escape(counts) if n else "none"}).</p>
</header>
{body}
<section id="provenance"><h2>Run provenance</h2>
{provenance}</section>
</body>
</html>
"""
