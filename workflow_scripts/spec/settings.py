"""The top-level settings of a study (everything in config.yaml but the experiments),
declared once: schema, default and help. The schema and the defaults table are
derived from :data:`SETTINGS`."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ..launchers.torchrun import DEFAULT_FABRIC_PROVIDER
from ..runtimes import RUNTIMES

# ---- a budget the user can give (--config budget=1h) ----

_UNITS = {"s": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}
_DURATION = r"([0-9]{1,6}(?:\.[0-9]{1,3})?)(s|min|m|h)"
#: the schema's pattern of a budget (what :func:`budget_seconds` reads)
BUDGET_PATTERN = f"^{_DURATION}$"


def budget_seconds(text: str) -> float:
    """``1h`` -> 3600.0; ``90min``, ``90m``, ``5400s``, ``1.5h``."""
    match = re.fullmatch(_DURATION, str(text))
    if not match:
        raise ValueError(f"{text!r} is no duration such as 45min, 1h or 5400s")
    return float(match.group(1)) * _UNITS[match.group(2)]


PRESET_NAME = {
    "type": "string",
    "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,49}$",
    "description": "a name of letters, digits, '.', '_' and '-'",
}
TRIALS = {"type": "integer", "minimum": 1}
#: the kinds of value that reach another tool's command line or environment (never a
#: shell): each refused at plan time unless it is of its kind, never starting with '-'
#: (which a tool would read as an option) and never with a control character
PATH = {
    "maxLength": 4096,  # Linux's PATH_MAX
    "pattern": "^[^-\\x00-\\x1f][^\\x00-\\x1f]*$",
    "description": "a path, not starting with '-', without control characters",
}
NAME = {
    "pattern": "^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}$",
    "description": "a name of letters, digits, '_', '.', '+' and '-', not starting with '-'",
}
MAX_TRIALS = {"type": ["integer", "null"], "minimum": 1}
IMAGE_FOLDER = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "images_per_class": {"type": "integer", "minimum": 1},
        "classes": {"type": "integer", "minimum": 2},
        "size": {"type": "integer", "minimum": 16},
    },
}
CONTAINERS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "base": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "source": {"enum": ["mmdebstrap", "registry"]},
                "suite": {
                    "type": "string",
                    "pattern": "^[a-z][a-z0-9.-]{0,31}$",
                    "description": "a Debian suite name such as bookworm or stable",
                },
                # null: the Debian mirror of the host's own apt sources
                "mirror": {
                    "type": ["string", "null"],
                    "pattern": "^(https?|file)://[^\\s\\x00-\\x1f]+$",
                    "description": "a mirror's URL (http://, https:// or file://)",
                },
                "image": {
                    "anyOf": [
                        {
                            "type": "string",
                            "pattern": "^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$",
                            "description": "an image reference pinned by digest "
                            "(...@sha256:<64 hex>)",
                        },
                        {"type": "null"},
                    ]
                },
            },
        },
        "wheelhouse": {"type": "string", **PATH},
        "prefix": {
            "type": "string",
            "pattern": "^[a-z0-9][a-z0-9._/-]*$",
            "description": "a lower-case image name prefix, e.g. localhost/cpu-train-study",
        },
        "shm_size": {
            "type": "string",
            "pattern": "^[0-9]+[bkmg]?$",
            "description": "a size such as 2g or 512m",
        },
        "memory": {
            "anyOf": [
                {
                    "type": "string",
                    "pattern": "^[0-9]+[kmg]?$",
                    "description": "a size such as 8g or 512m",
                },
                {"type": "null"},
            ]
        },
        "archive": {
            "type": ["string", "null"],
            **PATH,
            "description": "a folder on the filesystem a cluster's nodes share: each image "
            "is saved there once built, and a node whose engine lacks it loads it there "
            "(null: no archives)",
        },
    },
}
COLLECTIVES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "ranks": {
            "anyOf": [
                {"type": "integer", "minimum": 1},
                {
                    "type": "array",
                    "minItems": 1,
                    "items": {"type": "integer", "minimum": 1},
                    "uniqueItems": True,
                },
                {"const": "all"},
            ],
            "description": "the rank counts per node, each benchmarked in turn: a count, a "
            "list, or all (2, 4, 8, ... up to the node's CPUs, and the CPU count itself; "
            "from 1 across several nodes)",
        },
        "nodes": {
            "type": "integer",
            "minimum": 1,
            "description": "the nodes the benchmark spans (more than 1: on a cluster, "
            "--profile profiles/slurm)",
        },
        "variants": {
            "type": "array",
            "items": {
                "type": "string",
                "pattern": "^(gloo|ccl-(shm|tcp)(-offload)?)$",
                "description": "gloo, ccl-shm, ccl-tcp, ccl-shm-offload or ccl-tcp-offload",
            },
            "uniqueItems": True,
        },
        "sizes_kb": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "number", "exclusiveMinimum": 0, "maximum": 1048576},
        },
        "dtypes": {
            "type": "array",
            "minItems": 1,
            "items": {"enum": ["float32", "bfloat16"]},
            "uniqueItems": True,
        },
        "iterations": {"type": "integer", "minimum": 1},
    },
}
PRICE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "usd_per_hour"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "usd_per_hour": {"type": "number", "exclusiveMinimum": 0},
        "note": {"type": "string"},
        "throughput": {
            "enum": ["measured", "article"],
            "description": "measured: the price of the machine that ran the study (priced "
            "with its measured throughput); article: the article's instance (priced with "
            "the article's own figures)",
        },
    },
}
MACHINE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "results"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        # another run's results folder, records folder or summary.csv
        "results": {"type": "string", **PATH},
        "usd_per_hour": {"type": ["number", "null"], "exclusiveMinimum": 0},
        "note": {"type": "string"},
    },
}
CLUSTER = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        # the partition of the measured jobs (null: SLURM's default one)
        "partition": {"type": ["string", "null"], **NAME},
        "account": {"type": ["string", "null"], **NAME},
        # node features the measured jobs ask for (sbatch --constraint)
        "constraint": {
            "type": ["string", "null"],
            "pattern": "^[A-Za-z0-9_(\\[][A-Za-z0-9_.&|*,:()\\[\\]-]{0,255}$",
            "description": "SLURM node features such as avx512&bf16 (letters, digits and "
            "& | * , : ( ) [ ]), not starting with '-'",
        },
        "node_cpus": {"type": ["integer", "null"], "minimum": 1},
        "node_mem_mb": {"type": ["integer", "null"], "minimum": 256},
        "network_interface": {
            "type": ["string", "null"],
            "pattern": "^[A-Za-z0-9_][A-Za-z0-9._:-]{0,14}$",
            "description": "the network interface the ranks of a several-node trial talk "
            "over (Gloo, oneCCL and the rendezvous), e.g. ib0 or eth0",
        },
        "fabric_provider": {
            "type": ["string", "null"],
            "pattern": "^[A-Za-z0-9_][A-Za-z0-9_;.-]{0,63}$",
            "description": "the libfabric provider oneCCL's ranks of a several-node trial use "
            "between their nodes (FI_PROVIDER; shm still joins the ranks of a node), e.g. "
            "tcp, verbs or psm3; null: libfabric's own first choice, which on a TCP-only "
            "network can be shm, which reaches no other node",
        },
        "scheduler": {
            "enum": [None, "slurm"],
            "description": "where the measured jobs run: null on this machine (the study is "
            "planned for it), slurm submitted to SLURM (planned for the nodes of the "
            "partition, asked of sinfo; --profile profiles/slurm sets it)",
        },
        "block_by_node": {
            "type": "boolean",
            "description": "trials blocked by node: trial k of the i-th experiment runs on "
            "node (k + i) mod N of the partition's N nodes (sinfo's, at plan time), so that "
            "each experiment's trials rotate through the nodes, two experiments of as many "
            "trials share their nodes in equal shares, and a round's trials spread over all "
            "of them (a resubmitted job runs anywhere); false: SLURM places every trial",
        },
        "build_on": {
            "enum": ["login", "compute"],
            "description": "where the environment (and image) builds run on a cluster: login "
            "(the submit host, as localrules) or compute (cluster jobs, where login nodes "
            "are off limits for heavy work; the nodes then need PyPI and the shared "
            "filesystem, and the runtime must be local)",
        },
    },
}
LIMITS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "experiments": {"type": "integer", "minimum": 1},
        "trials": {"type": "integer", "minimum": 1},
        "over_memory": {"type": "boolean"},
    },
}
REPORT = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "name": {"type": ["string", "null"], "minLength": 1},
        "machines": {"type": "array", "items": MACHINE},
    },
}


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    schema: dict
    default: Any
    help: str
    #: never a string: a string from ``--config key=value`` is read as YAML
    structured: bool = False


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in [
        Setting("preset", PRESET_NAME, "default", "which preset to run"),
        Setting(
            "runtime",
            {"enum": list(RUNTIMES)},
            "auto",
            "where runs execute: auto = podman if it works, else docker, else local",
        ),
        Setting(
            "container_engine_conf",
            {"type": ["string", "null"], **PATH},
            None,
            "a containers.conf passed to podman as CONTAINERS_CONF (host-specific, opt-in)",
        ),
        Setting(
            "containers",
            CONTAINERS,
            {
                "base": {
                    "source": "mmdebstrap",
                    "suite": "bookworm",
                    "mirror": None,
                    "image": None,
                },
                "wheelhouse": "resources/wheelhouse",
                "prefix": "localhost/cpu-train-study",
                "shm_size": "2g",
                "memory": None,
                "archive": None,
            },
            "the container images: root image, wheelhouse, names, /dev/shm and memory limit of "
            "a run",
            structured=True,
        ),
        Setting(
            "preflight",
            {"type": "boolean"},
            False,
            "a pre-flight of the chosen study (preset preflight: of the default one): every "
            "experiment at its real model, shape, launcher, layout and backend, one warm-up "
            "and one timed step (an epochs run: one epoch cut at a few steps), one trial, "
            "into results/preflight/; the whole study's estimate then uses its step times",
            structured=True,
        ),
        Setting(
            "trials",
            TRIALS,
            1,
            "runs of each experiment (a seed sweep's seeds share them: 3 seeds of one "
            "trial each are 3 trials of one configuration; and one trial where the first "
            "stopped far slower than its baseline, by far_stop squared)",
            structured=True,
        ),
        Setting(
            "max_trials",
            MAX_TRIALS,
            None,
            "the cap of the adaptive rounds: after `trials` (2 at least: one trial each "
            "decides nothing), another round runs each experiment that a comparison still "
            "undecided names (one that this many trials may still decide: `futility`), or "
            "one the headline states whose interval is not yet within ±`margin`, up to "
            "this many trials (null, or not above `trials`: no adaptive rounds)",
            structured=True,
        ),
        Setting(
            "futility",
            {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
            0.1,
            "an undecided comparison asks for another adaptive round only while its "
            "chance of a verdict by `max_trials` (its predictive power, from the ratio "
            "and spread between trials it measures now) is at least this; 0: every "
            "undecided comparison goes on to the cap",
            structured=True,
        ),
        Setting(
            "budget",
            {
                "type": ["string", "null"],
                "pattern": BUDGET_PATTERN,
                "description": "a duration, a number and its unit (s, min, m or h) such as "
                "45min, 1.5h or 5400s",
            },
            None,
            "the wall time the study may take, e.g. 1h, 90min, 5400s: the adaptive rounds "
            "are capped at what fits in it (every experiment in every round, as estimated "
            "on this machine), and the estimate says what precision that buys; where not "
            "even the minimum trials fit, the experiments that do, the question first "
            "(planned again once the calibrations have measured this machine, where they "
            "had not yet); a clock holds the study to it; null: max_trials alone",
        ),
        Setting(
            "margin",
            {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            0.03,
            "two throughputs within this fraction of each other count as the same: a "
            "comparison whose 95 % interval lies wholly within ±margin is 'the same', "
            "wholly beyond it 'faster' or 'slower', else 'undecided' (another adaptive "
            "round runs it); a noisy machine needs more trials for a small margin",
            structured=True,
        ),
        Setting(
            "noise_threshold",
            {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            0.85,
            "the least drop that counts as a disturbance: a trial whose probe ran below "
            "this fraction of what its peers (this study's trials probed the same way) "
            "ordinarily read, and beyond their ordinary spread, was disturbed (before "
            "there are peers: below half the calibration's); the report's median of "
            "comparable trials likewise",
            structured=True,
        ),
        Setting(
            "noise_retries",
            {"type": "integer", "minimum": 0},
            2,
            "how often a disturbed trial (noise_threshold) is run again",
            structured=True,
        ),
        Setting(
            "warm_interpreter",
            {"type": "boolean"},
            False,
            "true: fork each single-process trial of the local runtime from a warm "
            "interpreter that has imported torch and the model's library (a process per "
            "trial all the same) instead of starting a fresh one, saving the interpreter's "
            "start and those imports (2-4 s a trial); off by default: a forked ResNet-50 "
            "trial measured 4.6 % slower than a fresh one (docs/measurement.md)",
            structured=True,
        ),
        Setting(
            "envs_root",
            {"type": "string", **PATH},
            ".venvs",
            "where the backend environments are built",
        ),
        Setting("installer", {"enum": ["uv", "pip"]}, "uv", "what installs the environments"),
        Setting(
            "python",
            {"type": ["string", "null"], **PATH},
            None,
            "the interpreter of the backend environments (null: the one running Snakemake)",
        ),
        Setting(
            "image_folder",
            IMAGE_FOLDER,
            {"images_per_class": 32, "classes": 10, "size": 256},
            "the generated image folder",
            structured=True,
        ),
        Setting(
            "collectives",
            COLLECTIVES,
            {
                "ranks": "all",
                "nodes": 1,
                "variants": ["gloo", "ccl-shm", "ccl-tcp", "ccl-shm-offload"],
                "sizes_kb": [1, 16, 256, 4096, 65536, 102400],
                "dtypes": ["float32", "bfloat16"],
                "iterations": 20,
            },
            "the allreduce microbenchmark: rank counts, process-group variants (none: no "
            "benchmark), message sizes in KiB, dtypes, timed calls per size",
            structured=True,
        ),
        Setting(
            "cluster",
            CLUSTER,
            {
                "partition": None,
                "account": None,
                "constraint": None,
                "node_cpus": None,
                "node_mem_mb": None,
                "network_interface": None,
                "fabric_provider": DEFAULT_FABRIC_PROVIDER,
                "scheduler": None,
                "block_by_node": True,
                "build_on": "login",
            },
            "on a SLURM cluster (--profile profiles/slurm): the partition, account and node "
            "features of the measured jobs, the nodes' CPUs and memory (null: asked of "
            "sinfo), and the network interface and fabric provider of several-node trials",
            structured=True,
        ),
        Setting(
            "prices",
            {"type": "array", "items": PRICE},
            [],
            "hourly prices that turn throughput into samples per dollar",
            structured=True,
        ),
        Setting(
            "limits",
            LIMITS,
            {"experiments": 2000, "trials": 20000, "over_memory": False},
            "what a config may ask for, checked before any job (raise them on purpose): "
            "experiments after the sweeps' expansion (each preset's count: docs/presets.md), "
            "trials in all (experiments x max(trials, max_trials)), and over_memory: true "
            "runs an experiment whose memory estimate exceeds the machine's (or a node's) "
            "memory, which is refused otherwise",
            structured=True,
        ),
        Setting(
            "report",
            REPORT,
            {"name": None, "machines": []},
            "the report: this run's name beside other machines, and other machines' "
            "results (name, results folder or summary.csv, usd_per_hour) to compare with",
            structured=True,
        ),
    ]
}

SETTING_DEFAULTS: dict[str, Any] = {name: s.default for name, s in SETTINGS.items()}
NOISE_THRESHOLD: float = SETTINGS["noise_threshold"].default
NOISE_RETRIES: int = SETTINGS["noise_retries"].default
