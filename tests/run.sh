#!/usr/bin/env bash
# Set up the tests' own tools, then run the tests: every one (slow ones too) by default.
#   bash tests/run.sh [pytest arguments]
#   bash tests/run.sh -m "not slow"       the fast path: unit tests only, no torch
#                                         environment, container, cluster or browser
#   bash tests/run.sh -m podman           (or torch, slurm, browser) by component
# Here: the workflow's virtualenv .venv from envs/workflow.txt (pytest among its tools).
# Each slow test gets what it needs itself, in any order (tests/components.py,
# tests/conftest.py): Debian's podman, runc, mmdebstrap, chromium, jemalloc and tcmalloc
# through tests/install.sh (root or sudo, apt-get); the backend environments under
# .venvs/ or $STUDY_ENVS_ROOT (the images' wheelhouse under
# ~/.cache/cpu-train-study/wheelhouse or $STUDY_WHEELHOUSE), from envs/*.txt; a SLURM
# cluster of two compute nodes on this machine (tests/slurm/cluster.sh: Debian's
# slurmctld, slurmd, munge, slurmdbd over MariaDB; network namespaces on a bridge),
# stopped afterwards. The container tests pass containers/engine/containers.conf to
# podman (this CI host kind needs it); set STUDY_CONTAINERS_CONF= (empty) where
# podman's defaults work.
set -euo pipefail
cd "$(dirname "$0")/.."

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --require-hashes \
    -r envs/workflow.txt
exec .venv/bin/python -m pytest "$@"
