#!/usr/bin/env bash
# Benchmark `rn50 prepare` against GNU tar on the same ILSVRC-layout train archive, in one run.
#
#   scripts/bench-prepare.sh [WORKDIR]        (default WORKDIR: /tmp/rn50-bench-prepare)
#
# Builds (once, reused while the parameters match) a fixture of CLASSES per-class tars of
# PER_CLASS real ImageNet photos each (shared/data/jpeg/imagenet, ~110 KB average: real JPEG
# sizes), packed like ILSVRC2012_img_train.tar: an outer tar of <wnid>.tar files, made by GNU
# tar. Then, REPS times each, interleaved, with the archive in the page cache:
#   gnu-tar  outer then inner tars, serially, as the usual shell scripts do
#            (tar -xf train.tar; for each <wnid>.tar: mkdir <wnid>; tar -xf <wnid>.tar -C <wnid>),
#            with -m --no-same-owner --no-same-permissions so it does no more work than prepare
#   prepare  rn50 prepare --train-tar train.tar --out DIR -j 1, then -j 2
#   prepare --verify -j 2 (MD5 of the whole archive while extracting; not part of the ratio)
# and prints the best time of each, MB/s (archive bytes / s) and the ratio to GNU tar. The two
# trees are compared file by file once, outside the timings.
#
# Environment: CLASSES (48), PER_CLASS (240), REPS (3), SYNC=1 to include a final `sync` in
# every timing (measures the disk, not just the page cache), RN50_SHARED_DATA, PREPARE (a
# prepare command to use instead of building one).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${1:-/tmp/rn50-bench-prepare}
CLASSES=${CLASSES:-48}
PER_CLASS=${PER_CLASS:-240}
REPS=${REPS:-3}
SYNC=${SYNC:-0}
SHARED=${RN50_SHARED_DATA:-$ROOT/../shared/data}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}

log() { printf '[bench-prepare] %s\n' "$*" >&2; }

# The prepare command: `rn50 prepare` once the binary has it, else the rn50-data example (the
# same code and command line, without libtorch).
if [[ -n ${PREPARE:-} ]]; then
    read -r -a PREP <<<"$PREPARE"
elif grep -q 'rn50_data' crates/rn50/src/*.rs 2>/dev/null; then
    log "building rn50 (release)"
    if [[ -x ./dev ]]; then ./dev build >&2; else cargo build --release -p rn50 >&2; fi
    PREP=("$TARGET/release/rn50" prepare)
else
    log "building the rn50-data prepare example (release)"
    cargo build --release -p rn50-data --example prepare >&2
    PREP=("$TARGET/release/examples/prepare")
fi
log "prepare command: ${PREP[*]}"

# --- fixture -----------------------------------------------------------------------------------
FIX=$WORK/fixture
TRAIN=$FIX/ILSVRC2012_img_train.tar
STAMP="classes=$CLASSES per_class=$PER_CLASS"
if [[ ! -f $TRAIN || "$(cat "$FIX/stamp" 2>/dev/null)" != "$STAMP" ]]; then
    log "building the fixture in $FIX ($STAMP)"
    rm -rf "$FIX"
    mkdir -p "$FIX/classes" "$FIX/staging"
    mapfile -t PHOTOS < <(find "$SHARED/jpeg/imagenet" -name '*.JPEG' | sort)
    [[ ${#PHOTOS[@]} -gt 0 ]] || { log "no photos in $SHARED/jpeg/imagenet"; exit 1; }
    mapfile -t WNIDS < <(awk '{print $1}' "$SHARED/ilsvrc2012/synsets.txt" | head -n "$CLASSES")
    n=0
    for wnid in "${WNIDS[@]}"; do
        d=$FIX/staging/$wnid
        mkdir -p "$d"
        for ((k = 0; k < PER_CLASS; k++)); do
            cp "${PHOTOS[$((n % ${#PHOTOS[@]}))]}" "$d/${wnid}_$((10000 + k)).JPEG"
            n=$((n + 1))
        done
        (cd "$d" && tar -cf "$FIX/classes/$wnid.tar" -- *.JPEG)
        rm -rf "$d"
    done
    (cd "$FIX/classes" && tar -cf "$TRAIN" -- *.tar)
    rm -rf "$FIX/classes" "$FIX/staging"
    echo "$STAMP" >"$FIX/stamp"
fi
BYTES=$(stat -c %s "$TRAIN")
FILES=$((CLASSES * PER_CLASS))
log "fixture: $TRAIN, $BYTES bytes, $CLASSES classes, $FILES images"
if ((BYTES < 1000000000)); then
    log "warning: the fixture is under 1 GB; raise CLASSES or PER_CLASS"
fi
# A checksum table for the --verify run.
printf 'file\tbytes\tmd5\n%s\t%s\t%s\n' "$(basename "$TRAIN")" "$BYTES" \
    "$(md5sum "$TRAIN" | cut -d' ' -f1)" >"$FIX/checksums.tsv"

# --- runs --------------------------------------------------------------------------------------
OUT=$WORK/out
now() { date +%s.%N; }
# CPU seconds (user + system) used so far by this shell's finished children. `times` must run in
# this shell, not a $(…) subshell, which would see only its own.
cpu_now() {
    times >"$WORK/times.txt"
    awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, a, "m"); sub("s", "", a[2]); t += a[1] * 60 + a[2] } printf "%.3f", t }' \
        "$WORK/times.txt"
}
finish() { if [[ $SYNC == 1 ]]; then sync; fi; }

gnu_tar() {
    local dst=$1
    mkdir -p "$dst/tmp" "$dst/train"
    tar -xmf "$TRAIN" --no-same-owner --no-same-permissions -C "$dst/tmp"
    for f in "$dst"/tmp/*.tar; do
        local w
        w=$(basename "$f" .tar)
        mkdir "$dst/train/$w"
        tar -xmf "$f" --no-same-owner --no-same-permissions -C "$dst/train/$w"
    done
}

# run NAME COMMAND...: one timed run into a fresh $OUT; sets LAST to the seconds.
run() {
    local name=$1
    shift
    rm -rf "$OUT"
    sync
    cat "$TRAIN" >/dev/null # same page-cache state for every contender
    local t0 t1 c0 c1
    c0=$(cpu_now)
    t0=$(now)
    "$@" >"$WORK/$name.log" 2>&1 || { log "$name failed:"; cat "$WORK/$name.log" >&2; exit 1; }
    finish
    t1=$(now)
    c1=$(cpu_now)
    LAST=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
    LAST_CPU=$(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.3f", b - a }')
    log "$name: $LAST s wall, $LAST_CPU s CPU"
}

declare -A BEST ALL CPU
record() {
    local name=$1 t=$LAST
    ALL[$name]="${ALL[$name]:-}$t "
    if [[ -z ${BEST[$name]:-} ]] || awk -v a="$t" -v b="${BEST[$name]}" 'BEGIN { exit !(a < b) }'; then
        BEST[$name]=$t
    fi
    if [[ -z ${CPU[$name]:-} ]] || awk -v a="$LAST_CPU" -v b="${CPU[$name]}" 'BEGIN { exit !(a < b) }'; then
        CPU[$name]=$LAST_CPU
    fi
}

NAMES=(gnu-tar prepare-j1 prepare-j2 prepare-j2-verify)
for ((r = 1; r <= REPS; r++)); do
    log "round $r/$REPS"
    run gnu-tar gnu_tar "$OUT"
    record gnu-tar
    if ((r == 1)); then mv "$OUT/train" "$WORK/gnu-train"; fi
    run prepare-j1 "${PREP[@]}" --train-tar "$TRAIN" --out "$OUT" -j 1
    record prepare-j1
    if ((r == 1)); then
        log "comparing prepare's tree with GNU tar's, file by file"
        diff -r "$WORK/gnu-train" "$OUT/train" >/dev/null || { log "the trees differ!"; exit 1; }
        [[ $(find "$OUT/train" -type f | wc -l) -eq $FILES ]] || { log "wrong file count"; exit 1; }
        rm -rf "$WORK/gnu-train"
    fi
    run prepare-j2 "${PREP[@]}" --train-tar "$TRAIN" --out "$OUT" -j 2
    record prepare-j2
    run prepare-j2-verify "${PREP[@]}" --train-tar "$TRAIN" --out "$OUT" -j 2 \
        --verify --checksums "$FIX/checksums.tsv"
    record prepare-j2-verify
done
rm -rf "$OUT"

# --- report ------------------------------------------------------------------------------------
echo
echo "rn50 prepare vs GNU tar $(tar --version | head -1 | awk '{print $NF}'): $BYTES-byte train tar," \
    "$CLASSES class tars, $FILES JPEGs; $(nproc) CPUs, load average now $(cut -d' ' -f1-3 /proc/loadavg);" \
    "best of $REPS; sync in timing: $SYNC"
printf '%-20s %8s %8s %11s %8s %11s   %s\n' "run" "wall s" "MB/s" "vs GNU tar" "CPU s" "CPU vs GNU" "all runs, wall s"
for name in "${NAMES[@]}"; do
    awk -v n="$name" -v t="${BEST[$name]}" -v g="${BEST[gnu-tar]}" -v b="$BYTES" -v all="${ALL[$name]}" \
        -v c="${CPU[$name]}" -v gc="${CPU[gnu-tar]}" \
        'BEGIN { printf "%-20s %8.3f %8.1f %10.2fx %8.3f %10.2fx   %s\n", n, t, b / t / 1e6, g / t, c, gc / c, all }'
done
awk -v a="${BEST[prepare-j1]}" -v b="${BEST[prepare-j2]}" \
    'BEGIN { printf "prepare -j 2 vs -j 1: %.2fx\n", a / b }'
