#!/usr/bin/env bash
# Trains mirror's default experiment (configs/default.yaml: a CNN on Fashion-MNIST) from a fresh
# Debian 12 machine: installs what is missing (as tests/run.sh does, without running the tests),
# builds build/mirror, and runs `build/mirror train configs/default.yaml` (extra arguments, e.g.
# --set train.steps=500, are passed on).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
MIRROR_INSTALL_ONLY=1 ./tests/run.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs" --target mirror >/dev/null
exec build/mirror train configs/default.yaml "$@"
