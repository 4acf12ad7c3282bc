"""Inside a SLURM job (the cluster profile's): which job, which nodes. Standard library
only.

The executor plugin's job step keeps only the job's identity (``SLURM_JOB_ID``,
``SLURM_CLUSTER_NAME``, ``SLURM_SUBMIT_*``) in what it runs; a single-process job
additionally runs as a one-task step (``srun -n1``) with that step's variables."""

from __future__ import annotations

import os

#: the variables a record keeps (those present), by their names in the record
RECORDED = {
    "job_id": "SLURM_JOB_ID",
    "cluster": "SLURM_CLUSTER_NAME",
    "partition": "SLURM_JOB_PARTITION",
    "step_id": "SLURM_STEP_ID",
    "job_nodelist": "SLURM_JOB_NODELIST",
    "cpus_on_node": "SLURM_CPUS_ON_NODE",
    "submit_host": "SLURM_SUBMIT_HOST",
}


def slurm_job(environ: dict | None = None) -> dict | None:
    """The SLURM job this process runs in (None outside one)."""
    env = os.environ if environ is None else environ
    if not env.get("SLURM_JOB_ID"):
        return None
    return {key: env[var] for key, var in RECORDED.items() if env.get(var)}
