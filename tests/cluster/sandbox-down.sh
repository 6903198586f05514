#!/usr/bin/env bash
# sandbox-down.sh - stop what sandbox-up.sh started. Safe to run any number of times.
# Everything is found by PID file or namespace inode, never by process name: other Slurm
# daemons, Ray clusters or databases on this machine are not ours to kill.
#   1. cancel the sandbox's jobs (if slurmctld answers)
#   2. stop slurmd, slurmctld, slurmdbd, mariadbd from their pid files
#   3. kill what is left in the sandbox's UTS namespaces (job processes that escaped
#      proctrack/linuxproc, typically a daemonized `ray start`)
#   4. stop munged, only if sandbox-up.sh started it (SANDBOX_KEEP_MUNGE=1 keeps it)
#   5. delete the network namespaces slnode*, the veths and the bridge
#   6. remove the per-node CPU cgroups (SANDBOX_NODE_CPU)
set -uo pipefail   # no -e: keep tearing down whatever fails
LAB=${SANDBOX_DIR:-/tmp/verl-launch-sandbox}
RUN=$LAB/run CONF=$LAB/etc/slurm.conf
log() { printf '[sandbox-down %(%T)T] %s\n' -1 "$*" >&2; }

alive() {  # alive PID [COMM]: running and, if COMM given, really that program (PIDs get reused)
  local pid=$1 comm=${2:-} st
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  st=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  # A zombie counts as gone: without a real init nobody may reap it soon.
  [ "$st" != Z ] && [ "$st" != X ] || return 1
  [ -z "$comm" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ]
}
stop_pid() {  # stop_pid PID [COMM]: TERM, then KILL after 10 s
  local pid=$1 comm=${2:-}
  alive "$pid" "$comm" || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in {1..100}; do alive "$pid" || return 0; sleep 0.1; done
  log "pid $pid ($comm) ignored SIGTERM, sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null
  for _ in {1..50}; do alive "$pid" || return 0; sleep 0.1; done
}
stop_pidfile() {  # stop_pidfile FILE COMM
  if [ -s "$1" ]; then stop_pid "$(cat "$1")" "$2"; fi
  rm -f "$1"
}

# 1. Cancel first so slurmd can end job steps cleanly before it goes.
if [ -f "$CONF" ] && alive "$(cat "$RUN/slurmctld.pid" 2>/dev/null)" slurmctld; then
  export SLURM_CONF=$CONF
  jobs=$(timeout 10 squeue -h -o '%A' 2>/dev/null | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    log "cancelling jobs: $jobs"
    # shellcheck disable=SC2086  # one job id per word
    timeout 10 scancel $jobs 2>/dev/null
    for _ in {1..40}; do
      [ -z "$(timeout 5 squeue -h -o '%A' 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
fi

# 2. Compute nodes before the controller, so they do not log a lost controller.
for f in "$RUN"/slurmd-node*.pid; do stop_pidfile "$f" slurmd; done
stop_pidfile "$RUN/slurmctld.pid" slurmctld
stop_pidfile "$RUN/slurmdbd.pid" slurmdbd
stop_pidfile "$RUN/mariadbd.pid" mariadbd

# 3. Leftovers in our UTS namespaces. Never the host's namespace, whatever the files say.
host_uts=$(readlink /proc/1/ns/uts /proc/self/ns/uts)
inodes=$(cat "$RUN"/ns-uts-* 2>/dev/null | sort -u | grep -vxF "$host_uts")
if [ -n "$inodes" ]; then
  for sig in TERM KILL; do
    # one find instead of a readlink per process: this runs on every test teardown
    mapfile -t left < <(find /proc/[0-9]*/ns/uts -maxdepth 0 -printf '%l %p\n' 2>/dev/null |
      awk -v want="$inodes" 'BEGIN { n = split(want, w, "\n"); for (i = 1; i <= n; i++) ok[w[i]] = 1 }
                             ok[$1] { split($2, p, "/"); print p[3] }')
    live=()
    for pid in "${left[@]}"; do alive "$pid" && live+=("$pid"); done
    [ ${#live[@]} -eq 0 ] && break
    log "SIG$sig to ${#live[@]} leftover process(es) in sandbox namespaces: ${live[*]}"
    kill -"$sig" "${live[@]}" 2>/dev/null
    for _ in {1..20}; do
      gone=1
      for pid in "${live[@]}"; do alive "$pid" && { gone=0; break; }; done
      [ $gone = 1 ] && break
      sleep 0.1
    done
  done
fi
rm -f "$RUN"/ns-uts-*

# 4. munged: other Slurm users on the machine may share it, so only if we started it.
if [ -s "$RUN/munged.pid" ] && [ "${SANDBOX_KEEP_MUNGE:-0}" != 1 ]; then
  stop_pidfile "$RUN/munged.pid" munged
fi

# 5. Network. Processes still in a namespace would keep it alive after `ip netns del`.
for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^slnode[0-9]+$/ {print $1}'); do
  for pid in $(ip netns pids "$ns" 2>/dev/null); do stop_pid "$pid"; done
  ip link del "slv${ns#slnode}" >/dev/null 2>&1
  ip netns del "$ns" >/dev/null 2>&1
done
for dev in $(ip -o link show 2>/dev/null | awk -F': ' '{sub(/@.*/, "", $2); print $2}' | grep -E '^slv[0-9]+$'); do
  ip link del "$dev" >/dev/null 2>&1
done
if ip link show slbr0 >/dev/null 2>&1; then ip link del slbr0; fi

# 6. CPU budgets: empty now (their processes are gone), so they can be removed.
if [ -s "$RUN/cgroups" ]; then
  while read -r cg; do
    [[ $cg == /sys/fs/cgroup/* ]] || continue
    rmdir "$cg" 2>/dev/null || log "could not remove cgroup $cg (processes left: $(wc -l < "$cg/cgroup.procs" 2>/dev/null))"
    rmdir "$(dirname "$cg")" 2>/dev/null || true
  done < "$RUN/cgroups"
  rm -f "$RUN/cgroups"
fi

# Dangling links into a stopped sandbox would break the machine's own Slurm clients.
for f in /etc/slurm/slurm.conf /etc/slurm/gres.conf /etc/slurm/slurmdbd.conf; do
  if [ -L "$f" ] && [[ $(readlink "$f") == "$LAB"/* ]]; then rm -f "$f"; fi
done
rm -f "$RUN/fingerprint"
log "stopped"
exit 0
