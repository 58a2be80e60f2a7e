#!/usr/bin/env bash
# Issue 47 items 2 and 3 on one GPU, in one call: the training step captured as one CUDA graph (`rn50 bench
# --cuda-graph`, src/step/graph.rs) and the folded bottleneck (`--fused-block`, crates/shim/cpp/fused_block.cpp)
# checked and measured against the eager per-layer step.
#
# 1. tests/cuda_fused.rs with its GPU tests (the graph's five among them: captured against eager over 12 steps,
#    the rate read at each replay, an overflowing replay skipped inside the graph, train's warm-up on the run's own
#    batches, and `rn50 train --cuda-graph` against the eager run and resumed, which runs $RN50), one test at a
#    time, then tests/fused_block.rs's (the fused bottleneck's cuDNN graphs, issue 47 item 3);
# 2. `rn50 bench` eager, with --cuda-graph, with --fused-block and with --fused-block --fused-block-plans 1000
#    (every plan cuDNN's heuristics know timed), alternating, R rounds (ResNet-50, batch 256, fp16, synthetic batch
#    on the device, defaults otherwise), then each once with --profile; prints every run, the medians and their
#    ratios to eager;
# 3. `rn50 train --dummy` the same way, eager and with --cuda-graph, and the ratio of their second epochs' img/s.
#
#   benches/cuda_graph_check.sh [--rounds R] [--steps S] [--warmup W] [--batch-size B] [--precision P] [--no-tests]
#
# Environment: RN50, the rn50 binary (default target/release/rn50), CUDA_FUSED, the cuda_fused test binary
# (default: the newest target/release/deps/cuda_fused-*), and FUSED_BLOCK, the fused_block test binary (default:
# the newest target/release/deps/fused_block-*; its GPU tests check the fused bottleneck's cuDNN graphs against the
# per-layer path, run after cuda_fused's where it is found), all built with `--features rn50/cuda` against the
# torch the GPU machine has: `scripts/gpu-bundle.sh --tests VERSION` builds all three on a machine with Rust and
# packs them into target/gpu-bundle/ (unpacked there: RN50=target/gpu-bundle/rn50 CUDA_FUSED=.../cuda_fused
# FUSED_BLOCK=.../fused_block). Where the libtorch they
# were built against is not at the path they record, python3's torch is put on LD_LIBRARY_PATH (torch/lib and the
# nvidia wheels' lib folders). OUT (default: a new temporary folder): where every output goes, the log
# (cuda_graph_check.log) and each run's JSON. PY (default python3) reads the JSON.
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=2 steps=60 warmup=20 batch=256 prec=fp16 tests=1
while [[ $# -gt 0 ]]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --batch-size) batch=$2; shift 2 ;;
        --precision) prec=$2; shift 2 ;;
        --no-tests) tests=0; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
RN50=$(realpath "${RN50:-target/release/rn50}")
export RN50 # the binary the tests that run rn50 start
CUDA_FUSED=${CUDA_FUSED:-$(ls -t target/release/deps/cuda_fused-* 2>/dev/null | grep -v '\.d$' | head -1)}
FUSED_BLOCK=${FUSED_BLOCK:-$(ls -t target/release/deps/fused_block-* 2>/dev/null | grep -v '\.d$' | head -1)}
PY=${PY:-python3}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/cuda_graph_check.log") 2>&1

if ! "$RN50" --version >/dev/null 2>&1; then
    . scripts/torch-env.sh
fi
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$RN50" --version
"$RN50" doctor | grep -Ei 'libtorch|cuda|cudnn' | head -8

status=0
if [[ $tests == 1 ]]; then
    echo "=== tests/cuda_fused.rs, GPU tests included ($CUDA_FUSED)"
    (cd crates/rn50 && timeout 420 "$CUDA_FUSED" --include-ignored --test-threads 1 --nocapture) || status=1
    if [[ -n $FUSED_BLOCK ]]; then
        echo "=== tests/fused_block.rs, GPU tests included ($FUSED_BLOCK)"
        (cd crates/rn50 && timeout 300 "$FUSED_BLOCK" --include-ignored --test-threads 1 --nocapture) || status=1
    fi
fi

common=(--device cuda --arch resnet50 --batch-size "$batch" --precision "$prec" --warmup "$warmup" --steps "$steps")
run() { # NAME FLAGS...: one bench, its table printed, its JSON kept as OUT/NAME.json
    local name=$1
    shift
    echo "=== rn50 bench ${common[*]} $*"
    timeout 300 "$RN50" bench "${common[@]}" "$@" --json "$OUT/$name.json" || status=1
}
modes=(eager graph block block-all)
flags() { # the flags of a mode
    case $1 in
        graph) echo --cuda-graph ;;
        block) echo --fused-block ;;
        block-all) echo --fused-block --fused-block-plans 1000 ;;
    esac
}
for r in $(seq 1 "$rounds"); do
    for m in "${modes[@]}"; do
        # shellcheck disable=SC2046 # the flags split into words on purpose
        run "$m.$r" $(flags "$m")
    done
done
for m in "${modes[@]}"; do
    # shellcheck disable=SC2046
    run "$m.profile" $(flags "$m") --profile
done

# 3. `rn50 train --dummy` eager and with --cuda-graph (the same network, batch and precision; 2 epochs of $steps
#    steps, the second one's img/s from metrics.jsonl: the first holds cuDNN's autotuning and the capture).
train() { # NAME FLAGS...
    local name=$1
    shift
    echo "=== rn50 train --dummy ${common[*]:0:8} --epochs 2 --steps-per-epoch $steps $*"
    rm -rf "$OUT/train-$name"
    timeout 300 "$RN50" train --dummy "${common[@]:0:8}" --epochs 2 --steps-per-epoch "$steps" --lr 0.1 -p 20 \
        --out "$OUT/train-$name" "$@" 2>&1 | grep -E 'cuda-graph|epoch [0-9]+:' || status=1
}
train eager
train graph --cuda-graph

"$PY" - "$OUT" "$rounds" "${modes[@]}" <<'PY'
import json, os, statistics, sys
out, rounds, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def load(name):
    path = os.path.join(out, name + ".json")
    return json.load(open(path)) if os.path.exists(path) else None
print(f"\n{'run':<14} {'img/s':>9} {'ms/step':>8}  CUDA graph")
med = {}
for mode in modes:
    ips = []
    for r in list(range(1, rounds + 1)) + ["profile"]:
        j = load(f"{mode}.{r}")
        if j is None:
            print(f"{mode}.{r:<8} missing")
            continue
        ran = j["config"].get("cuda_graph")
        why = j.get("cuda_graph_declined") or ""
        print(f"{mode + '.' + str(r):<14} {j['images_per_sec']:>9.1f} {j['step_ms']:>8.2f}  {ran} {why}")
        if r != "profile":
            ips.append(j["images_per_sec"])
    med[mode] = statistics.median(ips) if ips else float("nan")
print("\nmedian img/s: " + ", ".join(f"{m} {med[m]:.1f} ({med[m] / med['eager']:.3f}x eager)" for m in modes))
ips = {}
for mode in ["eager", "graph"]:
    path = os.path.join(out, f"train-{mode}", "metrics.jsonl")
    if os.path.exists(path):
        ips[mode] = [json.loads(l) for l in open(path)][-1]["images_per_sec"]
print(f"train, second epoch: {ips}" + (f": {ips['graph'] / ips['eager']:.3f}x" if len(ips) == 2 else ""))
PY
echo "exit $status"
exit $status
