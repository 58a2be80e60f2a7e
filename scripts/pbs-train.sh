#!/bin/bash
# Data-parallel ResNet-50 training under PBS Pro / UGE (ABCI-style): one `rn50 launch` per node, started on
# every node by mpirun (one process per node); each launcher starts one worker per GPU and supervises it.
#
# Submit on ABCI 3.0 (PBS Pro; 2 nodes × 8 H200, rt_HF = full node; group from `show_group`):
#
#   qsub -P GROUP -q rt_HF -l select=2 -l walltime=24:00:00 -v DATA=/path/to/imagenet,OUT=runs/r50 scripts/pbs-train.sh
#
# UGE (ABCI 2.0 style):  qsub -g GROUP -l rt_F=2 -l h_rt=24:00:00 -v DATA=...,OUT=... scripts/pbs-train.sh
#
# Variables: DATA (dataset root, required), OUT (run directory), GPUS_PER_NODE (default: GPUs seen on the head
# node), RN50 (binary; default target/release/rn50 of the submit directory), EXTRA (more `rn50 train` flags),
# STARTER (mpirun, the default, or pbsdsh), RN50_DIST_TIMEOUT (collective timeout, seconds), RN50_STOP_WAIT
# (seconds to wait after a signal for node 0's checkpoint, default 300). GLOO_*, NCCL_*, RN50_*, TORCH_* and
# OMP_NUM_THREADS, when set (qsub -v, or exported in this script), reach every node.
#
# The end of the walltime: PBS Pro sends no warning signal. At the walltime it sends SIGTERM to every process of
# the job, then SIGKILL kill_delay seconds later (10 s by default; `qstat -f` shows the queue's). On SIGTERM this
# script asks every node's launcher to stop (SIGUSR1 through mpirun), rn50 train saves a checkpoint and exits 3,
# and the script prints "checkpointed …; resubmit" and exits 3; resubmitting the same qsub command resumes from
# OUT (--resume auto). A checkpoint must fit in kill_delay: rn50 train also checkpoints every epoch, and every N
# minutes with EXTRA="--checkpoint-minutes N", which bounds what a kill before the save loses. rn50 has no
# time limit of its own (no --time-limit flag) to stop earlier. To get a warning before the end:
#   UGE:      qsub -l h_rt=24:00:00 -l s_rt=23:55:00 …  (SIGUSR1 at s_rt, which rn50 treats like SIGTERM);
#   PBS Pro:  ask the site for a longer kill_delay, or submit a shorter walltime and resubmit more often.
#PBS -N rn50
#PBS -j oe
#PBS -l walltime=24:00:00
#$ -N rn50
#$ -j y
#$ -cwd
set -uo pipefail

cd "${PBS_O_WORKDIR:-${SGE_O_WORKDIR:-$PWD}}"
: "${DATA:?set DATA=/path/to/imagenet (qsub -v DATA=...)}"
OUT=${OUT:-runs/train}
RN50=${RN50:-$PWD/target/release/rn50}
NODEFILE=${PBS_NODEFILE:-${SGE_JOB_HOSTLIST:-${PE_HOSTFILE:-}}}
if [[ -z $NODEFILE || ! -r $NODEFILE ]]; then
    echo "rn50: no PBS_NODEFILE / SGE_JOB_HOSTLIST / PE_HOSTFILE: not inside a PBS or UGE job?" >&2
    exit 2
fi
# The nodes in the node file's order (one line per MPI slot; PE_HOSTFILE: host first on each line): the first is
# the head node, where this script runs, and rank 0's (the rendezvous master, as rn50 itself reads PBS_NODEFILE).
mapfile -t NODES < <(awk 'NF && !seen[$1]++ { print $1 }' "$NODEFILE")
NNODES=${#NODES[@]}
if [[ $NNODES -eq 0 ]]; then
    echo "rn50: $NODEFILE lists no node" >&2
    exit 2
fi
MASTER=${NODES[0]}
JOBNUM=${PBS_JOBID:-${JOB_ID:-0}}
JOBNUM=${JOBNUM%%[!0-9]*}
PORT=${MASTER_PORT:-$((15000 + ${JOBNUM:-0} % 15000))}
GPUS_PER_NODE=${GPUS_PER_NODE:-$(nvidia-smi -L 2>/dev/null | wc -l)}
export RN50_DIST_TIMEOUT=${RN50_DIST_TIMEOUT:-600}
[[ $GPUS_PER_NODE -ge 1 ]] || GPUS_PER_NODE=1

mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
echo "rn50: $NNODES node(s) × $GPUS_PER_NODE worker(s), master $MASTER:$PORT, out $OUT"

# One launcher per node, each given its node rank as its argument (the node's position in the node file). MPI
# only places the launchers: training communicates through c10d (NCCL/Gloo), not MPI.
#
# The launcher runs in a process group of its own (set -m), in a subshell that records its exit status: a
# signalled mpirun ends its processes' groups (SIGCONT, SIGTERM, then SIGKILL about a second later) and exits 1,
# so it neither waits for the checkpoint nor reports the launcher's status 3. The node script forwards the
# signals it gets (mpirun forwards SIGUSR1; PBS sends SIGTERM) to the launcher's group; the launcher forwards them
# to the workers and waits for their checkpoint.
NODE_SCRIPT=$OUT/.rn50-node-$JOBNUM.sh
STATUS=$OUT/.rn50-node-$JOBNUM
rm -f "$STATUS".*.status
{
    echo '#!/bin/bash'
    echo "# rn50 node script of job $JOBNUM: \$1 = this node's rank"
    printf 'cd %q || exit 1\n' "$PWD"
    echo 'node=${1:?node rank}'
    echo 'set -m'
    # $RN50 unquoted on purpose (a container prefix such as `apptainer exec --nv rn50.sif rn50` works); EXTRA too.
    printf '( trap : TERM USR1 INT; %s launch --nproc-per-node %q --nnodes %q --node-rank "$node" --master %q -- train %q --out %q --resume auto %s\n' \
        "$RN50" "$GPUS_PER_NODE" "$NNODES" "$MASTER:$PORT" "$DATA" "$OUT" "${EXTRA:-}"
    printf '  echo $? > %q.$node.tmp && mv %q.$node.tmp %q.$node.status ) &\n' "$STATUS" "$STATUS" "$STATUS"
    echo 'child=$!'
    echo 'for s in TERM USR1 INT; do trap "kill -$s -- -$child 2>/dev/null" $s; done'
    echo 'while :; do wait $child; status=$?; kill -0 $child 2>/dev/null || break; done'
    echo 'exit $status'
} > "$NODE_SCRIPT"
chmod +x "$NODE_SCRIPT"

# Variables for the other nodes: only those set (mpirun -x of an unset variable warns).
FORWARD=()
for v in $(compgen -e); do
    [[ $v =~ ^(PATH|LD_LIBRARY_PATH|OMP_NUM_THREADS|GLOO_.*|NCCL_.*|RN50_.*|TORCH_.*)$ ]] && FORWARD+=(-x "$v")
done

# The starter runs in the background so that the trap below runs as soon as a signal arrives (bash runs traps
# only between commands).
signal=
case ${STARTER:-mpirun} in
    mpirun)
        # One app context per node, each with its own host and node rank (Open MPI; MPICH / Intel MPI Hydra take
        # the same `-n 1 -host H "$NODE_SCRIPT" i : …` form with -genvlist instead of -x).
        APPS=()
        for i in "${!NODES[@]}"; do
            [[ $i -gt 0 ]] && APPS+=(:)
            APPS+=(-n 1 --host "${NODES[$i]}" "$NODE_SCRIPT" "$i")
        done
        mpirun --bind-to none "${FORWARD[@]}" "${APPS[@]}" &
        ;;
    pbsdsh)
        # pbsdsh -n takes the index of a line of PBS_NODEFILE: each node's first line.
        (
            pids=()
            for i in "${!NODES[@]}"; do
                line=$(awk -v h="${NODES[$i]}" '$1 == h { print NR - 1; exit }' "$NODEFILE")
                pbsdsh -n "$line" -- "$NODE_SCRIPT" "$i" &
                pids+=($!)
            done
            trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM
            trap 'kill -USR1 "${pids[@]}" 2>/dev/null' USR1
            status=0
            for p in "${pids[@]}"; do wait "$p" || status=$?; done
            exit $status
        ) &
        ;;
    *) echo "rn50: STARTER must be mpirun or pbsdsh" >&2; exit 2 ;;
esac
starter=$!
# SIGTERM (PBS at the walltime, qdel) or SIGUSR1 (UGE's s_rt): ask every launcher to checkpoint and stop.
# mpirun forwards SIGUSR1 to its processes; a SIGTERM to mpirun would end them instead (see above).
on_signal() {
    signal=$1
    echo "rn50: SIG$1: asking every node to checkpoint and stop"
    kill -USR1 "$starter" 2>/dev/null
}
trap 'on_signal TERM' TERM
trap 'on_signal USR1' USR1
trap 'on_signal INT' INT
while :; do
    wait "$starter"
    status=$?
    kill -0 "$starter" 2>/dev/null || break
done

# Node 0's launcher ran rank 0, which writes the checkpoint: exit 3 there is "checkpointed and stopped", whatever
# mpirun made of the others' exits. After a signal it may still be saving when mpirun is gone: wait for it (PBS's
# SIGKILL after kill_delay ends this wait too).
if [[ -n $signal ]]; then
    for ((i = 0; i < ${RN50_STOP_WAIT:-300}; i++)); do
        [[ -e $STATUS.0.status ]] && break
        sleep 1
    done
fi
node0=$(cat "$STATUS.0.status" 2>/dev/null)
if [[ $status -eq 3 || $node0 == 3 ]]; then
    echo "rn50: checkpointed before the walltime; resubmit the same qsub command to resume from $OUT"
    exit 3
fi
if [[ -n $signal ]]; then
    echo "rn50: stopped by SIG$signal without a checkpoint (node 0 exit status ${node0:-unknown}); resubmitting resumes from the last one in $OUT" >&2
fi
exit $status
