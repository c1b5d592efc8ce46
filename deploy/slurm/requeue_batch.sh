#!/usr/bin/env bash
# requeue_batch.sh ARRAYJOB_TASK...: rerun failed (or cancelled) tasks of a batch_array.sbatch
# array and keep its merge job waiting for them.
#
#   deploy/slurm/requeue_batch.sh 123_1 123_5
#
# 1. `scontrol requeue ARRAYJOB_TASK` for each: the task runs again with the same shard and
#    resumes, skipping the lines already in its shard file (none twice, no partial line).
#    Slurm holds a requeued job for the credential lifetime (AuthInfo=cred_expire, 120 s by
#    default) before it may start again.
# 2. Why more is needed: once a task of an array ends in FAILED, CANCELLED, TIMEOUT, ... an
#    `afterok:<array>` dependency is marked failed (squeue: DependencyNeverSatisfied) and stays
#    so, even after the requeued task succeeds (checked on Slurm 22.05; resetting the
#    dependency to afterok:<array> fails again, and afterok on the task ids marked failed
#    before the requeue stays failed too). So every pending job whose dependency names
#    afterok on this array (the merge submitted by submit_batch.sh) gets a new dependency:
#    afterok on each task of the array that has not finished yet, the requeued ones included.
#    Tasks that completed are left out; they are done. If another task fails later, run this
#    again for it.
# Prints what it does on stderr; exits non-zero when a requeue or an update fails.
set -uo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 ARRAYJOB_TASK... (e.g. 123_1 123_5)" >&2
  exit 2
fi
rc=0
arrays=()
for t in "$@"; do
  if ! [[ $t =~ ^([0-9]+)_([0-9]+)$ ]]; then
    echo "requeue_batch: '$t' is not ARRAYJOB_TASK (e.g. 123_1)" >&2
    exit 2
  fi
  if scontrol requeue "$t"; then
    echo "requeue_batch: requeued $t" >&2
  else
    echo "requeue_batch: scontrol requeue $t failed" >&2
    rc=1
  fi
  [[ " ${arrays[*]} " == *" ${BASH_REMATCH[1]} "* ]] || arrays+=("${BASH_REMATCH[1]}")
done

user=$(id -un)
for a in "${arrays[@]}"; do
  # The tasks not finished: pending (requeued ones included, and those not started) or running.
  tasks=$(squeue -h -r -j "$a" -o %i 2>/dev/null | paste -sd: -)
  if [ -z "$tasks" ]; then
    echo "requeue_batch: no unfinished task in array $a; dependents left as they are" >&2
    continue
  fi
  # Pending jobs of ours with an afterok on this array (on the whole array or on its tasks).
  while read -r job dep; do
    [[ $dep == *"afterok:${a}_"* ]] || continue
    if scontrol update JobId="$job" Dependency="afterok:$tasks"; then
      echo "requeue_batch: job $job now depends on afterok:$tasks (was $dep)" >&2
    else
      echo "requeue_batch: could not update the dependency of job $job" >&2
      rc=1
    fi
  done < <(squeue -h -u "$user" -t PENDING -o "%i %E" 2>/dev/null)
done
exit "$rc"
