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
# Environment: RN50 (target/release/rn50), PYTHON (python3), JOBS (1), WORKERS (loader threads or processes of
# each run: 15 / JOBS, at least 1).
set -uo pipefail
cd "$(dirname "$0")/.."
data=$1 out=$2 budget=$3 queue=$4
shift 4
rn50=${RN50:-target/release/rn50} python=${PYTHON:-python3} jobs=${JOBS:-1}
if ! [[ $jobs =~ ^[1-9][0-9]?$ ]]; then
    echo "JOBS=$jobs: give 1 to 99 runs at once" >&2
    exit 2
fi
workers=${WORKERS:-$((15 / jobs > 0 ? 15 / jobs : 1))}
tarball=${TARBALL:-$out/runs.tgz}
mkdir -p "$out"
claims=$(mktemp -d "$out/.claims.XXXXXX") || exit 1
read -r -a queue <<<"$queue"
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
    local i job who recipe seed own tag est left t0 name run took log
    for i in "${!queue[@]}"; do
        mkdir "$claims/$i" 2>/dev/null || continue
        job=${queue[$i]}
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
        name=$who-$recipe-s$seed${tag:+-$tag}
        run=$out/$name log=$out/$name.log
        local flags=(--config "recipes/imagenette-$recipe.toml" --seed "$seed" -j "$workers" --out "$run" "$@"
            "${own[@]}")
        echo "=== $job at $((SECONDS - start)) s"
        if [ "$who" = rn50 ]; then
            timeout "$left" "$rn50" train "$data" "${flags[@]}" --keep-checkpoints 1 >"$log" 2>&1
        else
            timeout "$left" "$python" benches/reference_train.py "$data" "${flags[@]}" >"$log" 2>&1
        fi
        took=$((SECONDS - t0))
        printf '%s\n--- %s took %s s\n' "$(tail -n 8 "$log")" "$job" "$took"
        ((took > est)) && longest[$who$recipe]=$took
        printf '%s\n%s\n' "$name" "$name.log" >>"$out/finished"
        pack
    done
}

touch "$out/finished"
for ((l = 0; l < jobs; l++)); do
    lane "$@" &
done
wait
pack
rm -rf "$claims"
echo "queue done in $((SECONDS - start)) s with $jobs run(s) at once"
