"""Fixture records and what reads a report back, for the tests of the summary and the
report (no torch): :func:`make` a trial's record as the harness writes it, :func:`write`
records where the workflow lays them out, :func:`html_tables` a page's tables."""

from __future__ import annotations

import copy
import json
from html.parser import HTMLParser

import pandas as pd

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
