"""Each entry point's command, declared once: its parameters (:class:`Arg`), from which
both its command-line parser and a rule's command line for it are made; and a job's
result line (:func:`announce`)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


def announce(line: str, log: Path | None = None) -> None:
    """Print a job's result line (Snakemake shows it) and append it to the job's log."""
    print(line, flush=True)
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as fh:
            print(line, file=fh)


# ---------------------------------------------------------------------------
# A rule's entry point, its parameters declared once

#: an :class:`Arg` without a default: the command line must give it
REQUIRED = object()


@dataclasses.dataclass(frozen=True)
class Arg:
    """One parameter of an entry point, declared once: its option (``--name`` with
    dashes), type, default and help for the command line, and where a rule's job has
    its value (``rule``): ``"input.env"``, ``"output.record"``, ``"params.spec"``,
    ``"wildcards.trial"``, ``"log"`` (the job's first log file), ``"settings.KEY"``
    (the study settings the rule hands over, which rerun nothing), or a function of the
    job (``Job``); None: never from a rule (its default, or a person's command line).
    A value the job lacks (an optional input) leaves the option out: its default."""

    name: str
    rule: str | Callable[[Job], Any] | None = None
    type: Callable[[str], Any] = str
    default: Any = REQUIRED
    help: str | None = None
    #: a list of values (``--name a b c``)
    many: bool = False
    choices: Sequence[Any] | None = None
    #: further argparse keywords of a command-line-only option (nargs, action, metavar)
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        kwargs: dict[str, Any] = {"help": self.help, "dest": self.name}
        if self.many:
            kwargs.update(nargs="*", default=[] if self.default is REQUIRED else self.default)
        elif self.default is REQUIRED:
            kwargs["required"] = True
        else:
            kwargs["default"] = self.default
        if self.choices is not None:
            kwargs["choices"] = list(self.choices)
        parser.add_argument(self.option, type=self.type, **{**kwargs, **self.extra})

    def value(self, job: Job) -> Any:
        if self.rule is None:
            return None
        if callable(self.rule):
            return self.rule(job)
        where, _, key = self.rule.partition(".")
        if where == "log":
            return job.log[0]
        if where == "settings":
            return job.settings.get(key)
        source = getattr(job, where)
        return source.get(key) if hasattr(source, "get") else getattr(source, key, None)

    def argv(self, job: Job) -> list[str]:
        value = self.value(job)
        if value is None:
            return []
        if self.many:
            return [self.option, *map(str, value)]
        return [f"{self.option}={value}"]


@dataclasses.dataclass(frozen=True)
class Job:
    """What a rule's ``run:`` block hands its entry point: Snakemake's input, output,
    params, wildcards and log, and the study settings the rule passes."""

    input: Any
    output: Any
    params: Any
    wildcards: Any
    log: Any
    settings: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Command:
    """An entry point's parameters (:class:`Arg`), from which both its command line
    parser and a rule's command line for it are made: a parameter is declared once.
    ``sub``: the subcommand it is of its module's command line (images.py)."""

    description: str
    args: tuple[Arg, ...]
    sub: str | None = None

    def parser(self, prog: str | None = None) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog=prog, description=self.description)
        self.add_arguments(parser)
        return parser

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        for arg in self.args:
            arg.add_to(parser)

    def parse(self, argv: Sequence[str] | None, prog: str | None = None) -> argparse.Namespace:
        return self.parser(prog).parse_args(argv)

    def argv(self, inputs, output, params, wildcards, log, settings: Mapping) -> list[str]:
        """The rule's command line (``jobs.run``), from Snakemake's objects."""
        job = Job(inputs, output, params, wildcards, log, settings)
        return [*([self.sub] if self.sub else []), *(a for arg in self.args for a in arg.argv(job))]
