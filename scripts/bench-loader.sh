#!/usr/bin/env bash
# Input-pipeline benchmark: `rn50 bench-loader` vs torchvision's DataLoader (PIL decode, same
# transforms, as many worker processes as our threads) on the same files, in the same run.
#
#   scripts/bench-loader.sh [--val]      (after ./dev build; uses the env ./dev sets up)
#   OURS_FLAGS=--dct-scaling scripts/bench-loader.sh   (flags for rn50 only)
#
# Datasets: the 220 real ImageNet photos in shared/data/jpeg/imagenet (as an ImageFolder of
# symlinks), and SYNTH_N synthetic JPEGs with ImageNet's size distribution written to disk by
# `rn50 bench-loader --synthetic N --save-synthetic DIR`. Threads: 1 and 2 (THREADS).
# Prints a table with images/s, images/s per core and the ratio ours / torchvision.
#
# Environment: RN50_BIN (default target/release/rn50), RN50_PYTHON (default .venv/bin/python),
# RN50_SHARED_DATA (default ../shared/data), BATCH (64), STEPS (20), WARMUP (2), SYNTH_N (2000),
# THREADS ("1 2"), OUT (JSON results directory; default a temp dir), OURS_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${RN50_BIN:-target/release/rn50}
PY=${RN50_PYTHON:-.venv/bin/python}
SHARED=${RN50_SHARED_DATA:-../shared/data}
BATCH=${BATCH:-64}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-2}
SYNTH_N=${SYNTH_N:-2000}
THREADS=${THREADS:-1 2}
EXTRA=("$@")
read -r -a OURS <<<"${OURS_FLAGS:-}"

[[ -x $BIN ]] || { echo "error: $BIN not found (run ./dev build, or set RN50_BIN)" >&2; exit 1; }
[[ -x $PY ]] || { echo "error: $PY not found (run ./dev setup, or set RN50_PYTHON)" >&2; exit 1; }
# The stand-alone example binary takes the same flags without the subcommand.
if [[ $(basename "$BIN") == bench_loader ]]; then SUB=(); else SUB=(bench-loader); fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
OUT=${OUT:-$WORK/results}
mkdir -p "$OUT"

# ImageFolder view of the real samples: <wnid>/<wnid>.JPEG.
for f in "$SHARED"/jpeg/imagenet/*.JPEG; do
    wnid=$(basename "$f" .JPEG)
    mkdir -p "$WORK/imagenet/$wnid"
    ln -s "$(realpath "$f")" "$WORK/imagenet/$wnid/"
done
# Synthetic files on disk, so that both loaders read the very same bytes.
"$BIN" "${SUB[@]}" --synthetic "$SYNTH_N" --save-synthetic "$WORK/synthetic" \
    -j 2 -b "$BATCH" --steps 1 --warmup 0 >/dev/null

run() { # name dir threads
    local name=$1 dir=$2 j=$3
    "$BIN" "${SUB[@]}" "$dir" -j "$j" -b "$BATCH" --steps "$STEPS" --warmup "$WARMUP" \
        --json "$OUT/ours-$name-$j.json" "${EXTRA[@]}" "${OURS[@]}" >&2
    "$PY" scripts/bench_loader_torchvision.py "$dir" -j "$j" -b "$BATCH" --steps "$STEPS" \
        --warmup "$WARMUP" --json "$OUT/torchvision-$name-$j.json" "${EXTRA[@]}" >&2
}

for j in $THREADS; do
    run imagenet "$WORK/imagenet" "$j"
    run synthetic "$WORK/synthetic" "$j"
done

"$PY" - "$OUT" "$THREADS" <<'EOF'
import json, os, sys
out, threads = sys.argv[1], sys.argv[2].split()
load = lambda n: json.load(open(os.path.join(out, n)))
print(f"{'dataset':10} {'threads':>7} {'rn50 img/s':>11} {'per core':>9} "
      f"{'torchvision':>12} {'per core':>9} {'ratio':>6}  rn50 decode/augment ms per image")
for name in ["imagenet", "synthetic"]:
    for j in threads:
        o, t = load(f"ours-{name}-{j}.json"), load(f"torchvision-{name}-{j}.json")
        print(f"{name:10} {j:>7} {o['images_per_sec']:11.1f} {o['images_per_sec_per_core']:9.1f} "
              f"{t['images_per_sec']:12.1f} {t['images_per_sec_per_core']:9.1f} "
              f"{o['images_per_sec'] / t['images_per_sec']:5.2f}x  "
              f"{o['decode_ms_per_image']:.2f} / {o['augment_ms_per_image']:.2f}"
              f"  (bad images: {o['bad_images']})")
EOF
