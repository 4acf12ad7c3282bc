"""A config file read as plain data, bounded before a YAML parser sees it.

The study reads config.yaml itself (:func:`read_config_file`), and checks each
``--configfile`` Snakemake has parsed before the workflow's code runs
(:func:`check_configfile`): its bytes first (a regular file, at most
:data:`MAX_BYTES`, flow brackets and indentation no deeper than the loader's depth
limit), then YAML's safe loader with duplicate keys refused (naming the key and both
lines: YAML keeps the last one silently), then only plain values (a string, number,
boolean, null, list or mapping with text keys: YAML's dates, sets and binary are not
config values). A file that uses Snakemake's YAML templating (``__use_yte__``) ran
Python while Snakemake read it: the study says so and refuses it.

    python -m workflow_scripts.study --check FILE    # what snakemake would refuse, in seconds
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml

from ..util import shape_problem, show
from .config import CONFIG_MAX_DEPTH, CONFIG_MAX_VALUES, StudyConfigError
from .schema import not_plain

#: a config file's size (config.yaml: about 31 KB)
MAX_BYTES = 1 << 20
#: indentation deeper than this many columns is nesting beyond the depth limit
MAX_INDENT = 8 * CONFIG_MAX_DEPTH
#: Snakemake's YAML templating switch: a file with it runs Python as it is read
YTE_KEY = "__use_yte__"


def _text(path: Path) -> str:
    """The file's text, if it is a regular file of at most :data:`MAX_BYTES` whose
    flow brackets and indentation stay within the loader's depth limit."""
    try:
        info = path.stat()
    except OSError as exc:
        raise StudyConfigError(f"config error: cannot read {path}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise StudyConfigError(f"config error: {path} is not a regular file")
    if info.st_size > MAX_BYTES:
        raise StudyConfigError(
            f"config error: {path} is {info.st_size / 2**20:.1f} MiB, more than a config's "
            f"{MAX_BYTES // 2**20} MiB: refused before reading it"
        )
    with open(path, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StudyConfigError(
            f"config error: {path} is not UTF-8 text (byte {exc.start})"
        ) from None
    problem = _depth_problem(text)
    if problem:
        raise StudyConfigError(f"config error: {path} {problem}: refused before reading it")
    return text


def _depth_problem(text: str) -> str | None:
    """Nesting beyond the loader's depth limit, read off the bytes: flow brackets
    (``[[[...``) outside quotes and comments, or indentation."""
    depth = 0
    for number, line in enumerate(text.splitlines(), 1):
        indent = len(line) - len(line.lstrip(" "))
        if indent > MAX_INDENT and line.strip():
            return f"nests deeper than {CONFIG_MAX_DEPTH} levels (line {number} indented {indent})"
        quote = None
        for ch in line:
            if quote:
                if ch == quote:
                    quote = None
            elif ch in "'\"":
                quote = ch
            elif ch == "#":
                break
            elif ch in "[{":
                depth += 1
                if depth > CONFIG_MAX_DEPTH:
                    return f"nests deeper than {CONFIG_MAX_DEPTH} levels (line {number})"
            elif ch in "]}":
                depth = max(0, depth - 1)
    return None


class _Loader(yaml.SafeLoader):
    """YAML's safe loader that refuses a key given twice in one mapping."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                line = seen.get(key)
            except TypeError:  # an unhashable key: the safe loader says so itself
                break
            here = key_node.start_mark.line + 1
            if line is not None:
                raise StudyConfigError(
                    f"config error: {self.name} sets {show(key)} twice in one mapping, at "
                    f"line {line} and line {here}; YAML would keep the last silently: "
                    "remove one"
                )
            seen[key] = here
        return super().construct_mapping(node, deep=deep)


def load_text(text: str, path: Path) -> Any:
    """``text`` (the file ``path``) parsed with duplicate keys refused; a syntax error
    as the user's message, with its line and column."""
    loader = _Loader(text)
    loader.name = str(path)
    try:
        return loader.get_single_data()
    except RecursionError:
        raise StudyConfigError(f"config error: {path} nests too deeply to read") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise StudyConfigError(
            f"config error: {path} is not valid YAML{where}: {problem}"
        ) from None
    finally:
        loader.dispose()


def read_config_file(path: Path | str) -> dict:
    """A config file the study reads itself (config.yaml), as plain data: bounded before
    it is parsed, duplicate keys and values that are not plain data refused, its values
    counted and its depth measured (an alias bomb) before anything walks it."""
    path = Path(path)
    return _plain_mapping(load_text(_text(path), path), path)


def check_configfile(path: Path | str) -> dict:
    """A ``--configfile`` (parsed by Snakemake already) read again as the study reads
    config.yaml: what Snakemake lets through (a duplicate key, YAML's dates and sets, its
    templating) refused with the reason. JSON (Snakemake reads it first) too."""
    path = Path(path)
    data = load_text(_text(path), path)
    if isinstance(data, dict) and YTE_KEY in data:
        raise StudyConfigError(
            f"config error: {path} uses Snakemake's YAML templating ({YTE_KEY}), which ran "
            "its Python while Snakemake read the file: the study takes plain YAML or JSON "
            "(render the template yourself and give the result)"
        )
    return _plain_mapping(data, path)


def _plain_mapping(data: Any, path: Path) -> dict:
    problem = shape_problem(data, CONFIG_MAX_VALUES, CONFIG_MAX_DEPTH)
    if problem:
        raise StudyConfigError(f"config error: {path} has {problem}: refused before reading it")
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise StudyConfigError(f"config error: {path} must hold a mapping")
    problems = not_plain(data)
    if problems:
        raise StudyConfigError("\n".join(f"{p} (in {path})" for p in problems))
    return data
