#!/usr/bin/env bash
# Unpacks the files of PyPI's torch==VERSION wheel whose paths start with PREFIX into DEST (emptied first), the
# wheel downloaded into a temporary folder and deleted after: scripts/check-torch-compat.sh takes its headers
# (torch/include/), scripts/gpu-bundle.sh the whole torch/ to link against.
#
#   scripts/torch-wheel.sh VERSION DEST PREFIX
set -euo pipefail
cd "$(dirname "$0")/.."
version=$1 dest=$2 prefix=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
.venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    "torch==$version" -d "$tmp"
rm -rf "$dest"
mkdir -p "$dest"
.venv/bin/python - "$tmp"/torch-*.whl "$dest" "$prefix" <<'PY'
import sys, zipfile
wheel, dest, prefix = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith(prefix)])
PY
