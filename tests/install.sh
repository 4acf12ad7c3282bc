#!/usr/bin/env bash
# Install the Debian packages named that are missing (root, or sudo): what a test needs
# from the system, got by the test itself (tests/components.py, tests/slurm/cluster.sh).
#   bash tests/install.sh [--no-recommends] PACKAGE...
# Exits 0 when every package is installed, 1 (naming them) when they cannot be.
set -euo pipefail

recommends=()
if [ "${1:-}" = --no-recommends ]; then
    recommends=(--no-install-recommends)
    shift
fi
missing=()
for pkg in "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
((${#missing[@]})) || exit 0
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install.sh: needs apt-get to install ${missing[*]}; install them yourself" >&2
    exit 1
fi
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
echo "install.sh: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${recommends[@]}" \
    "${missing[@]}" >/dev/null
