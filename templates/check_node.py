# The allocation check (phase inputs-check): what this node needs for the run, before Ray.
# Rendered verbatim into the job script; runs on every node in one srun step, stdlib only.
# argv: SPEC_JSON RUN_DIR TOKEN_NAME TOKEN, where SPEC is
#   {"inputs": [[key, path], ...], "checkpoints": dir or null, "gpus": n or null,
#    "gpu_var": "CUDA_VISIBLE_DEVICES", "gpu_tool": "nvidia-smi" or null, "min_free_gb": x,
#    "verl_version": "0.9.1" or null, "ray_auth": "2.52" (the oldest Ray with token auth) or null}
# The batch shell wrote TOKEN into TOKEN_NAME in the run dir and the checkpoint dir on the head
# node: a node that cannot read it there is not on the same storage. Prints one line per
# problem ("@problem node: field: path: what") and exits 1 if there is any; a check still
# blocked after TIME_LIMIT seconds (a hung mount) is a problem too.
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading

TIME_LIMIT = 60
spec, run_dir, token_name, token = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
problems = []
doing = ["starting"]  # what the check is at: named if it never returns


def problem(field, path, what):
    problems.append(f"{node}: {field}: {path}: {what}")


def readable(field, path):
    doing[:] = [field, path]
    p = os.path.expanduser(path)
    try:
        if os.path.isdir(p):
            os.listdir(p)
        else:
            with open(p, "rb") as f:
                f.read(1)
    except FileNotFoundError:
        problem(field, path, "not found on this node")
    except OSError as e:
        problem(field, path, f"not readable ({e.strerror})")


def shared(field, path):
    """Writable here, and the storage the head node wrote its token to."""
    doing[:] = [field, path]
    try:
        with open(os.path.join(path, token_name)) as f:
            seen = f.read().strip()
    except OSError:
        seen = None
    if seen != token:
        problem(field, path, "not the storage the head node writes to (its check file is not there): "
                             "node-local? every node must see the same directory")
        return
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".verl-launch-write-"):
            pass
    except OSError as e:
        problem(field, path, f"not writable ({e.strerror})")


def gpus():
    """(what Slurm gave this step: the vendor's variable, or None; what the vendor's tool lists
    here, or None). A GPU that fell off the bus is still in the first, not in the second."""
    ids = os.environ.get(spec["gpu_var"] or "")
    given = None if ids is None else len([x for x in ids.split(",") if x.strip()])
    listed = None
    tool = spec.get("gpu_tool") and shutil.which(spec["gpu_tool"])
    if tool:
        try:
            out = subprocess.run([tool, "-L"], capture_output=True, text=True, timeout=20).stdout
            # MIG: Slurm counts instances, the tool's "GPU" lines count boards: no comparison
            if "MIG " not in out:
                listed = sum(1 for line in out.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.SubprocessError):
            pass
    return given, listed


def check_gpus(want):
    doing[:] = ["cluster.gpus_per_node", spec.get("gpu_tool") or spec["gpu_var"]]
    given, listed = gpus()
    field, var, tool = "cluster.gpus_per_node", spec["gpu_var"], spec.get("gpu_tool") or "a GPU tool"
    if given is not None and given != want:
        problem(field, var, f"Slurm gave this step {given} GPU(s), expected {want}")
    elif given is not None and listed is not None and listed < given:
        problem(field, var, f"{listed} GPU(s) usable here ({tool} lists {listed}), Slurm gave {given}")
    elif given is None and listed is not None and listed < want:  # no gres: Ray uses the first N
        problem(field, tool, f"{listed} GPU(s) here, expected {want}")
    elif given is None and listed is None:
        problem(field, var, f"cannot count this node's GPUs: no {var} from Slurm, no {tool}")


def free_disk(ckpt):
    # (a directory missing here is the shared-storage check's to report; with that off, the
    # disk it would be made on)
    where = ckpt or run_dir
    while not os.path.isdir(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    doing[:] = ["node_checks.min_free_gb", where]
    try:
        free = shutil.disk_usage(where).free / 1e9
        if free < spec["min_free_gb"]:
            want = f"{spec['min_free_gb']:f}".rstrip("0").rstrip(".")
            problem("node_checks.min_free_gb", where, f"{free:.1f} GB free, below {want} GB")
    except OSError as e:
        problem("node_checks.min_free_gb", where, f"cannot read its free space ({e.strerror})")


def release(version):
    """The leading numbers of a version: "0.9.1.dev0+cu12" -> [0, 9, 1]."""
    m = re.match(r"\d+(\.\d+)*", version or "")
    return [int(x) for x in m.group(0).split(".")] if m else []


def check_verl(want):
    """The verl this node's Python finds (its version file, without importing it: verl's import
    takes torch) is the recipe's verl.version ("0.9" matches any 0.9.x)."""
    doing[:] = ["verl.version", sys.executable]
    have = None
    found = importlib.util.find_spec("verl")
    if found and found.submodule_search_locations:
        try:
            with open(os.path.join(list(found.submodule_search_locations)[0], "version", "version")) as f:
                have = f.read().strip()
        except (OSError, ValueError):  # ValueError: not UTF-8
            pass
    if found and have is None:
        try:
            have = importlib.metadata.version("verl")
        except importlib.metadata.PackageNotFoundError:
            pass
    if not found:
        problem("verl.version", sys.executable, f"no verl installed for this Python (the recipe runs verl {want})")
    elif have is None:
        problem("verl.version", found.origin or sys.executable, f"cannot tell this verl's version (the recipe runs verl {want})")
    elif release(have)[:len(release(want))] != release(want):
        problem("verl.version", found.origin or sys.executable,
                f"this node's verl is {have}, the recipe runs verl {want} (verl.version; "
                "its checks and derived settings follow that version)")


def check_ray_auth(oldest):
    """The Ray this node's Python finds knows token authentication (Ray 2.52+): an older one
    ignores RAY_AUTH_MODE and would let anyone join. Its metadata, without importing it."""
    doing[:] = ["ray", sys.executable]
    try:
        have = importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        return  # Ray's own step says it plainly
    if release(have) < release(oldest):
        problem("cluster.ray_auth_off", sys.executable,
                f"this node's Ray {have} has no token authentication (Ray {oldest}+) and would let anyone who reaches "
                "the node join the job's Ray: upgrade Ray, or set cluster.ray_auth_off with the reason")


def check_all():
    for field, path in spec["inputs"]:
        readable(field, path)
    ckpt = spec.get("checkpoints")
    if spec.get("shared"):
        shared("paths.runs", run_dir)
        if ckpt:
            shared("trainer.default_local_dir", ckpt)
    if spec.get("min_free_gb") and (os.path.isdir(ckpt or run_dir) or not spec.get("shared")):
        free_disk(ckpt)
    if spec.get("gpus"):
        check_gpus(spec["gpus"])
    if spec.get("verl_version"):
        check_verl(spec["verl_version"])
    if spec.get("ray_auth"):
        check_ray_auth(spec["ray_auth"])


# In a thread, so that a call a hung mount never returns from cannot hold the job: say which.
worker = threading.Thread(target=check_all, daemon=True)
worker.start()
worker.join(TIME_LIMIT)
if worker.is_alive():
    problem(doing[0], doing[-1], f"did not answer within {TIME_LIMIT} s (a hung mount?)")
for line in problems:
    print(f"@problem {line}", flush=True)
os._exit(1 if problems else 0)  # not sys.exit: it would wait for a blocked thread
