"""The study: its fields and settings (declared once), the schema derived from them,
and the loader that turns config.yaml into validated experiment specs.

    fields.py    every experiment field: type, default, help, id tag, column, label
    settings.py  every top-level setting: type, default, help
    schema.py    the JSON schema built from both, and the messages for its errors
    config.py    load_study(): presets, sweeps, ids
    checks.py    combination checks, controlled variables, warnings (no machine needed)
    machine.py   the checks that need this machine: CPUs, memory, files
    paths.py     what a folder setting must be (a folder of data, not /proc or a device)
    files.py     a config file read as plain data, bounded before it is parsed
    causes.py    one message per cause (a default wrong for every experiment: one line)
    entry.py     the ways in: Snakemake (load_for_snakemake) and the command line

``python -m workflow_scripts.study [--set key=value ...]`` prints what a config
expands to (``--schema`` prints the schema; ``--check FILE`` checks a file for
``snakemake --configfile`` first).
"""

from ..spec.fields import BUILTIN_DEFAULTS, NAMES, PER_EXPERIMENT
from ..spec.settings import NOISE_RETRIES, NOISE_THRESHOLD, SETTING_DEFAULTS
from ..sysinfo import parse_cpu_list as parse_cpus
from .checks import check_spec
from .config import Study, StudyConfigError, derive_id, load_study
from .entry import (
    command_line_config,
    configfiles_given,
    load_for_snakemake,
    main,
    read_config,
    runs_jobs,
)
from .schema import build_schema

FIELD_NAMES = NAMES  # the field names, in declaration order (the fields: fields.FIELDS)

__all__ = [
    "BUILTIN_DEFAULTS", "FIELD_NAMES", "NOISE_RETRIES", "NOISE_THRESHOLD", "PER_EXPERIMENT",
    "SETTING_DEFAULTS", "Study", "StudyConfigError", "build_schema", "command_line_config",
    "check_spec", "configfiles_given", "derive_id",
    "load_for_snakemake", "load_study", "main", "parse_cpus", "read_config", "runs_jobs",
]  # fmt: skip
