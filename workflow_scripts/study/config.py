"""Turn the study configuration into a flat, validated list of experiments.

``load_study(config)`` takes the dict Snakemake builds (config.yaml plus
``--config key=value`` overrides, which arrive as top-level keys) and:

1. validates it against the schema derived from the field and setting
   declarations (``fields.py``, ``settings.py``; unknown keys anywhere are errors);
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
(``--schema`` prints the schema)
to print the expanded experiment table of a configuration.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import json
import re
import sys
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from .. import backends, launchers
from ..sysinfo import parse_cpu_list
from ..util import bare as _bare
from ..util import show
from .fields import (
    BUILTIN_DEFAULTS,
    FIELDS,
    ID_ALLOWED,
    ID_FIELDS,
    ID_PATTERN,
    INT_FIELDS,
    PER_EXPERIMENT,
    id_reference,
)
from .schema import build_schema, err, path_key, schema_message, validate_schema
from .settings import SETTING_DEFAULTS, SETTINGS

# Settings that are never strings: a string value from `--config` is read as YAML.
NON_STRING_SETTINGS = (
    *(name for name, s in SETTINGS.items() if s.structured),
    "defaults",
    "experiments",
    "sweeps",
    "presets",
)


# Variables the study sets from the spec (the field to use instead): a run must not get
# them from env_vars, or the record would show the spec while the run used another value.
CONTROLLED_ENV = {
    "OMP_NUM_THREADS": "use threads",
    "MKL_NUM_THREADS": "use threads",
    "LD_PRELOAD": "use launcher run_cpu with allocator/openmp",
    "MALLOC_CONF": "use allocator",
    "GOMP_CPU_AFFINITY": "use cpus",
    "OMP_PROC_BIND": "use cpus",
    "OMP_PLACES": "use cpus",
    "PJRT_DEVICE": "set by backend xla",
    "VIRTUAL_ENV": "the backend's environment",
    "PYTHONPATH": "the workflow's sources",
    "PATH": "the backend's environment",
}
CONTROLLED_PREFIXES = {"KMP_": "use openmp (run_cpu sets KMP_* for Intel OpenMP)"}


class StudyConfigError(Exception):
    """A configuration problem; ``str(exc)`` is the message to show the user."""


@dataclasses.dataclass
class Study:
    experiments: list[dict[str, Any]]
    settings: dict[str, Any]
    defaults: dict[str, Any]  # resolved defaults (built-in, then config, then preset)
    base_dir: Path
    #: legal but suspicious values, one line each (printed, never fatal)
    warnings: list[str] = dataclasses.field(default_factory=list)
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


def reparse_nested(value: Any, depth: int = 0) -> Any:
    """Snakemake reads the values nested in a ``--config key={...}`` override with
    YAML's base loader, as strings ('32', 'true'): read such leaves as YAML again."""
    if isinstance(value, dict):
        return {k: reparse_nested(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [reparse_nested(v, depth + 1) for v in value]
    if isinstance(value, str) and depth > 0:
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            return value
        return parsed if isinstance(parsed, (int, float, bool)) or parsed is None else value
    return value


def _integral(settings: dict) -> None:
    """Whole-number floats (``trials: 2.0``) of integer settings become ints."""
    for name, setting in SETTINGS.items():
        value = settings.get(name)
        if setting.schema.get("type") == "integer" and isinstance(value, float):
            settings[name] = int(value)
        if isinstance(value, dict) and "properties" in setting.schema:
            for key, sub in setting.schema["properties"].items():
                if sub.get("type") == "integer" and isinstance(value.get(key), float):
                    value[key] = int(value[key])


def _normalize(spec: dict) -> None:
    for f in INT_FIELDS:
        v = spec.get(f)
        if isinstance(v, float) and v.is_integer():
            spec[f] = int(v)


def tag(field: str, value: Any) -> str:
    """The id tag of one field value (used for swept fields)."""
    return FIELDS[field].tag(value)


def derive_id(spec: dict, defaults: dict) -> str:
    """The id of a spec without an explicit one, e.g. ``resnet50-ipex-ipexopt-bf16-cl-bs16``:
    the fields with an id position, each when it is always shown or differs from its
    reference value (see fields.Field)."""
    tags = []
    for name in ID_FIELDS:
        field = FIELDS[name]
        value = spec[name]
        if field.id_always or value != id_reference(name, spec, defaults):
            tags.append(field.tag(value))
    return "-".join(tags)


@dataclasses.dataclass
class _Item:
    spec: dict
    where: str  # e.g. "experiments[2]" or "sweeps[0]"
    origin: str  # e.g. "experiments[2]" or "sweeps[1] value batch_size=16"
    is_sweep: bool


def _resolve(fields: dict, defaults: dict, preset: str) -> dict:
    spec = copy.deepcopy({**BUILTIN_DEFAULTS, **defaults, **fields})
    backend = backends.get(spec["backend"])
    if spec["compile"] is None:
        spec["compile"] = backend.default_compile
    spec["env"] = backend.env
    spec["preset"] = preset
    _normalize(spec)
    return spec


def _expand(
    experiments: list, exp_base: str, sweeps: list, sweep_base: str, *, defaults: dict, preset: str
) -> tuple[list[_Item], list[str]]:
    items: list[_Item] = []
    errors: list[str] = []
    for i, exp in enumerate(experiments):
        where = f"{exp_base}[{i}]"
        spec = _resolve(exp, defaults, preset)
        if spec["group"] is None:
            spec["group"] = "experiments"
        if spec["id"] is None:
            spec["id"] = derive_id(spec, defaults)
        items.append(_Item(spec, where, where, False))
    for i, raw in enumerate(sweeps):
        where = f"{sweep_base}[{i}]"
        sweep = dict(raw)
        name = sweep.pop("name", None)
        swept = [k for k, v in sweep.items() if isinstance(v, list)]
        if not swept:
            errors.append(
                err(
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
            tags = [tag(k, spec[k]) for k in swept]
            if name:
                spec["id"] = "-".join([name, *tags])
            else:
                extra = [t for k, t in zip(swept, tags, strict=True) if k not in ID_FIELDS]
                spec["id"] = "-".join([derive_id(spec, defaults), *extra])
            shown = ", ".join(f"{k}={_bare(v)}" for k, v in zip(swept, values, strict=True))
            label = "value" if len(swept) == 1 else "values"
            items.append(_Item(spec, where, f"{where} {label} {shown}", True))
    return items, errors


# ---------------------------------------------------------------------------
# checks on resolved specs


def _owner_problems(spec: dict, kind: str, owners: list) -> list[str]:
    """A knob that only one backend (or launcher) acts on, set away from its neutral
    value while another one runs it."""
    problems = []
    for owner in owners:
        for knob, neutral in owner.owns.items():
            if spec[knob] != neutral and spec[kind] != owner.name:
                problems.append(
                    f"{knob} {show(spec[knob])} needs {kind} {owner.name!r} "
                    f"(got {kind} {spec[kind]!r})"
                )
    return problems


def check_spec(spec: dict) -> list[str]:
    """Combination problems of one resolved spec, as short sentences: the backend's and
    the launcher's own rules, the knobs they own, and the rules between data fields."""
    problems: list[str] = []
    backend = backends.get(spec["backend"])
    for other in backends.all_backends():
        if spec["compile"] in other.compile_options and other is not backend:
            problems.append(
                f"compile {spec['compile']!r} needs backend {other.name!r} "
                f"(got backend {backend.name!r})"
            )
    problems += _owner_problems(spec, "backend", backends.all_backends())
    problems += backend.check(spec)
    if spec["compile"] == "none" and spec["compile_mode"] != "default":
        problems.append(
            f"compile_mode {spec['compile_mode']!r} needs a compile (got compile 'none')"
        )
    elif spec["compile"] not in ("none", "inductor") and spec["compile_mode"] != "default":
        problems.append(
            f"compile_mode {spec['compile_mode']!r} needs compile 'inductor' (compile "
            f"{spec['compile']!r} ignores it)"
        )
    for name in spec["env_vars"]:
        field = CONTROLLED_ENV.get(name) or next(
            (f for prefix, f in CONTROLLED_PREFIXES.items() if name.startswith(prefix)), None
        )
        if field:
            problems.append(
                f"env_vars.{name} is set by the study itself ({field}); an override would "
                "run something else than the record says"
            )
    problems += _owner_problems(spec, "launcher", launchers.all_launchers())
    problems += launchers.get(spec["launcher"]).check(spec)
    if spec["data"] == "synthetic" and spec["num_workers"] != 0:
        problems.append(
            f"num_workers {spec['num_workers']} needs data 'per_sample' or 'image_folder' "
            "(data 'synthetic' reuses one in-memory batch; num_workers must be 0)"
        )
    if spec["data_dir"] is not None and spec["data"] != "image_folder":
        problems.append(
            f"data_dir {spec['data_dir']!r} needs data 'image_folder' (got data {spec['data']!r})"
        )
    if spec["model"].startswith("resnet") and spec["batch_size"] == 1 and spec["image_size"] <= 32:
        problems.append(
            f"model {spec['model']!r} at batch_size 1 with image_size {spec['image_size']} "
            "ends in 1x1 feature maps, where batch norm has one value per channel and cannot "
            "train; use batch_size >= 2 or image_size >= 64"
        )
    if spec["model"].startswith("resnet") and spec["image_size"] < 32:
        problems.append(
            f"model {spec['model']!r} needs image_size >= 32 (got image_size {spec['image_size']})"
        )
    if spec["cpus"] is not None:
        try:
            parse_cpu_list(spec["cpus"])
        except ValueError as exc:
            problems.append(
                f"cpus {spec['cpus']!r} is not a CPU list ({exc}); "
                "allowed: CPU numbers and a-b ranges (a <= b), comma-separated, e.g. '0-3,6'"
            )
    if not re.match(ID_PATTERN, spec["id"]):
        problems.append(f"id {spec['id']!r} is not allowed; allowed: {ID_ALLOWED}")
    return problems


def _resolved_validator() -> jsonschema.Draft202012Validator:
    schema = build_schema()
    props = {f: {"$ref": f"#/$defs/{f}"} for f in FIELDS}
    props["id"] = {"type": "string"}  # check_spec checks ids (derived ones too)
    props["env"] = {"enum": sorted({b.env for b in backends.all_backends()})}
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


def _settings(config: dict, overlay: dict, preset: str, cli: dict) -> dict:
    """The top-level settings: the declared defaults, then the config, then the preset's
    ``trials`` and ``image_folder``, then the command line's (it wins over a preset);
    nested mappings merged key by key."""
    settings = {key: copy.deepcopy(config.get(key, v)) for key, v in SETTING_DEFAULTS.items()}
    settings["preset"] = preset
    if "trials" in overlay:
        settings["trials"] = overlay["trials"]
    if "trials" in cli:
        settings["trials"] = cli["trials"]
    settings["image_folder"] = {
        **SETTING_DEFAULTS["image_folder"],
        **config.get("image_folder", {}),
        **overlay.get("image_folder", {}),
        **cli.get("image_folder", {}),
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
            err("containers.base.image", "source registry needs an image, pinned by digest")
        )
    settings["prices"] = [{"note": "", **p} for p in settings["prices"]]
    names = [p["name"] for p in settings["prices"]]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise StudyConfigError(err(f"prices[{i}].name", f"duplicate price name {name!r}"))

    return settings


def load_study(config: dict | None, base_dir: Path | str = ".", cli: dict | None = None) -> Study:
    """Validate ``config`` and expand it into a Study (raises StudyConfigError).

    ``cli``: what the command line set (Snakemake's ``--configfile`` and ``--config``);
    it wins over the selected preset, as it wins over config.yaml."""
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise StudyConfigError(err("", f"the config must be a mapping, got {show(config)}"))
    cli = _coerce_overrides(copy.deepcopy(dict(cli or {})))
    config = _coerce_overrides(copy.deepcopy(dict(config)))
    _merge(config, cli)
    errors = validate_schema(config)
    if errors:
        raise StudyConfigError("\n".join(errors))

    # 2. the preset overlay
    preset = config.get("preset", SETTING_DEFAULTS["preset"])
    presets = config.get("presets", {})
    if preset != "default" and preset not in presets:
        available = ", ".join(sorted({"default", *presets}))
        raise StudyConfigError(
            err("preset", f"{show(preset)} is not a preset; available: {available}")
        )
    overlay = presets.get(preset, {})
    settings = _settings(config, overlay, preset, cli)
    _integral(settings)

    defaults = {k: copy.deepcopy(v) for k, v in BUILTIN_DEFAULTS.items() if k not in PER_EXPERIMENT}
    defaults.update(copy.deepcopy(config.get("defaults", {})))
    defaults.update(copy.deepcopy(overlay.get("defaults", {})))
    defaults.update(copy.deepcopy(cli.get("defaults", {})))
    _normalize(defaults)

    def pick(key: str) -> tuple[list, str]:
        if key in cli:
            return cli[key], key
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
            err("", f"preset {preset!r} has no experiments (give experiments or sweeps)")
        )
    resolved = _resolved_validator()
    for item in items:
        at = f"{item.where} (id {item.spec['id']})"
        for error in sorted(resolved.iter_errors(item.spec), key=path_key):
            for line in schema_message(error):
                errors.append(line.replace("config error at ", f"config error at {at}.", 1))
        errors.extend(err(at, problem) for problem in check_spec(item.spec))

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
                err(
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
        warnings=setting_warnings(settings),
    )


def setting_warnings(settings: dict) -> list[str]:
    """Legal values that probably do not do what the user wants."""
    out = []
    if settings["noise_threshold"] >= 0.95:
        out.append(
            f"config warning at noise_threshold: {settings['noise_threshold']:g} reruns (and "
            "then flags) nearly every trial: a probe varies by a few percent on a quiet "
            f"machine; the default is {SETTING_DEFAULTS['noise_threshold']:g}"
        )
    if settings["noise_retries"] > 5:
        out.append(
            f"config warning at noise_retries: {settings['noise_retries']} reruns of a "
            "disturbed trial can take hours on a busy machine; the default is "
            f"{SETTING_DEFAULTS['noise_retries']}"
        )
    return out


def _merge(config: dict, over: dict) -> None:
    """Snakemake's merge of a ``--config`` override into the config: mappings key by key."""
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            _merge(config[key], value)
        else:
            config[key] = copy.deepcopy(value)


def check_yaml(path: Path | str) -> None:
    """A YAML file's syntax error as the user's message, with its line and column."""
    path = Path(path)
    try:
        yaml.safe_load(path.read_text())
    except OSError as exc:
        raise StudyConfigError(f"config error: cannot read {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise StudyConfigError(
            f"config error: {path} is not valid YAML{where}: {problem}"
        ) from None


def check_config_files(workflow, configfile: str = "config.yaml") -> None:
    """Before Snakemake reads them: the config files' YAML syntax, with line and column."""
    from snakemake.exceptions import WorkflowError

    try:
        for path in [Path(workflow.basedir) / configfile, *workflow.overwrite_configfiles]:
            check_yaml(path)
    except StudyConfigError as exc:
        raise WorkflowError(str(exc)) from None


def load_for_snakemake(workflow, config: dict) -> Study:
    """:func:`load_study` for the Snakefile, with the command line's ``--config`` winning
    over the preset, and the checks that need this machine (CPUs, memory, files). A
    configuration error stops Snakemake with the loader's message alone (a
    WorkflowError, no traceback); warnings are printed."""
    from snakemake.exceptions import WorkflowError

    from .machine import check_machine

    try:
        settings = workflow.config_settings
        cli = copy.deepcopy(dict(getattr(settings, "overwrite_config", None) or {}))
        _merge(cli, reparse_nested(dict(getattr(settings, "config", None) or {})))
        study = load_study(config, workflow.basedir, cli=cli)
        check_machine(study)
    except StudyConfigError as exc:
        raise WorkflowError(str(exc)) from None
    for line in study.warnings:
        print(line, file=sys.stderr)
    return study


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
                base = backends.get(spec["backend"]).default_compile
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
    ap = argparse.ArgumentParser(
        prog="python -m workflow_scripts.study",
        description="Print the experiments a study config expands to.",
    )
    ap.add_argument("--config", default="config.yaml", type=Path, help="default: config.yaml")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a top-level key, like snakemake --config KEY=VALUE (repeatable)",
    )
    ap.add_argument("--json", action="store_true", help="print the resolved specs as JSON")
    ap.add_argument("--schema", action="store_true", help="print the config schema (YAML)")
    args = ap.parse_args(argv)
    if args.schema:
        print(yaml.safe_dump(build_schema(), sort_keys=False, width=100), end="")
        return 0
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
