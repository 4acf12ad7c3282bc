"""The cluster and SLURM: what each job asks for, and what the nodes have.

- :mod:`.sizing`: every rule's Snakemake resources (whole nodes for a measured job, its
  CPUs, memory and time limit), which the SLURM executor plugin turns into sbatch
  options.
- :mod:`.slurm`: what the partition's nodes have (``sinfo``, or the ``cluster``
  setting) and what SLURM said when it ended a job step.
"""
