"""The documentation's tables that restate declarations, generated from them.

``summary.csv``'s columns come from :data:`workflow_scripts.summary.records.COLUMNS` (each
result's kind, unit and help from ``summary/results.py``, each knob's from
``spec/fields.py``), the experiment fields' allowed values and defaults from
:data:`workflow_scripts.spec.fields.FIELDS`, and the top-level settings' from
:data:`workflow_scripts.spec.settings.SETTINGS`. A page holds a generated table
between two marker comments::

    <!-- BEGIN generated: summary-columns -->
    ...
    <!-- END generated: summary-columns -->

``python -m workflow_scripts.docs_tables`` rewrites every such region of ``README.md``
and ``docs/*.md``; ``--check`` rewrites nothing and exits 1 when a page is stale
(``tests/test_docs.py`` checks the same).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .spec import fields, settings
from .summary import records, results

REPO = Path(__file__).resolve().parent.parent
#: the pages that may hold generated regions
PAGES = ("README.md", "docs/*.md")
#: where a knob's summary column is described (a page and anchor this module fills)
FIELDS_LINK = "configuration.md#experiment-fields"
#: what the study loader adds to each spec (spec/fields.py: DERIVED_KEYS)
DERIVED_HELP = {
    "env": "the backend environment it ran in (from its backend)",
    "preset": "the preset it belongs to",
}
REGION = re.compile(
    r"(?P<begin><!-- BEGIN generated: (?P<name>[a-z0-9-]+) -->\n)"
    r"(?P<body>.*?)"
    r"(?P<end><!-- END generated: (?P=name) -->)",
    re.DOTALL,
)


def cell(text: Any) -> str:
    """Text for one Markdown table cell: one line, ``|`` escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    head = list(header)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def scalar(value: Any) -> str:
    """A value as YAML writes it in flow style (null, true, 3, text, [a, b], {k: v})."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"{value:g}" if isinstance(value, float) else str(value)
    if isinstance(value, list):
        return "[" + ", ".join(scalar(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {scalar(v)}" for k, v in value.items()) + "}"
    text = str(value)
    plain = re.fullmatch(r"[A-Za-z0-9_./@+-]+", text) and text not in ("null", "true", "false")
    return text if plain else json.dumps(text)


def code(value: Any) -> str:
    return f"`{scalar(value)}`"


def _bounds(schema: dict) -> str:
    marks = (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"),
             ("exclusiveMaximum", "<"))  # fmt: skip
    return ", ".join(f"{sign} {scalar(schema[k])}" for k, sign in marks if k in schema)


def kind_described(schema: dict) -> bool:
    """Whether a text schema's description says what kind of text it takes ("a path,
    ...") rather than what the value is for ("the network interface ...")."""
    text = schema.get("description", "")
    return bool(schema.get("pattern") and text) and not text.startswith("the ")


def _keys(schema: dict) -> str:
    return ", ".join(f"`{k}`" for k in schema["properties"])


def allowed(schema: dict) -> str:
    """What a JSON schema of one value allows, in a few words."""
    if "const" in schema:
        return code(schema["const"])
    if "enum" in schema:
        return ", ".join(code(v) for v in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(allowed(s) for s in schema["anyOf"])
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    parts = []
    for kind in (t for t in types if t != "null"):
        if kind in ("integer", "number"):
            bounds = _bounds(schema)
            parts.append(f"{kind} {bounds}" if bounds else kind)
        elif kind == "string":
            if kind_described(schema):
                parts.append("text: " + schema["description"].removesuffix(" or null"))
            else:
                parts.append("non-empty text" if schema.get("minLength") else "text")
        elif kind == "boolean":
            parts.append("`true`, `false`")
        elif kind == "array":
            items = schema.get("items", {})
            if "properties" in items:
                parts.append("a list of mappings (" + _keys(items) + ")")
            else:
                parts.append("a list of " + allowed(items))
        elif kind == "object":
            if "properties" in schema:
                parts.append("a mapping (" + _keys(schema) + ")")
            else:
                names = allowed({"type": "string", **schema.get("propertyNames", {})})
                values = allowed(schema.get("additionalProperties", {}))
                parts.append(f"a mapping of {names} to {values}")
    if "null" in types:
        parts.append("`null`")
    return " or ".join(parts) or "anything"


def summary_columns() -> str:
    """Every column of ``summary.csv``, in its order, with its part, kind, unit and help."""
    rows = []
    for name in records.COLUMNS:
        if name in results.RESULTS:
            r = results.RESULTS[name]
            rows.append((f"`{name}`", r.section, r.kind, r.unit, r.help))
        elif name in fields.FIELDS:
            f = fields.FIELDS[name]
            kind = "integer" if f.integer else "number" if f.numeric else "text"
            kind = "flag" if f.types == ["boolean"] else kind
            what = f"the experiment's `{name}` ([field]({FIELDS_LINK}))"
            rows.append((f"`{name}`", results.SPEC, kind, "", what))
        else:
            help_ = DERIVED_HELP.get(name, "added by the study's loader")
            rows.append((f"`{name}`", results.SPEC, "text", "", help_))
    return table(("column", "part", "kind", "unit", "what"), rows)


def config_fields() -> str:
    """Every experiment field: its allowed values, built-in default and help."""
    rows = []
    for name, f in fields.FIELDS.items():
        note = "per experiment" if f.per_experiment else "" if f.sweepable else "not swept"
        what = f.help + (f" ({note})" if note else "")
        column = "yes" if f.column else ""
        rows.append((f"`{name}`", allowed(f.value_schema()), code(f.default), column, what))
    return table(("field", "allowed", "default", "in summary.csv", "what"), rows)


def _setting_rows(name: str, schema: dict, default: Any, help_: str) -> list[tuple]:
    """A setting's row, then one per key of a mapping it holds (dotted names)."""
    what = help_ or ("" if kind_described(schema) else schema.get("description", ""))
    props = schema.get("properties") if schema.get("type") == "object" else None
    shown = "see below" if props else code(default)
    rows = [(f"`{name}`", allowed(schema), shown, what)]
    for key, sub in (props or {}).items():
        sub_default = default.get(key) if isinstance(default, dict) else None
        rows += _setting_rows(f"{name}.{key}", sub, sub_default, "")
    return rows


def config_settings() -> str:
    """Every top-level setting (and each key of the mappings they hold)."""
    rows = []
    for name, s in settings.SETTINGS.items():
        rows += _setting_rows(name, s.schema, s.default, s.help)
    return table(("setting", "allowed", "default", "what"), rows)


def code_sides() -> str:
    """Which code runs on which side of the process boundary, from the package's own
    declaration (``workflow_scripts.RANK_SIDE`` and ``SHARED``)."""
    import workflow_scripts

    shared = ", ".join(f"`{name}`" for name in workflow_scripts.SHARED)
    return (
        f"- **rank side**: the package `workflow_scripts/{workflow_scripts.RANK_SIDE}/`, inside "
        "a backend's environment or image (torch, no pandas);\n"
        f"- **shared**: {shared}: standard library only at import time, their attributes "
        "read on the host and their methods run in the ranks;\n"
        "- **host side**: every other module, under Snakemake in the workflow's environment.\n"
    )


#: the CPUs the presets' table is planned on (the layouts a study runs follow the CPUs)
PRESET_CPUS = 2


def preset_groups() -> str:
    """What each preset expands to: its experiments, group by group, and its trials per
    experiment (the adaptive rounds' span; a run stopped far from its baseline and a
    seed sweep's seeds run fewer), from config.yaml, planned on :data:`PRESET_CPUS` CPUs
    (``snakemake -n`` prints the same groups with their estimated time on yours)."""
    import os
    from unittest import mock

    from .study import load_study, read_config
    from .sysinfo import PLAN_CPUS_VAR

    config = read_config(REPO / "config.yaml")
    names = [config["preset"], *(n for n in config.get("presets") or {} if n != config["preset"])]
    with mock.patch.dict(os.environ, {PLAN_CPUS_VAR: f"0-{PRESET_CPUS - 1}"}):
        studies = {n: load_study(dict(config), REPO, cli={"preset": n}) for n in names}
    groups: dict[str, dict[str, int]] = {}
    for n, study in studies.items():
        for spec in study.experiments:
            row = groups.setdefault(spec.get("group") or spec["id"], {})
            row[n] = row.get(n, 0) + 1
    rows = [[f"`{g}`", *(counts.get(n, "") for n in names)] for g, counts in groups.items()]
    rows.append(["**all**", *(f"**{len(s.experiments)}**" for s in studies.values())])
    spans = []
    for s in studies.values():
        low, high = s.settings["trials"], max(s.settings["trials"], s.settings["max_trials"] or 0)
        spans.append(f"{low} to {high}" if high > low else str(low))
    rows.append(["trials per experiment", *spans])
    return table(("group", *(f"`{n}`" for n in names)), rows)


SOURCES = {
    "preset-groups": f"config.yaml (planned on {PRESET_CPUS} CPUs)",
    "code-sides": "workflow_scripts/__init__.py (RANK_SIDE, SHARED)",
    "summary-columns": "workflow_scripts/summary/results.py and spec/fields.py",
    "config-fields": "workflow_scripts/spec/fields.py",
    "config-settings": "workflow_scripts/spec/settings.py",
}
RENDERERS: dict[str, Callable[[], str]] = {
    "preset-groups": preset_groups,
    "code-sides": code_sides,
    "summary-columns": summary_columns,
    "config-fields": config_fields,
    "config-settings": config_settings,
}


def render(name: str) -> str:
    """A region's body: a note saying where it comes from, then the table."""
    if name not in RENDERERS:
        raise KeyError(f"no generated table named {name!r} (known: {', '.join(RENDERERS)})")
    note = (
        f"<!-- generated from {SOURCES[name]} by "
        "`python -m workflow_scripts.docs_tables`: edit the declarations, not this table -->\n"
    )
    return note + "\n" + RENDERERS[name]()


def regenerate(text: str) -> str:
    """A page's text with every generated region rewritten from the declarations."""
    return REGION.sub(lambda m: m["begin"] + render(m["name"]) + m["end"], text)


def regions(text: str) -> list[str]:
    """The names of a page's generated regions, in their order."""
    return [m["name"] for m in REGION.finditer(text)]


def pages(root: Path = REPO) -> list[Path]:
    return sorted({p for pattern in PAGES for p in root.glob(pattern)})


def stale(root: Path = REPO) -> list[Path]:
    """The pages whose generated regions differ from what the declarations give now."""
    return [p for p in pages(root) if regenerate(p.read_text()) != p.read_text()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m workflow_scripts.docs_tables",
        description="Rewrite the generated tables of README.md and docs/*.md.",
    )
    ap.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 if stale")
    ap.add_argument("--root", type=Path, default=REPO, help="the repository (default: this one)")
    args = ap.parse_args(argv)
    old = stale(args.root)
    for path in old:
        where = path.relative_to(args.root)
        if args.check:
            print(f"{where}: generated tables are stale (python -m workflow_scripts.docs_tables)")
        else:
            path.write_text(regenerate(path.read_text()))
            print(f"{where}: generated tables rewritten")
    return 1 if args.check and old else 0


if __name__ == "__main__":
    sys.exit(main())
