#!/usr/bin/env bash
# sandbox-env.sh - print `export SLURM_CONF=...` if the local Slurm sandbox (sandbox-up.sh)
# is up and healthy, else exit 1 with the reason on stderr.
# Cheap enough for every Makefile/pytest run: pid files, one `scontrol ping`, one `sinfo`.
#   eval "$(tests/cluster/sandbox-env.sh)" || echo "no sandbox"
set -uo pipefail
LAB=${SANDBOX_DIR:-/tmp/verl-launch-sandbox}
RUN=$LAB/run CONF=$LAB/etc/slurm.conf
no() { echo "sandbox-env: not up ($*); start it with tests/cluster/sandbox-up.sh" >&2; exit 1; }

alive() {  # alive PID COMM: running, not a zombie, and really that program (PIDs get reused)
  local pid=$1 comm=$2 st
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  st=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [ "$st" != Z ] && [ "$st" != X ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ]
}
pid_in() { cat "$1" 2>/dev/null; }

# sandbox-up.sh writes the fingerprint only once the cluster passed its checks.
fp=$(cat "$RUN/fingerprint" 2>/dev/null) || no "no $RUN/fingerprint"
nodes=0 acct=none
for kv in $fp; do
  case $kv in nodes=*) nodes=${kv#nodes=} ;; acct=*) acct=${kv#acct=} ;; esac
done

alive "$(pid_in "$RUN/slurmctld.pid")" slurmctld || no "slurmctld not running"
if [ "$acct" = dbd ]; then
  alive "$(pid_in "$RUN/slurmdbd.pid")" slurmdbd || no "slurmdbd not running"
fi
for ((i = 1; i <= nodes; i++)); do
  alive "$(pid_in "$RUN/slurmd-node$i.pid")" slurmd || no "slurmd node$i not running"
done

export SLURM_CONF=$CONF
timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP' || no "slurmctld does not answer"
# comp/mix/alloc are normal while tests run; anything else (down, drain, idle*) is not.
n_ok=$(timeout 10 sinfo -h -N -o '%N %t' 2>/dev/null | grep -E ' (idle|mix|alloc|comp)$' | sort -u | wc -l)
[ "$n_ok" -eq "$nodes" ] || no "only $n_ok of $nodes nodes usable: $(sinfo -h -N -o '%N=%t' 2>&1 | tr '\n' ' ')"

echo "export SLURM_CONF=$CONF"
