"""Where a machine's CPU goes while something runs: every process's CPU time, read from /proc
every half second until stopped (TERM or Ctrl-C), then printed by command and by process.

On this project's 2-core machines a training job is CPU-bound, mostly in processes importing
torch, vLLM and verl; this is how that was found (docs/testing.md, "Figures"). Usage:

    python bench/cpu_by_process.py > cpu.txt &      # then run the job or the test
    kill %1                                         # when it has ended: the report is written

A process's CPU time is counted from when it was first seen (what it used before is left out),
up to the last time it was seen (a process that lived less than half a second may be missed).
"""

from __future__ import annotations

import collections
import os
import signal
import time

TICK = os.sysconf("SC_CLK_TCK")
stop = False


def _stop(*_):
    global stop
    stop = True


def _sample(pid: str):
    with open(f"/proc/{pid}/stat") as f:
        st = f.read()
    fields = st[st.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def _command(pid: str) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    me, t0 = str(os.getpid()), time.time()
    base, seen = {}, {}  # pid -> CPU at first sight; pid -> (command, CPU since, seconds after start)
    first = True
    while not stop:
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid == me:
                continue
            try:
                cpu = _sample(pid)
                if first:
                    base[pid] = cpu
                cmd = seen[pid][0] if pid in seen else _command(pid)
                since = seen[pid][2] if pid in seen else time.time() - t0
                seen[pid] = (cmd, cpu - base.get(pid, 0.0), since)
            except (OSError, ValueError, IndexError):
                pass  # gone meanwhile
        first = False
        time.sleep(0.5)
    total = sum(v[1] for v in seen.values())
    print(f"total {total:.0f} CPU-s over {time.time() - t0:.0f} s")
    by_cmd = collections.Counter()
    for cmd, cpu, _ in seen.values():
        words = cmd.split()
        by_cmd[" ".join(words[:3])[-100:] if words else "?"] += cpu
    print("--- by command (first 3 words)")
    for k, v in by_cmd.most_common(30):
        print(f"{v:8.1f}  {k}")
    print("--- by process (CPU-s, first seen at +s)")
    for pid, (cmd, cpu, since) in sorted(seen.items(), key=lambda kv: -kv[1][1])[:40]:
        print(f"{cpu:8.1f}  +{since:5.0f}s {pid:>7}  {cmd[:150]}")


if __name__ == "__main__":
    main()
