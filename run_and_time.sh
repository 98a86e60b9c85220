#!/usr/bin/env bash
# Run and time ONE seeded training run, as the MLPerf reference repos' run_and_time.sh do.
# A cluster job calls this once (not once per rank): LAUNCHER starts the ranks.
#
# Environment in:
#   BENCHMARK   benchmark name (default cosmoflow)
#   CONFIG      mini, full or a YAML path (default mini)
#   SEED        the run's seed, a positive integer (default: a random one, printed)
#   OUT         submission root (required); the log lands in
#               OUT/<submitter>/results/<system>/strong/<benchmark>/result_<i>.txt
#   RUN_INDEX   i above. Unset: mlhpc writes result_0.txt straight into OUT, which must not hold
#               results for this benchmark yet. Set (one job per seed, e.g. RUN_INDEX=$SLURM_ARRAY_TASK_ID):
#               the run goes to OUT/.run_and_time/<benchmark>-<i>/ and, on success, is merged into OUT
#               as result_<i>.txt; the first run's systems/ and implementation files are kept.
#   DATA        dataset directory to stage (default: mlhpc generates one under OUT/datasets, or under
#               the per-run folder when RUN_INDEX is set; pass DATA when jobs run at the same time)
#   LAUNCHER    command prefix that starts the ranks: empty (one process),
#               "torchrun --standalone --nproc_per_node=N", "srun", "mpirun -np N" (split on spaces)
#   EXTRA_ARGS  more `mlhpc run` flags and key=value overrides (split on spaces, no globbing)
#   MLHPC_CMD   how to call mlhpc (default: `mlhpc` when on PATH, else `${PYTHON:-python3} -m mlhpc`;
#               torchrun always gets `-m mlhpc`)
#   DRY_RUN     1: print the command and exit 0
#
# Prints STARTING/ENDING TIMING RUN lines and RESULT,<benchmark>,<seed>,<seconds>,<user>,<start>;
# exits with mlhpc's exit status (2: config error or target not reached).
set -euo pipefail

BENCHMARK=${BENCHMARK:-cosmoflow}
CONFIG=${CONFIG:-mini}
SEED=${SEED:-$((RANDOM * 32768 + RANDOM + 1))}
OUT=${OUT:-}
DATA=${DATA:-}
RUN_INDEX=${RUN_INDEX:-}

die() {
    echo "run_and_time.sh: $*" >&2
    exit 2
}

[[ -n $OUT ]] || die "set OUT to the submission root, e.g. OUT=runs/cosmoflow"
[[ $SEED =~ ^[1-9][0-9]*$ ]] || die "SEED=$SEED must be a positive integer"
[[ -z $RUN_INDEX || $RUN_INDEX =~ ^(0|[1-9][0-9]*)$ ]] || die "RUN_INDEX=$RUN_INDEX must be 0, 1, 2, ..."

# Split on whitespace without glob expansion: overrides such as decay_boundary_epochs=[8,10] stay intact.
read -r -a launcher <<<"${LAUNCHER:-}"
read -r -a extra <<<"${EXTRA_ARGS:-}"
if [[ " ${launcher[*]} " =~ [[:space:]/](torchrun|torch\.distributed\.run)[[:space:]] ]]; then
    mlhpc=(-m mlhpc) # torchrun starts python itself
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

run_out=$OUT
if [[ -n $RUN_INDEX ]]; then
    # mlhpc run numbers its logs from 0 and never writes into existing results, so each
    # indexed run gets its own folder and is renamed into place afterwards.
    run_out=$OUT/.run_and_time/$BENCHMARK-$RUN_INDEX
    shopt -s nullglob
    taken=("$OUT"/*/results/*/strong/"$BENCHMARK"/result_"$RUN_INDEX".txt)
    shopt -u nullglob
    ((${#taken[@]} == 0)) || die "${taken[0]} already exists; pick another RUN_INDEX or OUT"
fi

cmd=("${launcher[@]}" "${mlhpc[@]}" run "$BENCHMARK" --config "$CONFIG" --seeds 1 --first-seed "$SEED"
    --out "$run_out" --no-check ${DATA:+--data "$DATA"} "${extra[@]}")
if [[ ${DRY_RUN:-0} == 1 ]]; then
    printf '%q ' "${cmd[@]}"
    echo
    exit 0
fi
if [[ -n $RUN_INDEX && -e $run_out ]]; then
    echo "run_and_time.sh: removing the earlier attempt $run_out"
    rm -rf -- "$run_out"
fi

start=$(date +%s)
start_fmt=$(date +'%Y-%m-%d %r')
echo "STARTING TIMING RUN AT $start_fmt"
echo "+ ${cmd[*]}"
status=0
"${cmd[@]}" || status=$?
end=$(date +%s)
echo "ENDING TIMING RUN AT $(date +'%Y-%m-%d %r') (exit status $status)"
echo "RESULT,$BENCHMARK,$SEED,$((end - start)),${USER:-$(id -un)},$start_fmt"

if [[ -n $RUN_INDEX && $status != 0 ]]; then
    echo "run_and_time.sh: this attempt stays in $run_out (the next run with RUN_INDEX=$RUN_INDEX removes it)" >&2
elif [[ -n $RUN_INDEX ]]; then
    shopt -s nullglob
    logs=("$run_out"/*/results/*/strong/"$BENCHMARK"/result_0.txt)
    shopt -u nullglob
    ((${#logs[@]} == 1)) || die "expected one result_0.txt under $run_out, found ${#logs[@]}"
    rel=${logs[0]#"$run_out"/}
    dest=$OUT/${rel%result_0.txt}result_$RUN_INDEX.txt
    mkdir -p -- "$(dirname -- "$dest")"
    # ln creates the name only if it is free, atomically: two jobs never both take one slot.
    ln -- "${logs[0]}" "$dest" 2>/dev/null || die "$dest appeared while this run went on; its log stays in $run_out"
    rm -f -- "${logs[0]}"
    # The run's time breakdown (mlhpc report) follows its log: breakdown/<org>/.../result_<i>.json.
    breakdown_rel=${rel/\/results\//\/} # <org>/<system>/strong/<benchmark>/result_0.txt
    breakdown=$run_out/breakdown/${breakdown_rel%.txt}.json
    if [[ -f $breakdown ]]; then
        breakdown_dest=$OUT/breakdown/${breakdown_rel%result_0.txt}result_$RUN_INDEX.json
        mkdir -p -- "$(dirname -- "$breakdown_dest")"
        mv -- "$breakdown" "$breakdown_dest"
    fi
    # systems/<system>.json and benchmarks/<benchmark>/implementations/: the first run's copy wins,
    # taken whole (a hard link to the finished file) so a job finishing beside it never sees half.
    org=${rel%%/*}
    while IFS= read -r -d '' file; do
        target=$OUT/${file#"$run_out"/}
        if [[ ! -e $target ]]; then
            mkdir -p -- "$(dirname -- "$target")"
            ln -- "$file" "$target" 2>/dev/null || [[ -e $target ]] || cp -p -- "$file" "$target"
        fi
    done < <(find "$run_out/$org" -type f -print0)
    rm -rf -- "$run_out"
    rmdir -- "$OUT/.run_and_time" 2>/dev/null || true
    echo "run_and_time.sh: wrote $dest"
fi
exit "$status"
