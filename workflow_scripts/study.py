"""Turn the study configuration into a flat, validated list of experiments.

``load_study(config)`` takes the dict Snakemake builds (config.yaml plus
``--config key=value`` overrides, which arrive as top-level keys) and:

1. validates it against ``schemas/config.schema.yaml`` (unknown keys anywhere
   are errors);
2. applies the selected preset (``preset``, default ``"default"``): the
   preset's ``defaults`` and ``image_folder`` are merged key by key over the
   top-level ones, its ``experiments``, ``sweeps`` and ``trials`` replace the
   top-level ones when given;
3. expands ``experiments`` (in file order) then ``sweeps`` (in file order, each
   the Cartesian product of its list-valued fields in the order written, the
   last field varying fastest) into fully resolved experiment specs;
4. checks each spec (field values, combinations of fields, ids).

Every problem raises ``StudyConfigError`` whose message is meant for the
user, one line per problem, e.g.
``config error at experiments[2].precision: 'fp16' is not allowed; allowed: fp32, bf16``.

Run ``python -m workflow_scripts.study [--config config.yaml] [--set key=value ...]``
to print the expanded experiment table of a configuration.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import functools
import itertools
import json
import re
import sys
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMA_PATH = Path(__file__).parent / "schemas" / "config.schema.yaml"

# Built-in defaults of every experiment field, in the order fields are listed
# (and swept, and tagged). ``compile: None`` resolves to the backend's own choice.
BUILTIN_DEFAULTS: dict[str, Any] = {
    "id": None,
    "group": None,
    "claim_speedup": None,
    "backend": "eager",
    "model": "resnet50",
    "batch_size": 16,
    "image_size": 224,
    "warmup_steps": 3,
    "steps": 10,
    "time_budget_s": None,
    "data": "synthetic",
    "data_dir": None,
    "num_workers": 0,
    "precision": "fp32",
    "channels_last": False,
    "compile": None,
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
    # the noise probe's matrix size (N x N matmuls before the steps); 0 turns it off
    "probe_size": 1024,
    # keep torch.compile's caches between runs (default: a fresh, empty cache per trial)
    "warm_compile_cache": False,
    "env_vars": {},
}
FIELDS = list(BUILTIN_DEFAULTS)
# Fields set per experiment, never in ``defaults`` and never swept.
PER_EXPERIMENT = ("id", "group", "claim_speedup")
NOT_SWEPT = ("id", "name", "group", "claim_speedup", "env_vars")
INT_FIELDS = (
    "batch_size",
    "image_size",
    "warmup_steps",
    "steps",
    "num_workers",
    "threads",
    "seed",
    "timeout_s",
    "probe_size",
)

# Top-level settings other than defaults/experiments/sweeps/presets.
SETTING_DEFAULTS: dict[str, Any] = {
    "preset": "default",
    "runtime": "auto",
    # a containers.conf for podman on this kind of host (opt-in; None = the engine's own)
    "container_engine_conf": None,
    "containers": {
        # the root image: Debian minbase from mmdebstrap, or a registry image by digest
        "base": {
            "source": "mmdebstrap",
            "suite": "bookworm",
            "mirror": "http://deb.debian.org/debian",
            "image": None,
        },
        # where the host downloads the locked wheels the image builds install from
        "wheelhouse": "resources/wheelhouse",
        # image names: <prefix>-<image>:latest (runs always use the image ID)
        "prefix": "localhost/cpu-train-study",
        # /dev/shm of a run (DataLoader workers pass batches through it)
        "shm_size": "2g",
    },
    "trials": 1,
    "envs_root": ".venvs",
    "installer": "uv",
    "python": None,
    "image_folder": {"images_per_class": 32, "classes": 10, "size": 256},
    "prices": [],
    # a trial is noisy when its probe ran below this fraction of comparable trials' median
    "noise_threshold": 0.85,
    # how often the launcher reruns a trial whose probe fell below the reference
    "noise_retries": 2,
}

# Settings that are never strings: a string value from `--config` is read as YAML.
NON_STRING_SETTINGS = (
    "trials",
    "noise_threshold",
    "noise_retries",
    "image_folder",
    "containers",
    "prices",
    "defaults",
    "experiments",
    "sweeps",
    "presets",
)

# Which Python environment (envs/<env>.txt) runs each backend.
BACKEND_ENV = {"eager": "upstream", "inductor": "upstream", "ipex": "ipex", "xla": "xla"}
# compile used when the experiment leaves it unset (null)
BACKEND_COMPILE = {"eager": "none", "inductor": "inductor", "ipex": "none", "xla": "none"}

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
ID_ALLOWED = "1-100 letters, digits, '.', '_' or '-', starting with a letter or digit"
CPU_ITEM_RE = re.compile(r"^(\d+)(?:-(\d+))?$")


class StudyConfigError(Exception):
    """A configuration problem; ``str(exc)`` is the message to show the user."""


@dataclasses.dataclass
class Study:
    experiments: list[dict[str, Any]]
    settings: dict[str, Any]
    defaults: dict[str, Any]  # resolved defaults (built-in, then config, then preset)
    base_dir: Path
    by_id: dict[str, dict[str, Any]] = dataclasses.field(init=False)
    envs: list[str] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.by_id = {spec["id"]: spec for spec in self.experiments}
        self.envs = sorted({spec["env"] for spec in self.experiments})

    @property
    def ids(self) -> list[str]:
        return [spec["id"] for spec in self.experiments]

    def spec_json(self, experiment_id: str) -> str:
        """Canonical JSON of one spec: changes exactly when the spec changes."""
        return json.dumps(self.by_id[experiment_id], sort_keys=True, separators=(",", ":"))

    def path(self, p: str | Path) -> Path:
        """A path from the config (envs_root, data_dir) resolved against base_dir."""
        return self.base_dir / Path(p).expanduser()


# ---------------------------------------------------------------------------
# showing values and paths


def _show(value: Any) -> str:
    """A value as the user wrote it in YAML, strings quoted."""
    if isinstance(value, str):
        return repr(value)
    return _bare(value)


def _bare(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    return json.dumps(value, default=str)


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _err(where: str, message: str) -> str:
    return f"config error at {where}: {message}" if where else f"config error: {message}"


# ---------------------------------------------------------------------------
# schema validation


@functools.lru_cache(maxsize=1)
def _schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


@functools.lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(_schema())


def _allowed(schema: dict) -> str:
    """What a (leaf) schema accepts, in words."""
    if "enum" in schema:
        return ", ".join(_bare(v) for v in schema["enum"])
    if "pattern" in schema and "description" in schema:
        return schema["description"]
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    words = []
    for t in types:
        if t in ("integer", "number"):
            word = "an integer" if t == "integer" else "a number"
            if "minimum" in schema:
                word += f" >= {schema['minimum']}"
            if "exclusiveMinimum" in schema:
                word += f" > {schema['exclusiveMinimum']}"
            if "maximum" in schema:
                word += f" and <= {schema['maximum']}"
            words.append(word)
        elif t == "string":
            if "pattern" in schema:
                words.append(f"a string matching {schema['pattern']}")
            else:
                words.append("a non-empty string" if schema.get("minLength") else "a string")
        elif t == "boolean":
            words.append("true or false")
        elif t == "object":
            words.append("a mapping")
        elif t == "array":
            words.append("a list")
        elif t == "null":
            words.append("null")
    return " or ".join(words) or "see workflow_scripts/schemas/config.schema.yaml"


_TYPE_NAMES = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "list",
    dict: "mapping",
    type(None): "null",
}


def _leaves(error: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    """Descend through anyOf (a sweep field: a value or a list of values) to the
    branch that matches the value's shape, so the message names the real problem."""
    if error.validator not in ("anyOf", "oneOf") or not error.context:
        return [error]
    is_list = isinstance(error.instance, list)
    chosen = None
    for i, branch in enumerate(error.validator_value):
        if (branch.get("type") == "array") == is_list:
            chosen = i
            break
    if chosen is None:
        return [error]
    subs = [e for e in error.context if e.relative_schema_path[0] == chosen]
    return [leaf for sub in subs for leaf in _leaves(sub)] or [error]


def _schema_message(error: jsonschema.ValidationError) -> list[str]:
    parts = list(error.absolute_path)
    where = _path(parts)
    value = error.instance
    kind = error.validator
    parent = parts[-3] if len(parts) >= 3 else None
    field = parts[-1] if parts else None

    if kind == "additionalProperties" and isinstance(value, dict):
        known = list(error.schema.get("properties", {}))
        lines = []
        for key in value:
            if key in known:
                continue
            at = _path([*parts, key])
            in_sweep = len(parts) >= 2 and parts[-2] == "sweeps"
            if in_sweep and key == "id":
                lines.append(
                    _err(
                        at,
                        "a sweep cannot have an explicit id (all its experiments would "
                        "share it); set 'name' instead: ids become <name>-<swept values>",
                    )
                )
                continue
            if field == "defaults" and key in PER_EXPERIMENT:
                lines.append(_err(at, f"{key!r} cannot have a default; set it on each experiment"))
                continue
            hint = difflib.get_close_matches(str(key), known, n=1)
            did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
            lines.append(
                _err(
                    at,
                    f"unknown field {_show(key)}{did_you_mean}; allowed: {', '.join(known)}",
                )
            )
        return lines
    if "propertyNames" in error.relative_schema_path or "propertyNames" in error.schema_path:
        return [
            _err(where, f"key {_show(value)} is not allowed; allowed: {_allowed(error.schema)}")
        ]
    if kind == "required":
        missing = [k for k in error.validator_value if k not in value]
        return [_err(where, f"missing required field {k!r}") for k in missing]
    if isinstance(value, list) and kind in ("type", "enum"):
        if parent == "experiments" and field != "env_vars":
            return [
                _err(
                    where,
                    f"{_show(value)} is a list; an experiment takes single values "
                    "(use sweeps for lists)",
                )
            ]
        if field in NOT_SWEPT and len(parts) >= 3 and parent == "sweeps":
            return [_err(where, f"{_show(value)} is a list; {field!r} cannot be swept")]
        if len(parts) >= 2 and parts[-2] == "defaults":
            return [
                _err(
                    where,
                    f"{_show(value)} is a list; defaults take single values (use sweeps for lists)",
                )
            ]
    if kind == "type":
        got = _TYPE_NAMES.get(type(value), type(value).__name__)
        article = "an" if got[0] in "aeiou" else "a"
        if value is None:
            return [_err(where, f"null is not allowed; allowed: {_allowed(error.schema)}")]
        return [
            _err(where, f"{_show(value)} is {article} {got}; allowed: {_allowed(error.schema)}")
        ]
    if kind in ("enum", "minimum", "exclusiveMinimum", "maximum", "pattern", "minLength"):
        return [_err(where, f"{_show(value)} is not allowed; allowed: {_allowed(error.schema)}")]
    if kind == "minItems":
        return [_err(where, "an empty list is not allowed; a swept field needs at least one value")]
    return [_err(where, error.message[:200])]


def _path_key(error: jsonschema.ValidationError) -> list:
    return [(0, p, "") if isinstance(p, int) else (1, 0, str(p)) for p in error.absolute_path]


def validate_schema(config: dict) -> list[str]:
    """The schema errors of a raw config, as messages (empty when valid)."""
    lines: list[str] = []
    for error in sorted(_validator().iter_errors(config), key=_path_key):
        for leaf in _leaves(error):
            for line in _schema_message(leaf):
                if line not in lines:
                    lines.append(line)
    return lines


# ---------------------------------------------------------------------------
# resolving specs


def _coerce_overrides(config: dict) -> dict:
    """``--config key=value`` may hand over a non-string setting as a string
    (e.g. trials='2'); read such strings as YAML."""
    for key in NON_STRING_SETTINGS:
        value = config.get(key)
        if isinstance(value, str):
            try:
                parsed = yaml.safe_load(value)
            except yaml.YAMLError:
                continue
            if not isinstance(parsed, str):
                config[key] = parsed
    return config


def _normalize(spec: dict) -> None:
    for f in INT_FIELDS:
        v = spec.get(f)
        if isinstance(v, float) and v.is_integer():
            spec[f] = int(v)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_.-") or "x"


def _tag(field: str, value: Any) -> str:
    """The id tag of one field value (used for swept fields)."""
    if field == "compile":
        return f"compile-{value}"
    if field == "ipex_optimize":
        return "ipexopt" if value else "noipexopt"
    if field == "channels_last":
        return "cl" if value else "nocl"
    if field == "data":
        return {"synthetic": "synthetic", "per_sample": "persample", "image_folder": "folder"}[
            value
        ]
    if field == "data_dir":
        return "dir-" + (_safe(Path(value).name) if value else "generated")
    if field == "num_workers":
        return f"nw{value}"
    if field == "threads":
        return f"t{value}" if value is not None else "tdefault"
    if field == "cpus":
        return "cpus" + value.replace(",", "_") if value else "cpusall"
    if field == "launcher":
        return "runcpu" if value == "run_cpu" else "nolauncher"
    if field == "allocator":
        return value if value != "default" else "defaultalloc"
    if field == "openmp":
        return "iomp" if value == "intel" else "gomp"
    if field == "batch_size":
        return f"bs{value}"
    if field == "image_size":
        return f"px{value}"
    if field == "warmup_steps":
        return f"warmup{value}"
    if field == "steps":
        return f"steps{value}"
    if field == "lr":
        return f"lr{value:g}"
    if field == "time_budget_s":
        return f"budget{value:g}" if value else "nobudget"
    if field == "seed":
        return f"seed{value}"
    if field == "timeout_s":
        return f"timeout{value}"
    if field == "probe_size":
        return f"probe{value}"
    if field == "warm_compile_cache":
        return "warmcache" if value else "coldcache"
    return _safe(str(value))  # backend, model, compile_mode, precision


# Fields the derived id shows; the others are appended as tags when swept.
ID_FIELDS = (
    "model",
    "backend",
    "compile",
    "compile_mode",
    "ipex_optimize",
    "precision",
    "channels_last",
    "data",
    "num_workers",
    "threads",
    "launcher",
    "allocator",
    "openmp",
    "batch_size",
    "image_size",
)


def derive_id(spec: dict, default_image_size: int) -> str:
    """The id of a spec without an explicit one, e.g. ``resnet50-ipex-ipexopt-bf16-cl-bs16``."""
    tags = [spec["model"]]
    if spec["backend"] != "eager":
        tags.append(spec["backend"])
    if spec["compile"] != BACKEND_COMPILE[spec["backend"]]:
        tags.append(f"compile-{spec['compile']}")
    if spec["compile_mode"] != "default":
        tags.append(spec["compile_mode"])
    if spec["ipex_optimize"]:
        tags.append("ipexopt")
    tags.append(spec["precision"])
    if spec["channels_last"]:
        tags.append("cl")
    if spec["data"] != "synthetic":
        tags.append(_tag("data", spec["data"]))
    if spec["num_workers"] > 0:
        tags.append(f"nw{spec['num_workers']}")
    if spec["threads"] is not None:
        tags.append(f"t{spec['threads']}")
    if spec["launcher"] == "run_cpu":
        tags.append("runcpu")
    if spec["allocator"] != "default":
        tags.append(spec["allocator"])
    if spec["openmp"] == "intel":
        tags.append("iomp")
    tags.append(f"bs{spec['batch_size']}")
    if spec["image_size"] != default_image_size:
        tags.append(f"px{spec['image_size']}")
    return "-".join(tags)


@dataclasses.dataclass
class _Item:
    spec: dict
    where: str  # e.g. "experiments[2]" or "sweeps[0]"
    origin: str  # e.g. "experiments[2]" or "sweeps[1] value batch_size=16"
    is_sweep: bool


def _resolve(fields: dict, defaults: dict, preset: str) -> dict:
    spec = copy.deepcopy({**BUILTIN_DEFAULTS, **defaults, **fields})
    if spec["compile"] is None:
        spec["compile"] = BACKEND_COMPILE.get(spec["backend"], "none")
    spec["env"] = BACKEND_ENV.get(spec["backend"], spec["backend"])
    spec["preset"] = preset
    _normalize(spec)
    return spec


def _expand(
    experiments: list, exp_base: str, sweeps: list, sweep_base: str, *, defaults: dict, preset: str
) -> tuple[list[_Item], list[str]]:
    items: list[_Item] = []
    errors: list[str] = []
    default_px = defaults["image_size"]
    for i, exp in enumerate(experiments):
        where = f"{exp_base}[{i}]"
        spec = _resolve(exp, defaults, preset)
        if spec["group"] is None:
            spec["group"] = "experiments"
        if spec["id"] is None:
            spec["id"] = derive_id(spec, default_px)
        items.append(_Item(spec, where, where, False))
    for i, raw in enumerate(sweeps):
        where = f"{sweep_base}[{i}]"
        sweep = dict(raw)
        name = sweep.pop("name", None)
        swept = [k for k, v in sweep.items() if isinstance(v, list)]
        if not swept:
            errors.append(
                _err(
                    where,
                    "a sweep needs at least one field with a list of values "
                    "(e.g. batch_size: [8, 32]); move a single run to experiments",
                )
            )
            continue
        group = sweep.pop("group", None) or name or "+".join(swept)
        for values in itertools.product(*(sweep[k] for k in swept)):
            fields = {**sweep, **dict(zip(swept, values, strict=True))}
            spec = _resolve(fields, defaults, preset)
            spec["group"] = group
            tags = [_tag(k, spec[k]) for k in swept]
            if name:
                spec["id"] = "-".join([name, *tags])
            else:
                extra = [t for k, t in zip(swept, tags, strict=True) if k not in ID_FIELDS]
                spec["id"] = "-".join([derive_id(spec, default_px), *extra])
            shown = ", ".join(f"{k}={_bare(v)}" for k, v in zip(swept, values, strict=True))
            label = "value" if len(swept) == 1 else "values"
            items.append(_Item(spec, where, f"{where} {label} {shown}", True))
    return items, errors


# ---------------------------------------------------------------------------
# checks on resolved specs


def parse_cpus(text: str) -> list[int]:
    """``'0-3,6'`` -> ``[0, 1, 2, 3, 6]``; ValueError when malformed."""
    cpus: list[int] = []
    for part in text.split(","):
        m = CPU_ITEM_RE.match(part.strip())
        if not m:
            raise ValueError(f"{part!r} is not a CPU number or an a-b range")
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) is not None else a
        if a > b:
            raise ValueError(f"range {part!r} runs backwards")
        cpus.extend(range(a, b + 1))
    return cpus


def check_spec(spec: dict) -> list[str]:
    """Combination problems of one resolved spec, as short sentences."""
    problems: list[str] = []
    backend, comp = spec["backend"], spec["compile"]
    if comp == "ipex" and backend != "ipex":
        problems.append(f"compile 'ipex' needs backend 'ipex' (got backend {backend!r})")
    if spec["ipex_optimize"] and backend != "ipex":
        problems.append(f"ipex_optimize true needs backend 'ipex' (got backend {backend!r})")
    if backend == "inductor" and comp != "inductor":
        problems.append(
            f"backend 'inductor' means torch.compile with inductor (got compile {comp!r}); "
            "use backend 'eager' for no compile"
        )
    if backend == "eager" and comp == "inductor":
        problems.append(
            "backend 'eager' means no torch.compile (got compile 'inductor'); "
            "use backend 'inductor' for torch.compile with inductor"
        )
    if backend == "xla":
        if comp not in ("none", "ipex"):
            problems.append(f"backend 'xla' needs compile 'none' (got compile {comp!r})")
        if spec["precision"] != "fp32":
            problems.append(
                f"backend 'xla' needs precision 'fp32' (got precision {spec['precision']!r})"
            )
        if spec["channels_last"]:
            problems.append("backend 'xla' needs channels_last false (got true)")
    if comp == "none" and spec["compile_mode"] != "default":
        problems.append(
            f"compile_mode {spec['compile_mode']!r} needs a compile (got compile 'none')"
        )
    if spec["launcher"] != "run_cpu":
        if spec["allocator"] != "default":
            problems.append(
                f"allocator {spec['allocator']!r} needs launcher 'run_cpu' "
                f"(got launcher {spec['launcher']!r})"
            )
        if spec["openmp"] == "intel":
            problems.append(
                f"openmp 'intel' needs launcher 'run_cpu' (got launcher {spec['launcher']!r})"
            )
    if spec["data"] == "synthetic" and spec["num_workers"] != 0:
        problems.append(
            f"num_workers {spec['num_workers']} needs data 'per_sample' or 'image_folder' "
            "(data 'synthetic' reuses one in-memory batch; num_workers must be 0)"
        )
    if spec["data_dir"] is not None and spec["data"] != "image_folder":
        problems.append(
            f"data_dir {spec['data_dir']!r} needs data 'image_folder' (got data {spec['data']!r})"
        )
    if spec["model"].startswith("resnet") and spec["image_size"] < 32:
        problems.append(
            f"model {spec['model']!r} needs image_size >= 32 (got image_size {spec['image_size']})"
        )
    if spec["cpus"] is not None:
        try:
            parse_cpus(spec["cpus"])
        except ValueError as exc:
            problems.append(
                f"cpus {spec['cpus']!r} is not a CPU list ({exc}); "
                "allowed: CPU numbers and a-b ranges (a <= b), comma-separated, e.g. '0-3,6'"
            )
    if not ID_RE.match(spec["id"]):
        problems.append(f"id {spec['id']!r} is not allowed; allowed: {ID_ALLOWED}")
    return problems


def _resolved_validator() -> jsonschema.Draft202012Validator:
    schema = _schema()
    props = {f: {"$ref": f"#/$defs/{f}"} for f in FIELDS}
    props["id"] = {"type": "string"}  # check_spec checks ids (derived ones too)
    props["env"] = {"enum": sorted(set(BACKEND_ENV.values()))}
    props["preset"] = {"$ref": "#/$defs/preset_name"}
    return jsonschema.Draft202012Validator(
        {
            "$defs": schema["$defs"],
            "type": "object",
            "additionalProperties": False,
            "required": list(props),
            "properties": props,
        }
    )


# ---------------------------------------------------------------------------
# the entry point


def load_study(config: dict | None, base_dir: Path | str = ".") -> Study:
    """Validate ``config`` and expand it into a Study (raises StudyConfigError)."""
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise StudyConfigError(_err("", f"the config must be a mapping, got {_show(config)}"))
    config = _coerce_overrides(copy.deepcopy(dict(config)))
    errors = validate_schema(config)
    if errors:
        raise StudyConfigError("\n".join(errors))

    # 2. the preset overlay
    preset = config.get("preset", SETTING_DEFAULTS["preset"])
    presets = config.get("presets", {})
    if preset != "default" and preset not in presets:
        available = ", ".join(sorted({"default", *presets}))
        raise StudyConfigError(
            _err("preset", f"{_show(preset)} is not a preset; available: {available}")
        )
    overlay = presets.get(preset, {})
    settings = {key: copy.deepcopy(config.get(key, v)) for key, v in SETTING_DEFAULTS.items()}
    settings["preset"] = preset
    if "trials" in overlay:
        settings["trials"] = overlay["trials"]
    settings["image_folder"] = {
        **SETTING_DEFAULTS["image_folder"],
        **config.get("image_folder", {}),
        **overlay.get("image_folder", {}),
    }
    given = config.get("containers", {})
    settings["containers"] = {
        **SETTING_DEFAULTS["containers"],
        **given,
        "base": {**SETTING_DEFAULTS["containers"]["base"], **given.get("base", {})},
    }
    base = settings["containers"]["base"]
    if base["source"] == "registry" and not base["image"]:
        raise StudyConfigError(
            _err("containers.base.image", "source registry needs an image, pinned by digest")
        )
    settings["prices"] = [{"note": "", **p} for p in settings["prices"]]
    names = [p["name"] for p in settings["prices"]]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise StudyConfigError(_err(f"prices[{i}].name", f"duplicate price name {name!r}"))

    defaults = {k: copy.deepcopy(v) for k, v in BUILTIN_DEFAULTS.items() if k not in PER_EXPERIMENT}
    defaults.update(copy.deepcopy(config.get("defaults", {})))
    defaults.update(copy.deepcopy(overlay.get("defaults", {})))
    _normalize(defaults)

    def pick(key: str) -> tuple[list, str]:
        if key in overlay:
            return overlay[key], f"presets.{preset}.{key}"
        return config.get(key, []), key

    experiments, exp_base = pick("experiments")
    sweeps, sweep_base = pick("sweeps")

    # 3. expansion, 4. checks
    items, errors = _expand(
        experiments, exp_base, sweeps, sweep_base, defaults=defaults, preset=preset
    )
    if not items and not errors:
        raise StudyConfigError(
            _err("", f"preset {preset!r} has no experiments (give experiments or sweeps)")
        )
    resolved = _resolved_validator()
    for item in items:
        at = f"{item.where} (id {item.spec['id']})"
        for error in sorted(resolved.iter_errors(item.spec), key=_path_key):
            for line in _schema_message(error):
                errors.append(line.replace("config error at ", f"config error at {at}.", 1))
        errors.extend(_err(at, problem) for problem in check_spec(item.spec))

    seen: dict[str, _Item] = {}
    for item in items:
        sid = item.spec["id"]
        if sid in seen:
            first = seen[sid]
            fix = (
                "give the sweeps different names"
                if first.is_sweep and item.is_sweep
                else "give one of them an explicit id"
            )
            errors.append(
                _err(
                    "", f"duplicate experiment id {sid!r} ({first.origin} and {item.origin}); {fix}"
                )
            )
        else:
            seen[sid] = item
    if errors:
        raise StudyConfigError("\n".join(errors))

    return Study(
        experiments=[item.spec for item in items],
        settings=settings,
        defaults=defaults,
        base_dir=Path(base_dir).resolve(),
    )


# ---------------------------------------------------------------------------
# command line


def read_config(path: Path | str, sets: list[str] | None = None) -> dict:
    """config.yaml plus ``key=value`` overrides (values read as YAML, like Snakemake's
    ``--config``)."""
    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise StudyConfigError(f"config error: cannot read {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise StudyConfigError(f"config error: {path} is not valid YAML: {exc}") from exc
    config = {} if config is None else config
    if not isinstance(config, dict):
        raise StudyConfigError(f"config error: {path} must hold a mapping")
    for item in sets or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise StudyConfigError(f"config error: --set {item!r}: expected key=value")
        try:
            config[key] = yaml.safe_load(value)
        except yaml.YAMLError:
            config[key] = value
    return config


def format_table(study: Study) -> str:
    s = study.settings
    lines = [
        (
            f"preset {s['preset']}: {len(study.experiments)} experiments, "
            f"envs {', '.join(study.envs)}, trials {s['trials']}, runtime {s['runtime']}"
        ),
    ]
    changed = {
        k: v
        for k, v in study.defaults.items()
        if k != "compile" and v != BUILTIN_DEFAULTS[k] and k not in PER_EXPERIMENT
    }
    if changed:
        lines.append("defaults: " + " ".join(f"{k}={_bare(v)}" for k, v in changed.items()))
    rows = [("id", "backend", "env", "group", "claim", "fields (other than the defaults)")]
    skip = {"id", "backend", "group", "claim_speedup", "env", "preset"}
    for spec in study.experiments:
        diffs = []
        for k in FIELDS:
            if k in skip:
                continue
            base = study.defaults[k]
            if k == "compile" and base is None:
                base = BACKEND_COMPILE[spec["backend"]]
            if spec[k] != base:
                diffs.append(f"{k}={_bare(spec[k])}")
        claim = "" if spec["claim_speedup"] is None else f"{spec['claim_speedup']:g}x"
        rows.append(
            (spec["id"], spec["backend"], spec["env"], spec["group"], claim, " ".join(diffs))
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[5])
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Print the experiments a study config expands to.")
    ap.add_argument("--config", default="config.yaml", type=Path, help="default: config.yaml")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a top-level key, like snakemake --config KEY=VALUE (repeatable)",
    )
    ap.add_argument("--json", action="store_true", help="print the resolved specs as JSON")
    args = ap.parse_args(argv)
    try:
        config = read_config(args.config, args.set)
        study = load_study(config, base_dir=args.config.parent)
    except StudyConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"settings": study.settings, "experiments": study.experiments}, indent=2))
    else:
        print(format_table(study))
    return 0


if __name__ == "__main__":
    sys.exit(main())
