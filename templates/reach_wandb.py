# Run on every node before Ray starts: does W&B answer, with this key, and does Weave's trace
# server (when tracing to Weave)? Standard library only; the key is sent, never printed.
# argv: TIMEOUT (seconds), and "weave" when traces go to Weave.
import base64
import json
import os
import sys
import time
import urllib.error
import urllib.request

timeout = float(sys.argv[1])
weave = sys.argv[2:3] == ["weave"]
node = os.environ.get("SLURMD_NODENAME", "this node")
base = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").rstrip("/")
# Weave's own rule (weave/trace/env.py): W&B's cloud traces at trace.wandb.ai, others at /traces.
trace = os.environ.get("WF_TRACE_SERVER_URL") or (
    "https://trace.wandb.ai" if base == "https://api.wandb.ai" else base + "/traces")
auth = "Basic " + base64.b64encode(("api:" + os.environ["WANDB_API_KEY"]).encode()).decode()


def ask(url, body=None):
    req = urllib.request.Request(url, data=body, headers={"Authorization": auth, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


t0 = time.monotonic()
url = base + "/graphql"
try:
    viewer = json.loads(ask(url, json.dumps({"query": "query Viewer { viewer { username } }"}).encode()))
    if not (viewer.get("data") or {}).get("viewer"):
        sys.exit(f"{node}: W&B at {base} did not accept the API key (no viewer)")
    if weave:
        url = trace + "/server_info"
        ask(url)
except urllib.error.HTTPError as e:
    why = "rejected the API key" if e.code in (401, 403) else f"answered HTTP {e.code}"
    sys.exit(f"{node}: {url} {why}")
except Exception as e:  # DNS, refused, timed out, TLS: all mean no traces from this node
    sys.exit(f"{node}: {url} did not answer within {timeout:g} s ({type(e).__name__}: {e})")
ms = (time.monotonic() - t0) * 1000
print(f"{node}: W&B at {base}" + (f" and Weave at {trace}" if weave else "") + f" answer ({ms:.0f} ms)")
