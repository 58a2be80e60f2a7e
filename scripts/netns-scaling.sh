#!/usr/bin/env bash
# Data-parallel `rn50 bench` across two "nodes" joined by a rate-limited link, beside `rn50 scaling`'s prediction
# for the same link (issue 24). One machine: each node is a network namespace with a veth to a bridge in a third
# ("switch") namespace, on 10.200.X.0/24 (X unused on this host); each node's veth is shaped with tc's token
# bucket filter (`tc qdisc replace dev VETH root tbf rate RATE burst BURST latency 50ms`, so each node sends at
# RATE). Everything is removed on exit (trap), also on Ctrl-C. Needs root and iproute2.
#
#   scripts/netns-scaling.sh                 # rates 1gbit and 5gbit
#   scripts/netns-scaling.sh 500mbit 2gbit   # tc's rate units; `none` for an unshaped link
#
# For each rate: the link's measured TCP throughput (a 2 s stream from node 1 to node 0), then
#   2 nodes × 1 rank  (`rn50 launch --nnodes 2 --nproc-per-node 1 … -- bench`, world 2, every all-reduce crosses the link)
#   2 nodes × 2 ranks (world 4: two ranks per node share the node's link; on 2 cores also its CPUs)
# and `rn50 scaling` for the same worker counts, bandwidth (the measured one, in GB/s) and workers per node. Its
# single-worker step T1 is measured with the same threads per rank and under the same load: as many
# single-process benches at once as the job has ranks (they share this machine's cores as the ranks do).
#
# Environment: RN50 (binary; default target/release/rn50), ARCH (resnet50), BATCH (per rank, 16), IMAGE (224),
# STEPS (6), WARMUP (2), THREADS (per rank, 1), BURST (256kb), LATENCY_US (the model's per-step latency, 30),
# OUT (where the JSON files go; default a new temporary directory, kept). Defaults take about 10 minutes for two
# rates on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."

RN50=${RN50:-$PWD/target/release/rn50}
ARCH=${ARCH:-resnet50}
BATCH=${BATCH:-16}
IMAGE=${IMAGE:-224}
STEPS=${STEPS:-6}
WARMUP=${WARMUP:-2}
THREADS=${THREADS:-1}
BURST=${BURST:-256kb}
LATENCY_US=${LATENCY_US:-30}
PORT=29500
RATES=("$@")
[[ ${#RATES[@]} -gt 0 ]] || RATES=(1gbit 5gbit)

die() { echo "netns-scaling: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "needs root (network namespaces, tc)"
command -v ip >/dev/null && command -v tc >/dev/null || die "needs iproute2 (ip, tc)"
[[ -x $RN50 ]] || die "no $RN50 (./dev build, or set RN50)"
PY=$(command -v python3) || die "needs python3 (the throughput check and the JSON figures)"
OUT=${OUT:-$(mktemp -d -t rn50-netns-scaling.XXXXXX)}
mkdir -p "$OUT"

TAG=rn50s-$$
SW=$TAG-sw
NODES=("$TAG-n0" "$TAG-n1")
cleanup() {
    local ns pid
    for ns in "${NODES[@]}" "$SW"; do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true
    done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# 10.200.X.0/24 with X unused by this host's addresses and routes.
used=$(ip -4 addr show; ip -4 route show table all)
X=
for i in $(seq 0 255); do
    x=$(( ($$ + i) % 256 ))
    if ! grep -q "10\.200\.$x\." <<<"$used"; then X=$x; break; fi
done
[[ -n $X ]] || die "every 10.200.X.0/24 is in use here"
MASTER=10.200.$X.1

ip netns add "$SW"
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
for i in 0 1; do
    ns=${NODES[$i]}
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$SW" link add "port$i" type veth peer name "veth$i" netns "$ns"
    ip -n "$SW" link set "port$i" master br0
    ip -n "$SW" link set "port$i" up
    ip -n "$ns" addr add "10.200.$X.$((i + 1))/24" dev "veth$i"
    ip -n "$ns" link set "veth$i" up
done
echo "netns-scaling: nodes ${NODES[*]} on 10.200.$X.0/24 (master $MASTER:$PORT); results in $OUT"

BENCH=(bench -a "$ARCH" -b "$BATCH" --image-size "$IMAGE" --steps "$STEPS" --warmup "$WARMUP" --device cpu
       --precision fp32 --threads "$THREADS" --data device)
export OMP_NUM_THREADS=$THREADS

# Node 1 streams to node 0 for 2 s; prints GB/s (10^9 bytes/s) of what arrived.
throughput() {
    ip netns exec "${NODES[0]}" "$PY" - "$MASTER" <<'EOF' &
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5201)); s.listen(1); s.settimeout(20)
c, _ = s.accept(); c.settimeout(20)
n, t0 = 0, None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.perf_counter()
    n += len(b)
print(f"{n / (time.perf_counter() - t0) / 1e9:.4f}")
EOF
    local rx=$!
    sleep 0.5
    ip netns exec "${NODES[1]}" "$PY" - "$MASTER" <<'EOF'
import socket, sys, time
c = socket.create_connection((sys.argv[1], 5201), timeout=20)
buf, end = b"\0" * (1 << 20), time.perf_counter() + 2
while time.perf_counter() < end: c.sendall(buf)
c.close()
EOF
    wait "$rx"
}

# `rn50 launch` on both nodes, NPROC ranks each; rank 0 writes JSON.
bench_nodes() {
    local nproc=$1 json=$2 i pids=()
    for i in 0 1; do
        GLOO_SOCKET_IFNAME=veth$i ip netns exec "${NODES[$i]}" "$RN50" launch --nnodes 2 --node-rank "$i" \
            --nproc-per-node "$nproc" --master "$MASTER:$PORT" --timeout 300 -- "${BENCH[@]}" --json "$json" \
            >"$json.node$i.log" 2>&1 &
        pids+=($!)
    done
    for i in 0 1; do wait "${pids[$i]}" || die "node $i failed: $(tail -n 5 "$json.node$i.log")"; done
}

figures() {
    "$PY" - "$@" <<'EOF'
import json, sys
print(f"{'run':<24} {'world':>5} {'img/s':>8} {'step ms':>9} {'compute ms':>10} {'exposed all-reduce ms':>22}")
for f in sys.argv[1:]:
    d = json.load(open(f))
    w = (d.get("config") or {}).get("world_size") or 1
    ar = d.get("allreduce_ms")
    print(f"{f.rsplit('/', 1)[-1][:-5]:<24} {w:>5} {d['images_per_sec']:>8.2f} {d.get('step_ms') or 0:>9.1f} "
          f"{d.get('compute_ms') or 0:>10.1f} {'-' if ar is None else f'{ar:.1f}':>22}")
EOF
}

# The model's T1 is one worker's step with no communication. Here the ranks of a job share this machine's cores,
# so T1 is measured under the same load: K single-process benches at once (K = the job's ranks), none talking to
# another; prints the median of their median steps (ms).
bench_alone() {
    local k=$1 name=$2 j pids=()
    for ((j = 0; j < k; j++)); do
        ip netns exec "${NODES[$((j % 2))]}" "$RN50" "${BENCH[@]}" --json "$OUT/$name.$j.json" \
            >"$OUT/$name.$j.log" 2>&1 &
        pids+=($!)
    done
    for ((j = 0; j < k; j++)); do
        wait "${pids[$j]}" || die "single-rank bench failed: $(tail -n 5 "$OUT/$name.$j.log")"
    done
    "$PY" - "$OUT/$name".*.json <<'EOF'
import json, statistics, sys
print(f"{statistics.median(json.load(open(f))['step_ms'] for f in sys.argv[1:]):.1f}")
EOF
}

echo "== 1 rank, no network ($ARCH, batch $BATCH, ${IMAGE} px, $THREADS thread(s)), alone and 2 or 4 at once"
ip netns exec "${NODES[0]}" "$RN50" "${BENCH[@]}" --json "$OUT/1x1.json" >"$OUT/1x1.log" 2>&1 \
    || die "single-rank bench failed: $(tail -n 5 "$OUT/1x1.log")"
figures "$OUT/1x1.json"
T1_2=$(bench_alone 2 alone2)
T1_4=$(bench_alone 4 alone4)
echo "T1 with 2 benches at once: $T1_2 ms; with 4: $T1_4 ms"

for rate in "${RATES[@]}"; do
    for i in 0 1; do
        if [[ $rate == none ]]; then
            ip netns exec "${NODES[$i]}" tc qdisc del dev "veth$i" root 2>/dev/null || true
        else
            ip netns exec "${NODES[$i]}" tc qdisc replace dev "veth$i" root tbf rate "$rate" burst "$BURST" latency 50ms
        fi
    done
    gbs=$(throughput)
    echo
    echo "== link: tbf rate $rate burst $BURST on each node's veth; measured TCP throughput $gbs GB/s"
    bench_nodes 1 "$OUT/$rate-2x1.json"
    bench_nodes 2 "$OUT/$rate-2x2.json"
    figures "$OUT/$rate-2x1.json" "$OUT/$rate-2x2.json"
    echo "-- rn50 scaling, 2 nodes × 1 (T1 $T1_2 ms, bandwidth $gbs GB/s, ${LATENCY_US} µs):"
    "$RN50" scaling --step-ms "$T1_2" -a "$ARCH" -b "$BATCH" --gpus 1,2 --gpus-per-node 1 --bandwidth-gbs "$gbs" \
        --latency-us "$LATENCY_US" --json "$OUT/$rate-2x1.predicted.json"
    echo "-- rn50 scaling, 2 nodes × 2 (T1 $T1_4 ms; intra-node: loopback preset):"
    "$RN50" scaling --step-ms "$T1_4" -a "$ARCH" -b "$BATCH" --gpus 1,4 --gpus-per-node 2 --intra loopback \
        --bandwidth-gbs "$gbs" --latency-us "$LATENCY_US" --json "$OUT/$rate-2x2.predicted.json"
done
