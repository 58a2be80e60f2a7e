#!/usr/bin/env bash
# Benchmark `rn50 prepare` against GNU tar on the same ILSVRC-layout train archive, in one run.
#
#   scripts/bench-prepare.sh [WORKDIR]        (default WORKDIR: /tmp/rn50-bench-prepare)
#
# Builds (once, reused while the parameters match) a fixture of CLASSES per-class tars of
# PER_CLASS real ImageNet photos each (shared/data/jpeg/imagenet, ~110 KB average: real JPEG
# sizes), packed like ILSVRC2012_img_train.tar: an outer tar (GNU format) of <wnid>.tar files.
# Then, REPS times each, interleaved, with the archive in the page cache:
#   gnu-tar  outer then inner tars, serially, as the usual shell scripts do
#            (tar -xf train.tar; for each <wnid>.tar: mkdir <wnid>; tar -xf <wnid>.tar -C <wnid>),
#            with -m --no-same-owner --no-same-permissions so it does no more work than prepare
#   prepare  rn50 prepare --train-tar train.tar --out DIR -j 1, then -j 2
#   prepare --verify -j 2 (MD5 of the whole archive while extracting; not part of the ratio)
# and prints the best time of each, MB/s (archive bytes / s) and the ratio to GNU tar. The two
# trees are compared file by file once, outside the timings.
#
# Every timed run writes to a fresh, empty ext4 file system (a loop-mounted image made with
# mkfs.ext4 just before, unmounted after; needs root): on a used ext4, creating files right after
# thousands were deleted is several times slower (the allocator skips recently freed inodes), so
# earlier runs' leftovers would decide the result. Without root (or with FS=dir) each run gets a
# new folder under WORKDIR instead, all deleted at the end.
#
# Environment: CLASSES (48), PER_CLASS (240), REPS (3), SYNC=1 to include a final `sync` in
# every timing (measures the disk, not just the page cache), FS=loop|dir, RN50_SHARED_DATA,
# PREPARE (a prepare command to use instead of building one).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${1:-/tmp/rn50-bench-prepare}
CLASSES=${CLASSES:-48}
PER_CLASS=${PER_CLASS:-240}
REPS=${REPS:-3}
SYNC=${SYNC:-0}
if [[ $(id -u) -eq 0 ]] && command -v mkfs.ext4 >/dev/null; then FS=${FS:-loop}; else FS=${FS:-dir}; fi
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
    mkdir -p "$FIX"
    # Written straight from the photos (GNU tar format, no staging files: deleting thousands of
    # staging files would slow the next file creations on ext4, skewing the first timings).
    python3 - "$SHARED" "$TRAIN" "$CLASSES" "$PER_CLASS" <<'PY'
import io, pathlib, sys, tarfile
shared, train, classes, per_class = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
photos = sorted((shared / "jpeg/imagenet").glob("*.JPEG"))
assert photos, f"no photos in {shared}/jpeg/imagenet"
data = [p.read_bytes() for p in photos]
wnids = [l.split()[0] for l in (shared / "ilsvrc2012/synsets.txt").read_text().splitlines()][:classes]
def member(name, payload):
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(payload), 0o644, 1_330_000_000
    return info, io.BytesIO(payload)
n = 0
with tarfile.open(train, "w", format=tarfile.GNU_FORMAT) as outer:
    for wnid in wnids:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as inner:
            for k in range(per_class):
                inner.addfile(*member(f"{wnid}_{10000 + k}.JPEG", data[n % len(data)]))
                n += 1
        outer.addfile(*member(f"{wnid}.tar", buf.getvalue()))
PY
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
OUTS=$WORK/out
MNT=$WORK/mnt
IMG=$WORK/fs.img
rm -rf "$OUTS"
cleanup() {
    if mountpoint -q "$MNT" 2>/dev/null; then umount "$MNT"; fi
    rm -f "$IMG"
}
trap cleanup EXIT

# fresh_out NAME: sets OUT to an empty folder on a fresh file system (see the header).
fresh_out() {
    if [[ $FS == loop ]]; then
        cleanup
        truncate -s $((BYTES * 3)) "$IMG"
        mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$IMG"
        mkdir -p "$MNT"
        mount -o loop "$IMG" "$MNT"
        OUT=$MNT/out
    else
        OUT=$OUTS/$1-$r
    fi
}
now() { date +%s.%N; }
# CPU seconds (user + system) used so far by this shell's finished children, into CPU_NOW.
# `times` must run in this shell, not in a $(…) subshell, which would see only its own.
cpu_now() {
    times >"$WORK/times.txt"
    CPU_NOW=$(awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, a, "m"); sub("s", "", a[2]); t += a[1] * 60 + a[2] } printf "%.3f", t }' \
        "$WORK/times.txt")
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

# run NAME COMMAND...: one timed run (into $OUT, set by the caller); sets LAST and LAST_CPU.
run() {
    local name=$1
    shift
    mkdir -p "$OUTS"
    sync
    cat "$TRAIN" >/dev/null # same page-cache state for every contender
    local t0 t1 c0 c1
    cpu_now
    c0=$CPU_NOW
    t0=$(now)
    "$@" >"$WORK/$name.log" 2>&1 || { log "$name failed:"; cat "$WORK/$name.log" >&2; exit 1; }
    finish
    t1=$(now)
    cpu_now
    c1=$CPU_NOW
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
log "checking that prepare's tree is GNU tar's, file by file"
rm -rf "$WORK/check"
gnu_tar "$WORK/check/gnu"
"${PREP[@]}" --train-tar "$TRAIN" --out "$WORK/check/prepare" -j 2 >/dev/null
diff -r "$WORK/check/gnu/train" "$WORK/check/prepare/train" >/dev/null || { log "the trees differ!"; exit 1; }
[[ $(find "$WORK/check/prepare/train" -type f | wc -l) -eq $FILES ]] || { log "wrong file count"; exit 1; }
rm -rf "$WORK/check"

log "timing on fresh file systems: FS=$FS"
for ((r = 1; r <= REPS; r++)); do
    log "round $r/$REPS"
    fresh_out gnu-tar
    run gnu-tar gnu_tar "$OUT"
    record gnu-tar
    fresh_out prepare-j1
    run prepare-j1 "${PREP[@]}" --train-tar "$TRAIN" --out "$OUT" -j 1
    record prepare-j1
    fresh_out prepare-j2
    run prepare-j2 "${PREP[@]}" --train-tar "$TRAIN" --out "$OUT" -j 2
    record prepare-j2
    fresh_out prepare-j2-verify
    run prepare-j2-verify "${PREP[@]}" --train-tar "$TRAIN" --out "$OUT" -j 2 \
        --verify --checksums "$FIX/checksums.tsv"
    record prepare-j2-verify
done
cleanup
rm -rf "$OUTS"

# --- report ------------------------------------------------------------------------------------
echo
echo "rn50 prepare vs GNU tar $(tar --version | head -1 | awk '{print $NF}'): $BYTES-byte train tar," \
    "$CLASSES class tars, $FILES JPEGs; $(nproc) CPUs, load average now $(cut -d' ' -f1-3 /proc/loadavg);" \
    "best of $REPS; sync in timing: $SYNC; FS=$FS"
printf '%-20s %8s %8s %11s %8s %11s   %s\n' "run" "wall s" "MB/s" "vs GNU tar" "CPU s" "CPU vs GNU" "all runs, wall s"
for name in "${NAMES[@]}"; do
    awk -v n="$name" -v t="${BEST[$name]}" -v g="${BEST[gnu-tar]}" -v b="$BYTES" -v all="${ALL[$name]}" \
        -v c="${CPU[$name]}" -v gc="${CPU[gnu-tar]}" \
        'BEGIN { printf "%-20s %8.3f %8.1f %10.2fx %8.3f %10.2fx   %s\n", n, t, b / t / 1e6, g / t, c, gc / c, all }'
done
awk -v a="${BEST[prepare-j1]}" -v b="${BEST[prepare-j2]}" \
    'BEGIN { printf "prepare -j 2 vs -j 1: %.2fx\n", a / b }'
