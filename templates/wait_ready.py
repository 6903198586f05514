# Wait until Ray reports every node and GPU of the allocation, with a deadline.
# Rendered verbatim into the job script (runs on the head node with the recipe's Python).
# argv: HEAD_ADDRESS NODES_FILE GPUS_PER_NODE TIMEOUT_S STEP_PID...
import glob
import os
import socket
import sys
import time

address, nodes_file = sys.argv[1], sys.argv[2]
gpus_per_node, timeout = float(sys.argv[3]), float(sys.argv[4])
step_pids = [int(p) for p in sys.argv[5:]]
expected = {}  # address -> hostname
with open(nodes_file) as f:
    for line in f:
        if len(line.split()) >= 2:
            host, ip = line.split()[:2]
            expected[ip] = host
want_gpus = gpus_per_node * len(expected)
deadline = time.monotonic() + timeout
log_dir = os.path.dirname(nodes_file)


def say(msg):
    print(f"[verl-launch {time.strftime('%F %T')}] {msg}", flush=True)


def dead_step():
    for pid in step_pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                    return pid
        except OSError:
            return pid
    return None


head_host = expected.get(address.rsplit(":", 1)[0])


def fail(why, missing):
    say(f"ERROR: Ray not ready: {why}")
    for host in sorted(missing):
        print(f"@missing {host} {why}", flush=True)
        say(f"node {host} did not join")
        pattern = "ray-head.r*.log" if host == head_host else f"ray-worker-{glob.escape(host)}.r*.log"
        logs = sorted(glob.glob(os.path.join(log_dir, pattern)), key=os.path.getmtime)
        if logs:
            with open(logs[-1], errors="replace") as f:
                for line in f.readlines()[-10:]:
                    print(f"    {host}| {line.rstrip()}", flush=True)
    sys.exit(3)


def check_deadline_and_steps(missing):
    pid = dead_step()
    if pid is not None:
        fail(f"a Ray srun step (pid {pid}) exited", missing)
    if time.monotonic() > deadline:
        fail(f"deadline of {timeout:.0f} s passed (cluster.ready_timeout)", missing)


def phase(name, detail=""):
    print(f"@phase {name} {detail}".rstrip(), flush=True)


host, port = address.rsplit(":", 1)
while True:  # the head's GCS port first: ray.init would block on a closed port
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        break
    except OSError:
        check_deadline_and_steps(set(expected.values()))
        time.sleep(0.2)

phase("head-up", address)
# Ray's GCS client reads the node table that ray.nodes() reads, without ray.init(): no driver
# to register, no workers for the raylet to start, on the head, while its own Ray is starting.
import ray  # noqa: E402  (only once the head answers)


def node_table():
    """{address: GPUs} of the alive nodes."""
    return {n.node_manager_address: n.resources_total.get("GPU", 0)
            for n in gcs.get_all_node_info(timeout=5).values() if n.state == n.ALIVE}


def node_table_via_driver():  # older Rays without GcsClient.get_all_node_info
    if not ray.is_initialized():
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    return {n["NodeManagerAddress"]: n["Resources"].get("GPU", 0) for n in ray.nodes() if n["Alive"]}


gcs = None
read = node_table
last = None
joined = False
while True:
    # Under load a first connection or a GCS call can time out: retry until the deadline.
    try:
        if read is node_table and gcs is None:
            try:
                gcs = ray._raylet.GcsClient(address=address)
            except AttributeError:
                read = node_table_via_driver
        try:
            alive = read()
        except AttributeError:  # a node record without these fields: ask as a driver
            read = node_table_via_driver
            alive = read()
    except Exception as e:  # noqa: BLE001  (any failure here is "not ready yet")
        say(f"Ray not answering yet ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
        gcs = None
        if ray.is_initialized():
            ray.shutdown()
        check_deadline_and_steps(set(expected.values()))
        time.sleep(1)
        continue
    gpus = sum(alive.values())
    missing = {h for ip, h in expected.items() if ip not in alive}
    status = f"Ray {len(expected) - len(missing)}/{len(expected)} nodes, {gpus:g}/{want_gpus:g} GPUs"
    if status != last:
        say(status)
        last = status
    if not missing and not joined:
        phase("workers-up", f"{len(expected)} nodes")
        joined = True
    if not missing and gpus >= want_gpus:
        if ray.is_initialized():
            ray.shutdown()
        phase("ready", f"{len(expected)} nodes, {gpus:g} GPUs")
        sys.exit(0)
    check_deadline_and_steps(missing)
    time.sleep(0.1)
