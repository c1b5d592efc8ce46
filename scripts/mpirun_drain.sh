#!/usr/bin/env bash
# mpirun_drain.sh: `mpirun ARGS...` with a graceful stop from the outside. Open MPI's mpirun
# turns a SIGTERM into a kill of the job (SIGTERM to the ranks after odls_base_sigkill_timeout,
# 1 s by default, then SIGKILL as long again after it), so nothing could drain. This wrapper
# forwards SIGTERM and SIGINT to mpirun as SIGUSR1, which mpirun passes to every rank at
# once; `snapserve serve` drains on it (running requests get --shutdown-timeout), stops the
# worker ranks, and the job exits 0. Use it wherever mpirun is the process a supervisor
# signals (a container's entry point, a systemd unit):
#   scripts/mpirun_drain.sh -np 4 build/snapserve serve --tp 4 --shutdown-timeout 30
# MPIRUN names the launcher (default: mpirun on PATH). Exit code: mpirun's.
set -u
"${MPIRUN:-mpirun}" "$@" &
pid=$!
trap 'kill -USR1 "$pid" 2>/dev/null' TERM INT
while :; do
  wait "$pid"
  rc=$?
  kill -0 "$pid" 2>/dev/null || exit "$rc"  # wait returned for a trapped signal: keep waiting
done
