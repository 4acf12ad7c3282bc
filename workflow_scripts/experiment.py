"""An experiment's spec as the code holds it on both sides of the process boundary.

:class:`Spec` is a frozen mapping that holds every field declared in
:mod:`workflow_scripts.spec.fields` (the loader gives each its value or its default),
and it is strict about names: a read of a name it lacks (a misspelt field) raises
``KeyError`` at that read, on the host and in a rank alike, instead of handing back
None; ``.get`` hands back its default only for the keys a host adds beside the fields
(:data:`EXTRA_KEYS`). A change makes a new spec (``spec | {"steps": 3}``).

Shared by both sides, standard library only: it knows the fields from the spec it
holds (every one of them), so a rank needs no copy of the declarations. The fast
test ``tests/test_layout.py`` checks every name the code reads by a string against
the declarations too, before anything runs.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, NoReturn

#: what a later trial carries from its experiment's first trial (trial/carry.py)
CARRIED_KEY = "carried"
#: the baseline a trial stops early against when far from it (plan/far.py)
FAR_KEY = "far_from"
#: a rank's block of the spec's CPUs (rank/distributed/ranks.py)
PIN_KEY = "pin"
#: the pre-flight's mark on a spec it shortened (plan/preflight.py)
PREFLIGHT_KEY = "preflight"
#: what the probe before the steps ordinarily reads here, per thread count: the rate
#: below which it was disturbed (trial/peers.py), so that the trial probes again before
#: it steps rather than run disturbed and be run again
PROBE_FLOOR_KEY = "probe_floors"
#: the keys a spec holds only where they were set: ``.get`` gives its default for them
EXTRA_KEYS = frozenset({CARRIED_KEY, FAR_KEY, PIN_KEY, PREFLIGHT_KEY, PROBE_FLOOR_KEY})


class Spec(dict):
    """An experiment's spec: a frozen ``dict`` (JSON, ``==`` and ``{**spec}`` work as
    for any dict) whose reads of a name it lacks raise."""

    __slots__ = ()

    def __missing__(self, key: Any) -> NoReturn:
        raise KeyError(self._unknown(key))

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self:
            return dict.__getitem__(self, key)
        if key in EXTRA_KEYS:
            return default
        raise KeyError(self._unknown(key))

    def _unknown(self, key: Any) -> str:
        ident = dict.get(self, "id", "?")
        return (
            f"{key!r} is not a field of experiment {ident}'s spec (a misspelt name? its "
            "fields are declared in workflow_scripts/spec/fields.py)"
        )

    def _frozen(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("a Spec is frozen: make a new one, e.g. spec | {'steps': 3}")

    __setitem__ = __delitem__ = _frozen
    setdefault = pop = popitem = clear = update = __ior__ = _frozen  # type: ignore[assignment]

    def __or__(self, other: Mapping) -> Spec:  # type: ignore[override]
        return Spec({**self, **other})

    def __reduce__(self) -> tuple:  # pickle and copy: through the constructor
        return (Spec, (dict(self),))

    def __copy__(self) -> Spec:
        return self

    def __deepcopy__(self, memo: dict) -> Spec:
        return Spec(copy.deepcopy(dict(self), memo))
