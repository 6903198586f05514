# Beside the driver, on the head node: what the run's Ray work is doing, read from this job's
# own GCS (no dashboard, and no driver job of its own). Rendered verbatim into the job script.
# - STATE_FILE (JSON): nodes, actors and placement groups, and verl's training step, rewritten when
#   they change, and once more when stopped (TERM at teardown: the driver's last steps);
# - a line on stdout when the one-line summary changes (`submit --wait` shows it too);
# - a verdict, when the driver waits on something that will never come: one line in
#   VERDICT_FILE, "PHASE<TAB>NODE<TAB>WHY" (NODE "-": no node to blame), then exit 4:
#   - hang: Ray work waits for resources the cluster cannot give: at once if no node could
#     ever hold it, else after PENDING_TIMEOUT seconds of waiting (0: never; verl waits
#     forever, silently, for a placement group or actor that does not fit);
#   - driver-error: a vLLM engine died (vLLM's own lines in the driver log), or an actor of the
#     job died (Ray's actor table: its process died, or ran out of memory), and the driver is
#     still running GRACE s later (cluster.death_grace; verl's trainer waits on a dead engine for ever);
#   - hang: no new training step for STALL_TIMEOUT ("auto": 10 x the slowest step seen, at
#     least 1800 s; "off"), counted from the first step, so a slow start is never a stall.
# - a line in LOST_FILE ("node reason") for each of the job's nodes Ray marks dead;
# - "NODE<TAB>LINE" in ENGINE_FILE once a vLLM engine's death is seen (and at TERM: the driver
#   may fail of it before a verdict is due), so that the job's phase names the engine.
# Exits 0 if this Ray has no such API: the job then runs on without the watchdog.
# argv: GCS_ADDRESS STATE_FILE VERDICT_FILE NODES_FILE DRIVER_LOG PENDING_TIMEOUT LOST_FILE
#       STALL_TIMEOUT ENGINE_FILE STEPS_FILE [GRACE_S] [POLL_S]
import json
import os
import re
import signal
import sys
import time
from collections import Counter

gcs, state_file, reason_file, nodes_file, driver_log = sys.argv[1:6]
pending_timeout, lost_file, stall_timeout, engine_file = float(sys.argv[6]), *sys.argv[7:10]
steps_file = sys.argv[10] if len(sys.argv) > 10 else None  # when each step was first seen (`report`)
EVIDENCE_GRACE = float(sys.argv[11]) if len(sys.argv) > 11 else 20.0  # s: a driver failing of a death says better why
poll = float(sys.argv[12]) if len(sys.argv) > 12 else 2.0
STALL_FLOOR, STALL_STEPS = 1800, 10  # "auto" (launcher/checks/fields.py says the same to users)
hosts = {}
with open(nodes_file) as f:
    for line in f:
        if len(line.split()) >= 2:
            host, ip = line.split()[:2]
            hosts[ip] = host

try:  # Ray's own GCS client and protos: what `ray status` reads, without a driver
    from ray._raylet import GcsClient, GcsClientOptions, GlobalStateAccessor
    from ray.core.generated import common_pb2, gcs_pb2

    A, PG, PGS = gcs_pb2.ActorTableData, gcs_pb2.PlacementGroupTableData, gcs_pb2.PlacementGroupStats
    client = GcsClient(address=gcs)
    accessor = GlobalStateAccessor(GcsClientOptions.create(gcs, None, allow_cluster_id_nil=True,
                                                           fetch_cluster_id_if_nil=False))
    if not accessor.connect():
        raise RuntimeError(f"cannot connect to {gcs}")
except Exception as e:  # noqa: BLE001  (another Ray: run without the watchdog, and say so)
    print(f"[verl-launch] the Ray watchdog is off: {type(e).__name__}: {e}", flush=True)
    sys.exit(0)


def say(msg):
    print(f"[verl-launch {time.strftime('%F %T')}] {msg}", flush=True)


def res(d):
    return {k: round(v, 3) for k, v in sorted(d.items()) if not k.startswith(("node:", "bundle_group"))
            and "_group_" not in k and k != "memory" and k != "object_store_memory"}


def fmt(d):
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in d.items()) + "}"


dead = {}  # node id -> (host, why): the job's nodes Ray has marked dead


def snapshot():
    nodes = {}
    usage = client.get_all_resource_usage(timeout=10).resource_usage_data
    # Lease requests the raylets queue for want of resources, by shape: what waits, not what starts.
    queued = [res(d.shape) for d in usage.resource_load_by_shape.resource_demands
              if d.num_ready_requests_queued or d.num_infeasible_requests_queued]
    table = client.get_all_node_info(timeout=10)
    # A dead node whose address has a live one is a worker whose first `ray start` failed and
    # was started again before the job was ready (cluster.ray_start_retries), not a lost node.
    alive = {n.node_manager_address for n in table.values() if n.state == gcs_pb2.GcsNodeInfo.ALIVE}
    for nid, n in table.items():
        if n.state != gcs_pb2.GcsNodeInfo.ALIVE and n.node_manager_address in hosts \
                and n.node_manager_address not in alive and nid.hex() not in dead:
            info = getattr(n, "death_info", None)  # (what Ray says of the death, where it says it)
            why = " ".join(str(getattr(info, "reason_message", "") or "marked dead by Ray").split())
            dead[nid.hex()] = (hosts[n.node_manager_address], why[:300])
            with open(lost_file, "a") as f:
                f.write(f"{hosts[n.node_manager_address]} {why[:300]}\n")
        if n.state == gcs_pb2.GcsNodeInfo.ALIVE:
            ip = n.node_manager_address
            nodes[nid.hex()] = {"ip": ip, "host": hosts.get(ip, ip), "total": res(n.resources_total), "free": {}}
    for r in usage.batch:
        if r.node_id.hex() in nodes:  # a resource with nothing free is left out: 0
            n = nodes[r.node_id.hex()]
            n["free"] = {k: res(r.resources_available).get(k, 0) for k in n["total"]}
    actors = []
    for raw in accessor.get_actor_table(None, None):
        a = A.FromString(raw)
        node = nodes.get(a.node_id.hex(), {})
        death = reason = None
        if a.HasField("death_cause"):
            which = a.death_cause.WhichOneof("context") or ""
            ctx = getattr(a.death_cause, which, None)
            text = getattr(ctx, "error_message", "") or getattr(ctx, "formatted_exception_string", "")
            death = " ".join(str(text).split())[:300] or which
            # why, in Ray's words: WORKER_DIED (its process died), RAY_KILL, OUT_OF_SCOPE, ...
            reason = "OUT_OF_MEMORY" if which == "oom_context" else \
                common_pb2.ActorDiedErrorContext.Reason.Name(ctx.reason) if which == "actor_died_error_context" \
                else which.replace("_context", "").upper()
        actors.append({"id": a.actor_id.hex(), "class": a.class_name.rsplit(".", 1)[-1],  # not f.<locals>.Cls
                       "state": A.ActorState.Name(a.state),
                       "host": node.get("host") or hosts.get(a.address.ip_address), "pid": a.pid,
                       "needs": res(a.required_resources),
                       "in_pg": bool(a.placement_group_id.strip(b"\0")), "death": death, "reason": reason})
    pgs = []
    for raw in accessor.get_placement_group_table():
        p = PG.FromString(raw)
        pgs.append({"id": p.placement_group_id.hex(), "name": p.name, "state": PG.PlacementGroupState.Name(p.state),
                    "scheduling": PGS.SchedulingState.Name(p.stats.scheduling_state),
                    "strategy": common_pb2.PlacementStrategy.Name(p.strategy),
                    "bundles": [res(b.unit_resources) for b in p.bundles],
                    "hosts": [nodes.get(b.node_id.hex(), {}).get("host") for b in p.bundles]})
    return list(nodes.values()), actors, pgs, queued


total_steps, head_read = None, 0


def training():
    """(step, total, seconds per step, resumed from) from the driver log: the last `step:N`
    verl's console logger printed and its `timing_s/step` (the mean of the last five), the
    `Total training steps: N` verl's trainer prints at its start (looked for in the log's first
    MiB), and the checkpoint step it said it resumed from (Evidence, polled before)."""
    global total_steps, head_read
    try:
        size = os.path.getsize(driver_log)
        with open(driver_log, "rb") as f:
            if total_steps is None and head_read < min(size, 1 << 20):
                head = f.read(1 << 20)
                head_read = len(head)
                found = re.findall(rb"Total training steps: (\d+)", head)
                total_steps = int(found[-1]) if found else None
            f.seek(max(0, size - 65536))
            # "step:N - key:value - ...", not "timing_s/step:2.4" (Ray may split a long line there)
            lines = re.findall(rb"(?<![\w/])step:(\d+) - ([^\n]*)", f.read())
    except OSError:
        return None, total_steps, None, evidence.resumed
    if not lines:
        return None, total_steps, None, evidence.resumed
    times = [float(t) for _, rest in lines[-5:] for t in re.findall(rb"timing_s/step:([0-9.eE+-]+)", rest)]
    return int(lines[-1][0]), total_steps, (sum(times) / len(times) if times else None), evidence.resumed


def progress(step, total, per_step, resumed=None):
    """"training step 3/120, 12.3 s/step, ETA 0:24:36" (what is known of it), and "resumed from
    step 2" after a restart."""
    if step is None:
        return f"resumed from step {resumed}, not yet stepped" if resumed is not None else ""
    text = f"training step {step}" + (f"/{total}" if total else "")
    if per_step:
        text += f", {per_step:.1f} s/step"
        if total and total > step:
            eta = int((total - step) * per_step)
            text += f", ETA {eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}"
    return text + (f" (resumed from step {resumed})" if resumed is not None else "")


def summary(actors, pgs, train):
    alive = Counter(a["class"] for a in actors if a["state"] == "ALIVE")
    where = {c: sorted({a["host"] for a in actors if a["class"] == c and a["state"] == "ALIVE"}) for c in alive}
    waiting = sum(a["state"] in ("PENDING_CREATION", "RESTARTING") for a in actors)
    text = f"ray: {sum(alive.values())} actors alive"
    if alive:
        text += " (" + "; ".join(f"{c} x{n} on {','.join(where[c])}" for c, n in alive.most_common()) + ")"
    text += f", {waiting} starting" if waiting else ""
    pending = sum(p["state"] in ("PENDING", "RESCHEDULING") for p in pgs)
    if pgs:
        text += f"; placement groups {len(pgs) - pending} placed, {pending} waiting"
    done = progress(*train)
    return text + (f"; {done}" if done else "")


def fits(need, node, key="total"):
    return all(node[key].get(k, 0) >= v for k, v in need.items())


def short_of(need, nodes):
    """The resources no node has enough of (free now), and the recipe field that gives them."""
    best = {k: max((n["free"].get(k, 0) for n in nodes), default=0) for k in need}
    short = [k for k, v in need.items() if best[k] < v]
    fields = {"CPU": "cluster.cpus_per_task", "GPU": "cluster.gpus_per_node (or cluster.nodes)"}
    return short, [fields.get(k, f"the Ray resource {k}") for k in short]


def verdict(what, need, nodes, actors, waited, never):
    short, fields = short_of(need, nodes)
    held = Counter((a["class"], a["host"]) for a in actors if a["state"] == "ALIVE" and not a["in_pg"]
                   and a["needs"].get("CPU"))
    free = "; ".join(f"{n['host']} " + ", ".join(f"{k} {n['free'].get(k, 0):g}/{n['total'].get(k, 0):g}"
                                                 for k in sorted(need)) for n in nodes)
    why = "no node has that much in all" if never else \
        f"waiting {waited:.0f} s with nothing else starting (cluster.pending_timeout)"
    text = (f"{what} needs {fmt(need)} on one node and cannot be placed ({why}); free now: {free}")
    if held:
        text += "; held by actors: " + ", ".join(f"{c} x{n} on {h}" for (c, h), n in sorted(held.items()))
    if fields:
        text += f"; raise {' and '.join(fields)}"
    return text


ANSI = re.compile(r"\x1b\[[0-9;]*m")
PREFIX = re.compile(r"^\((\w+)[^)]*?(?:ip=([0-9a-fA-F.:]+))?\) ")  # "(vLLMHttpServer pid=9, ip=10.0.0.2) "
LEVEL = re.compile(r"^(\(\w+ pid=\d+\) )?(DEBUG|INFO|WARNING|ERROR|CRITICAL) [0-9-]+ [0-9:]+ \[[^]]*\] ")  # vLLM's
# vLLM's own words when an engine process dies, said in the process that ran it (which node);
# EngineDeadError is also raised in its callers (another node), so it names a node only if
# nothing better does.
ENGINE_DIED = re.compile(r"engine core exited unexpectedly|EngineCore encountered a fatal error"
                         r"|Engine core proc \S+ died unexpectedly")
ENGINE_DEAD = re.compile(r"EngineDeadError")
ERROR = re.compile(r"^(\w+\.)*\w*(Error|Exception)\b[:(]|died unexpectedly|exited unexpectedly")
HARDWARE = re.compile(r"uncorrectable ECC|ECC error|\bXid\b|fallen off the bus|GPU is lost|NVML_ERROR", re.I)
RESUMED = re.compile(r"global_step_(\d+)\s*$")
HEAD = hosts.get(gcs.rsplit(":", 1)[0])  # Ray's prefix has no ip= for the driver's own node


class Evidence:
    """The driver log as it grows: the first vLLM engine death (when, which node, vLLM's line),
    the last error lines, a node named in a GPU hardware error, the step verl resumed from."""

    def __init__(self):
        self.offset, self.rest, self.errors = 0, b"", []
        self.engine = self.engine_weak = self.hardware = self.told = self.resumed = None

    def poll(self):
        try:
            with open(driver_log, "rb") as f:
                f.seek(self.offset)
                chunk = f.read(4 << 20)
        except OSError:
            return
        self.offset += len(chunk)
        lines = (self.rest + chunk).split(b"\n")
        self.rest = lines.pop()[-65536:]
        for raw in lines:
            line = ANSI.sub("", raw.decode(errors="replace")).rstrip("\r")
            m = PREFIX.match(line)
            text = line[m.end() if m else 0:].strip()
            if text.startswith("Resuming from ") and RESUMED.search(text):  # verl's trainer (its TaskRunner)
                self.resumed = int(RESUMED.search(text).group(1))
            said = LEVEL.sub("", " ".join(text.split()))[:300]
            if not (ERROR.search(said) or ENGINE_DEAD.search(said) or HARDWARE.search(said)):
                continue
            node = (hosts.get(m.group(2), m.group(2)) if m.group(2) else HEAD) if m else None
            if ERROR.search(said) and said not in self.errors:
                self.errors = (self.errors + [said])[-3:]
            if ENGINE_DIED.search(said) and m and self.engine is None:
                self.engine = (node, said, time.monotonic())
            elif ENGINE_DEAD.search(said) and self.engine_weak is None:
                self.engine_weak = (node if m else None, said, time.monotonic())
            if HARDWARE.search(said) and node in hosts.values():  # a job node, to exclude by name
                self.hardware = node

    def engine_died(self):
        """(node, vLLM's line, when first seen) of a dead engine, or None; also in ENGINE_FILE."""
        first, best = self.engine_weak or self.engine, self.engine or self.engine_weak
        if best is None:
            return None
        if self.told != best[:2]:
            with open(engine_file, "w") as f:
                f.write(f"{best[0] or 'a node'}\t{best[1]}\n")
            self.told = best[:2]
        return best[0], best[1], min(first[2], best[2])

    def last_errors(self):
        return " | ".join(self.errors) or "none"


def write_state(state):
    tmp = state_file + ".tmp"
    with open(tmp, "w") as f:
        json.dump(dict(state, time=time.time()), f, indent=1)
    os.replace(tmp, state_file)


def judge(phase, node, why):
    """The verdict: written for the job script (which ends the driver), said, and exit."""
    why = " ".join(why.split())
    with open(reason_file, "w") as f:
        f.write(f"{phase}\t{node or '-'}\t{why}\n")
    say(f"ERROR: {why.split('; the driver')[0]}")  # (its log lines are in the output already)
    sys.exit(4)


def stall_limit(slowest):
    """Seconds without a step that make a stall (None: off)."""
    if stall_timeout == "off":
        return None
    if stall_timeout == "auto":
        return max(STALL_FLOOR, STALL_STEPS * slowest)
    return float(stall_timeout)


def note_step(step):
    """One line in the steps file: the step and when it was first seen (within a poll)."""
    if steps_file:
        try:
            with open(steps_file, "a") as f:
                f.write(json.dumps({"step": step, "time": round(time.time(), 3)}) + "\n")
        except OSError:
            pass


def last_look(*_):
    """Stopped at teardown: the driver may have logged its last steps, or an engine's death,
    since the last poll."""
    evidence.poll()
    evidence.engine_died()
    if last_state is not None:
        train = training()
        if train[0] != last_state["step"]:
            if train[0] is not None:
                note_step(train[0])
            write_state(dict(last_state, step=train[0], total_steps=train[1], seconds_per_step=train[2],
                             resumed_from=train[3], training=progress(*train)))
    sys.exit(0)


last_summary = last_state = None
evidence = Evidence()
signal.signal(signal.SIGTERM, last_look)
# Waiting is judged only while nothing moves: an actor that becomes alive, a placement group
# placed or a training step restarts the clock (Ray starts a node's actors one by one on a
# busy machine), and each item's clock starts when it is first seen waiting.
never_polls = Counter()
first_seen = {}
moved_at = time.monotonic()
last_moves = None
failures = 0
died_at = {}  # actor id -> when first seen dead of an unexpected cause
step_at = step_seen = None  # the last training step and when it was first seen
slowest = 0.0  # the longest time seen between two steps
while True:
    try:
        nodes, actors, pgs, queued = snapshot()
        failures = 0
    except Exception as e:  # noqa: BLE001  (a busy GCS times out now and then: try again)
        failures += 1
        if failures == 1:
            say(f"ray watchdog: GCS did not answer ({type(e).__name__}: {str(e)[:200]}); trying again")
        if failures >= 30:  # a minute of errors: this Ray is not what the watchdog reads
            say(f"the Ray watchdog is off: {type(e).__name__}: {str(e)[:200]}")
            sys.exit(0)
        time.sleep(poll)
        continue
    now = time.monotonic()
    evidence.poll()
    train = training()
    step = train[0]
    if step is not None and step != step_seen:
        slowest = max(slowest, now - step_at) if step_at is not None else slowest
        step_at, step_seen = now, step
        note_step(step)
    text = summary(actors, pgs, train)
    state = {"summary": text, "step": step, "total_steps": train[1], "seconds_per_step": train[2],
             "resumed_from": train[3],
             "training": progress(*train), "nodes": nodes, "actors": actors, "placement_groups": pgs}
    if state != last_state:
        write_state(state)
        last_state = state
    if text != last_summary:
        say(text)
        last_summary = text
    moves = (sorted((a["id"], a["state"]) for a in actors), sorted((p["id"], p["state"]) for p in pgs), step)
    if moves != last_moves:
        moved_at, last_moves = now, moves
    waiting = []  # (id, what, what it needs on one node, can it never fit)
    for p in pgs:
        if p["state"] in ("PENDING", "RESCHEDULING"):
            # STRICT_PACK: all bundles on one node; otherwise each bundle on some node.
            if p["strategy"] == "STRICT_PACK":
                need = dict(sum((Counter(b) for b in p["bundles"]), Counter()))
            else:
                need = {k: max(b.get(k, 0) for b in p["bundles"]) for k in set().union(*p["bundles"])}
            never = p["scheduling"] == "INFEASIBLE" or not all(any(fits(b, n) for n in nodes) for b in p["bundles"]) \
                or (p["strategy"] == "STRICT_PACK" and not any(fits(need, n) for n in nodes))
            waiting.append((p["id"], f"placement group {p['name'] or p['id'][:8]} ({len(p['bundles'])} bundle(s) "
                                     f"{fmt(p['bundles'][0]) if p['bundles'] else '{}'}, {p['strategy']})", need, never))
    # Actors waiting for resources (a lease of their shape queued), not starting up. One in a
    # placement group waits on the group; one that asks for nothing is placed even on a full node.
    for a in actors:
        if a["state"] == "PENDING_CREATION" and not a["in_pg"] and a["needs"]:
            never = not any(fits(a["needs"], n) for n in nodes)
            if never or a["needs"] in queued:
                waiting.append((a["id"], f"actor {a['class']}", a["needs"], never))
    ids = {w[0] for w in waiting}
    never_polls = Counter({k: n for k, n in never_polls.items() if k in ids})
    first_seen = {k: t for k, t in first_seen.items() if k in ids}
    for wid, what, need, never in waiting:
        never_polls[wid] = never_polls[wid] + 1 if never else 0
        waited = now - max(moved_at, first_seen.setdefault(wid, now))
        if never_polls[wid] >= 2 or (pending_timeout and waited >= pending_timeout):
            if pending_timeout:
                judge("hang", None, verdict(what, need, nodes, actors, waited, never_polls[wid] >= 2))
    # What the driver waits on has died: a vLLM engine (its own words in the log), or an actor
    # (Ray's table). The driver gets EVIDENCE_GRACE s to fail of it on its own.
    engine = evidence.engine_died()
    if engine and now - engine[2] >= EVIDENCE_GRACE:
        node, said, _ = engine
        judge("driver-error", evidence.hardware, f"vLLM EngineCore on {node or 'a node'} died ({said}); "
                                                f"the driver's last errors: {evidence.last_errors()}")
    for a in actors:
        # (an actor that ended itself, exit_actor(), is WORKER_DIED too: "exit type: INTENDED_...")
        if a["state"] == "DEAD" and a["reason"] in ("WORKER_DIED", "OUT_OF_MEMORY") \
                and "INTENDED_" not in (a["death"] or ""):
            if now - died_at.setdefault(a["id"], now) >= EVIDENCE_GRACE:
                judge("driver-error", evidence.hardware,
                      f"Ray actor {a['class']} on {a['host'] or 'a node'} died ({a['reason']}: {a['death']}); "
                      f"the driver's last errors: {evidence.last_errors()}")
    limit = stall_limit(slowest) if step_at is not None else None
    if limit and now - step_at >= limit:
        how = f"{STALL_STEPS} x the slowest step, {slowest:.0f} s, at least {STALL_FLOOR} s" \
            if stall_timeout == "auto" else f"{limit:g} s"
        judge("hang", evidence.hardware, f"no training step for {now - step_at:.0f} s after step {step_seen} "
                                         f"(cluster.stall_timeout={stall_timeout}: {how}); "
                                         f"the driver's last errors: {evidence.last_errors()}")
    time.sleep(poll)
