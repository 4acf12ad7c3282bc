"""Code behind the CPU training study workflow, on two sides of a process boundary.

- **Rank side**: the :mod:`workflow_scripts.rank` package runs inside a backend
  environment or image, in the trial's ranks and probes: ``rank.harness`` (the training
  loop), ``rank.run_trial`` (one rank's entry), ``rank.data``, ``rank.models``,
  ``rank.probe``, ``rank.contention`` and ``rank.distributed``.
  Standard library and torch/torchvision only (a backend's own libraries are imported
  inside its methods).
- **Shared** (:data:`SHARED`, the one list of them: the layering test and the docs read
  it): read on both sides, standard library only at import time (the ``backends`` and
  ``launchers`` packages: their attributes are read on the host, their methods run in
  the ranks).
- **Host side**: everything else runs in the workflow's own environment, under
  Snakemake, and may also use pandas, matplotlib, jsonschema and yaml:

  - ``jobs``: how every rule enters this code; ``spec``: every field and setting,
    declared once; ``study``: the config, validated and expanded, and the ways in;
  - the rules' entries: building (``envs``, ``images``, ``runtimes``, and the data:
    ``imagefolder``, ``digits``), measuring (``trial``, ``calibration``,
    ``collectives``) and reporting (``report``);
  - the packages behind them: ``plan`` (the pre-flight, the estimate, the adaptive
    rounds, the run order, progress), ``summary`` (the records, ``summary.csv``'s
    columns, other machines' results) and ``cluster`` (what each job asks a cluster
    for, SLURM's nodes);
  - ``docs_tables``: the documentation's tables, generated from the declarations.

  A rule names its entry module in its ``run:`` block, and Snakemake reruns a rule
  whose block's text changes: the entries stay where the rules name them.

Rank-side and shared modules import nothing host-side (``tests/test_layout.py``), no
module imports another's private names or takes part in an import cycle, and the
packages stand in floors: ``spec``; ``summary``, ``cluster``, ``plan``; ``study``;
``trial``, ``report``: none imports one above it.
"""

#: the package that runs inside a backend environment (the rank side)
RANK_SIDE = "rank"
#: top-level modules and packages read on both sides (standard library only at import)
SHARED = (
    "util", "sysinfo", "commands", "experiment", "workloads", "metrics", "backends", "launchers",
    "shm",
)  # fmt: skip

__all__: list[str] = []
