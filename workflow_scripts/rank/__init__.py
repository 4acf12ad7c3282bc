"""The rank side of the process boundary: what runs inside a backend environment or
image, in a trial's ranks and probes.

``run_trial`` (one rank's entry script) -> ``harness`` (the training loop and its
result) with ``trainer`` (the model, data and optimizer of a spec: ``data``,
``models``, ``optim``) and ``measure`` (the FLOP count, the probe around the steps);
``probe`` (the noise probe and the matmul ceiling, also the calibration's),
``contention`` (other processes' CPU time on the rank's CPUs) and ``distributed`` (the
rank's CPUs and process group, the study's ``ccl`` backend, the allreduce benchmark).

Standard library and torch/torchvision only (a backend's own libraries are imported
inside its methods); of the project, only the shared modules
(:data:`workflow_scripts.SHARED`), never host-side code (``tests/test_layout.py``).
"""
