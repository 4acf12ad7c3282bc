"""Fast tests for workflow_scripts.summary.records and workflow_scripts.report (no torch)."""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest
import scipy.stats

from tests.fixture_records import headline_text, html_tables, left_out_by_budget, make, write
from workflow_scripts import report
from workflow_scripts.report import html
from workflow_scripts.report.distributed import process_group
from workflow_scripts.summary import records as rec

REPO = Path(__file__).resolve().parents[1]

PLOTS = ("ladder", "batch_size", "num_workers", "threads", "backends", "ceiling")
FIRST_COLUMNS = [
    "experiment",
    "trial",
    "backend",
    "status",
    "samples_per_s",
    "step_time_median_s",
    "step_time_p90_s",
    "step_time_p95_s",
    "step_time_p99_s",
    "step_time_stdev_s",
    "step_time_mean_s",
    "time_to_first_step_s",
    "setup_s",
    "peak_rss_mb",
    "final_loss",
    "threads",
    "precision",
]

FAIL_TAIL = 'Traceback:\n  x = a < b && c > d\nRuntimeError: "bad" <script>alert(1)</script>'


def sample_records():
    return [
        make("baseline", 0, 10.0),
        make("baseline", 1, 12.0),
        make("bf16", 0, 22.0, precision="bf16", claim_speedup=2.3),
        make("bf16-cl", 0, 33.0, precision="bf16", channels_last=True, claim_speedup=4.16),
        make("bs8", 0, 9.0, group="batch_size", batch_size=8, threads=1),
        make("bs32", 0, 14.0, group="batch_size", batch_size=32),
        make("compiled", 0, 40.0, group="backends", backend="inductor", compile="inductor"),
        make(
            "ipex-bf16",
            0,
            None,
            status="failed",
            error={"type": "RuntimeError", "message": "boom & <fail>", "tail": FAIL_TAIL},
            group="backends",
            backend="ipex",
            env="ipex",
        ),
        make(
            "xla",
            0,
            None,
            status="crashed",
            error={"type": "Signal", "message": "killed", "tail": "SIGKILL <oom> & 'x'"},
            group="backends",
            backend="xla",
            env="xla",
        ),
        # partial: no metrics and no provenance at all
        {"experiment": "partial", "trial": 0, "spec": {"id": "partial", "group": "data"}},
    ]


def write_records(tmp_path, records):
    paths = write(tmp_path, records)
    bad = tmp_path / "records" / "corrupt" / "trial3.json"
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_text('{"experiment": "corrupt", "metrics": {"samples_per_s": 1')
    paths.append(bad)
    return paths


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    paths = write_records(tmp, sample_records())
    records = rec.load_records(paths)
    prices = [{"name": "c7i.2xlarge", "usd_per_hour": 0.357, "note": "on-demand <us-east-1>"}]
    out = report.build_report(
        records,
        report.Outputs(tmp / "summary.csv", tmp / "report" / "index.html", tmp / "report"),
        report.Options(prices=prices, title="Test <report>"),
    )
    html_text = (tmp / "report" / "index.html").read_text()
    return tmp, records, out, html_text


def test_load_records_corrupt_becomes_crashed(tmp_path):
    paths = write_records(tmp_path, sample_records()[:1])
    paths.append(tmp_path / "missing" / "trial0.json")
    records = rec.load_records(paths)
    assert len(records) == 3
    assert records[0]["status"] == "ok"
    bad = records[1]
    assert bad["status"] == "crashed"
    assert bad["experiment"] == "corrupt" and bad["trial"] == 3
    assert "unreadable" in bad["error"]["message"]
    assert "samples_per_s" in bad["error"]["tail"]
    assert records[2]["status"] == "crashed" and records[2]["experiment"] == "missing"


def test_flatten_columns_and_values():
    row = rec.flatten(make("bf16-cl", 2, 33.0, precision="bf16", channels_last=True))
    assert list(row) == rec.COLUMNS
    assert rec.COLUMNS[: len(FIRST_COLUMNS)] == FIRST_COLUMNS
    assert rec.COLUMNS[-2:] == ["error_type", "error"]
    assert row["trial"] == 2
    assert row["samples_per_s"] == 33.0
    assert row["step_time_median_s"] == pytest.approx(16 / 33)
    assert row["threads"] == 2  # spec threads null -> torch_num_threads
    assert row["omp_num_threads"] == "2"
    assert row["kmp_affinity"] is None
    assert row["ld_preload"] == "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"
    assert row["cpu_flags"] == "avx512f avx512_bf16 avx512_vnni"
    assert row["torch_version"] == "2.14.1+cu130"
    assert row["ipex_version"] is None
    assert row["channels_last"] is True
    assert "unknown_extra" not in row and "unknown_metric" not in row


def test_flatten_threads_prefers_spec():
    assert rec.flatten(make("t1", threads=1))["threads"] == 1


def test_flatten_never_crashes_on_junk():
    for junk in ({}, {"metrics": None, "spec": [], "provenance": "x"}, {"error": "plain"}):
        row = rec.flatten(junk)
        assert list(row) == rec.COLUMNS
        assert math.isnan(row["samples_per_s"])
    assert rec.flatten({"error": "plain"})["error"] == "plain"
    assert rec.flatten({})["status"] == "crashed"


def test_error_keeps_message_and_tail():
    r = make("x", sps=None, status="failed", error={"type": "E", "message": "m", "tail": "a\nb"})
    row = rec.flatten(r)
    assert row["error_type"] == "E"
    assert row["error"] == "m\na\nb"


def test_summary_csv(built):
    tmp, _, out, _ = built
    df = pd.read_csv(tmp / "summary.csv")
    assert list(df.columns) == rec.COLUMNS
    assert list(df.columns[: len(FIRST_COLUMNS)]) == FIRST_COLUMNS
    assert len(df) == 11  # nothing dropped, incl. the corrupt file
    assert list(df["experiment"])[:4] == ["baseline", "baseline", "bf16", "bf16-cl"]
    bs8 = df[df["experiment"] == "bs8"].iloc[0]
    assert bs8["threads"] == 1 and bs8["batch_size"] == 8
    assert df[df["experiment"] == "bs32"].iloc[0]["threads"] == 2
    failed = df[df["experiment"] == "ipex-bf16"].iloc[0]
    assert failed["status"] == "failed"
    assert math.isnan(failed["samples_per_s"]) and math.isnan(failed["step_time_p99_s"])
    assert failed["error_type"] == "RuntimeError"
    assert "<script>" in failed["error"]
    partial = df[df["experiment"] == "partial"].iloc[0]
    assert partial["status"] == "crashed" and math.isnan(partial["samples_per_s"])
    corrupt = df[df["experiment"] == "corrupt"].iloc[0]
    assert corrupt["status"] == "crashed" and corrupt["error_type"] == rec.UNREADABLE
    assert out == {"trials": 11, "ok": 7, "failed": 4, "incorrect": 0, "left_out": 0,
                   "baseline": "baseline"}  # fmt: skip
    header, first = (tmp / "summary.csv").read_text().splitlines()[:2]
    assert header.startswith(",".join(FIRST_COLUMNS) + ",")
    assert first.startswith("baseline,0,eager,ok,10.0,")  # whole numbers stay integers


def test_summary_frame_empty():
    df = rec.summary_frame([])
    assert list(df.columns) == rec.COLUMNS and len(df) == 0


def test_speedups_vs_baseline(built):
    _, records, _, _ = built
    stats = report.stats.experiment_stats(rec.summary_frame(records))
    base = stats.set_index("experiment").loc["baseline"]
    assert base["n_trials"] == 2 and base["n_ok"] == 2
    assert base["sps_median"] == 11.0 and base["sps_min"] == 10.0 and base["sps_max"] == 12.0
    assert report.stats.pick_baseline(stats) == "baseline"
    ladder = report.stats.ladder_frame(stats, "baseline").set_index("experiment")
    assert list(ladder.index) == ["baseline", "bf16", "bf16-cl"]
    assert ladder.loc["baseline", "speedup"] == pytest.approx(1.0)
    assert ladder.loc["baseline", "speedup_min"] == pytest.approx(10 / 11)
    assert ladder.loc["baseline", "speedup_max"] == pytest.approx(12 / 11)
    assert ladder.loc["bf16", "speedup"] == pytest.approx(2.0)
    assert ladder.loc["bf16-cl", "speedup"] == pytest.approx(3.0)
    assert ladder.loc["bf16-cl", "claim_speedup"] == pytest.approx(4.16)

    backends = report.stats.backend_frame(stats, "baseline").set_index("backend")
    assert list(backends.index) == ["eager", "inductor", "ipex", "xla"]
    assert backends.loc["eager", "experiment"] == "bf16-cl"
    assert backends.loc["inductor", "speedup"] == pytest.approx(40 / 11)
    assert pd.isna(backends.loc["ipex", "experiment"])

    grouped = report.stats.with_group_speedup(stats).set_index("experiment")
    assert grouped.loc["bs32", "group_baseline"] == "bs8"
    assert grouped.loc["bs32", "group_speedup"] == pytest.approx(14 / 9)
    assert grouped.loc["bf16", "group_speedup"] == pytest.approx(2.0)
    # the backends group's first experiment succeeded; its failed members get NaN
    assert grouped.loc["compiled", "group_speedup"] == pytest.approx(1.0)
    assert math.isnan(grouped.loc["ipex-bf16", "group_speedup"])

    costs = report.stats.cost_frame(
        stats, "baseline", report.stats.parse_prices('[{"name":"a","usd_per_hour":2}]')
    )
    assert costs.loc[0, "baseline_samples_per_usd"] == pytest.approx(11 * 3600 / 2)
    assert costs.loc[0, "best"] == "compiled"
    assert costs.loc[0, "best_samples_per_usd"] == pytest.approx(40 * 3600 / 2)


def test_baseline_falls_back_to_first_ladder_experiment():
    frame = rec.summary_frame([make("fp32", sps=5.0), make("bf16", sps=10.0)])
    stats = report.stats.experiment_stats(frame)
    assert report.stats.pick_baseline(stats) == "fp32"
    ladder = report.stats.ladder_frame(stats, "fp32")
    assert list(ladder["speedup"]) == pytest.approx([1.0, 2.0])


def test_html_content(built):
    _, records, _, html_text = built
    assert "Test &lt;report&gt;" in html_text
    order = [
        'class="headline"',
        'id="ladder"',
        'id="cost"',
        'id="backends"',
        'id="correctness"',
        'id="startup"',
        'id="batch_size"',
        'id="ceiling"',
        'id="noise"',
        'id="other"',
        'id="failures"',
        'id="summary"',
        'id="provenance"',
    ]
    positions = [html_text.index(marker) for marker in order]
    assert positions == sorted(positions)
    # sweeps this run did not have: one line, no section, no figure
    assert 'id="num_workers"' not in html_text and 'id="threads"' not in html_text
    assert "Not run in this preset: dataloader workers sweep, threads sweep." in html_text
    # in a provisional report (a round's or a stage's, while the study goes on): not yet
    page = html.Page("Provisional report: the first trial of x", "baseline", [], not_run=["x"])
    provisional = html.page_html(page, rec.summary_frame(records), 1)
    assert "Not run yet: x." in provisional and "in this preset" not in provisional
    assert "AMD EPYC 9R14" in html_text and "avx512_bf16" in html_text
    assert "abc123" in html_text and "2.14.1+cu130" in html_text
    # ladder table: speedup with spread for 2 trials, claim
    assert "11.0 (10.0–12.0)" in html_text
    assert "2.00×" in html_text and "3.00×" in html_text and "4.16×" in html_text
    # cost: $0.357/hour / (11 samples/s * 3600) * 1e6 = $9.02 per million samples
    assert f"${0.357 / (11 * 3600) * 1e6:,.2f}" == "$9.02"
    assert "$9.02" in html_text
    assert "on-demand &lt;us-east-1&gt;" in html_text
    # failures section lists failed ids with escaped tails
    failures = html_text[html_text.index('id="failures"') : html_text.index('id="summary"')]
    for name in ("ipex-bf16", "xla", "partial", "corrupt"):
        assert name in failures
    assert "<script>" not in html_text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in failures
    assert "a &lt; b &amp;&amp; c &gt; d" in failures
    assert "SIGKILL &lt;oom&gt; &amp;" in failures
    assert re.search(r"<pre>[^<]*&lt;script&gt;", failures)
    # other groups
    other = html_text[html_text.index('id="other"') : html_text.index('id="failures"')]
    assert "compiled" in other and "partial" in other
    # the inline SVG figures: the plots with data (no empty sweeps) and the extra ones
    figures = re.findall(r'<figure id="fig-([a-z_]+)"', html_text)
    assert figures == ["ladder", "backends", "losses", "startup", "batch_size"]
    assert html_text.count("<svg") == len(figures)


def test_html_self_contained(built):
    _, _, _, html_text = built
    assert not re.search(r"https?://", html_text)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html_text)
    assert "<link" not in html_text and "<script" not in html_text
    assert "@import" not in html_text


def test_plots_exist_and_are_svg(built):
    tmp, _, _, _ = built
    for name in PLOTS:
        path = tmp / "report" / f"{name}.svg"
        assert path.is_file()
        root = ET.parse(path).getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
    # num_workers and threads were not run in this set; their files still exist
    assert "not run in this preset" in (tmp / "report" / "threads.svg").read_text()
    assert "no successful trials" not in (tmp / "report" / "ladder.svg").read_text()


def test_ladder_labels_stay_on_their_bars(tmp_path, monkeypatch):
    """A long label (a step over a long-named parent) on a bar too short to hold it goes
    after the bar: no label runs off its bar's start into the experiment names."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from workflow_scripts.report import figures

    drawn = []
    save = figures.save_svg
    monkeypatch.setattr(figures, "save_svg", lambda fig, path: drawn.append(fig) or save(fig, path))
    ladder = pd.DataFrame({
        "experiment": ["baseline", "ipex-optimize-fp32", "ipex-optimize-bf16-cl", "fast"],
        "speedup": [1.0, 1.19, 2.30, 4.0], "speedup_min": [1.0, 1.1, 2.2, 3.9],
        "speedup_max": [1.0, 1.2, 2.4, 4.1], "claim_speedup": [math.nan, math.nan, 4.46, math.nan],
        "step_parent": [None, "baseline", "ipex-optimize-fp32", "baseline"],
        "step_speedup": [math.nan, 1.19, 1.94, 4.0],
    })  # fmt: skip
    figures.plot_ladder(ladder, tmp_path / "ladder.svg", baseline="baseline")
    (fig,) = drawn
    ax = fig.axes[0]
    renderer = FigureCanvasAgg(fig).get_renderer()  # (closed: its canvas is gone)
    start = ax.transData.transform((0, 0))[0]
    labels = {t.get_text(): t.get_window_extent(renderer) for t in ax.texts}
    long = next(k for k in labels if "over ipex-optimize-fp32" in k)
    assert all(box.x0 >= start for box in labels.values()), labels
    # the long one sits after its bar; a short one still fits inside its long bar
    assert labels[long].x0 > ax.transData.transform((2.30, 0))[0]
    assert labels["4.00×"].x1 < ax.transData.transform((4.0, 0))[0]


def test_inline_svg_ids_unique(built):
    _, _, _, html_text = built
    ids = re.findall(r'\bid="([^"]+)"', html_text)
    assert len(ids) == len(set(ids))


def test_empty_report(tmp_path):
    out = report.build_report(
        [], report.Outputs(tmp_path / "s.csv", tmp_path / "r.html", tmp_path / "p")
    )
    assert out["trials"] == 0
    for name in PLOTS:
        text = (tmp_path / "p" / f"{name}.svg").read_text()
        assert re.search(r">(no [^<]+|not run in this preset)</text>", text), name
    assert list(pd.read_csv(tmp_path / "s.csv").columns) == rec.COLUMNS


def test_cli(tmp_path):
    paths = write_records(tmp_path, sample_records()[:6])
    prices = json.dumps([{"name": "m", "usd_per_hour": 1.0, "note": "config"}])
    cmd = [sys.executable, "-m", "workflow_scripts.report", "--records", *map(str, paths)]
    cmd += ["--summary", str(tmp_path / "out" / "summary.csv")]
    cmd += ["--html", str(tmp_path / "out" / "report" / "index.html")]
    cmd += ["--plots-dir", str(tmp_path / "out" / "report"), "--prices-json", prices]
    cmd += ["--title", "CLI"]
    res = subprocess.run(cmd, check=False, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    html_path = tmp_path / "out" / "report" / "index.html"
    assert res.stdout.strip().splitlines()[-1] == f"report: {html_path} (7 trials, 1 failed)"
    for name in PLOTS:
        assert (tmp_path / "out" / "report" / f"{name}.svg").is_file()
    assert len(pd.read_csv(tmp_path / "out" / "summary.csv")) == 7


def test_junk_records_do_not_crash(tmp_path):
    listing = tmp_path / "r" / "trial0.json"
    listing.parent.mkdir()
    listing.write_text("[1, 2]")
    loaded = rec.load_records([listing])
    assert loaded[0]["status"] == "crashed" and "JSON object" in loaded[0]["error"]["message"]
    junk = [None, "x", {}, {"status": "ok", "metrics": {"samples_per_s": "n/a"}}, *loaded]
    out = report.build_report(
        junk, report.Outputs(tmp_path / "s.csv", tmp_path / "r.html", tmp_path / "p")
    )
    assert out["trials"] == 5 and out["ok"] == 1 and out["failed"] == 4
    for name in PLOTS:
        assert (tmp_path / "p" / f"{name}.svg").is_file()


def test_the_ladder_shows_what_the_checks_saw_take_effect(tmp_path):
    def checked(rec, **checks):
        rec["checks"] = {"output_dtype": "float32", "compiled": False, "device": "cpu", **checks}
        return rec

    records = [
        checked(make("baseline", 0, 10.0)),
        checked(
            make("bf16-cl", 0, 30.0, precision="bf16", channels_last=True),
            output_dtype="bfloat16", input_channels_last=True, weights_channels_last=True,
        ),
        checked(  # asked for channels_last, but the weights stayed contiguous
            make("bf16-cl-broken", 0, 20.0, precision="bf16", channels_last=True),
            output_dtype="bfloat16", input_channels_last=True, weights_channels_last=False,
        ),
        checked(  # asked for bf16 and a compile that did not happen
            make("lost", 0, 11.0, precision="bf16", compile="inductor", backend="inductor"),
        ),
    ]  # fmt: skip
    assert report.stats.in_effect(records) == {
        "baseline": "fp32 output",
        "bf16-cl": "bf16 output, channels_last inputs+weights",
        "bf16-cl-broken": "bf16 output, channels_last asked, weights not channels_last!",
        "lost": "fp32 output (asked bf16!), not compiled!",
    }
    report.build_report(
        records, report.Outputs(tmp_path / "s.csv", tmp_path / "r.html", tmp_path / "p")
    )
    page = (tmp_path / "r.html").read_text()
    assert "in effect (checked)" in page
    assert "channels_last asked, weights not channels_last!" in page
    assert "fp32 output (asked bf16!), not compiled!" in page


def test_accuracy_table_and_the_books_claims(tmp_path):
    """Time-to-train speedups and accuracy changes against the group's one-process fp32
    run, and the book's claims beside the fastest multi-rank run of each kind."""

    def acc(experiment, trial, train_s, accuracy, **spec):
        r = make(experiment, trial, 1437 * 3 / train_s, group="accuracy", launcher="torchrun",
                 data="digits", epochs=3, model="cnn", batch_size=32, **spec)  # fmt: skip
        r["metrics"].update(train_time_s=train_s, test_accuracy=accuracy, test_loss=0.2)
        return r

    records = [
        acc("acc-r1", 0, 10.0, 0.95, ranks=1, threads=2),
        acc("acc-r1", 1, 10.0, 0.96, ranks=1, threads=2),
        acc("acc-gloo-r2", 0, 8.0, 0.94, ranks=2, threads=1),
        acc("acc-ccl-r2", 0, 6.0, 0.94, ranks=2, threads=1, dist_backend="ccl"),
        acc(
            "acc-ccl-bf16-r2",
            0,
            5.0,
            0.90,
            ranks=2,
            threads=1,
            dist_backend="ccl",
            precision="bf16",
        ),  # fmt: skip
        make("ddp-r2", 0, 20.0, group="ddp", launcher="torchrun", ranks=2, threads=1),
    ]
    html_path = tmp_path / "report" / "index.html"
    report.build_report(
        rec.load_records(write_records(tmp_path, records)),
        report.Outputs(tmp_path / "summary.csv", html_path, tmp_path / "report"),
    )
    summary = pd.read_csv(tmp_path / "summary.csv").set_index("experiment")
    assert summary.loc["acc-ccl-r2", "test_accuracy"] == 0.94
    assert summary.loc["acc-ccl-r2", "train_time_s"] == 6.0
    assert math.isnan(summary.loc["ddp-r2", "test_accuracy"])  # no epochs: no accuracy

    page = html_path.read_text()
    section = page[page.index("Accuracy: time to train") :]
    tables = html_tables(section)
    table = tables[0].set_index("experiment")
    assert list(table.index) == ["acc-r1", "acc-gloo-r2", "acc-ccl-r2", "acc-ccl-bf16-r2"]
    assert table.loc["acc-r1", "test accuracy (%)"] == "95.5 (95.0–96.0)"  # median (min–max)
    # with its interval and verdict (acc-r1's two trials took the same time: no spread)
    assert table.loc["acc-gloo-r2", "speedup"] == "1.25× ([1.25–1.25], faster)"
    assert table.loc["acc-ccl-r2", "speedup"] == "1.67× ([1.67–1.67], faster)"
    assert table.loc["acc-ccl-bf16-r2", "Δ accuracy (points)"] == "-5.5"
    assert table.loc["acc-ccl-r2", "ranks × threads"] == "2 × 1"
    assert table.loc["acc-ccl-r2", "process group"] == "ccl shm"
    claims = tables[1].set_index("claim")
    ours = claims.columns[-1]
    assert ours == "ours, against acc-r1"
    assert claims.loc["Gloo, several ranks", ours].startswith(
        "1.25× ([1.25–1.25], faster) (acc-gloo-r2, 2 × 1, fp32)"
    )
    assert claims.loc["oneCCL, several ranks", ours].startswith("1.67× ([1.67–1.67], faster) (acc")
    assert claims.loc["oneCCL, any setting", ours] == (
        "2.00× ([2.00–2.00], faster) (acc-ccl-bf16-r2, 2 × 1, bf16), accuracy -5.5 points"
    )
    assert claims.loc["Gloo, several ranks", "book (its machine)"].startswith("about 1.25×")
    # the throughput table holds the DDP runs without epochs only
    ddp = page[page.index("<h2>Distributed training") : page.index("Accuracy: time to train")]
    assert "ddp-r2" in ddp and "acc-ccl-r2" not in ddp
    # oneCCL's worker thread, sharing the rank's CPUs or on one reserved for it
    row = {"dist_backend": "ccl", "ccl_worker_offload": True}
    assert process_group(row) == "ccl shm + worker"
    assert process_group({**row, "comm_cpu": True}) == "ccl shm + worker on a reserved CPU"


def test_accuracy_over_seeds_and_the_weak_scaling_arm(tmp_path):
    """Runs that differ only in their seed are one row (medians over the seeds, accuracy
    min-max over every trial of every seed); a weak-scaled batch shows each rank's share;
    the time to the target accuracy, and how many seeds reached it."""

    def acc(experiment, seed, train_s, accuracy, reached_s, **spec):
        spec = {"group": "acc-weak", "ranks": 1, "threads": 2, "target_accuracy": 0.9,
                "batch_size": 16, "lr": 0.01, **spec}  # fmt: skip
        r = make(experiment, 0, 1437 * 3 / train_s, launcher="torchrun", data="digits",
                 epochs=3, model="cnn", seed=seed, **spec)  # fmt: skip
        r["metrics"].update(train_time_s=train_s, test_accuracy=accuracy, test_loss=0.2,
                            time_to_accuracy_s=reached_s)  # fmt: skip
        return r

    weak = {"ranks": 2, "threads": 1, "batch_scaling": "weak", "batch_size": 32, "lr": 0.02}
    records = [
        acc("acc-weak-r1-seed0", 0, 10.0, 0.95, 6.0),
        acc("acc-weak-r1-seed1", 1, 12.0, 0.93, 8.0),
        acc("acc-weak-r1-seed2", 2, 11.0, 0.97, 7.0),
        acc("acc-weak-r2-seed0", 0, 5.0, 0.91, 4.0, **weak),
        acc("acc-weak-r2-seed1", 1, 6.0, 0.85, None, **weak),
        acc("acc-weak-r2-seed2", 2, 5.5, 0.92, 4.5, **weak),
        acc("acc-weak-r2-lr-seed0", 0, 5.0, 0.80, None, **{**weak, "lr": 0.04}),
    ]
    html_path = tmp_path / "report" / "index.html"
    report.build_report(
        rec.load_records(write_records(tmp_path, records)),
        report.Outputs(tmp_path / "summary.csv", html_path, tmp_path / "report"),
    )
    summary = pd.read_csv(tmp_path / "summary.csv").set_index("experiment")
    assert summary.loc["acc-weak-r2-seed1", "seed"] == 1
    assert summary.loc["acc-weak-r2-seed0", "batch_scaling"] == "weak"
    assert summary.loc["acc-weak-r2-seed0", "time_to_accuracy_s"] == 4.0
    assert math.isnan(summary.loc["acc-weak-r2-seed1", "time_to_accuracy_s"])  # not reached
    page = html_path.read_text()
    table = html_tables(page[page.index("Accuracy: time to train") :])[0]
    table = table.set_index("experiment")
    # three seeds each make one row; another learning rate is another configuration
    assert list(table.index) == ["acc-weak-r1", "acc-weak-r2", "acc-weak-r2-lr-seed0"]
    r1, r2 = table.loc["acc-weak-r1"], table.loc["acc-weak-r2"]
    assert r1["seeds"] == "0, 1, 2" and table.loc["acc-weak-r2-lr-seed0", "seeds"] == "0"
    assert r1["test accuracy (%)"] == "95.0 (93.0–97.0)"  # median over seeds (min–max)
    assert r1["time to train (s)"] == "11.00" and r2["time to train (s)"] == "5.50"
    # the time-to-train speedup's interval: the spread of log time pooled over the seeds
    # of every configuration (2 + 2 degrees of freedom), Student's t
    logs = [[math.log(t) for t in times] for times in ((10.0, 12.0, 11.0), (5.0, 6.0, 5.5))]
    s = math.sqrt(sum(statistics.variance(x) * 2 for x in logs) / 4)
    half = scipy.stats.t.ppf(0.975, 4) * s * math.sqrt(1 / 3 + 1 / 3)
    assert r2["speedup"] == f"2.00× ([{2 * math.exp(-half):.2f}–{2 * math.exp(half):.2f}], faster)"
    assert r2["Δ accuracy (points)"] == "-4.0"
    assert r2["global batch"] == "32 (weak: 16/rank)" and r1["global batch"] == "16"
    assert r1["time to target (s)"] == "7.00 (to 90 %)"
    assert r2["time to target (s)"] == "4.25 (to 90 %), 2 of 3 seeds"
    assert table.loc["acc-weak-r2-lr-seed0", "time to target (s)"] == "not reached (90 %)"
    ddp = page[page.index("<h2>Distributed training") : page.index("Accuracy: time to train")]
    assert "acc-weak-r1-seed0" not in ddp  # seeds too have the accuracy table only
    # the book's claims: a row each, a column per group with a one-process reference
    fixed = {**weak, "batch_scaling": "fixed", "group": "accuracy"}
    records.append(acc("acc-r1", 0, 10.0, 0.95, 6.0, group="accuracy"))
    records.append(acc("acc-r2", 0, 8.0, 0.95, 5.0, **fixed))
    report.build_report(
        rec.load_records(write_records(tmp_path / "b", records)),
        report.Outputs(tmp_path / "b.csv", html_path, tmp_path / "report"),
    )
    page = html_path.read_text()
    claims = html_tables(page[page.index("Accuracy: time to train") :])[1].set_index("claim")
    assert list(claims.index) == ["Gloo, several ranks", "oneCCL, several ranks",
                                  "oneCCL, any setting"]  # fmt: skip
    assert claims.loc["Gloo, several ranks", "ours, against acc-r1"].startswith("1.25× ([0.")
    ours = claims.loc["Gloo, several ranks", "ours, against acc-r1"]
    assert "], undecided) (acc-r2, 2 × 1, fp32)" in ours
    weak_col = claims.loc["Gloo, several ranks", "ours, against acc-weak-r1"]
    # the seeds' times to train 10, 12 and 11 s against 5 s: their geometric means' ratio
    assert weak_col.startswith(f"{(10 * 12 * 11) ** (1 / 3) / 5:.2f}× ([") and weak_col.endswith(
        "], faster) (acc-weak-r2-lr-seed0, 2 × 1, fp32), accuracy -15.0 points"
    )


def test_the_allreduce_microbenchmark_per_rank_count(tmp_path):
    """A row per variant, rank count and dtype; a count that failed is named, and the
    record's other counts are still shown."""

    def rows(n, lat):
        return [{"ranks": n, "dtype": "float32", "bytes": b, "latency_s": {"loop": lat * b},
                 "busbw_GBps": 1.0 / lat} for b in (1024, 1048576)]  # fmt: skip

    collectives = [
        {"variant": "gloo", "status": "ok", "ranks": [2, 4], "results": rows(2, 1e-6)
         + rows(4, 2e-6), "by_ranks": [{"ranks": 2, "status": "ok"},
                                        {"ranks": 4, "status": "ok"}]},
        {"variant": "ccl-shm", "status": "failed", "ranks": [2, 4], "results": rows(2, 5e-7),
         "by_ranks": [{"ranks": 2, "status": "ok"}, {"ranks": 4, "status": "failed"}],
         "error": {"message": "4 ranks: rank 0: 4 ranks need 4 CPUs, but the trial has 2"},
         "group": {"ccl_config": {"ofi": {"providers": ["shm", "shm"]}}}},
        # a record of one count, as written before counts were swept
        {"variant": "ccl-tcp", "status": "ok", "ranks": 2, "results": [
            {k: v for k, v in r.items() if k != "ranks"} for r in rows(2, 3e-6)],
         "group": {"ccl_config": {"ofi": {"providers": ["tcp"]}}}},
    ]  # fmt: skip
    html_path = tmp_path / "report" / "index.html"
    records = [make("baseline", 0, 10.0)]
    report.build_report(
        rec.load_records(write_records(tmp_path, records)),
        report.Outputs(tmp_path / "summary.csv", html_path, tmp_path / "report"),
        report.Options(collectives=collectives),
    )
    page = html_path.read_text()
    section = page[page.index("Allreduce microbenchmark") :]
    assert "between 2, 4 ranks" in section
    table = html_tables(section)[0]
    got = list(zip(table["variant"], table["ranks"].astype(str), strict=True))
    assert got == [("gloo", "2"), ("gloo", "4"), ("ccl-shm", "2"), ("ccl-tcp", "2")]
    # the libfabric providers oneCCL opened, as its records say (Gloo: none)
    assert list(table["libfabric"]) == ["—", "—", "shm", "tcp"]
    assert "libfabric: the providers oneCCL opened" in section
    assert table.iloc[1]["1 KiB"] == "2.05 ms · 5e+05 GB/s"  # 2e-6 s/B x 1024 B; 1 / 2e-6
    assert "collectives ccl-shm failed: 4 ranks: rank 0: 4 ranks need 4 CPUs" in section


def test_trials_the_budgets_clock_left_out_are_counted_apart_from_failures(tmp_path):
    """A left-out trial (plan/clock.py) is no failure and no measurement: the page and
    the report's counts say how many the clock left out, the failures section does not
    list them among the failures, and the next run runs them."""
    from workflow_scripts.plan import clock

    left = make("bf16", status=clock.LEFT_OUT, sps=None, precision="bf16",
                error={"type": clock.KIND, "message": clock.why(30, 1e9)})  # fmt: skip
    records = [make("baseline"), make("baseline", trial=1), left,
               make("bf16-cl", status="failed", sps=None, error={"type": "RuntimeError",
                                                                 "message": "boom"}),
               make("compiled", status="incorrect", sps=None,
                    error={"type": "GradientCheckFailed", "message": "off"})]  # fmt: skip
    loaded = rec.load_records(write(tmp_path / "r", records))
    out = report.build_report(
        loaded,
        report.Outputs(
            tmp_path / "summary.csv", tmp_path / "report/index.html", tmp_path / "report"
        ),
    )
    assert (out["trials"], out["ok"], out["failed"], out["left_out"]) == (5, 2, 1, 1)
    assert out["incorrect"] == 1
    page = (tmp_path / "report/index.html").read_text()
    counts = re.search(r'<p class="counts">(.*?)</p>', page, re.S).group(1)
    assert "<b>1</b> incorrect,\n<b>1</b> failed, <b>1</b> left out by the budget's clock" in counts
    assert "incorrect: 1" in counts and "failed: 1" in counts, counts
    failures = page[page.index('<section id="failures">') :]
    failures = failures[: failures.index("</section>")]
    assert '<p class="note" id="left-out">1 trial left out, not failed' in failures
    # the headline: an incorrect trial's gradients failed the check (a later trial of it
    # takes that verdict without running)
    headline = (
        "2 ok, 1 incorrect (their step failed the gradient check; a configuration's later "
        "trials take its first trial's verdict without running), 1 failed, 1 left out"
    )
    assert headline in page
    assert "bf16-cl" in failures and "bf16 —" not in failures.replace("bf16-cl", "")
    statuses = pd.read_csv(tmp_path / "summary.csv")["status"]
    assert sorted(statuses) == ["failed", "incorrect", "left_out", "ok", "ok"]


def test_what_a_budgets_plan_left_out_is_stated(tmp_path):
    """The experiments a budget's plan left out before any trial ran (the report rule's
    params.plan, study/entry.py plan_budget) are named on the page: in the headline, by
    group, and listed whole; a report without that plan says nothing of it, and a plan
    that is not JSON is refused with its option's name."""
    paths = write_records(tmp_path, sample_records()[:6])
    plan = {"budget": "1h", "planned": 9, "left_out": [
        {"id": "bert-base", "group": "transformers"}, {"id": "gpt2", "group": "transformers"},
        {"id": "infer-resnet50-bs1", "group": "inference"}]}  # fmt: skip

    def run(*extra):
        out = tmp_path / f"out{len(extra)}"
        cmd = [sys.executable, "-m", "workflow_scripts.report", "--records", *map(str, paths),
               "--summary", str(out / "summary.csv"), "--html", str(out / "index.html"),
               "--plots-dir", str(out), *extra]  # fmt: skip
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
        page = (out / "index.html").read_text() if res.returncode == 0 else ""
        return res, page

    res, page = run("--plan-json", json.dumps(plan))
    assert res.returncode == 0, res.stderr
    text = headline_text(page)
    assert (
        "The budget (1h) left out 3 of the study's 9 experiments before any trial ran, to fit "
        "it: transformers (2), inference (1)"
    ) in text, text
    assert left_out_by_budget(page) == [
        "transformers: bert-base, gpt2", "inference: infer-resnet50-bs1"]  # fmt: skip
    assert "Left out by the budget (1h): 3 of the study's 9 experiments" in page
    # no plan, or one that left nothing out: not a word of it
    for extra in ((), ("--plan-json", "{}"), ("--plan-json", "[1]")):
        res, page = run(*extra)
        assert res.returncode == 0, res.stderr
        assert "left-out-by-budget" not in page and "left out 0" not in page
    res, _ = run("--plan-json", "{not json")
    assert res.returncode == 2 and "--plan-json is not valid JSON" in res.stderr
    # the plan made again from the calibrations (study/replan.py) comes in a file, and wins
    made = tmp_path / "plan.json"
    made.write_text(json.dumps({**plan, "left_out": plan["left_out"][:1]}))
    res, page = run("--plan-json", json.dumps(plan), "--plan-file", str(made))
    assert res.returncode == 0, res.stderr
    assert left_out_by_budget(page) == ["transformers: bert-base"]
    made.write_text(json.dumps({**plan, "replanned": {"admitted": []}}))
    res, page = run("--plan-file", str(made))
    assert res.returncode == 0, res.stderr
    assert (
        "left out 3 of the study's 9 experiments by its plan, made again once the "
        "calibrations and the question's first trials had run"
    ) in headline_text(page)
    made.write_text("{not json")
    res, _ = run("--plan-file", str(made))
    assert res.returncode == 2 and "--plan-file is not valid JSON" in res.stderr
