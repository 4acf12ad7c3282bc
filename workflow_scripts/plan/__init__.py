"""What the study will run and how long it takes.

- :mod:`.estimate`: each trial's wall time before anything runs, from this machine's
  calibrations and pre-flight (``snakemake -n`` prints it).
- :mod:`.rounds`: the adaptive rounds (another trial only where a comparison is still
  undecided) and the time budget.
- :mod:`.order`: the order a round runs in, the question first (job priorities).
- :mod:`.progress`: the progress line after every trial (done, elapsed, left).

The calibration job itself (the reference probes the estimate reads) is
:mod:`workflow_scripts.calibration`, a measured job like ``trial`` and ``collectives``.
"""
