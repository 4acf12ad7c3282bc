"""Fixture records and what reads a report back, for the tests of the summary and the
report (no torch): :func:`make` a trial's record as the harness writes it, :func:`write`
records where the workflow lays them out, :func:`html_tables` a page's tables; two
machines' fixture studies (:func:`machine_a`, :func:`machine_b`) and the report of A with
B beside it (:func:`build_page`), a page's :func:`section`, an inference record with what
its served model computed (:func:`served`)."""

from __future__ import annotations

import copy
import json
import re
from html.parser import HTMLParser

import pandas as pd

from workflow_scripts import report
from workflow_scripts.summary import records as rec

SPEC = {
    "id": "baseline",
    "group": "ladder",
    "claim_speedup": 1.0,
    "backend": "eager",
    "env": "upstream",
    "model": "resnet50",
    "batch_size": 16,
    "image_size": 224,
    "warmup_steps": 3,
    "steps": 10,
    "data": "synthetic",
    "data_dir": None,
    "num_workers": 0,
    "precision": "fp32",
    "channels_last": False,
    "compile": "none",
    "compile_mode": "default",
    "ipex_optimize": False,
    "threads": None,
    "cpus": None,
    "launcher": "none",
    "allocator": "default",
    "openmp": "gnu",
    "lr": 0.01,
    "seed": 0,
    "timeout_s": 1800,
    "env_vars": {},
    "preset": "default",
}
PROVENANCE = {
    "cpu_model": "AMD EPYC 9R14",
    "cpu_flags": ["avx512f", "avx512_bf16", "avx512_vnni"],
    "logical_cpus": 2,
    "physical_cores": 1,
    "numa_nodes": 1,
    "affinity": "0-1",
    "torch_num_threads": 2,
    "torch_interop_threads": 2,
    "env": {"OMP_NUM_THREADS": "2", "KMP_AFFINITY": None, "LD_PRELOAD": "/x/libtcmalloc.so"},
    "ld_preload": ["/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"],
    "openmp_runtime": "libgomp",
    "versions": {
        "python": "3.11.7",
        "torch": "2.14.1+cu130",
        "torchvision": "0.29.1",
        "ipex": None,
        "torch_xla": None,
    },
    "env_name": "upstream",
    "env_lock_sha256": "08d8aaaabbbbccccdddd",
    "image": None,
    "image_id": None,
    "image_digest": None,
    "runtime": "local",
    "git_revision": "abc123",
    "git_dirty": False,
    "hostname": "h",
    "kernel": "6.1",
    "started_at": "2026-11-21T10:00:00+00:00",
    "finished_at": "2026-11-21T10:01:00+00:00",
    "unknown_extra": {"ignored": True},
}


def make(experiment, trial=0, sps=10.0, status="ok", error=None, **spec_over):
    spec = dict(SPEC, id=experiment, **spec_over)
    metrics = {}
    if sps is not None:
        step = spec["batch_size"] / sps
        metrics = {
            "samples_per_s": sps,
            "steps_timed": 10,
            "step_time_s": {
                "mean": step,
                "median": step,
                "p90": step * 1.1,
                "p95": step * 1.2,
                "p99": step * 1.3,
                "stdev": 0.01,
                "min": step * 0.9,
                "max": step * 1.4,
            },
            "time_to_first_step_s": 4.2,
            "setup_s": 1.1,
            "peak_rss_mb": 2100.5,
            "final_loss": 6.9,
            "first_loss": 7.0,
            "wall_s": 30.2,
            "unknown_metric": 1,
        }
    return {
        "schema_version": 1,
        "experiment": experiment,
        "trial": trial,
        "spec": spec,
        "status": status,
        "error": error,
        "metrics": metrics,
        "step_times_s": [1.0],
        "losses": [7.0],
        "provenance": copy.deepcopy(PROVENANCE),
    }


class _Tables(HTMLParser):
    """The tables of an HTML page as lists of rows of cell texts."""

    def __init__(self):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None and self.tables:
            self.tables[-1][-1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def html_tables(page: str) -> list[pd.DataFrame]:
    parser = _Tables()
    parser.feed(page)
    return [pd.DataFrame(t[1:], columns=t[0]) for t in parser.tables if t]


def write(folder, records) -> list:
    """Each record as the workflow lays it out: <folder>/records/<experiment>/trial<k>.json."""
    paths = []
    for r in records:
        p = folder / "records" / r["experiment"] / f"trial{r['trial']}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(r))
        paths.append(p)
    return paths


LOSSES = [2.30, 2.25, 2.20, 2.15, 2.10, 2.05, 2.00, 1.95, 1.90, 1.85]
PRICE_A = 0.1027
PRICE_B = 0.2


def trial(exp, k=0, sps=10.0, losses=LOSSES, steps_timed=8, probe=(180.0, 400.0), **spec):
    """A fixture record: 8 timed steps asked, ``steps_timed`` run, a probe, losses."""
    r = make(exp, k, sps, steps=8, preset="quick", **spec)
    if sps is not None:
        r["metrics"]["steps_timed"] = steps_timed
        r["metrics"]["time_budget_hit"] = steps_timed < 8
        r["probe"] = {"fp32_gflops": probe[0], "bf16_gflops": probe[1], "size": 1024}
        r["probe"]["threads"] = 2
        r["losses"] = list(losses)
        r["step_times_s"] = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 1.0, 1.0][:steps_timed]
        r["probe"]["seconds"] = 0.5
        r["attempts"] = 1
        # the study's own cost: what was predicted before the trial ran, and its wall time
        r["estimate"] = {"seconds": 16.0, "basis": "calibration"}
        r["trial_wall_s"] = 20.0 + k
    return r


def machine_a():
    """An AVX-512 BF16 machine, preset quick: the ladder, a budget-cut bf16, a noisy
    baseline trial, a failed IPEX run, a compiled run whose losses diverge, another
    model in another group; no sweeps."""
    diverging = [2.30, 2.6, 3.4, 5.0, 9.0, 14.0, 20.0, 30.0, 45.0, 60.0]
    return [
        trial("baseline", 0, 10.0),
        trial("baseline", 1, 12.0),
        trial("baseline", 2, 4.0, probe=(60.0, 150.0)),  # disturbed: the peers' probes say so
        trial("bf16", 0, 22.0, steps_timed=3, precision="bf16", claim_speedup=2.67),
        trial("bf16-cl", 0, 33.0, precision="bf16", channels_last=True, claim_speedup=4.16),
        trial(
            "runcpu-tcmalloc", 0, 35.2, precision="bf16", channels_last=True,
            launcher="run_cpu", allocator="tcmalloc", claim_speedup=4.28,
        ),
        trial(
            "inductor-bf16-cl", 0, 40.0, losses=diverging, precision="bf16",
            channels_last=True, backend="inductor", compile="inductor",
        ),
        trial("inductor-fp32", 0, 12.1, backend="inductor", compile="inductor"),
        trial("ipex-baseline", 0, 9.0, backend="ipex", env="ipex"),
        trial(
            "ipex-optimize-bf16-cl", 0, None, status="failed", backend="ipex", env="ipex",
            ipex_optimize=True, precision="bf16", channels_last=True,
            error={"type": "RuntimeError", "message": "bf16 prepack needs AVX-512"},
        ),
        trial("resnet18", 0, 80.0, group="models", model="resnet18", image_size=64),
    ]  # fmt: skip


def machine_b():
    """An AVX2-only machine, preset default: bf16 emulated (slower than fp32); bf16-cl
    ran at another batch; an experiment machine A does not have."""
    prov = copy.deepcopy(PROVENANCE)
    prov.update(cpu_model="Intel Xeon E5-2686 v4", cpu_flags=["avx2", "fma"], logical_cpus=8)
    records = [
        trial("baseline", 0, 8.0),
        trial("bf16", 0, 4.0, precision="bf16"),
        trial("bf16-cl", 0, 5.0, precision="bf16", channels_last=True, batch_size=32),
        trial(
            "runcpu-tcmalloc", 0, 5.2, precision="bf16", channels_last=True,
            launcher="run_cpu", allocator="tcmalloc",
        ),
        trial("xla-fp32", 0, 3.0, backend="xla", env="xla"),
    ]  # fmt: skip
    for r in records:
        r["provenance"] = copy.deepcopy(prov)
        r["spec"]["preset"] = "default"
    return records


PRICES = [
    {"name": "this machine", "usd_per_hour": PRICE_A, "note": "assumed"},
    {"name": "article: c7i.2xlarge", "usd_per_hour": 0.357, "throughput": "article"},
]


def build_page(tmp):
    """Machine A's report, machine B beside it: the folder, the records, what
    build_report returned and the page's HTML."""
    write(tmp / "b", machine_b())
    records = rec.load_records(write(tmp / "a", machine_a()))
    out = report.build_report(
        records,
        report.Outputs(tmp / "summary.csv", tmp / "report" / "index.html", tmp / "report"),
        report.Options(
            prices=PRICES,
            machines=[{"name": "avx2-box", "results": str(tmp / "b"), "usd_per_hour": PRICE_B}],
            name="avx512-box",
        ),
    )
    text = (tmp / "report" / "index.html").read_text()
    return tmp, records, out, text


def section(text, sid):
    start = text.index(f'<section id="{sid}">')
    return text[start : text.index("</section>", start)]


def headline_text(page: str) -> str:
    """The headline box's words, without tags, on one line."""
    box = re.search(r'<div class="headline".*?</div>', page, re.S)
    assert box, page[:3000]
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", box.group(0)))


def left_out_by_budget(page: str) -> list[str]:
    """The items of the page's list of what a budget's plan left out ("group: ids")."""
    listed = re.search(r'<details class="note" id="left-out-by-budget">.*?</details>', page, re.S)
    assert listed, page[:3000]
    return re.findall(r"<li>([^<]*)</li>", listed.group(0))


def served(record: dict, cosine: float, int8: int | None = None, layers: int = 74,
           accuracy: tuple[float, float] | None = None) -> dict:  # fmt: skip
    """A fixture inference record with what its served model computed (the harness's
    ``checks.serving``): logits against fp32 eager, oneDNN's INT8 kernels, and for a
    model it trained, its held-out accuracy served and in fp32 eager."""
    onednn = {"heavy_primitives": layers, "int8_primitives": int8 or 0, "bf16_primitives": 0,
              "int8_isa": "AVX512-VNNI" if int8 else None}  # fmt: skip
    record["checks"] = {
        **record.get("checks", {}),
        "serving": {
            "agreement": {
                "cosine": cosine,
                "max_abs_diff": 0.05,
                "reference_max_abs": 2.0,
                "top1_agreement": 0.875,
            },  # fmt: skip
            "onednn": onednn,
            "weight_layers": layers,
            "reference_accuracy": accuracy[1] if accuracy else None,
            "served_accuracy": accuracy[0] if accuracy else None,
            "serve_s": 1.5,
        },
    }
    if accuracy:
        record["metrics"]["test_accuracy"] = accuracy[0]
    return record
