#!/usr/bin/env bash
# Builds rn50 for a GPU machine that has PyTorch but no Rust toolchain (a cluster's compute node, a container, the
# device machine of a development session): against the CUDA wheel of the torch release that machine has, with
# the cuda feature, its debug information stripped and the binary xz-compressed, ready to copy over. With --tests
# the GPU test binaries come too (tests/cuda_fused.rs and tests/fused_block.rs, whose GPU tests run there with
# --include-ignored; `benches/cuda_graph_check.sh` runs them).
#
#   scripts/gpu-bundle.sh [--tests] [VERSION [OUT]]     VERSION: a torch release on PyPI (default 2.11.0);
#                                                       OUT: the bundle's folder (default target/gpu-bundle)
#
# The wheel (about 900 MB, of which its torch/ is kept under .venv/gpu/torch-VERSION, about 2 GB) is downloaded
# once. Its libraries are linked against here, not shipped: on the GPU machine rn50 finds that machine's own torch
# through LD_LIBRARY_PATH, which OUT/env.sh (scripts/torch-env.sh) sets from its python3's torch (`. OUT/env.sh`
# after unpacking). The CUDA, cuDNN and NCCL headers, and the cuDNN frontend's (without which --fused-block has no
# cuDNN graphs: the build is checked for them), come from the .venv's nvidia wheels (`./dev setup`).
#
# On the GPU machine, with OUT copied to the same path inside the repository:
#   for f in OUT/*.xz; do xz -dkf "$f"; chmod +x "${f%.xz}"; done; . OUT/env.sh; OUT/rn50 doctor
set -euo pipefail
cd "$(dirname "$0")/.."
tests=0
if [[ ${1:-} == --tests ]]; then
    tests=1
    shift
fi
version=${1:-2.11.0}
out=${2:-target/gpu-bundle}
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "VERSION: a torch release such as 2.11.0, not '$version'" >&2; exit 2; }
[[ -x .venv/bin/python ]] || { echo "no .venv: run ./dev setup first" >&2; exit 2; }

root=$PWD/.venv/gpu/torch-$version
if [[ ! -f $root/torch/lib/libtorch_cuda.so ]]; then
    echo "downloading torch==$version (its CUDA wheel, once)"
    scripts/torch-wheel.sh "$version" "$root" torch/
    [[ -f $root/torch/lib/libtorch_cuda.so ]] || { echo "torch==$version's wheel has no CUDA" >&2; exit 1; }
fi
# crates/shim-build looks for the CUDA, NCCL and cuDNN headers in nvidia/ beside torch/, and for the cuDNN
# frontend's in include/ there: the .venv's.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ln -sfn "$site/nvidia" "$root/nvidia"
ln -sfn "$site/include" "$root/include"
[[ -f $root/include/cudnn_frontend.h ]] || { echo "the cuDNN frontend's headers are missing from $site/include: run ./dev setup" >&2; exit 1; }

export LIBTORCH=$root/torch CARGO_TARGET_DIR=$PWD/target/gpu-$version ZSTD_SYS_USE_PKG_CONFIG=1
cargo build --release --locked -p rn50 --features rn50/cuda
bins=("$CARGO_TARGET_DIR/release/rn50")
if [[ $tests == 1 ]]; then
    # The test binaries' paths, from cargo's JSON messages.
    mapfile -t found < <(cargo test --release --locked -p rn50 --features rn50/cuda --no-run \
        --test cuda_fused --test fused_block --message-format=json |
        .venv/bin/python -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])')
    [[ ${#found[@]} == 2 ]] || { echo "expected the cuda_fused and fused_block test binaries, found: ${found[*]}" >&2; exit 1; }
    bins+=("${found[@]}")
fi
# The fused block's graphs are compiled only where the frontend's headers were found: say so here, not on the GPU.
if [[ $(nm -C "$CARGO_TARGET_DIR/release/rn50" | grep -c cudnn_frontend) == 0 ]]; then
    echo "rn50 was built without the cuDNN frontend's graphs" >&2
    exit 1
fi

mkdir -p "$out"
for b in "${bins[@]}"; do
    name=$(basename "$b")
    name=${name%-*} # cuda_fused-HASH -> cuda_fused
    objcopy --strip-debug "$b" "$out/$name"
    xz -T0 -f "$out/$name"
done
cp scripts/torch-env.sh "$out/env.sh"
echo "built against torch $version with the cuda feature:"
ls -l "$out"
du -sh "$out"
