# Why a run's Ray processes died, kept past the teardown (issue 65). Rendered verbatim into the
# job script; two modes:
# - gather GCS DEATHS NODES_FILE ENDED [ENGINE_FILE]: before Ray stops, on the head, with
#   runtime.python: the workers Ray's own tables say died unintended (a signal, an exception, an
#   OOM kill) before the driver ended (ENDED, epoch s; 0: any time), a JSON line each in DEATHS,
#   first death first: node, pid, worker id, the actor's class (else "task"), Ray's exit type
#   and words. A vLLM engine that died (ENGINE_FILE, "NODE<TAB>LINE", the watchdog's) is no Ray
#   worker: its server actor on NODE is added last ("ENGINE_DIED"), for its log's sake only.
#   Each node then keeps those workers' own logs (the teardown's keep_last_words).
# - name DEATHS KEPT RUN_DIR: after that, any python: "EXIT_TYPE<TAB>LINE", the line naming the
#   first death with the words its kept log holds (KEPT/NODE/: a signal, an exception, known
#   words), where that log is (relative to RUN_DIR), and the deaths that followed it; nothing if
#   none died.
# Exits 0 whatever happens: it only adds words to a failure.
import json
import re
import sys
import time
from pathlib import Path

UNINTENDED = ("SYSTEM_ERROR", "USER_ERROR", "NODE_OUT_OF_MEMORY")


def gather(gcs, deaths_file, nodes_file, ended, engine_file=None):
    import socket

    host, port = gcs.rsplit(":", 1)
    try:  # a GCS that is gone would have Ray's client retry for a minute: ask only one that answers
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError:
        return
    from ray._raylet import GcsClientOptions, GlobalStateAccessor
    from ray.core.generated import common_pb2, gcs_pb2

    hosts = {}
    with open(nodes_file) as f:
        for line in f:
            host, _, ip = line.partition(" ")
            if ip.strip():
                hosts[ip.split()[0]] = host
    accessor = GlobalStateAccessor(GcsClientOptions.create(gcs, None, allow_cluster_id_nil=True,
                                                           fetch_cluster_id_if_nil=False))
    if not accessor.connect():
        return
    actors, servers = {}, []  # worker id -> the actor's class; vLLM's servers (node, pid, worker id)
    for raw in accessor.get_actor_table(None, None):
        a = gcs_pb2.ActorTableData.FromString(raw)
        actors[a.address.worker_id.hex()] = a.class_name.rsplit(".", 1)[-1]
        if actors[a.address.worker_id.hex()] == "vLLMHttpServer" and a.pid:
            servers.append((hosts.get(a.address.ip_address, a.address.ip_address), a.pid, a.address.worker_id.hex()))
    rows = []
    for raw in accessor.get_worker_table():
        w = gcs_pb2.WorkerTableData.FromString(raw)
        kind = common_pb2.WorkerExitType.Name(w.exit_type) if w.HasField("exit_type") else ""
        end = w.end_time_ms / 1000 if w.end_time_ms else time.time()
        if w.is_alive or w.worker_type != common_pb2.WORKER or kind not in UNINTENDED or (ended and end > ended + 1):
            continue
        wid = w.worker_address.worker_id.hex()
        ip = w.worker_address.ip_address
        rows.append({"node": hosts.get(ip, ip), "pid": w.pid, "worker_id": wid, "what": actors.get(wid, "task"),
                     "exit_type": kind, "detail": " ".join(w.exit_detail.split())[:600], "end": round(end, 3)})
    rows.sort(key=lambda r: r["end"])
    engine = Path(engine_file).read_text().split("\t", 1) if engine_file and Path(engine_file).is_file() else []
    if len(engine) == 2:
        rows += [{"node": node, "pid": pid, "worker_id": wid, "what": "vLLMHttpServer", "exit_type": "ENGINE_DIED",
                  "detail": " ".join(engine[1].split())[:600], "end": round(time.time(), 3)}
                 for node, pid, wid in servers if node == engine[0]]
    with open(deaths_file, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


# What a log's last words say ended the process, most telling first.
SIGNAL = re.compile(r"\*\*\* (SIG[A-Z]+) received|Fatal Python error: (Segmentation fault|Aborted|Bus error|"
                    r"Floating point exception|Illegal instruction)")
SIGNALS = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
           "Floating point exception": "SIGFPE", "Illegal instruction": "SIGILL"}
EXCEPTION = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*\.)*[A-Za-z_][A-Za-z0-9_]*(?:Error|Exception|Exit|Interrupt)"
                       r"(?:: .*)?$")
THREAD = re.compile(r"^Exception in thread ([^:]+?)(?: \([^)]*\))?:$")
KNOWN = re.compile(r"(NCCL[^\n]{0,40}(?:timeout|timed out|error)[^\n]*|Watchdog caught collective operation "
                   r"timeout[^\n]*|[Gg]loo[^\n]{0,40}(?:timed out|[Tt]imeout)[^\n]*|CUDA error: [^\n]*|"
                   r"CUDA out of memory[^\n]*|NVRM: Xid[^\n]*|[Oo]ut of memory[^\n]*|MemoryError[^\n]*)")
FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)')
STDLIB = re.compile(r"/lib/python3\.\d+/(?!site-packages/|dist-packages/)")


def words(text: str) -> str:
    """What the end of a worker's log says killed it, in its own words; "" if nothing."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    said = []
    for i, ln in enumerate(lines):
        m = SIGNAL.search(ln)
        if m:
            sig = m.group(1) or SIGNALS[m.group(2)]
            fatal = next((x.strip() for x in lines[i:i + 20] if x.startswith("Fatal Python error: ")), None)
            # faulthandler's stack, most recent call first: the first frame of the process's own
            # code (not Python's library), where it called into what crashed
            frames = [f for f in (FRAME.match(x) for x in lines[i:i + 60]) if f]
            own = [f for f in frames if not STDLIB.search(f.group(1))] or frames
            where = f" in {own[0].group(3)} ({Path(own[0].group(1)).name}:{own[0].group(2)})" if own else ""
            said = [f"{sig}{f' ({fatal})' if fatal else ''}{where}"]
            break
    if not said:
        thread = None
        for ln in lines:
            t = THREAD.match(ln.strip())
            if t:
                thread = t.group(1)
            elif EXCEPTION.match(ln.strip()):
                said = [f"{ln.strip()}" + (f" (in thread {thread})" if thread else "")]
    known = KNOWN.findall(text)
    if known and not any(known[-1] in s for s in said):
        said.append(known[-1].strip())
    return "; ".join(said)[:400]


def name(deaths_file, kept_dir, run_dir):
    try:
        rows = [json.loads(x) for x in Path(deaths_file).read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return
    rows = [r for r in rows if r["exit_type"] != "ENGINE_DIED"]  # (named by the driver's phase already)
    if not rows:
        return
    first, rest = rows[0], rows[1:]
    what = f"Ray actor {first['what']}" if first["what"] != "task" else "a Ray task's worker"
    kept = sorted((Path(kept_dir) / first["node"]).glob(f"*-{first['pid']}.*"),
                  key=lambda p: (p.suffix != ".err", str(p)))
    said = ""
    for log in kept:
        said = words(log.read_text(errors="replace"))
        if said:
            break
    if not said:
        if first["exit_type"] == "NODE_OUT_OF_MEMORY":
            said = f"killed for the node's memory (Ray's memory monitor): {first['detail'][:300]}"
        else:
            said = ("no last words in its log: killed from outside, as by SIGKILL (the kernel's OOM killer, "
                    f"`kill -9`) (Ray: {first['exit_type']})")
    line = f"{what} on {first['node']} (pid {first['pid']}) died first: {said}"
    if kept:
        line += f"; its log: {kept[0].relative_to(run_dir)}"
    if rest:
        line += f"; then {len(rest)} more died after it (" + ", ".join(
            f"{r['what']} on {r['node']}" for r in rest[:3]) + (", ..." if len(rest) > 3 else "") + ")"
    print(f"{first['exit_type']}\t{' '.join(line.split())}")


if __name__ == "__main__":
    try:
        if sys.argv[1] == "gather":
            gather(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5] or 0), *sys.argv[6:7])
        elif sys.argv[1] == "name":
            name(sys.argv[2], sys.argv[3], sys.argv[4])
    except Exception as e:  # noqa: BLE001 - words added to a failure must never fail the teardown
        print(f"[verl-launch] last words: {type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(0)
