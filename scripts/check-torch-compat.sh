#!/usr/bin/env bash
# Compiles every C++ file of rn50's build (torch-sys's generated wrapper, both shims, with the cuda feature) and
# type-checks the Rust against the headers of another PyTorch release, so that the compat path that lets rn50
# build against PyTorch 2.11 and 2.12 (crates/shim-build/compat/rn50_torch_compat.h) keeps working. `./dev test`
# runs it for 2.11.0; no linking, so the wheel's headers are all it needs (about 530 MB to download once, then
# cached under .venv/compat).
#
#   scripts/check-torch-compat.sh [VERSION]      VERSION: a torch release on PyPI, default 2.11.0
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-2.11.0}
root=$PWD/.venv/compat/torch-$version
if [[ ! -f $root/torch/include/torch/headeronly/version.h ]]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    .venv/bin/python -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        "torch==$version" -d "$tmp"
    rm -rf "$root"
    mkdir -p "$root"
    .venv/bin/python - "$tmp"/torch-*.whl "$root" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("torch/include/")])
PY
fi
mkdir -p "$root/torch/lib"
# The CUDA and NCCL headers sit next to torch/ in a site-packages (crates/shim-build looks there): the .venv's.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ln -sfn "$site/nvidia" "$root/nvidia"
LIBTORCH=$root/torch cargo check --locked --workspace --all-targets --features rn50/cuda \
    --target-dir "target/compat-$version"
