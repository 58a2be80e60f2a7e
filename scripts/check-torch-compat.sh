#!/usr/bin/env bash
# Type-checks every C++ file of rn50's build (torch-sys's generated wrapper, both shims, with the cuda feature)
# against the headers of another PyTorch release, so that the compat path that lets rn50 build against PyTorch
# 2.11 and 2.12 (crates/shim-build/compat/rn50_torch_compat.h) keeps working. `./dev test` runs it for 2.11.0; no
# linking, so the wheel's headers are all it needs (about 530 MB to download once, then cached under
# .venv/compat).
#
# The headers reach only the C++, which the build scripts of torch-sys and rn50-shim (crates/shim: the C++ of rn50
# and rn50-distributed) compile: checking rn50-shim runs both, and checks nothing but torch-sys's few dependencies
# besides (352 CPU-seconds when this checked the rn50 package, which built the C libraries and checked every crate).
# The Rust reads no header (tch's bindings are the same whatever the libtorch), so the workspace's crates, already
# built and linted by `./dev test`, are not checked again.
#
#   scripts/check-torch-compat.sh [VERSION]      VERSION: a torch release on PyPI, default 2.11.0
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-2.11.0}
root=$PWD/.venv/compat/torch-$version
if [[ ! -f $root/torch/include/torch/headeronly/version.h ]]; then
    scripts/torch-wheel.sh "$version" "$root" torch/include/
fi
mkdir -p "$root/torch/lib"
# The CUDA and NCCL headers sit next to torch/ in a site-packages (crates/shim-build looks there): the .venv's.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ln -sfn "$site/nvidia" "$root/nvidia"
# Type-checked, not compiled (scripts/cxx-syntax-only): what a compile would refuse, without the code generation.
CXX=$PWD/scripts/cxx-syntax-only LIBTORCH=$root/torch cargo check --locked -p rn50-shim --features rn50-shim/cuda \
    --target-dir "target/compat-$version"
