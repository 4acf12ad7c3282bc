"""The config schema, derived from the field and setting declarations, and the
user's messages for its errors.

:func:`build_schema` assembles a JSON Schema (draft 2020-12) from
:data:`fields.FIELDS` (one ``$defs`` entry per experiment field, and the
``defaults`` mapping and those of ``groups``: ``study_group``, ``group_shared`` and
``group_run``, a single experiment's or a sweep's) and
:data:`settings.SETTINGS`. It has no ``default`` keywords: the defaults live in the
declarations, and the loader applies them. :func:`validate_schema` turns
jsonschema's errors into one line each, naming the field path, the value and what
is allowed (with a suggestion for a near-miss name).

    python -m workflow_scripts.study --schema     # print the schema as YAML
"""

from __future__ import annotations

import datetime
import difflib
import functools
import math
import re
from typing import Any

import jsonschema

from ..spec.fields import FIELDS, NOT_SWEPT, PER_EXPERIMENT
from ..spec.settings import MAX_TRIALS, PRESET_NAME, SETTINGS, TRIALS
from ..util import bare as _bare
from ..util import show as _show

SCHEMA_URI = "https://json-schema.org/draft/2020-12/schema"

#: how a study was written before groups: refused, saying how to write it now
FORMER_STUDY_KEYS = ("experiments", "sweeps")
FORMER_STUDY = (
    "a study is written as groups: groups: {<name>: {runs: [...]}}, its single "
    "experiments and sweeps in one list (docs/configuration.md#groups); top-level "
    "experiments and sweeps are no longer read"
)


def _ref(name: str) -> dict:
    return {"$ref": f"#/$defs/{name}"}


@functools.cache
def build_schema() -> dict:
    """The whole config schema, from the declarations."""
    defs: dict[str, Any] = {
        "preset_name": PRESET_NAME,
        "trials": TRIALS,
        "max_trials": MAX_TRIALS,
    }
    for name, field in FIELDS.items():
        defs[name] = field.value_schema()
    defs["defaults"] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {n: _ref(n) for n in FIELDS if n not in PER_EXPERIMENT},
    }
    defs.update(_group_defs(_sweep_properties()))
    groups = {
        "description": "the study by group: each group's runs (experiments and sweeps, in "
        "one list) get its name as their group and its shared fields where they set none; "
        "expanded in the order written",
        "type": "object",
        "propertyNames": _ref("group"),
        "additionalProperties": _ref("study_group"),
    }
    defs["preset"] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "defaults": _ref("defaults"),
            "groups": groups,
            "trials": _ref("trials"),
            "max_trials": _ref("max_trials"),
            "preflight": SETTINGS["preflight"].schema,
            "image_folder": SETTINGS["image_folder"].schema,
            "collectives": SETTINGS["collectives"].schema,
        },
    }
    # presets use them too
    shared = {
        "preset": _ref("preset_name"),
        "trials": _ref("trials"),
        "max_trials": _ref("max_trials"),
    }
    properties = {name: shared.get(name, s.schema) for name, s in SETTINGS.items()}
    properties["defaults"] = _ref("defaults")
    properties["groups"] = groups
    properties["presets"] = {
        "type": "object",
        "propertyNames": _ref("preset_name"),
        "additionalProperties": _ref("preset"),
    }
    return {
        "$schema": SCHEMA_URI,
        "title": "CPU training study configuration",
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
        "$defs": defs,
    }


def _sweep_properties() -> dict[str, Any]:
    """A sweep's keys: its ``name``, every field (a swept one: a value or a list of
    them) and ``layouts``."""
    props: dict[str, Any] = {"name": _ref("id")}
    for name in FIELDS:
        if name == "id":
            continue
        if name in NOT_SWEPT:
            props[name] = _ref(name)
        else:
            many = {"type": "array", "minItems": 1, "items": _ref(name)}
            props[name] = {"anyOf": [_ref(name), many]}
    props["layouts"] = {
        "enum": ["all", "multi", "multi-threaded"],
        "description": "all: one experiment per ranks x threads split of the CPUs (the "
        "sweep's cpus, else all this machine lets the study use) whose ranks divide the "
        "global batch; multi: those with 2 ranks or more; multi-threaded: 2 ranks or more "
        "of 2 threads or more (e.g. for comm_cpu; none on fewer than 4 CPUs); sets ranks and "
        "threads",
    }
    return props


def _group_defs(sweep_props: dict[str, Any]) -> dict[str, Any]:
    """A group: its runs (single experiments, sweeps and blocks of them, in one list: the
    order is the study's) get its name as their group, and its shared fields where they
    set none; a block's runs its shared fields over the group's."""
    closed = {"type": "object", "additionalProperties": False}
    # a sweep: a name, layouts or a field holding a list (config.is_sweep)
    some_list = {"not": {"additionalProperties": {"not": {"type": "array"}}}}
    return {
        "group_shared": {
            **closed,
            "properties": {n: _ref(n) for n in FIELDS if n not in ("id", "group")},
        },
        "group_experiment": {**closed, "properties": {n: _ref(n) for n in FIELDS if n != "group"}},
        "group_sweep": {
            **closed,
            "properties": {n: v for n, v in sweep_props.items() if n != "group"},
        },
        "group_single_or_sweep": {
            "description": "a group's run: a sweep when it has a name, layouts or a field "
            "holding a list of values, else one experiment",
            "if": {"anyOf": [{"required": ["name"]}, {"required": ["layouts"]}, some_list]},
            "then": _ref("group_sweep"),
            "else": _ref("group_experiment"),
        },
        "group_block": {
            "description": "runs of the group that share more values: its shared fields "
            "over the group's, for its runs alone, in its place",
            **closed,
            "required": ["runs"],
            "properties": {
                "shared": _ref("group_shared"),
                "runs": {"type": "array", "items": _ref("group_single_or_sweep")},
            },
        },
        "group_run": {
            "description": "a group's run (one experiment or a sweep), or a block of runs "
            "that share more values (it has runs of its own)",
            "if": {"type": "object", "required": ["runs"]},
            "then": _ref("group_block"),
            "else": _ref("group_single_or_sweep"),
        },
        "study_group": {
            **closed,
            "required": ["runs"],
            "properties": {
                "shared": _ref("group_shared"),
                "runs": {"type": "array", "items": _ref("group_run")},
            },
        },
    }


def _whole_pattern(validator, pattern: str, instance: Any, schema: dict):
    """JSON Schema's ``pattern``, with an anchored end that means the end: Python's
    ``$`` also matches before a trailing newline, so ``"a1\\n"`` would pass
    ``^[a-z0-9]+$``; a value that ends in a newline never matches a pattern that
    ends in ``$``."""
    if not validator.is_type(instance, "string"):
        return
    if re.search(pattern, instance) is None or (pattern.endswith("$") and instance.endswith("\n")):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _finite_number(checker, instance: Any) -> bool:
    """JSON's number: YAML's ``.nan`` and ``.inf`` are none (a NaN limit is no limit,
    every comparison with it being false; JSON has neither)."""
    return jsonschema.Draft202012Validator.TYPE_CHECKER.is_type(instance, "number") and (
        not isinstance(instance, float) or math.isfinite(instance)
    )


#: draft 2020-12 with :func:`_whole_pattern`, and numbers finite (every validation of a
#: config goes through it)
StudyValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    {"pattern": _whole_pattern},
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("number", _finite_number),
)


@functools.cache
def validator() -> jsonschema.Draft202012Validator:
    return StudyValidator(build_schema())


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def err(where: str, message: str) -> str:
    return f"config error at {where}: {message}" if where else f"config error: {message}"


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
    return " or ".join(words) or "see `python -m workflow_scripts.study --schema`"


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


def schema_message(error: jsonschema.ValidationError) -> list[str]:
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
            in_sweep = "layouts" in known  # a sweep (a group's run with a list too)
            in_group = _group_of(parts)
            if in_group is not None and key in ("id", "group"):
                lines.append(err(at, _in_group(key, in_group, shared=field == "shared")))
                continue
            if in_sweep and key == "id":
                lines.append(
                    err(
                        at,
                        "a sweep cannot have an explicit id (all its experiments would "
                        "share it); set 'name' instead: ids become <name>-<swept values>",
                    )
                )
                continue
            if key in FORMER_STUDY_KEYS and (not parts or parts[0] == "presets" == parts[-2]):
                lines.append(err(at, FORMER_STUDY))
                continue
            if field == "defaults" and key in PER_EXPERIMENT:
                lines.append(err(at, f"{key!r} cannot have a default; set it on each experiment"))
                continue
            hint = difflib.get_close_matches(str(key), known, n=1)
            did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
            lines.append(
                err(
                    at,
                    f"unknown field {_show(key)}{did_you_mean}; allowed: {', '.join(known)}",
                )
            )
        return lines
    if "propertyNames" in error.relative_schema_path or "propertyNames" in error.schema_path:
        return [err(where, f"key {_show(value)} is not allowed; allowed: {_allowed(error.schema)}")]
    if kind == "required":
        missing = [k for k in error.validator_value if k not in value]
        return [err(where, f"missing required field {k!r}") for k in missing]
    if isinstance(value, list) and kind in ("type", "enum"):
        if field in NOT_SWEPT and len(parts) >= 3 and parent == "runs":
            return [err(where, f"{_show(value)} is a list; {field!r} cannot be swept")]
        if len(parts) >= 2 and parts[-2] == "shared":
            return [
                err(
                    where,
                    f"{_show(value)} is a list; shared values are single (a run that "
                    "sets a list of values is a sweep)",
                )
            ]
        if len(parts) >= 2 and parts[-2] == "defaults":
            return [
                err(
                    where,
                    f"{_show(value)} is a list; defaults take single values (a run with a "
                    "list of values is a sweep)",
                )
            ]
    if kind == "type":
        got = _TYPE_NAMES.get(type(value), type(value).__name__)
        article = "an" if got[0] in "aeiou" else "a"
        if value is None:
            return [err(where, f"null is not allowed; allowed: {_allowed(error.schema)}")]
        if isinstance(value, float) and not math.isfinite(value):
            allowed = _allowed(error.schema)
            return [err(where, f"{value} is not a finite number; allowed: {allowed}")]
        return [err(where, f"{_show(value)} is {article} {got}; allowed: {_allowed(error.schema)}")]
    if kind in ("maxLength", "maxProperties"):
        limit = error.validator_value
        unit = "characters" if kind == "maxLength" else "entries"
        return [err(where, f"{_show(value)} is longer than allowed: at most {limit} {unit}")]
    if kind in ("enum", "minimum", "exclusiveMinimum", "maximum", "pattern", "minLength"):
        return [err(where, f"{_show(value)} is not allowed; allowed: {_allowed(error.schema)}")]
    if kind == "minItems":
        return [err(where, "an empty list is not allowed; a swept field needs at least one value")]
    return [err(where, error.message[:200])]


def _group_of(parts: list) -> str | None:
    """The group whose run (``groups.<name>.runs[i]``, a block's
    ``groups.<name>.runs[i].runs[j]``) or shared fields (``groups.<name>.shared``, a
    block's ``groups.<name>.runs[i].shared``) a path names, else None."""
    k = 2 if parts[:1] == ["presets"] else 0  # (a preset's: presets.<preset>.groups)
    if parts[k : k + 1] != ["groups"] or len(parts) < k + 3:
        return None
    tail = [p if isinstance(p, str) else 0 for p in parts[k + 2 :]]
    shapes = (["runs", 0], ["shared"], ["runs", 0, "runs", 0], ["runs", 0, "shared"])
    return str(parts[k + 1]) if tail in shapes else None


def _in_group(key: str, group: str, *, shared: bool) -> str:
    if key == "group":
        return f"the runs of a group get its name ({group!r}) as their group; remove 'group' here"
    if shared:
        return "an id names one experiment: set it on each run (a sweep: its name)"
    return (
        "a sweep cannot have an explicit id (all its experiments would share it); set "
        "'name' instead: ids become <name>-<swept values>"
    )


def path_key(error: jsonschema.ValidationError) -> list:
    return [(0, p, "") if isinstance(p, int) else (1, 0, str(p)) for p in error.absolute_path]


def validate_schema(config: dict) -> list[str]:
    """The schema errors of a raw config, as messages (empty when valid)."""
    lines: list[str] = []
    for error in sorted(validator().iter_errors(config), key=path_key):
        for leaf in _leaves(error):
            for line in schema_message(leaf):
                if line not in lines:
                    lines.append(line)
    return lines


def _error_paths(config: Any) -> set[tuple]:
    """The paths of every schema error of a config, through anyOf/oneOf branches."""
    paths: set[tuple] = set()

    def walk(error: jsonschema.ValidationError) -> None:
        paths.add(tuple(error.absolute_path))
        for sub in error.context or ():
            walk(sub)

    for error in validator().iter_errors(config):
        walk(error)
    return paths


def _string_leaves(value: Any, path: tuple = ()) -> list[tuple[tuple, str]]:
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _string_leaves(v, (*path, k))]
    if isinstance(value, list):
        return [leaf for i, v in enumerate(value) for leaf in _string_leaves(v, (*path, i))]
    return [(path, value)] if isinstance(value, str) and path else []


def _put(config: Any, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        config = config[key]
    config[path[-1]] = value


def coerce_strings(config: dict) -> dict:
    """Strings where the schema wants a number, a flag or null, read as YAML when that
    gives one: Snakemake reads the values nested in ``--config key={...}`` as strings
    ('32', 'true', 'null'). A string the schema accepts stays a string (an id '007', a
    CPU list '3', a report name '2024'). Changes ``config`` in place and returns it."""
    import yaml

    bad = _error_paths(config)
    for path, text in _string_leaves(config):
        if path not in bad:
            continue
        try:
            parsed = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        if isinstance(parsed, (dict, list, str)):
            continue
        _put(config, path, parsed)
        nonfinite = isinstance(parsed, float) and not math.isfinite(parsed)
        if path in _error_paths(config) and not nonfinite:  # no better: keep what was given
            _put(config, path, text)
    return config


#: what YAML's safe loader builds besides plain data, in words (a datetime before its
#: base class, the date)
_NOT_PLAIN = (
    (datetime.datetime, "a date and time"),
    (datetime.date, "a date"),
    (bytes, "binary data"),
    (set, "a set"),
    (tuple, "a tuple"),
)


def _kind(value: Any) -> str:
    return next((w for cls, w in _NOT_PLAIN if isinstance(value, cls)), type(value).__name__)


def not_plain(value: Any, where: str = "") -> list[str]:
    """Messages for every value in ``value`` (bounded by a size check first) that is not
    plain data: a string, a number, a boolean, null, a list or a mapping with text keys
    (YAML's dates, sets and binary are not config values). At most 20."""
    problems: list[str] = []
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack and len(problems) < 20:
        item, at = stack.pop()
        if isinstance(item, dict):
            for key, sub in item.items():
                if not isinstance(key, str):
                    problems.append(err(at, f"key {_show(key)} is not text; a key is text"))
                    continue
                stack.append((sub, f"{at}.{key}" if at else key))
        elif isinstance(item, list):
            stack.extend((sub, f"{at}[{i}]") for i, sub in enumerate(item))
        elif item is not None and not isinstance(item, (str, bool, int, float)):
            problems.append(
                err(
                    at,
                    f"{_kind(item)} ({_show(item)}) is not a plain value; allowed: a string, "
                    "number, boolean, null, list or mapping (quoted, a value is text)",
                )
            )
    return sorted(problems)
