# shellcheck shell=bash
# slurm_cluster.sh: a private one-node Slurm (slurmctld + slurmd, as root) that stays up while
# a test submits sbatch jobs. Source it, then:
#
#   source tests/deploy/slurm_cluster.sh
#   slurm_cluster_start || exit $?     # 77: no Slurm/munge, or not root; 1: failed to start
#   sbatch ...; squeue ...; scontrol ...   # SLURM_CONF is exported
#   (the cluster is torn down on exit: an EXIT trap calls slurm_cluster_stop)
#
# The same recipe as tests/comm/slurm_local.sh (munge, a slurm.conf in a fresh temp dir with
# free ports, cons_tres, CPUs=2, MpiDefault=none, ReturnToService=2), plus what batch jobs
# need: JobRequeue=1 (batch jobs are requeueable by default), MaxArraySize, job completion
# records in a text file (no accounting here, so this is where each task's exit code is kept:
# slurm_cluster_jobcomp), and a short credential lifetime, which is also how long a requeued
# job must wait before it may start again (120 s by default).
#
# After slurm_cluster_start:
#   SLURM_CLUSTER_DIR      the temp dir (slurm.conf, daemon logs, jobcomp.txt)
#   SLURM_CONF             exported; every client (sbatch, squeue, ...) needs it
#   SLURM_CLUSTER_JOBCOMP  the jobcomp/filetxt file
# Knobs (environment, read by slurm_cluster_start):
#   SLURM_CLUSTER_CPUS         CPUs of the node (default 2)
#   SLURM_CLUSTER_CRED_EXPIRE  credential lifetime = requeue delay, seconds (default 10)
#   SLURM_CLUSTER_KEEP=1       keep the temp dir after exit
#   SLURM_CLUSTER_NO_TRAP=1    do not install the EXIT trap (call slurm_cluster_stop yourself)
# A caller with its own EXIT trap should call slurm_cluster_stop from it.
# shellcheck disable=SC2317  # (functions run from traps)

SLURM_CLUSTER_DIR=""
_slurm_cluster_ctld_pid=""
_slurm_cluster_slurmd_pid=""
_slurm_cluster_watchdog_pid=""

_slurm_cluster_munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

# Every local TCP port bound or in use, in decimal, one a line.
_slurm_cluster_used_ports() {
  local _sl local_addr _rest
  cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | while read -r _sl local_addr _rest; do
    [[ $local_addr == *:* ]] && echo $((16#${local_addr##*:}))
  done
}
_slurm_cluster_free_port() {  # <ports to avoid...>
  local used port
  used=" $(_slurm_cluster_used_ports | tr '\n' ' ') $* "
  for _ in $(seq 200); do
    port=$((20000 + RANDOM % 30000))
    [[ $used == *" $port "* ]] || { echo "$port"; return 0; }
  done
  return 1
}

_slurm_cluster_stop_pid() {  # TERM, up to 10 s, then KILL
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

# slurm_cluster_logs [lines]: tails of the daemon logs, to stderr.
slurm_cluster_logs() {
  local daemon log lines=${1:-30}
  [ -n "$SLURM_CLUSTER_DIR" ] || return 0
  for daemon in slurmctld slurmd; do
    log=$SLURM_CLUSTER_DIR/$daemon.log
    [ -s "$log" ] || log=$SLURM_CLUSTER_DIR/$daemon.out
    echo "--- tail of $log" >&2
    tail -n "$lines" "$log" >&2 2>/dev/null
  done
}

# slurm_cluster_stop: cancel what is left (so no slurmstepd outlives slurmd), stop the daemons,
# remove the temp dir. Safe to call twice.
slurm_cluster_stop() {
  [ -n "$_slurm_cluster_watchdog_pid" ] && kill -KILL "$_slurm_cluster_watchdog_pid" 2>/dev/null
  _slurm_cluster_watchdog_pid=""
  if [ -n "$_slurm_cluster_ctld_pid" ] && kill -0 "$_slurm_cluster_ctld_pid" 2>/dev/null; then
    timeout 5 scancel --quiet --user=root 2>/dev/null
    for _ in $(seq 100); do
      [ -z "$(timeout 2 squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  _slurm_cluster_stop_pid "$_slurm_cluster_slurmd_pid"
  _slurm_cluster_stop_pid "$_slurm_cluster_ctld_pid"
  _slurm_cluster_slurmd_pid=""
  _slurm_cluster_ctld_pid=""
  if [ -n "$SLURM_CLUSTER_DIR" ]; then
    if [ "${SLURM_CLUSTER_KEEP:-0}" = 1 ]; then
      echo "slurm_cluster: kept $SLURM_CLUSTER_DIR" >&2
    else
      rm -rf "$SLURM_CLUSTER_DIR"
    fi
  fi
  SLURM_CLUSTER_DIR=""
}

# slurm_cluster_start: start the cluster; returns 0 when the node is idle, 77 when Slurm or
# munge is missing or we are not root, 1 on a failure to start (logs on stderr).
slurm_cluster_start() {
  local tool ctld_port slurmd_port state dir
  for tool in sbatch srun squeue scontrol scancel slurmctld slurmd munge; do
    if ! PATH=$PATH:/usr/sbin:/sbin command -v "$tool" >/dev/null; then
      echo "slurm_cluster: $tool not found (apt-get install slurm-wlm munge); skipping" >&2
      return 77
    fi
  done
  if [ "$(id -u)" -ne 0 ]; then
    echo "slurm_cluster: needs root (slurmd runs as root here); skipping" >&2
    return 77
  fi
  export PATH=$PATH:/usr/sbin:/sbin

  # munge: reuse a running munged, else start the system one.
  if ! _slurm_cluster_munge_ok; then
    if [ ! -s /etc/munge/munge.key ]; then
      mkdir -p /etc/munge
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 status=none
      chown munge:munge /etc/munge/munge.key
      chmod 400 /etc/munge/munge.key
    fi
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown munge:munge /run/munge /var/lib/munge /var/log/munge
    runuser -u munge -- munged || true
    for _ in $(seq 50); do _slurm_cluster_munge_ok && break; sleep 0.1; done
    if ! _slurm_cluster_munge_ok; then
      echo "slurm_cluster: munged did not start (munge -n | unmunge fails)" >&2
      tail -n 20 /var/log/munge/munged.log >&2 2>/dev/null
      return 1
    fi
  fi

  dir=$(mktemp -d "${TMPDIR:-/tmp}/slurm_cluster.XXXXXX") || return 1
  SLURM_CLUSTER_DIR=$dir
  [ "${SLURM_CLUSTER_NO_TRAP:-0}" = 1 ] || trap slurm_cluster_stop EXIT

  # Ports are chosen and bound under the lock slurm_local.sh uses, so copies never collide.
  exec 8>"${TMPDIR:-/tmp}/slurm_local.lock"
  if ! flock -w 60 8; then
    echo "slurm_cluster: could not take ${TMPDIR:-/tmp}/slurm_local.lock" >&2
    exec 8>&-
    return 1
  fi
  if ! ctld_port=$(_slurm_cluster_free_port) || ! slurmd_port=$(_slurm_cluster_free_port "$ctld_port"); then
    echo "slurm_cluster: no free TCP port found" >&2
    exec 8>&-
    return 1
  fi

  mkdir -p "$dir/state" "$dir/spool" "$dir/tmp"
  export SLURM_CONF=$dir/slurm.conf
  SLURM_CLUSTER_JOBCOMP=$dir/jobcomp.txt
  # Job ids start at ctld_port * 1000, unique among the clusters running now (mpi/pmix names
  # its temp files and Open MPI its shared-memory segments after the job id); TmpFS is ours.
  cat >"$SLURM_CONF" <<EOF
ClusterName=cluster$$
FirstJobId=$((ctld_port * 1000))
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=${SLURM_CLUSTER_CRED_EXPIRE:-10}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
JobRequeue=1
SchedulerParameters=sched_interval=2,bf_interval=2
MaxArraySize=1001
MaxJobCount=10000
MinJobAge=600
JobCompType=jobcomp/filetxt
JobCompLoc=$SLURM_CLUSTER_JOBCOMP
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
TmpFS=$dir/tmp
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs=${SLURM_CLUSTER_CPUS:-2} State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF

  # Foreground daemons (-D) in the background: their pids are ours to stop.
  slurmctld -D -i >"$dir/slurmctld.out" 2>&1 8>&- &
  _slurm_cluster_ctld_pid=$!
  slurmd -D -N localhost >"$dir/slurmd.out" 2>&1 8>&- &
  _slurm_cluster_slurmd_pid=$!
  # Should the caller be SIGKILLed (no trap runs), a watchdog tears the daemons down.
  (
    trap - EXIT TERM INT HUP
    _slurm_cluster_watchdog_pid=""
    while kill -0 $$ 2>/dev/null; do sleep 1; done
    SLURM_CLUSTER_KEEP=0 slurm_cluster_stop
  ) >/dev/null 2>&1 8>&- &
  _slurm_cluster_watchdog_pid=$!
  disown "$_slurm_cluster_watchdog_pid"

  # Bounded wait (30 s) for the node to be idle.
  state=""
  for _ in $(seq 300); do
    if ! kill -0 "$_slurm_cluster_ctld_pid" 2>/dev/null || ! kill -0 "$_slurm_cluster_slurmd_pid" 2>/dev/null; then
      echo "slurm_cluster: a Slurm daemon exited during start-up" >&2
      slurm_cluster_logs 30
      exec 8>&-
      return 1
    fi
    state=$(sinfo -h -n localhost -o %T 2>/dev/null)
    [ "$state" = idle ] && break
    sleep 0.1
  done
  flock -u 8
  exec 8>&-
  if [ "$state" != idle ]; then
    echo "slurm_cluster: node not idle after 30 s (state '${state:-unknown}')" >&2
    slurm_cluster_logs 30
    return 1
  fi
  return 0
}

# slurm_cluster_state <jobid>: the job's state (PENDING, RUNNING, COMPLETED, FAILED, ...), from
# squeue while Slurm keeps the record (MinJobAge), else from the jobcomp file; empty if unknown.
slurm_cluster_state() {
  local s
  s=$(scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | head -n 1)
  if [ -z "$s" ] && [ -s "${SLURM_CLUSTER_JOBCOMP:-}" ]; then
    s=$(grep "^JobId=$1 " "$SLURM_CLUSTER_JOBCOMP" | tail -n 1 | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
  fi
  echo "$s"
}

# slurm_cluster_jobcomp: the job completion records so far (one line per finished run of a job
# or array task: JobId, JobState, ExitCode, ...).
slurm_cluster_jobcomp() {
  cat "${SLURM_CLUSTER_JOBCOMP:-/dev/null}" 2>/dev/null
}
