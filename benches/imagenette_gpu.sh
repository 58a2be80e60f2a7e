#!/usr/bin/env bash
# rn50 and the PyTorch reference (benches/reference_train.py) on Imagenette on one GPU, one run after the other,
# for a queue of runs, until BUDGET seconds would be passed by the next one (each run's length is estimated by the
# longest of its kind so far, so a timed device session ends with whole runs). Each run writes
# OUT/<who>-<recipe>-s<seed>/ (metrics.jsonl, summary.json); TARBALL (OUT/runs.tgz) holds them all without weights,
# refreshed after every run.
#
#   benches/imagenette_gpu.sh DATA OUT BUDGET "rn50:5ep:1 ref:5ep:1 rn50:20ep:1 ..." [flags for both]
#
# A job is WHO:RECIPE:SEED[:FLAGS]: WHO rn50 or ref (benches/reference_train.py), RECIPE naming
# recipes/imagenette-<RECIPE>.toml, FLAGS (optional) comma-separated flags of that run alone, e.g.
# `rn50:5ep:1:--lr=0.05,--zero-init-residual` for a tuning sweep (on the held-out slice that
# benches/imagenette_holdout.py makes, never on val): its folder is then named after them too.
#
# Environment: RN50 (target/release/rn50), PYTHON (python3), WORKERS (15: loader threads of each).
set -uo pipefail
cd "$(dirname "$0")/.."
data=$1 out=$2 budget=$3 queue=$4
shift 4
rn50=${RN50:-target/release/rn50} python=${PYTHON:-python3} workers=${WORKERS:-15}
tarball=${TARBALL:-$out/runs.tgz}
mkdir -p "$out"
start=$SECONDS
declare -A longest
for job in $queue; do
    IFS=: read -r who recipe seed own <<<"$job"
    IFS=, read -r -a own <<<"${own:-}"
    tag=$(printf '%s' "${own[*]:-}" | tr -c 'A-Za-z0-9.=\n' '-' | tr -s '-' | sed 's/^-//; s/-$//')
    est=${longest[$who$recipe]:-0}
    left=$((budget - (SECONDS - start)))
    if ((est + 10 > left)); then
        echo "skip $job: $left s left, the last such run took $est s"
        continue
    fi
    t0=$SECONDS
    run=$out/$who-$recipe-s$seed${tag:+-$tag}
    flags=(--config "recipes/imagenette-$recipe.toml" --seed "$seed" -j "$workers" --out "$run" "$@" "${own[@]}")
    echo "=== $job at $((SECONDS - start)) s"
    if [ "$who" = rn50 ]; then
        timeout "$left" "$rn50" train "$data" "${flags[@]}" --keep-checkpoints 1 2>&1 | tail -12
    else
        timeout "$left" "$python" benches/reference_train.py "$data" "${flags[@]}" 2>&1 | tail -8
    fi
    took=$((SECONDS - t0))
    echo "--- $job took $took s"
    ((took > est)) && longest[$who$recipe]=$took
    tar czf "$tarball" -C "$out" --exclude='*.safetensors' --exclude='*.png' --exclude=io.jsonl \
        --exclude=tensorboard --exclude=runs.tgz $(cd "$out" && ls -d */ 2>/dev/null)
done
