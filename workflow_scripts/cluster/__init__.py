"""The cluster and SLURM: what each job asks for, and what the nodes have.

- :mod:`.sizing`: every rule's Snakemake resources (whole nodes for a measured job, its
  CPUs, memory and time limit), which the SLURM executor plugin turns into sbatch
  options.
- :mod:`.slurm`: what the partition's nodes have (``sinfo``, or the ``cluster``
  setting) and what SLURM said when it ended a job step.
"""

import importlib

#: the package's own modules (never looked up among the former module's names)
_MODULES = ("sizing", "slurm")


def __getattr__(name: str):
    """The former module ``workflow_scripts.cluster``'s names: now :mod:`.sizing`'s."""
    if not name.startswith("__") and name not in _MODULES:
        sizing = importlib.import_module(f"{__name__}.sizing")
        if hasattr(sizing, name):
            return getattr(sizing, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
