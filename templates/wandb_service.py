# wandb's service for this node's Ray processes, owned by the job rather than by Ray.
# Started on every node before `ray start`: its token (WANDB_SERVICE), in Ray's environment,
# makes every wandb run on the node (verl's trainer's) use this wandb-core instead of one of
# its own. Ray ends the trainer's actor with SIGTERM, which skips wandb's exit hook: a run's
# own wandb-core would stop with the run unfinished and its last step never sent. This one is
# the job's: on USR1 (the teardown's step, once the driver has ended) it finishes every run
# still open with the job's exit code (read from EXIT_FILE) and waits until wandb-core has sent
# everything; then Ray is stopped. Bounded: it never holds the job's end past TIMEOUT.
# argv: TOKEN_FILE EXIT_FILE TIMEOUT (seconds for the finish). Never prints the key.
import os
import signal
import sys
import threading
import time

token_file, exit_file, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
node = os.environ.get("SLURMD_NODENAME", "this node")
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # kept for sigwait below, however early it comes
try:  # if the step's shell that started it dies, this ends too (as if Slurm's TERM): never left behind
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass


def say(text):
    print(f"[verl-launch {time.strftime('%F %T')}] wandb on {node}: {text}", flush=True)


def bounded(seconds, what):  # a wandb call that must not hang the job's end: exit after SECONDS
    done = threading.Event()

    def watch():
        if not done.wait(seconds):
            say(f"{what} took over {seconds:.0f} s: stopped (what was not sent is lost)")
            os._exit(1)
    threading.Thread(target=watch, daemon=True).start()
    return done


import wandb  # noqa: E402

started = bounded(60, "starting wandb-core")
wandb.setup()  # starts wandb-core and sets WANDB_SERVICE; TERM (Slurm's) still ends this at once
started.set()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # from now on, sigwait's
token = os.environ.get("WANDB_SERVICE")
if not token:
    say("wandb.setup() gave no WANDB_SERVICE: runs on this node use their own wandb-core")
    sys.exit(1)
with open(token_file + ".tmp", "w") as f:
    f.write(token)
os.replace(token_file + ".tmp", token_file)

sig = signal.sigwait({signal.SIGUSR1, signal.SIGTERM, signal.SIGINT})
try:
    with open(exit_file) as f:
        code = int(f.read().strip())
except (OSError, ValueError):
    code = 1 if sig == signal.SIGUSR1 else 128 + sig  # no word from the job: it did not end well
t0 = time.monotonic()
finished = bounded(timeout, "sending what is left")
try:
    wandb.teardown(exit_code=code)  # finishes every open run and waits for wandb-core
except BaseException as e:  # noqa: BLE001  (wandb-core gone: Slurm's TERM reached it too)
    say(f"could not finish: {type(e).__name__}: {e}")
    sys.exit(1)
finished.set()
say(f"finished its runs with exit code {code} in {time.monotonic() - t0:.1f} s")
