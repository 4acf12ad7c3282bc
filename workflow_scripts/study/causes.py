"""One message per cause: the plan-time checks speak of each experiment, and a value
wrong for every experiment (a default, a group's shared field) would print one line per
experiment (a CPU list of 10^11 CPUs in ``defaults``: 164 lines). Lines that say the same
of the same field of several experiments become one, naming the setting (``defaults.<field>``
where the defaults set it) and how many experiments it touches; and no config prints more
than :data:`MOST_LINES` lines."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from ..spec.fields import BUILTIN_DEFAULTS, FIELDS

#: the most lines a config's errors print (a screenful); the rest are counted
MOST_LINES = 40
#: experiments named in a grouped line before "and N more"
NAMED = 5

_LINE = re.compile(r"config (?P<kind>error|warning) at (?P<where>.+?): (?P<msg>.*)", re.S)
_WITH_ID = re.compile(r"(?P<loc>.+) \(id (?P<id>[^)]+)\)(?:\.(?P<field>.+))?", re.S)


def _experiment(where: str, ids: Sequence[str]) -> tuple[str, str | None] | None:
    """The experiment a message's place names and the field in it, or None (a setting of
    the study's own): ``groups.g.runs[0] (id x).batch_size`` and ``experiment x.cpus``."""
    m = _WITH_ID.fullmatch(where)
    if m:
        return m["id"], m["field"]
    if where.startswith("experiment "):
        rest = where.removeprefix("experiment ")
        for sid in sorted(ids, key=len, reverse=True):  # (ids may hold dots)
            if rest == sid:
                return sid, None
            if rest.startswith(sid + "."):
                return sid, rest[len(sid) + 1 :]
    return None


def one_per_cause(
    lines: Iterable[str],
    ids: Sequence[str],
    given: Iterable[str],
    total: int | None = None,
    kind: str = "error",
) -> list[str]:
    """``lines`` with those that say the same (``msg``) of the same field of several
    experiments as one: ``config error at defaults.cpus: '0-99999999999' is not a CPU list
    (all 159 experiments)``. ``ids``: the study's experiments; ``given``: the fields its
    defaults set (the config's, a preset's, the command line's); ``total``: how many
    experiments it has. At most :data:`MOST_LINES` lines (the last counting the rest:
    ``kind`` error or warning)."""
    given = set(given)
    who: dict[tuple, list[str]] = {}  # a cause: the experiments it touches
    first: dict[tuple, str] = {}  # and its first line
    for line in lines:
        m = _LINE.fullmatch(line)
        found = _experiment(m["where"], ids) if m else None
        if found is None:
            key: tuple = ("line", line)
        else:
            sid, field = found
            if field is None:
                word = m["msg"].split(" ", 1)[0]
                field = word if word in FIELDS else None
            key = (m["kind"], field, m["msg"])
        first.setdefault(key, line)
        touched = who.setdefault(key, [])
        if found is not None and found[0] not in touched:
            touched.append(found[0])
    out: list[str] = []
    for key, line in first.items():
        if key[0] == "line" or len(who[key]) < 2:
            out.append(line)
            continue
        said, field, msg = key
        n = len(who[key])
        if n == total:
            many = f"all {total} experiments"
        else:
            more = f" and {n - NAMED} more" if n > NAMED else ""
            many = f"{n} experiments: {', '.join(who[key][:NAMED])}{more}"
        where = f"defaults.{field}" if field in given else (field or "")
        head = f"config {said} at {where}: " if where else f"config {said}: "
        out.append(f"{head}{msg} ({many})")
    if len(out) > MOST_LINES:
        left = len(out) - (MOST_LINES - 1)
        out = out[: MOST_LINES - 1] + [f"config {kind}: and {left} more like those above"]
    return out


def given_fields(defaults: dict) -> set[str]:
    """The fields a study's resolved ``defaults`` set otherwise than the built-in ones
    (the config's, a preset's or the command line's)."""
    unset = object()
    return {k for k, v in defaults.items() if BUILTIN_DEFAULTS.get(k, unset) != v}
