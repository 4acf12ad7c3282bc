"""Turn the study configuration into a flat, validated list of experiments.

``load_study(config)`` takes the dict Snakemake builds (config.yaml plus
``--config key=value`` overrides, which arrive as top-level keys) and:

1. validates it against the schema derived from the field and setting
   declarations (``fields.py``, ``settings.py``; unknown keys anywhere are errors);
2. applies the selected preset (``preset``, default ``"default"``): the
   preset's ``defaults`` and ``image_folder`` are merged key by key over the
   top-level ones, its ``trials`` replaces the top-level one when given; the study's
   ``groups`` come from the first of the command line, the preset and config.yaml
   that gives them (:func:`study_of`);
3. expands each of ``groups`` (a group's ``runs`` with its name as their ``group``
   and its ``shared`` fields under their own: :func:`study_runs`), in the order
   written, into fully resolved experiment specs: a sweep is the Cartesian product
   of its list-valued fields in the order written, the last field varying fastest;
4. checks each spec (field values, combinations of fields, ids);
5. with ``preflight``, shortens each spec to its pre-flight (``preflight.py``).

Every problem raises ``StudyConfigError`` whose message is meant for the
user, one line per problem, e.g.
``config error at groups.ladder.runs[2].precision: 'fp16' is not allowed; allowed:
fp32, bf16``.

Run ``python -m workflow_scripts.study [--config config.yaml] [--set key=value ...]``
(``--schema`` prints the schema)
to print the expanded experiment table of a configuration.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import math
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from .. import backends, launchers, workloads
from ..experiment import Spec
from ..plan import preflight
from ..spec.fields import (
    BUILTIN_DEFAULTS,
    FIELDS,
    ID_FIELDS,
    INT_FIELDS,
    PER_EXPERIMENT,
    id_reference,
)
from ..spec.settings import SETTING_DEFAULTS, SETTINGS, budget_seconds
from ..sysinfo import parse_cpu_list, plan_cpus
from ..util import bare as _bare
from ..util import shape_problem, show
from .causes import given_fields, one_per_cause
from .checks import check_spec, setting_warnings, weights_problems
from .schema import (
    StudyValidator,
    build_schema,
    coerce_strings,
    err,
    not_plain,
    path_key,
    schema_message,
    validate_schema,
)

# Settings that are never strings: a string value from `--config` is read as YAML.
NON_STRING_SETTINGS = (
    *(name for name, s in SETTINGS.items() if s.structured),
    "defaults",
    "groups",
    "presets",
)


class StudyConfigError(Exception):
    """A configuration problem; ``str(exc)`` is the message to show the user."""


@dataclasses.dataclass
class Study:
    experiments: list[Spec]
    settings: dict[str, Any]
    defaults: dict[str, Any]  # resolved defaults (built-in, then config, then preset)
    base_dir: Path
    #: legal but suspicious values, one line each (printed, never fatal)
    warnings: list[str] = dataclasses.field(default_factory=list)
    #: the experiments a budget's plan left out before any ran (study/entry.py,
    #: ``plan_budget``), each ``{"id", "group"}``, in the study's order
    left_out: list[dict[str, str]] = dataclasses.field(default_factory=list)
    #: a budget's plan that is made again once the calibrations have run (study/replan.py):
    #: ``{"must": [ids it runs], "reserve": [ids it runs where they fit then]}``; None
    replan: dict[str, list[str]] | None = None
    by_id: dict[str, Spec] = dataclasses.field(init=False)
    envs: list[str] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.by_id = {spec["id"]: spec for spec in self.experiments}
        self.envs = sorted({spec["env"] for spec in self.experiments})

    @property
    def results(self) -> str:
        """Where its records, summary and report go (``results``; a pre-flight's apart)."""
        return preflight.results_root(self.settings)

    @property
    def logs(self) -> str:
        """Where the logs of its trials, collectives and report go."""
        return preflight.logs_root(self.settings)

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


#: a config's size, checked before it is read: config.yaml holds about 2,000 values,
#: 6 levels deep; a YAML alias counts each time it is used (an alias bomb is refused
#: after this many steps, not expanded into schema errors or messages)
CONFIG_MAX_VALUES = 200_000
CONFIG_MAX_DEPTH = 32


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
    where: str  # e.g. "groups.ladder.runs[2]"
    origin: str  # e.g. "groups.batch.runs[0] value batch_size=16"
    is_sweep: bool


def resolve_spec(fields: dict, defaults: dict, preset: str) -> dict:
    """One experiment's fields over the resolved defaults, with what the loader derives."""
    spec = copy.deepcopy({**BUILTIN_DEFAULTS, **defaults, **fields})
    backend = backends.get(spec["backend"])
    if spec["compile"] is None:
        spec["compile"] = backend.default_compile
    launcher = spec["launcher"]
    spec["env"] = (
        launchers.get(launcher).env(spec, backend) if launcher in launchers.names() else backend.env
    )
    spec["preset"] = preset
    _input_size(spec, fields)
    workload = workloads.WORKLOADS.get(spec["model"])
    if workload is not None and not workload.text:
        spec["dropout"] = False  # an image model has none either way
    _training(spec)
    _weak_scaling(spec)
    _normalize(spec)
    return spec


def _training(spec: dict) -> None:
    """The optimizer, learning rate and schedule a spec leaves to its model (null) become
    its family's (``workloads.TRAINING_DEFAULTS``): the spec holds what runs."""
    w = workloads.WORKLOADS.get(spec["model"])
    if w is None:
        return  # the schema names the allowed models
    for key, value in workloads.TRAINING_DEFAULTS[w.family].items():
        if spec.get(key) is None:
            spec[key] = value


def _weak_scaling(spec: dict) -> None:
    """batch_scaling weak: the written batch_size is each rank's and the written lr the
    one-process rate; the spec holds the global batch and the scaled rate (nodes x ranks
    times each), as every other part of the study reads them."""
    if spec.get("batch_scaling") != "weak":
        return
    world = int(spec.get("ranks") or 1) * int(spec.get("nodes") or 1)
    if isinstance(spec.get("batch_size"), int) and isinstance(spec.get("lr"), (int, float)):
        spec["batch_size"] *= world
        spec["lr"] = round(spec["lr"] * world, 12)


def _input_size(spec: dict, fields: dict) -> None:
    """A text model's spec holds its sequence length (``null``: the model's own) and no
    image size, an image model's no sequence length; a value the experiment sets
    itself stays, for the checks to refuse."""
    w = workloads.WORKLOADS.get(spec["model"])
    if w is None:
        return
    if w.text:
        spec["seq_len"] = spec["seq_len"] or w.seq_len
        spec["attention"] = spec["attention"] or "sdpa"
        if "image_size" not in fields:
            spec["image_size"] = None
    elif "seq_len" not in fields:
        spec["seq_len"] = None


@dataclasses.dataclass
class _Run:
    """One entry of a study before its expansion: a single experiment or a sweep."""

    fields: dict  # a group's run: with its group and the group's shared fields
    where: str  # e.g. "groups.ladder.runs[2]", "presets.quick.groups.ladder.runs[0]"
    is_sweep: bool


def is_sweep(run: dict) -> bool:
    """Whether a group's run is a sweep: it has a ``name``, ``layouts`` or a field
    holding a list of values (the schema tells them apart the same way)."""
    return "name" in run or "layouts" in run or any(isinstance(v, list) for v in run.values())


def study_of(config: dict, overlay: dict, cli: dict, preset: str) -> list[_Run]:
    """The study's runs: the ``groups`` of the first of the command line, the preset and
    config.yaml that gives them, so that a command line (or ``--configfile``) or a
    preset with a study of its own runs it without config.yaml's groups."""
    layers = ((cli, ""), (overlay, f"presets.{preset}."), (config, ""))
    section, base = next(((s, b) for s, b in layers if "groups" in s), ({}, ""))
    return study_runs(section, base)


def study_runs(section: dict, base: str = "") -> list[_Run]:
    """A study's runs in the order they expand: each group's ``runs`` (the groups in the
    order written), a run with the group's name as its ``group`` and each of the group's
    ``shared`` fields it does not set itself (its own value wins). A block (an entry of a
    group's runs with ``runs`` of its own) gives its runs, in its place, its ``shared``
    fields over the group's."""
    runs = []
    for name, group in (section.get("groups") or {}).items():
        shared = group.get("shared") or {}
        for i, run in enumerate(group.get("runs") or []):
            where = f"{base}groups.{name}.runs[{i}]"
            if is_block(run):
                inner = {**shared, **(run.get("shared") or {})}
                for j, each in enumerate(run["runs"] or []):
                    runs.append(_group_run(name, inner, each, f"{where}.runs[{j}]"))
            else:
                runs.append(_group_run(name, shared, run, where))
    return runs


def is_block(run: dict) -> bool:
    """Whether an entry of a group's runs is a block of runs (it has ``runs``)."""
    return "runs" in run


def _group_run(group: str, shared: dict, run: dict, where: str) -> _Run:
    own = {k: v for k, v in shared.items() if k not in run}
    return _Run({"group": group, **own, **run}, where, is_sweep(run))


def _expand(
    runs: list[_Run],
    *,
    defaults: dict,
    preset: str,
    most: int,
) -> tuple[list[_Item], list[str]]:
    """The experiments of a study's runs, at most ``most`` of them (limits.
    experiments): counted before a sweep is expanded, so a config that asks for more
    costs nothing but the message."""
    items: list[_Item] = []
    errors: list[str] = []
    singles = sum(1 for run in runs if not run.is_sweep)
    sweeps = len(runs) - singles
    asked = singles + sum(_sweep_size(run.fields) for run in runs if run.is_sweep)
    if asked > most:
        return [], [
            err(
                "limits.experiments",
                f"the study asks for {asked} experiments ({singles} listed, the "
                f"rest from {sweeps} sweeps), more than the limit of {most}; raise "
                f"it on purpose, e.g. --config limits='{{experiments: {asked}}}'",
            )
        ]
    for run in runs:
        if run.is_sweep:
            items_, errors_ = _expand_sweep(run, defaults=defaults, preset=preset)
            items += items_
            errors += errors_
            continue
        spec = resolve_spec(run.fields, defaults, preset)
        if spec["id"] is None:
            spec["id"] = derive_id(spec, defaults)
        items.append(_Item(spec, run.where, run.where, False))
    return items, errors


def _expand_sweep(run: _Run, *, defaults: dict, preset: str) -> tuple[list[_Item], list[str]]:
    """One sweep's experiments: the product of its lists, each with every layout."""
    where = run.where
    sweep = dict(run.fields)
    name = sweep.pop("name", None)
    swept = [k for k, v in sweep.items() if isinstance(v, list)]
    if not swept and "layouts" not in sweep:
        return [], [
            err(
                where,
                "a sweep needs at least one field with a list of values "
                "(e.g. batch_size: [8, 32]) or layouts; a single run takes an id, not a name",
            )
        ]
    group = sweep.pop("group")
    clashes = _tag_clashes(sweep, swept)
    layouts, problem = _layouts(sweep)
    if problem:
        return [], [err(f"{where}.layouts", problem)]
    items: list[_Item] = []
    for values, (n_ranks, threads) in itertools.product(
        itertools.product(*(sweep[k] for k in swept)), layouts
    ):
        fields = {**sweep, **dict(zip(swept, values, strict=True))}
        if n_ranks:
            fields.update(ranks=n_ranks, threads=threads)
        spec = resolve_spec(fields, defaults, preset)
        if n_ranks and spec["batch_size"] % (n_ranks * spec["nodes"]):
            continue  # a split that cannot share the global batch evenly
        spec["group"] = group
        keys = [*swept, *(("ranks", "threads") if n_ranks else ())]
        tags = [tag(k, spec[k]) + clashes.get((k, _value_key(spec[k])), "") for k in keys]
        if name:
            spec["id"] = "-".join([name, *tags])
        else:
            extra = [t for k, t in zip(keys, tags, strict=True) if k not in ID_FIELDS]
            spec["id"] = "-".join([derive_id(spec, defaults), *extra])
        shown = ", ".join(f"{k}={_bare(spec[k])}" for k in keys)
        label = "value" if len(keys) == 1 else "values"
        items.append(_Item(spec, where, f"{where} {label} {shown}", True))
    return items, []


def _sweep_size(raw: Any) -> int:
    """How many experiments a sweep can expand to at most (its lists' product, times
    the CPUs for ``layouts``), without expanding it."""
    if not isinstance(raw, dict):
        return 1
    size = math.prod(len(v) for v in raw.values() if isinstance(v, list))
    if "layouts" in raw:
        try:
            cpus = raw.get("cpus")
            size *= len(parse_cpu_list(cpus)) if isinstance(cpus, str) else len(plan_cpus())
        except ValueError:
            pass
    return size


def _layouts(sweep: dict) -> tuple[list[tuple[int | None, int | None]], str | None]:
    """The (ranks, threads) pairs of ``layouts`` (popped from the sweep): every split of
    the CPU budget into equal blocks, fewest ranks first (``multi``: 2 ranks or more);
    [(None, None)] without it. The budget is the sweep's ``cpus`` or what this machine
    lets the study use, at plan time (:func:`~workflow_scripts.sysinfo.plan_cpus`)."""
    kind = sweep.pop("layouts", None)
    if kind is None:
        return [(None, None)], None
    clash = [k for k in ("ranks", "threads") if k in sweep]
    if clash:
        return [], f"layouts {kind!r} sets ranks and threads itself; remove {' and '.join(clash)}"
    cpus = sweep.get("cpus")
    try:
        budget = len(parse_cpu_list(cpus)) if isinstance(cpus, str) else len(plan_cpus())
    except ValueError:
        return [], f"layouts {kind!r} needs a valid cpus list (got cpus {cpus!r})"
    least = 1 if kind == "all" else 2
    threads = 2 if kind == "multi-threaded" else 1
    pairs = [
        (r, budget // r)
        for r in range(least, budget + 1)
        if budget % r == 0 and budget // r >= threads
    ]
    if not pairs and kind == "multi":
        return [], f"layouts {kind!r}: {budget} CPU(s) cannot hold 2 ranks"
    # multi-threaded: none where the CPUs cannot hold 2 ranks of 2 threads (a 2-CPU
    # machine still runs the rest of the default study)
    return pairs, None


def _value_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _tag_clashes(sweep: dict, swept: list[str]) -> dict[tuple[str, str], str]:
    """Swept values of one field that share an id tag (two data_dirs ending in the same
    folder name): a short hash of the value each, to add to the tag."""
    out: dict[tuple[str, str], str] = {}
    for key in swept:
        by_tag: dict[str, set[str]] = {}
        for value in sweep[key]:
            by_tag.setdefault(tag(key, value), set()).add(_value_key(value))
        for values in by_tag.values():
            if len(values) > 1:
                for v in values:
                    out[(key, v)] = "-" + hashlib.sha1(v.encode()).hexdigest()[:6]
    return out


# ---------------------------------------------------------------------------
# checks on resolved specs


def _resolved_validator() -> jsonschema.Draft202012Validator:
    schema = build_schema()
    props = {f: {"$ref": f"#/$defs/{f}"} for f in FIELDS}
    props["id"] = {"type": "string"}  # check_spec checks ids (derived ones too)
    envs = {b.env for b in backends.all_backends()}
    envs |= {e for launcher in launchers.all_launchers() for e in launcher.envs}
    props["env"] = {"enum": sorted(envs)}
    props["preset"] = {"$ref": "#/$defs/preset_name"}
    return StudyValidator(
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
    ``trials``, ``max_trials``, ``preflight``, ``image_folder`` and ``collectives``, then
    the command line's (it wins over a preset); nested mappings merged key by key."""
    settings = {key: copy.deepcopy(config.get(key, v)) for key, v in SETTING_DEFAULTS.items()}
    settings["preset"] = preset
    for key in ("trials", "max_trials", "preflight"):  # a preset may be a pre-flight
        if key in overlay:
            settings[key] = overlay[key]
        if key in cli:
            settings[key] = cli[key]
    settings["image_folder"] = {
        **SETTING_DEFAULTS["image_folder"],
        **config.get("image_folder", {}),
        **overlay.get("image_folder", {}),
        **cli.get("image_folder", {}),
    }
    settings["collectives"] = {
        **SETTING_DEFAULTS["collectives"],
        **config.get("collectives", {}),
        **overlay.get("collectives", {}),
        **cli.get("collectives", {}),
    }
    c = settings["collectives"]
    counts = c["ranks"] if isinstance(c["ranks"], list) else [c["ranks"]]
    if c["nodes"] == 1 and any(n != "all" and n < 2 for n in counts):
        raise StudyConfigError(
            err(
                "collectives.ranks",
                f"{show(c['ranks'])}: on one node (collectives.nodes 1) "
                "an allreduce needs at least 2 ranks",
            )  # fmt: skip
        )
    settings["limits"] = {**SETTING_DEFAULTS["limits"], **config.get("limits", {})}
    settings["cluster"] = {**SETTING_DEFAULTS["cluster"], **config.get("cluster", {})}
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
    if settings["budget"] and budget_seconds(settings["budget"]) <= 0:
        raise StudyConfigError(
            err(
                "budget",
                f"{show(settings['budget'])} is no time; allowed: a positive "
                "duration such as 45min, 1h or 5400s (null: no budget)",
            )  # fmt: skip
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
    it wins over the selected preset, as it wins over config.yaml. Its nested strings
    where the schema wants a number, a flag or null are read as YAML
    (:func:`~.schema.coerce_strings`)."""
    config, cli = _validated(config, cli)  # 1. the schema, every error at once
    preset, overlay = _preset(config)  # 2. the preset overlay
    settings = _settings(config, overlay, preset, cli)
    _integral(settings)
    defaults = _defaults(config, overlay, cli)
    items, errors = _expand(  # 3. expansion
        study_of(config, overlay, cli, preset),
        defaults=defaults,
        preset=preset,
        most=settings["limits"]["experiments"],
    )
    if not items and not errors:
        raise StudyConfigError(
            err(
                "", f"preset {preset!r} has no experiments (give groups: {{name: {{runs: [...]}}}})"
            )
        )
    errors += _problems(items, settings)  # 4. the checks of what it expanded to
    if errors:  # (one line per cause: a default wrong for every experiment, once)
        ids = [item.spec["id"] for item in items]
        errors = one_per_cause(errors, ids, given_fields(defaults), len(items))
        raise StudyConfigError("\n".join(errors))
    specs = [item.spec for item in items]
    if settings["preflight"]:  # 5. the pre-flight: every experiment, the fewest steps
        specs = [preflight.shorten(spec) for spec in specs]
        settings = preflight.settings(settings)
    return Study(
        experiments=[Spec(spec) for spec in specs],
        settings=settings,
        defaults=defaults,
        base_dir=Path(base_dir).resolve(),
        warnings=setting_warnings(settings),
    )


def _validated(config: dict | None, cli: dict | None) -> tuple[dict, dict]:
    """The config with the command line merged in, and the command line's part, both
    checked against the schema (their size first: a bounded walk)."""
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise StudyConfigError(err("", f"the config must be a mapping, got {show(config)}"))
    for what, value in (("the config", config), ("the command line's config", cli)):
        problem = shape_problem(value, CONFIG_MAX_VALUES, CONFIG_MAX_DEPTH)
        if problem:
            raise StudyConfigError(err("", f"{what} has {problem}: refused before reading it"))
        problems = not_plain(value)  # (YAML's dates, sets, binary: with their path)
        if problems:
            raise StudyConfigError("\n".join(problems))
    cli = coerce_strings(_coerce_overrides(copy.deepcopy(dict(cli or {}))))
    config = _coerce_overrides(copy.deepcopy(dict(config)))
    merge_config(config, cli)
    errors = validate_schema(config)
    if errors:
        raise StudyConfigError("\n".join(errors))
    return config, cli


def _preset(config: dict) -> tuple[str, dict]:
    """The selected preset's name and what it overlays (nothing for the default)."""
    preset = config.get("preset", SETTING_DEFAULTS["preset"])
    presets = config.get("presets", {})
    if preset != "default" and preset not in presets:
        available = ", ".join(sorted({"default", *presets}))
        raise StudyConfigError(
            err("preset", f"{show(preset)} is not a preset; available: {available}")
        )
    return preset, presets.get(preset, {})


def _defaults(config: dict, overlay: dict, cli: dict) -> dict:
    """Every experiment's defaults: the built-in ones, then the config's, the preset's
    and the command line's."""
    defaults = {k: copy.deepcopy(v) for k, v in BUILTIN_DEFAULTS.items() if k not in PER_EXPERIMENT}
    defaults.update(copy.deepcopy(config.get("defaults", {})))
    defaults.update(copy.deepcopy(overlay.get("defaults", {})))
    defaults.update(copy.deepcopy(cli.get("defaults", {})))
    _normalize(defaults)
    return defaults


def _problems(items: list[_Item], settings: dict) -> list[str]:
    """What is wrong with the expanded experiments, in this order: more trials than
    the limit, each experiment's resolved schema and checks, duplicate ids, and
    ``weights_from`` that names no experiment it can take weights from."""
    errors = []
    most = max(settings["trials"], settings["max_trials"] or 0)
    if len(items) * most > settings["limits"]["trials"]:
        errors.append(
            err(
                "limits.trials",
                f"{len(items)} experiments x up to {most} trials is {len(items) * most} "
                f"trials, more than the limit of {settings['limits']['trials']}; raise it on "
                f"purpose, e.g. --config limits='{{trials: {len(items) * most}}}'",
            )
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
        if sid not in seen:
            seen[sid] = item
            continue
        first = seen[sid]
        fix = (
            "give the sweeps different names"
            if first.is_sweep and item.is_sweep
            else "give one of them an explicit id"
        )
        errors.append(
            err("", f"duplicate experiment id {sid!r} ({first.origin} and {item.origin}); {fix}")
        )
    for sid, problem in weights_problems([item.spec for item in seen.values()]):
        errors.append(err(f"{seen[sid].where} (id {sid})", problem))
    return errors


def merge_config(config: dict, over: dict) -> None:
    """Snakemake's merge of a ``--config`` override into the config: mappings key by key."""
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            merge_config(config[key], value)
        else:
            config[key] = copy.deepcopy(value)
