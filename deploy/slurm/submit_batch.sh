#!/usr/bin/env bash
# submit_batch.sh: submit a sharded `snapserve batch` run: batch_array.sbatch as an array of
# N tasks (at most K running at once), then batch_merge.sbatch with
# --dependency=afterok:<array job>. Prints the job ids on stdout, one `name=id` a line:
#   array_job=123
#   merge_job=124
# (eval-able: `eval "$(deploy/slurm/submit_batch.sh -n 8)"`). Everything else goes to stderr.
#
# usage: submit_batch.sh [-n SHARDS] [-k MAX_RUNNING] [-- EXTRA_SBATCH_ARGS...]
#   -n SHARDS       array tasks = shards (default $BATCH_SHARDS, else 4)
#   -k MAX_RUNNING  at most this many tasks at once (--array=0-(N-1)%K; default: no limit)
#   EXTRA_SBATCH_ARGS go to both sbatch calls (--partition, --time, --account, ...)
# Environment: SNAPSERVE_BIN, SNAP_MODEL, BATCH_INPUT, BATCH_OUTPUT, BATCH_THREADS,
# BATCH_ARGS as in batch_array.sbatch; BATCH_LOG_DIR (default: the output's directory) for
# the logs snap-batch-<array>_<task>.out and snap-batch-merge-<job>.out. Paths are made
# absolute here, so the jobs do not depend on the directory they start in.
#
# When a task fails, the merge's afterok dependency can never be satisfied any more, even if
# the task is requeued and then succeeds (Slurm remembers the failure on the array): use
# requeue_batch.sh, which requeues the task and points the merge at the unfinished tasks.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
shards=${BATCH_SHARDS:-4}
limit=""
while getopts "n:k:h" opt; do
  case $opt in
    n) shards=$OPTARG ;;
    k) limit=$OPTARG ;;
    h) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
    *) echo "usage: $0 [-n SHARDS] [-k MAX_RUNNING] [-- EXTRA_SBATCH_ARGS...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = -- ] && shift
if ! [[ $shards =~ ^[1-9][0-9]*$ ]] || { [ -n "$limit" ] && ! [[ $limit =~ ^[1-9][0-9]*$ ]]; }; then
  echo "submit_batch: -n and -k take positive integers" >&2
  exit 2
fi

BATCH_INPUT=$(realpath -m "${BATCH_INPUT:-input.jsonl}")
BATCH_OUTPUT=$(realpath -m "${BATCH_OUTPUT:-results.jsonl}")
if [ ! -r "$BATCH_INPUT" ]; then
  echo "submit_batch: cannot read BATCH_INPUT $BATCH_INPUT" >&2
  exit 1
fi
if [ ! -d "$(dirname "$BATCH_OUTPUT")" ]; then
  echo "submit_batch: the directory of BATCH_OUTPUT $BATCH_OUTPUT does not exist" >&2
  exit 1
fi
# A binary given as a path (not a name on PATH) is made absolute as well.
SNAPSERVE_BIN=${SNAPSERVE_BIN:-snapserve}
[[ $SNAPSERVE_BIN == */* ]] && SNAPSERVE_BIN=$(realpath -m "$SNAPSERVE_BIN")
[ -n "${SNAP_MODEL:-}" ] && SNAP_MODEL=$(realpath -m "$SNAP_MODEL") && export SNAP_MODEL
log_dir=$(realpath -m "${BATCH_LOG_DIR:-$(dirname "$BATCH_OUTPUT")}")
mkdir -p "$log_dir"
export SNAPSERVE_BIN BATCH_INPUT BATCH_OUTPUT BATCH_SHARDS=$shards

array_spec=0-$((shards - 1))${limit:+%$limit}
array_job=$(sbatch --parsable --array="$array_spec" --output="$log_dir/%x-%A_%a.out" \
  "$@" "$here/batch_array.sbatch")
array_job=${array_job%%;*}  # --parsable prints "id" or "id;cluster"
echo "submit_batch: array job $array_job (--array=$array_spec) over $BATCH_INPUT" >&2
echo "array_job=$array_job"

if [ "$shards" -eq 1 ]; then
  # One shard writes BATCH_OUTPUT itself: nothing to merge.
  echo "merge_job=none"
  exit 0
fi
# --kill-on-invalid-dep=no: where the site cancels jobs whose dependency can never be
# satisfied (SchedulerParameters=kill_invalid_depend), keep the merge pending, so that
# requeue_batch.sh can still repoint it after a task failed.
merge_job=$(sbatch --parsable --dependency="afterok:$array_job" --kill-on-invalid-dep=no \
  --output="$log_dir/%x-%j.out" "$@" "$here/batch_merge.sbatch")
merge_job=${merge_job%%;*}
echo "submit_batch: merge job $merge_job (afterok:$array_job) writes $BATCH_OUTPUT" >&2
echo "merge_job=$merge_job"
