#!/usr/bin/env bash
# rn50 and the PyTorch reference (benches/reference_train.py) on Imagenette on one GPU, for a queue of runs, until
# BUDGET seconds would be passed by the next one (each run's length is estimated by the longest of its kind so far,
# so a timed device session ends with whole runs). Each run writes OUT/<who>-<recipe>-s<seed>/ (metrics.jsonl,
# summary.json) and its output to OUT/<that name>.log; TARBALL (OUT/runs.tgz) holds the finished runs and their
# logs without weights, refreshed after every run.
#
#   benches/imagenette_gpu.sh DATA OUT BUDGET "rn50:5ep:1 ref:5ep:1 rn50:20ep:1 ..." [flags for both]
#
# A job is WHO:RECIPE:SEED[:FLAGS]: WHO rn50 or ref (benches/reference_train.py), RECIPE naming
# recipes/imagenette-<RECIPE>.toml, FLAGS (optional) comma-separated flags of that run alone, e.g.
# `rn50:5ep:1:--lr=0.05,--zero-init-residual` for a tuning sweep (on the held-out slice that
# benches/imagenette_holdout.py makes, never on val): its folder is then named after them too.
#
# JOBS runs at once share the GPU (default 1): each of JOBS lanes takes the next job of the queue not yet taken, in
# queue order, when its last one ends. A 5-epoch ResNet-50 at batch 64 and 128 px leaves an H200 waiting on kernel
# launches, so a tuning sweep gets through more runs with a few lanes; runs whose wall-clock is reported (time to
# accuracy) run with JOBS=1.
#
# Before anything runs or OUT is made, every job is checked: WHO, RECIPE and SEED, no run twice, and its whole
# command line as rn50 reads it (`RN50_PARSE_ONLY=1 rn50 train`: each flag's range and the rules between them; the
# reference takes rn50's flag names, and refuses at its start what it does not implement). One refused job refuses
# the queue (exit 2, each refusal named): a device session's minutes go to a queue that runs whole, not to half of
# one. With BUDGET 0 the script only checks the queue.
#
# Environment: RN50 (target/release/rn50), PYTHON (python3), JOBS (1), WORKERS (loader threads or processes of
# each run: 15 / JOBS, at least 1).
set -uo pipefail
cd "$(dirname "$0")/.."
data=$1 out=$2 budget=$3 queue=$4
shift 4
shared=("$@")
rn50=${RN50:-target/release/rn50} python=${PYTHON:-python3} jobs=${JOBS:-1}
if ! [[ $jobs =~ ^[1-9][0-9]?$ ]]; then
    echo "JOBS=$jobs: give 1 to 99 runs at once" >&2
    exit 2
fi
if ! [[ $budget =~ ^[0-9]+$ ]]; then
    echo "BUDGET $budget: give the seconds the queue may take (0 only checks it)" >&2
    exit 2
fi
if ! [ -x "$rn50" ]; then
    echo "RN50=$rn50 is not an executable: build rn50 or point RN50 at it" >&2
    exit 2
fi
workers=${WORKERS:-$((15 / jobs > 0 ? 15 / jobs : 1))}
tarball=${TARBALL:-$out/runs.tgz}
read -r -a queue <<<"$queue"

# Reads job $1 (WHO:RECIPE:SEED[:FLAGS]) into who, recipe, seed, own (its flags), name (its folder's, OUT/name) and
# flags (the run's command line after DATA); the caller declares them local.
job() {
    local tag
    IFS=: read -r who recipe seed own <<<"$1"
    IFS=, read -r -a own <<<"${own:-}"
    tag=$(printf '%s' "${own[*]:-}" | tr -c 'A-Za-z0-9.=\n' '-' | tr -s '-' | sed 's/^-//; s/-$//')
    name=$who-$recipe-s$seed${tag:+-$tag}
    flags=(--config "recipes/imagenette-$recipe.toml" --seed "$seed" -j "$workers" --out "$out/$name" "${shared[@]}"
        "${own[@]}")
    if [ "$who" = rn50 ]; then
        flags+=(--keep-checkpoints 1)
    fi
}

# Checks every job as the header says, 16 at a time, and exits 2 naming each refused one.
preflight() {
    local checks i who recipe seed own name flags why refused=0
    local -A seen=()
    checks=$(mktemp -d) || exit 1
    for i in "${!queue[@]}"; do
        job "${queue[$i]}"
        why=
        if [ -n "${seen[$name]:-}" ]; then
            why="the same run as ${seen[$name]} (OUT/$name)"
        elif [ "$who" != rn50 ] && [ "$who" != ref ]; then
            why="WHO is rn50 or ref"
        elif ! [ -f "recipes/imagenette-$recipe.toml" ]; then
            why="no recipes/imagenette-$recipe.toml"
        elif ! [[ $seed =~ ^[0-9]+$ ]]; then
            why="SEED is a number"
        fi
        seen[$name]=${queue[$i]}
        if [ -n "$why" ]; then
            echo "$why" >"$checks/$i.err"
            continue
        fi
        {
            if RN50_PARSE_ONLY=1 "$rn50" train "$data" "${flags[@]}" >/dev/null 2>"$checks/$i.err"; then
                rm "$checks/$i.err"
            else
                echo "rn50 exited $?" >>"$checks/$i.err"
            fi
        } &
        if ((i % 16 == 15)); then
            wait
        fi
    done
    wait
    for i in "${!queue[@]}"; do
        if [ -e "$checks/$i.err" ]; then
            printf 'refused %s: %s\n' "${queue[$i]}" "$(grep -m 1 . "$checks/$i.err")" >&2
            refused=$((refused + 1))
        fi
    done
    rm -rf "$checks"
    if ((refused)); then
        echo "$refused of ${#queue[@]} job(s) refused: nothing ran" >&2
        exit 2
    fi
}

preflight
mkdir -p "$out"
claims=$(mktemp -d "$out/.claims.XXXXXX") || exit 1
start=$SECONDS

# Packs what OUT/finished names (a run's folder and log, appended when it ended; a run that failed before writing
# its folder has only its log) into the tarball: written beside it, then renamed over it, so a reader never sees
# half of one.
pack() {
    local name names=()
    while read -r name; do
        [ -e "$out/$name" ] && names+=("$name")
    done <"$out/finished"
    ((${#names[@]})) || return 0
    tar czf "$tarball.$BASHPID" -C "$out" --exclude='*.safetensors' --exclude='*.png' --exclude=io.jsonl \
        --exclude=tensorboard "${names[@]}" && mv -f "$tarball.$BASHPID" "$tarball"
}

# One lane: claims queue entries in order (a job is its lane's when `mkdir` of its number succeeds, which only one
# lane's can) and runs each.
lane() {
    local -A longest=()
    local i who recipe seed own name flags est left t0 run took log
    for i in "${!queue[@]}"; do
        mkdir "$claims/$i" 2>/dev/null || continue
        job "${queue[$i]}"
        est=${longest[$who$recipe]:-0}
        left=$((budget - (SECONDS - start)))
        if ((est + 10 > left)); then
            echo "skip ${queue[$i]}: $left s left, the last such run took $est s"
            continue
        fi
        t0=$SECONDS
        run=$out/$name log=$out/$name.log
        echo "=== ${queue[$i]} at $((SECONDS - start)) s"
        if [ "$who" = rn50 ]; then
            timeout "$left" "$rn50" train "$data" "${flags[@]}" >"$log" 2>&1
        else
            timeout "$left" "$python" benches/reference_train.py "$data" "${flags[@]}" >"$log" 2>&1
        fi
        took=$((SECONDS - t0))
        printf '%s\n--- %s took %s s\n' "$(tail -n 8 "$log")" "${queue[$i]}" "$took"
        ((took > est)) && longest[$who$recipe]=$took
        printf '%s\n%s\n' "$name" "$name.log" >>"$out/finished"
        pack
    done
}

touch "$out/finished"
for ((l = 0; l < jobs; l++)); do
    lane &
done
wait
pack
rm -rf "$claims"
echo "queue done in $((SECONDS - start)) s with $jobs run(s) at once"
