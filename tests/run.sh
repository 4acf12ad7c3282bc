#!/usr/bin/env bash
# Set up everything the tests need on a fresh Linux machine, then run them all.
#   bash tests/run.sh [pytest arguments]      e.g.  bash tests/run.sh -m "not slow"
# Installs (when missing): Debian's jemalloc and tcmalloc (the run_cpu allocator
# tests), podman + runc + mmdebstrap (the container tests build every image and
# run the quick preset in them), the workflow's virtualenv .venv from
# envs/workflow.txt. The backend environments and images are built by the tests
# themselves (under .venvs/ or $STUDY_ENVS_ROOT; the wheelhouse under
# ~/.cache/cpu-train-study/wheelhouse or $STUDY_WHEELHOUSE), from envs/*.txt.
# The SLURM tests (tests/test_slurm.py) install and start a cluster of two compute
# nodes on this machine themselves (tests/slurm/cluster.sh: Debian's slurmctld, slurmd,
# munge; network namespaces on a bridge; root or sudo) and stop it afterwards.
# The container tests pass containers/engine/containers.conf to podman (this CI
# host kind needs it); set STUDY_CONTAINERS_CONF= (empty) where podman's defaults work.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_packages=(libjemalloc2 libgoogle-perftools4 podman runc mmdebstrap chromium)
if command -v apt-get >/dev/null 2>&1; then
    missing=()
    for pkg in "${apt_packages[@]}"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        sudo=""
        [ "$(id -u)" = 0 ] || sudo="sudo"
        echo "installing ${missing[*]}"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
else
    echo "warning: no apt-get; install jemalloc and tcmalloc yourself for the run_cpu tests" >&2
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --require-hashes \
    -r envs/workflow.txt
exec .venv/bin/python -m pytest "$@"
