#!/usr/bin/env bash
# A real one-node Slurm for the tests, from Debian's packages (see shared/reference/slurm-on-one-host.md).
#   scripts/slurm.sh install          install slurm-wlm and munge if missing (root, apt)
#   scripts/slurm.sh start STATE_DIR  write slurm.conf there, start munged, slurmctld, slurmd; wait for idle
#   scripts/slurm.sh stop STATE_DIR   cancel every job, stop the daemons
#   scripts/slurm.sh ctld-stop|ctld-start STATE_DIR   stop or restart only the controller (outage tests)
# The daemons read STATE_DIR/slurm.conf; clients find it through SLURM_CONF=STATE_DIR/slurm.conf.
set -euo pipefail
cmd=${1:?usage: slurm.sh install|start|stop|ctld-stop|ctld-start [STATE_DIR]}
state=${2:-}

install() {
  if command -v slurmctld >/dev/null && command -v munged >/dev/null; then return; fi
  if [ "$(id -u)" != 0 ]; then echo "slurm.sh: installing Slurm needs root" >&2; exit 1; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

conf() {
  local host mem ctld_port slurmd_port
  host=$(hostname -s)
  # Ports of our own, so that daemons left over from an earlier run (same machine, other state dir)
  # cannot answer for this cluster or keep its slurmd from binding.
  ctld_port=$(free_port)
  slurmd_port=$(free_port)
  getent hosts "$host" >/dev/null || echo "127.0.1.1 $host" >> /etc/hosts
  mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
  mkdir -p "$state/ctld" "$state/slurmd" "$state/log"
  chown -R slurm:slurm "$state/ctld"
  chmod 0755 "$state"
  # slurmctld reads slurm.conf and its state as the slurm user: every directory above must let it through.
  if ! setpriv --reuid=slurm --regid=slurm --clear-groups test -x "$state/ctld"; then
    echo "slurm.sh: the slurm user cannot reach $state; use a state directory under a world-searchable one" \
      "(such as a new directory in /tmp)" >&2
    exit 1
  fi
  cat > "$state/slurm.conf" <<CONF
ClusterName=gridbot-test
SlurmctldHost=$host
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=slurm
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,bf_interval=1
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=300
KillWait=10
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$state/ctld/jobcomp.log
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/slurmd
SlurmctldPidFile=$state/ctld/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/ctld/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
NodeName=$host CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=$mem State=UNKNOWN
PartitionName=fast Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO MaxCPUsPerNode=4
PartitionName=big Nodes=$host Default=NO MaxTime=INFINITE State=UP OverSubscribe=NO MaxCPUsPerNode=4
PartitionName=small Nodes=$host Default=NO MaxTime=INFINITE State=UP OverSubscribe=NO MaxCPUsPerNode=2
CONF
}

start_ctld() {
  setsid /usr/sbin/slurmctld -D -f "$state/slurm.conf" </dev/null >>"$state/log/ctld.out" 2>&1 &
  echo $! > "$state/ctld.pid"
}

start() {
  conf
  mkdir -p /run/munge && chown munge:munge /run/munge
  if ! (munge -n 2>/dev/null | unmunge >/dev/null 2>&1); then
    setsid setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged -F </dev/null \
      >>"$state/log/munge.out" 2>&1 &
    echo $! > "$state/munged.pid"
    for _ in $(seq 1 50); do
      if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then break; fi
      sleep 0.1
    done
  fi
  start_ctld
  setsid /usr/sbin/slurmd -D -f "$state/slurm.conf" </dev/null >>"$state/log/slurmd.out" 2>&1 &
  echo $! > "$state/slurmd.pid"
  export SLURM_CONF="$state/slurm.conf"
  local deadline=$((SECONDS + 60)) states=""
  while [ $SECONDS -lt $deadline ]; do
    states=$(timeout 5 sinfo -h -o %t 2>&1) || true
    if grep -q idle <<<"$states"; then return; fi
    sleep 0.3
  done
  echo "slurm.sh: Slurm did not become idle within 60 s (sinfo said: $states); last log lines:" >&2
  tail -n 15 "$state"/log/*.out "$state"/ctld/slurmctld.log "$state"/log/slurmd.log >&2 2>/dev/null || true
  exit 1
}

stop_pid() {
  local f=$state/$1.pid
  if [ -f "$f" ]; then kill "$(cat "$f")" 2>/dev/null || true; rm -f "$f"; fi
}

case "$cmd" in
  install) install ;;
  start) start ;;
  stop)
    SLURM_CONF="$state/slurm.conf" timeout 10 scancel -u root 2>/dev/null || true
    sleep 1
    stop_pid slurmd; stop_pid ctld; stop_pid munged ;;
  ctld-stop) stop_pid ctld ;;
  ctld-start) start_ctld ;;
  *) echo "slurm.sh: unknown command $cmd" >&2; exit 2 ;;
esac
