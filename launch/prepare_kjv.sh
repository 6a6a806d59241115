#!/usr/bin/env bash
# Writes the King James Bible as plain text (4.3 MB, public domain) for the character-level GPT
# example: installs Debian's bible-kjv if missing, prints every verse with `bible` and strips the
# verse references. Usage: launch/prepare_kjv.sh [OUT]   (default runs/data/kjv.txt)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$root/runs/data/kjv.txt}
if ! command -v bible >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq bible-kjv >/dev/null
fi
mkdir -p "$(dirname "$out")"
bible -f "Gen1:1-Rev22:21" | sed -e 's/^[^ ]* //' >"$out.tmp"
mv "$out.tmp" "$out"
echo "wrote $out ($(wc -c <"$out") bytes)"
