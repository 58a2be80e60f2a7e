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
# STARTER (mpirun, the default, or pbsdsh), RN50_DIST_TIMEOUT (collective timeout, seconds).
# On the scheduler's warning signal (SIGUSR1 or SIGTERM before the walltime) the launchers forward it to the
# workers, rn50 train checkpoints and exits 3; resubmitting the same command resumes from OUT (--resume auto).
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
NODEFILE=${PBS_NODEFILE:-${SGE_JOB_HOSTLIST:-}}
if [[ -z $NODEFILE || ! -r $NODEFILE ]]; then
    echo "rn50: no PBS_NODEFILE / SGE_JOB_HOSTLIST: not inside a PBS or UGE job?" >&2
    exit 2
fi
mapfile -t NODES < <(sort -u "$NODEFILE")
NNODES=${#NODES[@]}
MASTER=${NODES[0]}
JOBNUM=${PBS_JOBID:-${JOB_ID:-0}}
PORT=${MASTER_PORT:-$((15000 + ${JOBNUM%%[!0-9]*} % 15000))}
GPUS_PER_NODE=${GPUS_PER_NODE:-$(nvidia-smi -L 2>/dev/null | wc -l)}
export RN50_DIST_TIMEOUT=${RN50_DIST_TIMEOUT:-600}
[[ $GPUS_PER_NODE -ge 1 ]] || GPUS_PER_NODE=1

echo "rn50: $NNODES node(s) × $GPUS_PER_NODE worker(s), master $MASTER:$PORT"

# One launcher per node. The per-node script finds its node rank from the MPI launcher (Open MPI, MPICH/Intel
# MPI) or, under pbsdsh, from its host's position in the node list. MPI only places the launchers: training
# communicates through c10d (NCCL/Gloo), not MPI.
mkdir -p "$OUT"
NODE_SCRIPT=$OUT/.rn50-node-$JOBNUM.sh
cat > "$NODE_SCRIPT" <<NODE
#!/bin/bash
cd "$PWD"
rank=\${OMPI_COMM_WORLD_RANK:-\${PMI_RANK:-}}
if [[ -z \$rank ]]; then
    i=0; me=\$(hostname -s)
    for h in ${NODES[*]}; do [[ \${h%%.*} == \$me ]] && rank=\$i; i=\$((i + 1)); done
fi
exec $RN50 launch --nproc-per-node $GPUS_PER_NODE --nnodes $NNODES --node-rank "\${rank:?cannot tell the node rank of this host}" \\
    --master $MASTER:$PORT -- train "$DATA" --out "$OUT" --resume auto ${EXTRA:-}
NODE
chmod +x "$NODE_SCRIPT"

case ${STARTER:-mpirun} in
    mpirun)
        HOSTS=$(IFS=,; echo "${NODES[*]}")
        # Open MPI syntax; for Intel MPI / MPICH use: mpirun -np $NNODES -ppn 1 -hosts $HOSTS "$NODE_SCRIPT"
        mpirun -n "$NNODES" --host "$HOSTS" --map-by ppr:1:node --bind-to none -x PATH -x LD_LIBRARY_PATH \
            -x RN50_DIST_TIMEOUT "$NODE_SCRIPT"
        ;;
    pbsdsh) pbsdsh -u "$NODE_SCRIPT" ;;
    *) echo "rn50: STARTER must be mpirun or pbsdsh" >&2; exit 2 ;;
esac
status=$?
if [[ $status -eq 3 ]]; then
    echo "rn50: checkpointed before the walltime; resubmit the same qsub command to resume from $OUT"
fi
exit $status
