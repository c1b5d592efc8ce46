#!/usr/bin/env bash
# slurm_local.sh <ntasks> <command...>: a private one-node Slurm (slurmctld + slurmd, as root)
# in a fresh temp dir, then `srun --mpi=pmix --overcommit -n <ntasks> <command...>`; exits
# with srun's status. Daemons are torn down on every exit. 77 when Slurm is not installed or
# we are not root (slurmd must be). Ports are picked free under a lock, so copies can overlap.
#   SLURM_LOCAL_TIME        srun --time in minutes (default 10)
#   SLURM_LOCAL_SRUN_ARGS   extra srun arguments, word-split (default none)
#   SLURM_LOCAL_KEEP=1      keep the temp dir (config, logs) after exit
# shellcheck disable=SC2317  # (functions run from traps)
set -uo pipefail

if [ $# -lt 2 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 <ntasks> <command...>" >&2
  exit 2
fi
ntasks=$1
shift

for tool in srun slurmctld slurmd scontrol munge; do
  if ! PATH=$PATH:/usr/sbin:/sbin command -v "$tool" >/dev/null; then
    echo "slurm_local: $tool not found (apt-get install slurm-wlm munge); skipping" >&2
    exit 77
  fi
done
if [ "$(id -u)" -ne 0 ]; then
  echo "slurm_local: needs root (slurmd runs as root here); skipping" >&2
  exit 77
fi
export PATH=$PATH:/usr/sbin:/sbin

# --- munge: reuse a running munged, else start the system one ---------------------
munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }
if ! munge_ok; then
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 status=none
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  runuser -u munge -- munged || true
  for _ in $(seq 50); do munge_ok && break; sleep 0.1; done
  if ! munge_ok; then
    echo "slurm_local: munged did not start (munge -n | unmunge fails)" >&2
    tail -n 20 /var/log/munge/munged.log >&2 2>/dev/null
    exit 1
  fi
fi

# --- private cluster in a temp dir ------------------------------------------------
dir=$(mktemp -d "${TMPDIR:-/tmp}/slurm_local.XXXXXX")
ctld_pid=""
slurmd_pid=""
srun_pid=""
watchdog_pid=""

show_logs() {  # show_logs [lines]: the log file, or the daemon's stderr when it had none
  local daemon log lines=${1:-30}
  for daemon in slurmctld slurmd; do
    log=$dir/$daemon.log
    [ -s "$log" ] || log=$dir/$daemon.out
    echo "--- tail of $log" >&2
    tail -n "$lines" "$log" >&2 2>/dev/null
  done
}

stop_pid() {  # stop_pid <pid>: TERM, up to 10 s, then KILL
  local pid=$1
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}

teardown() {
  [ -n "$watchdog_pid" ] && kill -KILL "$watchdog_pid" 2>/dev/null
  if [ -n "$ctld_pid" ] && kill -0 "$ctld_pid" 2>/dev/null; then
    # Jobs left behind (srun killed, time limit) end before slurmd goes, so no slurmstepd stays.
    timeout 5 scancel --quiet --user=root 2>/dev/null
    for _ in $(seq 50); do
      [ -z "$(timeout 2 squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  stop_pid "$slurmd_pid"
  stop_pid "$ctld_pid"
  if [ "${SLURM_LOCAL_KEEP:-0}" = 1 ]; then
    echo "slurm_local: kept $dir" >&2
  else
    rm -rf "$dir"
  fi
}
trap teardown EXIT
on_signal() {  # forward to srun, then exit (teardown cancels what is left)
  [ -n "$srun_pid" ] && kill -TERM "$srun_pid" 2>/dev/null && wait "$srun_pid" 2>/dev/null
  exit "$1"
}
trap 'on_signal 143' TERM
trap 'on_signal 130' INT
trap 'on_signal 129' HUP

# Every local TCP port bound or in use, in decimal, one a line.
used_ports() {
  local _sl local_addr _rest
  cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | while read -r _sl local_addr _rest; do
    [[ $local_addr == *:* ]] && echo $((16#${local_addr##*:}))
  done
}
free_port() {  # free_port <ports to avoid...>
  local used port
  used=" $(used_ports | tr '\n' ' ') $* "
  for _ in $(seq 200); do
    port=$((20000 + RANDOM % 30000))
    [[ $used == *" $port "* ]] || { echo "$port"; return 0; }
  done
  return 1
}

# Choosing ports and binding them happens under one lock, so two copies never pick the same.
exec 9>"${TMPDIR:-/tmp}/slurm_local.lock"
flock -w 60 9 || { echo "slurm_local: could not take ${TMPDIR:-/tmp}/slurm_local.lock" >&2; exit 1; }
if ! ctld_port=$(free_port) || ! slurmd_port=$(free_port "$ctld_port"); then
  echo "slurm_local: no free TCP port found" >&2
  exit 1
fi

mkdir -p "$dir/state" "$dir/spool" "$dir/tmp"
export SLURM_CONF=$dir/slurm.conf
# Two copies at once must not share a job id: mpi/pmix makes $TmpFS/spmix_appdir_<uid>_<job>.<step>
# (a clash fails the launch) and Open MPI names its shared-memory segments after the PMIx
# namespace slurm.pmix.<job>.<step> (a clash crashes the ranks). So TmpFS is ours and the
# job ids start at ctld_port * 1000, unique among the copies running now.
cat >"$SLURM_CONF" <<EOF
ClusterName=local$$
FirstJobId=$((ctld_port * 1000))
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
TmpFS=$dir/tmp
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF

# Foreground daemons (-D) in the background: their pids are ours to stop.
# Their stderr copies the log files; *.out keeps only what comes before a log file opens.
slurmctld -D -i >"$dir/slurmctld.out" 2>&1 9>&- &
ctld_pid=$!
slurmd -D -N localhost >"$dir/slurmd.out" 2>&1 9>&- &
slurmd_pid=$!
# Should this script be SIGKILLed (no trap runs), a watchdog tears the daemons down.
(
  trap - EXIT TERM INT HUP
  watchdog_pid=""
  while kill -0 $$ 2>/dev/null; do sleep 1; done
  teardown
) >/dev/null 2>&1 9>&- &
watchdog_pid=$!
disown "$watchdog_pid"

# Bounded wait (30 s) for the node to be idle.
state=""
for _ in $(seq 300); do
  if ! kill -0 "$ctld_pid" 2>/dev/null || ! kill -0 "$slurmd_pid" 2>/dev/null; then
    echo "slurm_local: a Slurm daemon exited during start-up" >&2
    show_logs
    exit 1
  fi
  state=$(sinfo -h -n localhost -o %T 2>/dev/null)
  [ "$state" = idle ] && break
  sleep 0.1
done
if [ "$state" != idle ]; then
  echo "slurm_local: node not idle after 30 s (state '${state:-unknown}')" >&2
  show_logs
  exit 1
fi
flock -u 9
exec 9>&-

# --- the step ----------------------------------------------------------------------
# --overcommit: up to ntasks > CPUs on the 2-CPU node. In the background with our stdin, so a
# signal to this script is handled at once (not after srun) and the teardown still runs.
# shellcheck disable=SC2086
OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1} srun --mpi=pmix --overcommit --time="${SLURM_LOCAL_TIME:-10}" -n "$ntasks" ${SLURM_LOCAL_SRUN_ARGS:-} "$@" <&0 &
srun_pid=$!
wait "$srun_pid"
rc=$?
srun_pid=""
# Slurm 22.05's srun can exit 0 when the step failed to launch (mpi/pmix set-up errors).
if [ "$rc" -eq 0 ] && grep -q "exiting abnormally" "$dir/slurmd.log" 2>/dev/null; then
  echo "slurm_local: the step failed to launch, though srun exited 0" >&2
  rc=1
fi
[ "$rc" -eq 0 ] || { echo "slurm_local: srun exited $rc" >&2; show_logs 10; }
exit "$rc"
