#!/usr/bin/env bash
# The GPU step, rn50 against PyTorch in the same run: `rn50 bench` as it runs by default (the fused cuDNN batch
# norm), with --fused-block (bottlenecks with their batch norms folded into the convolutions through cuDNN graphs) and
# with --no-fused-bn (PyTorch's separate kernels), PyTorch eager (benches/pytorch_train_bench.py) and PyTorch with torch.compile, alternating,
# R rounds each, same arch / batch / precision / channels_last / steps, synthetic batch on the GPU. Prints each
# run, then the median of each and its ratio to PyTorch eager and to torch.compile.
#
#   benches/bench_vs_pytorch_gpu.sh [--rounds R] [--steps S] [--warmup W] [--batch-size B] [--arch A]
#                                   [--precision fp16|bf16|fp32] [--no-compile]
#
# RN50 (default target/release/rn50, built with --features cuda) and PY (default .venv/bin/python, a PyTorch
# with CUDA and torchvision) choose the two sides; a GPU node with its own PyTorch sets both.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3 steps=100 warmup=20 batch=256 arch=resnet50 prec=fp16 compile=1
while [[ $# -gt 0 ]]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --batch-size) batch=$2; shift 2 ;;
        --arch) arch=$2; shift 2 ;;
        --precision) prec=$2; shift 2 ;;
        --no-compile) compile=0; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
RN50=${RN50:-target/release/rn50}
PY=${PY:-.venv/bin/python}
out=$(mktemp -d)
common="--arch $arch --batch-size $batch --precision $prec --warmup $warmup --steps $steps"
impls="rn50 rn50-fused-block rn50-unfused torch"
[[ $compile == 1 ]] && impls="$impls torch-compile"
printf '%-14s %-6s %10s\n' impl round img/s
for r in $(seq 1 "$rounds"); do
    for impl in $impls; do
        f=$out/$impl.$r.json
        case $impl in
            rn50) "$RN50" bench $common --device cuda --json "$f" >/dev/null ;;
            rn50-fused-block) "$RN50" bench $common --device cuda --fused-block --json "$f" >/dev/null ;;
            rn50-unfused) "$RN50" bench $common --device cuda --no-fused-bn --json "$f" >/dev/null ;;
            torch) "$PY" benches/pytorch_train_bench.py $common --channels-last --device cuda >"$f" ;;
            torch-compile) "$PY" benches/pytorch_train_bench.py $common --channels-last --device cuda --compile >"$f" ;;
        esac
        printf '%-14s %-6s %10.1f\n' "$impl" "$r" \
            "$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["images_per_sec"])' "$f")"
    done
done
echo
"$PY" - "$out" $impls <<'PY'
import glob, json, statistics, sys
out, impls = sys.argv[1], sys.argv[2:]
med = {i: statistics.median(json.load(open(f))["images_per_sec"] for f in glob.glob(f"{out}/{i}.*.json")) for i in impls}
print(f"{'impl':<14} {'img/s':>9} {'vs eager':>9} {'vs compile':>11}")
for i in impls:
    vs_c = f"{med[i] / med['torch-compile']:>10.3f}x" if "torch-compile" in med else f"{'-':>11}"
    print(f"{i:<14} {med[i]:>9.1f} {med[i] / med['torch']:>8.3f}x {vs_c}")
PY
