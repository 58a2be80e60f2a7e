#!/usr/bin/env bash
# rn50 against the PyTorch reference (benches/reference_train.py) on Imagenette, seed by seed: for each seed the
# two train the same recipe at the same time, each with the same threads, so both see the same machine.
# Then benches/parity_table.py prints the per-epoch top-1 (mean, min..max over the seeds) and the wall-clocks.
#
#   benches/imagenette_parity.sh DATA OUT "1 2 3" [flags for both, e.g. -a resnet18 --image-size 64]
#
# Environment: RECIPE (recipes/imagenette-5ep.toml), THREADS (1: compute threads of each), WORKERS (1: loader
# threads of each), RN50 (target/release/rn50), PYTHON (.venv/bin/python), RN50_FLAGS (flags for rn50 alone, e.g.
# --dct-scaling).
set -euo pipefail
cd "$(dirname "$0")/.."
data=$1 out=$2 seeds=$3
shift 3
recipe=${RECIPE:-recipes/imagenette-5ep.toml}
threads=${THREADS:-1} workers=${WORKERS:-1}
rn50=${RN50:-target/release/rn50} python=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
for s in $seeds; do
    "$rn50" train --config "$recipe" "$data" --seed "$s" --threads "$threads" -j "$workers" \
        --out "$out/rn50-s$s" "$@" ${RN50_FLAGS:-} >"$out/rn50-s$s.log" 2>&1 &
    rn=$!
    "$python" benches/reference_train.py "$data" --config "$recipe" --seed "$s" --threads "$threads" \
        -j "$workers" --out "$out/pytorch-s$s" "$@" >"$out/pytorch-s$s.log" 2>&1 &
    ref=$!
    wait $rn || { echo "rn50 seed $s failed: $out/rn50-s$s.log" >&2; exit 1; }
    wait $ref || { echo "reference seed $s failed: $out/pytorch-s$s.log" >&2; exit 1; }
done
"$python" benches/parity_table.py --rn50 "$out"/rn50-s*/ --reference "$out"/pytorch-s*/
