#!/usr/bin/env bash
# Install the peers bench_peers.py compares against (litdata 0.2.76, MosaicML streaming
# 0.13.0) in a venv of their own, benchmarks/.peers-venv, beside the system's torch
# (--system-site-packages). Each peer is installed on its own, within a time limit; the
# outcome of each goes to benchmarks/.peers-venv/status-<name>.txt ("ok" or why not), which
# bench_peers.py reads to skip a peer with the reason.
#
#     bash benchmarks/install_peers.sh [seconds per peer, default 300]
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="$HERE/.peers-venv"
LIMIT="${1:-300}"
python3 -m venv --system-site-packages "$VENV" || { echo "cannot make $VENV"; exit 1; }
for spec in "litdata litdata==0.2.76" "streaming mosaicml-streaming==0.13.0"; do
    set -- $spec
    name=$1 package=$2
    if timeout "$LIMIT" "$VENV/bin/pip" install -q "$package" >"$VENV/install-$name.log" 2>&1 \
        && "$VENV/bin/python" -c "import $name" >>"$VENV/install-$name.log" 2>&1; then
        echo ok >"$VENV/status-$name.txt"
    else
        echo "pip install $package failed or timed out after ${LIMIT}s: $(tail -n 1 "$VENV/install-$name.log")" \
            >"$VENV/status-$name.txt"
    fi
    echo "$name: $(cat "$VENV/status-$name.txt")"
done
