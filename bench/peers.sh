#!/usr/bin/env bash
# The peers' Python for the benchmarks (bench/run_*.sh): what a user would pick today, PyPI's torch
# 2.x (MKL + oneDNN, torch.compile), numpy, tensorflow-cpu and h5py, in a virtual environment created
# here when missing; Debian's python3-torch (1.13, from 2022) only as a fallback. Never a
# requirement of the test suite.
#
# Prints two tab-separated fields on one line: the interpreter, and what it is in words (the
# versions, and "PyPI venv DIR" or "Debian fallback: why"); prints "none<TAB>why" and exits 0 when
# no interpreter can import torch. Messages go to stderr.
#   MIRROR_PEERS_VENV   the venv's directory (default ~/.cache/mirror/peers-venv)
#   MIRROR_PEERS_PYTHON an interpreter to use as it is (no install)
#   MIRROR_PEERS_OFFLINE=1  never install: use the venv if it is complete, else the fallback
# Usage: bench/peers.sh            (creates or completes the venv: several minutes the first time)
set -uo pipefail
venv=${MIRROR_PEERS_VENV:-$HOME/.cache/mirror/peers-venv}
probe='import sys, importlib
v = []
for m in ("torch", "numpy", "tensorflow"):
    try:
        v.append(m + " " + importlib.import_module(m).__version__)
    except Exception:
        if m != "tensorflow": sys.exit(1)
print(", ".join(v))'
describe() { TF_CPP_MIN_LOG_LEVEL=3 "$1" -c "$probe" 2>/dev/null; }

if [ -n "${MIRROR_PEERS_PYTHON:-}" ]; then
    if d=$(describe "$MIRROR_PEERS_PYTHON"); then printf '%s\t%s (MIRROR_PEERS_PYTHON)\n' "$MIRROR_PEERS_PYTHON" "$d"; exit 0; fi
    printf 'none\tMIRROR_PEERS_PYTHON=%s cannot import torch and numpy\n' "$MIRROR_PEERS_PYTHON"
    exit 0
fi

why=""
if d=$(describe "$venv/bin/python") && [[ $d == *tensorflow* ]]; then
    printf '%s\t%s (PyPI venv %s)\n' "$venv/bin/python" "$d" "$venv"
    exit 0
fi
if [ "${MIRROR_PEERS_OFFLINE:-0}" != 1 ]; then
    echo "bench/peers.sh: installing torch, numpy and tensorflow-cpu from PyPI into $venv (once)" >&2
    if { [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"; } >&2 &&
        "$venv/bin/pip" install -q --disable-pip-version-check torch numpy tensorflow-cpu h5py >&2; then
        if d=$(describe "$venv/bin/python"); then
            printf '%s\t%s (PyPI venv %s)\n' "$venv/bin/python" "$d" "$venv"
            exit 0
        fi
    fi
    why="the PyPI install into $venv failed"
else
    why="MIRROR_PEERS_OFFLINE=1 and $venv is incomplete"
fi
if d=$(describe /usr/bin/python3); then
    printf '%s\t%s (Debian fallback: %s)\n' /usr/bin/python3 "$d" "$why"
    exit 0
fi
printf 'none\t%s, and /usr/bin/python3 cannot import torch (HINT: apt-get install python3-torch)\n' "$why"
