#!/usr/bin/env bash
# Run and time ONE seeded training run, as the MLPerf reference repos' run_and_time.sh do.
# A cluster job calls this once (not once per rank): LAUNCHER starts the ranks. mlhpc itself
# writes the result into the submission (`mlhpc run --index`); this script lays out nothing, and
# it neither draws a seed nor works one out: seeds are mlhpc's planner's.
#
# Environment in:
#   BENCHMARK   benchmark name (default cosmoflow)
#   CONFIG      mini, full or a YAML path (default mini)
#   OUT         submission root (required); the log lands in
#               OUT/<submitter>/results/<system>/strong/<benchmark>/result_<RUN_INDEX>.txt
#   RUN_INDEX   the run's index in the campaign, 0, 1, 2, ... (default 0; e.g. $SLURM_ARRAY_TASK_ID).
#               mlhpc refuses an index whose result exists, and takes OUT/campaign.json's settings.
#   FIRST_SEED  the campaign's first seed, passed on as --first-seed (default: the one OUT/campaign.json
#               records, else one mlhpc's planner draws and records); the run's seed is the planner's
#               for RUN_INDEX, which mlhpc writes back (--seed-file) for the RESULT line
#   DATA        dataset directory to stage (default: mlhpc generates one under OUT/datasets)
#   LAUNCHER    command prefix that starts the ranks: empty (one process),
#               "torchrun --standalone --nproc_per_node=N", "srun", "mpirun -np N" (split on spaces)
#   EXTRA_ARGS  more `mlhpc run` flags and key=value overrides (one line, split on spaces, no globbing)
#   MLHPC_PYTHON  the Python that runs `-m mlhpc`, one path never split (a path with a space is
#               fine); it wins over MLHPC_CMD. `mlhpc run --slurm`'s seed jobs set it.
#   MLHPC_CMD   how to call mlhpc, split on spaces as before (so a path with a space goes in
#               MLHPC_PYTHON) (default: `mlhpc` when on PATH, else `${PYTHON:-python3} -m mlhpc`;
#               torchrun always gets `-m mlhpc`)
#   DRY_RUN     1: print the command and exit 0
#
# Arguments: when given, they are the whole `mlhpc` command line (`run <benchmark> ...`) and the
# variables that build one (CONFIG, OUT, RUN_INDEX, FIRST_SEED, DATA, EXTRA_ARGS) are not read;
# SEED must then be the run's seed as the planner gave it, for the RESULT line. `mlhpc run --slurm`
# writes its seed jobs so, from the campaign's job graph: nothing is rebuilt or worked out here.
#
# Prints STARTING/ENDING TIMING RUN lines, and RESULT,<benchmark>,<seed>,<seconds>,<user>,<start>
# only when the run succeeded; exits with mlhpc's exit status (2: config error, taken index, or
# target not reached; 127: the launcher or mlhpc is not on PATH, e.g. the venv is not activated).
set -euo pipefail

BENCHMARK=${BENCHMARK:-cosmoflow}
CONFIG=${CONFIG:-mini}
RUN_INDEX=${RUN_INDEX:-0}
OUT=${OUT:-}
DATA=${DATA:-}
FIRST_SEED=${FIRST_SEED:-}

die() {
    echo "run_and_time.sh: $*" >&2
    exit 2
}

seed_file=
if (($# > 0)); then
    [[ -n ${SEED:-} ]] || die "with a command line given, set SEED to its run's seed as mlhpc planned it (for the RESULT line)"
    [[ $SEED =~ ^[1-9][0-9]*$ ]] || die "SEED=$SEED must be a positive integer"
else
    # By hand or in a job array: mlhpc's planner gives the seed and writes it back.
    [[ -z ${SEED:-} ]] || die "SEED=$SEED: by hand the seed is mlhpc's (the planner's for RUN_INDEX); set FIRST_SEED, the campaign's first seed, or nothing"
    [[ -n $OUT ]] || die "set OUT to the submission root, e.g. OUT=runs/cosmoflow"
    [[ $RUN_INDEX =~ ^(0|[1-9][0-9]*)$ ]] || die "RUN_INDEX=$RUN_INDEX must be 0, 1, 2, ..."
    # On OUT, which every node of the run sees, since rank 0 writes it wherever it runs. It stays
    # there (the script removes no file): the name is this run's alone (index, host, pid, start),
    # so a file left by an earlier run is never read as this run's seed. The host's name is kept
    # to letters, digits, `.` and `-` (no `/`: it cannot leave OUT/.mlhpc-runs) and 64 characters.
    printf -v now '%(%s)T' -1
    host=${HOSTNAME:-host}
    host=${host//[^A-Za-z0-9.-]/_}
    seed_file="$OUT/.mlhpc-runs/run_and_time-$RUN_INDEX-${host:0:64}-$$-$now.seed"
fi

# A variable read as words is one line: `read` would drop every line after the first unseen.
for name in LAUNCHER EXTRA_ARGS MLHPC_CMD; do
    [[ ${!name:-} != *$'\n'* ]] || die "$name holds a newline, and only its first line would be read; put it on one line"
done
[[ ${MLHPC_PYTHON:-} != *$'\n'* ]] || die "MLHPC_PYTHON holds a newline; set it to the Python's path"

# Split on whitespace without glob expansion: overrides such as decay_boundary_epochs=[8,10] stay intact.
read -r -a launcher <<<"${LAUNCHER:-}"
read -r -a extra <<<"${EXTRA_ARGS:-}"
if [[ " ${launcher[*]} " =~ [[:space:]/](torchrun|torch\.distributed\.run)[[:space:]] ]]; then
    mlhpc=(-m mlhpc) # torchrun starts python itself
elif [[ -n ${MLHPC_PYTHON:-} ]]; then
    mlhpc=("$MLHPC_PYTHON" -m mlhpc) # one path, never split
elif [[ -n ${MLHPC_CMD:-} ]]; then
    read -r -a mlhpc <<<"$MLHPC_CMD"
elif command -v mlhpc >/dev/null; then
    mlhpc=(mlhpc)
else
    mlhpc=("${PYTHON:-python3}" -m mlhpc)
fi

# Ranks started by srun/mpirun inherit this; torchrun sets 1 itself. Unset, each rank takes every core.
if [[ -n ${SLURM_CPUS_PER_TASK:-} && -z ${OMP_NUM_THREADS:-} ]]; then
    export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK
fi

if (($# > 0)); then
    run_args=("$@")
else
    run_args=(run "$BENCHMARK" --config "$CONFIG" --index "$RUN_INDEX" ${FIRST_SEED:+--first-seed "$FIRST_SEED"}
        --out "$OUT" --no-check ${DATA:+--data "$DATA"} --seed-file "$seed_file" "${extra[@]}")
fi
cmd=("${launcher[@]}" "${mlhpc[@]}" "${run_args[@]}")
if [[ ${DRY_RUN:-0} == 1 ]]; then
    printf '%q ' "${cmd[@]}"
    echo
    exit 0
fi

# A missing program is one line before anything starts, not the shell's "command not found" in the middle.
program=${cmd[0]}
if ! command -v "$program" >/dev/null; then
    from=$([[ ${#launcher[@]} -gt 0 ]] && echo LAUNCHER || echo MLHPC_CMD)
    split=
    [[ $from == MLHPC_CMD && -z ${MLHPC_PYTHON:-} && ${MLHPC_CMD:-} == *" "* ]] &&
        split=" (MLHPC_CMD is split on spaces: a Python whose path has one goes in MLHPC_PYTHON)"
    [[ -n ${MLHPC_PYTHON:-} && ${#launcher[@]} -eq 0 ]] && from=MLHPC_PYTHON
    echo "run_and_time.sh: $program is not on PATH; activate the venv (. .venv/bin/activate)" \
        "or give $from its full path$split" >&2
    exit 127
fi

start=$(date +%s)
start_fmt=$(date +'%Y-%m-%d %r')
echo "STARTING TIMING RUN AT $start_fmt"
echo "+ ${cmd[*]}"
status=0
"${cmd[@]}" || status=$?
end=$(date +%s)
echo "ENDING TIMING RUN AT $(date +'%Y-%m-%d %r') (exit status $status)"
run="the run of seed ${SEED:-}"
if [[ -n $seed_file ]]; then
    run="the run of index $RUN_INDEX"
    # The seed mlhpc ran, as its planner gave it.
    { read -r SEED <"$seed_file"; } 2>/dev/null || true
    if ((status == 0)) && ! [[ ${SEED:-} =~ ^[1-9][0-9]*$ ]]; then
        echo "run_and_time.sh: the run of index $RUN_INDEX ended, but mlhpc wrote no seed to $seed_file" \
            "(rank 0 writes it: OUT must be shared with its node); no RESULT line" >&2
        exit 1
    fi
fi
# A RESULT line is a time to train: a failed run has none, and its exit status says why.
if ((status == 0)); then
    echo "RESULT,$BENCHMARK,$SEED,$((end - start)),${USER:-$(id -un)},$start_fmt"
else
    echo "run_and_time.sh: $run failed (exit status $status); no RESULT line" >&2
fi
exit "$status"
