# Weave's sender for this node's Ray processes, owned by the job rather than by Ray.
# Ray kills verl's agent-loop workers (SIGKILL) the moment verl's driver ends, and their Weave
# client sends only once a second: what it had not sent was lost, the last step's traces first.
# So the job has Weave write every trace record to its write-ahead log on this node's disk
# (WEAVE_ENABLE_WAL, with each process's own sender off: WEAVE_DISABLE_WAL_SENDER, set by
# ray_step once this is ready) and this process sends them, every second, with Weave's own WAL
# sender. A record is on disk as soon as the call is; a killed worker loses none. On USR1 (the
# teardown's step once the driver has ended, or the Ray step's end) it sends what is left and ends.
# argv: READY_FILE TIMEOUT (seconds for the last send). The key comes from the environment and is
# never printed. Exit 3: this weave has no write-ahead log (the job then leaves Weave as it is).
import fcntl
import glob
import os
import signal
import sys
import threading
import time

ready_file, timeout = sys.argv[1], float(sys.argv[2])
node = os.environ.get("SLURMD_NODENAME", "this node")
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGTERM, signal.SIGINT})  # for sigtimedwait
try:  # if the step's shell that started it dies, this ends too: never left behind
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass


def say(text):
    print(f"[verl-launch {time.strftime('%F %T')}] weave on {node}: {text}", flush=True)


try:
    from weave.durability.wal_client_id import WAL_ROOT, compute_client_id
    from weave.durability.wal_sender import create_sender
    from weave.trace.env import weave_trace_server_url
    from weave.trace_server_bindings import call_batch_processor
    from weave.trace_server_bindings.remote_http_trace_server import RemoteHTTPTraceServer
except ImportError as e:
    say(f"this weave has no write-ahead log ({e}): traces are sent as Weave does by itself, and those "
        "not sent when Ray kills a worker are lost")
    sys.exit(3)

key = os.environ.get("WANDB_API_KEY", "")
if not key:
    say("no WANDB_API_KEY: nothing to send with")
    sys.exit(3)
# This key's logs of every entity and project on this node (Weave keeps one per key under HOME).
pattern = os.path.join(WAL_ROOT, "*", "*", compute_client_id(key))
server = RemoteHTTPTraceServer(weave_trace_server_url(), password=key, should_batch=True)
# Batched as Weave's own client batches: a call's start waits for its end, to go as one. At the
# end, a call a killed worker never ended would hold the last send for weave's 5 minutes: 2 s,
# then it goes as a start alone (Weave shows it unfinished, as it was).
call_batch_processor.FLUSH_TIMEOUT_SECONDS = min(getattr(call_batch_processor, "FLUSH_TIMEOUT_SECONDS", 2), 2)
senders = {}
sent = 0
with open(ready_file + ".tmp", "w") as f:
    f.write(pattern)
os.replace(ready_file + ".tmp", ready_file)


def send_all(wait: float) -> int:
    """One pass over every log: each under a lock (nodes sharing a home directory take turns;
    WAIT seconds at most for one that another node holds)."""
    n = 0
    for d in glob.glob(pattern):
        try:
            lock = open(os.path.join(d, ".verl-launch-sender.lock"), "a")
        except OSError:
            continue
        with lock:
            if not locked(lock, time.monotonic() + wait):
                continue
            if d not in senders:
                senders[d] = create_sender(d, server)
            n += senders[d].drain_once()
    return n


def locked(f, deadline: float) -> bool:
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


def bounded(seconds, what):  # a send that must not hold the job's end: exit after SECONDS
    done = threading.Event()

    def watch():
        if not done.wait(seconds):
            say(f"{what} took over {seconds:.0f} s: stopped (what was not sent stays in {os.path.dirname(pattern)})")
            os._exit(1)
    threading.Thread(target=watch, daemon=True).start()
    return done


while True:
    sig = signal.sigtimedwait({signal.SIGUSR1, signal.SIGTERM, signal.SIGINT}, 1.0)
    if sig is not None:
        break
    try:
        sent += send_all(0)
    except Exception as e:  # noqa: BLE001  (the server did not take it: the records stay, sent next time)
        say(f"sending failed, kept for the next try: {type(e).__name__}: {e}")

t0 = time.monotonic()
finished = bounded(timeout, "sending what is left")
last = send_all(timeout / 2)
server.call_processor.stop_accepting_new_work_and_flush_queue()  # sends the batch and waits
finished.set()
sent += last
say(f"sent {sent} trace records, the last {last} at the end in {time.monotonic() - t0:.1f} s")
