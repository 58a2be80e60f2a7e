#!/usr/bin/env bash
# rn50 bench vs the equivalent PyTorch eager loop (benches/pytorch_train_bench.py), in the same run,
# alternating, same arch / batch / precision / memory format / threads / steps. Prints each run and the
# ratio of medians per configuration.
#
#   benches/bench_vs_pytorch.sh [--rounds R] [--steps S] [--warmup W] [--threads T] [--batch-size B]
#                               [--arch A] [--image-size PX] [--configs "fp32 bf16+cl"]
#
# --arch takes rn50's names; PyTorch builds timm's network for the variants (resnet50d, seresnext50d_32x4d, ...).
#
# Configs: fp32 (NCHW), fp32+cl, bf16 (NCHW), bf16+cl. Run ./dev build first (or let this call it).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=2 steps=10 warmup=2 threads=$(nproc) batch=32 arch=resnet50 size=224 configs="fp32 bf16+cl"
while [[ $# -gt 0 ]]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --batch-size) batch=$2; shift 2 ;;
        --arch) arch=$2; shift 2 ;;
        --image-size) size=$2; shift 2 ;;
        --configs) configs=$2; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
./dev build >&2
PY=.venv/bin/python
out=$(mktemp -d)
printf '%-10s %-6s %-8s %10s\n' config round impl img/s
for cfg in $configs; do
    prec=${cfg%%+*}
    if [[ $cfg == *+cl ]]; then rcl=--channels-last pcl=--channels-last; else rcl=--no-channels-last pcl=; fi
    common="--arch $arch --batch-size $batch --image-size $size --precision $prec"
    common+=" --threads $threads --warmup $warmup --steps $steps"
    for r in $(seq 1 "$rounds"); do
        target/release/rn50 bench $common $rcl --device cpu --json "$out/rn50.$cfg.$r.json" >/dev/null
        $PY benches/pytorch_train_bench.py $common $pcl --device cpu >"$out/torch.$cfg.$r.json"
        for impl in rn50 torch; do
            printf '%-10s %-6s %-8s %10.2f\n' "$cfg" "$r" "$impl" \
                "$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["images_per_sec"])' "$out/$impl.$cfg.$r.json")"
        done
    done
done
echo
$PY - "$out" $configs <<'PY'
import glob, json, statistics, sys
out, configs = sys.argv[1], sys.argv[2:]
print(f"{'config':<10} {'rn50 img/s':>11} {'PyTorch img/s':>14} {'ratio':>7}")
for c in configs:
    med = lambda impl: statistics.median(json.load(open(f))["images_per_sec"] for f in glob.glob(f"{out}/{impl}.{c}.*.json"))
    r, t = med("rn50"), med("torch")
    print(f"{c:<10} {r:>11.2f} {t:>14.2f} {r / t:>6.3f}x")
PY
