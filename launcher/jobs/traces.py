"""A run's traced trajectories, read back from Weave: list, filter, one whole, counted per step.

A trajectory is one root call that verl's rollout_trace_attr wrapped (the agent loop's `run`),
with its attributes (step, sample_index, rollout_n, validate, experiment_name) and the calls
inside it (generate, the tool parser, each tool's execute). Filters are Weave's own query (a
`$expr` on `attributes.*`), evaluated by the server; the calls stream as JSON lines and are
never all held: roots come in pages, and each page's nested calls in one query by trace id.

Weave's HTTP API, read with the standard library, not weave's Python client: importing the
client alone takes about 2.8 s on a 2-core node (weave 0.54), more than the whole first screen
may (bench/traces_bench.py), and it is not needed to read. The key comes from where `submit`
finds it (secrets.find_key) and only ever goes into the Authorization header.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..checks import secrets
from ..errors import RecipeError, RemoteError
from ..core.paths import RunPaths

CLOUD_API, CLOUD_TRACES = "https://api.wandb.ai", "https://trace.wandb.ai"  # weave's own default pair
FIRST_PAGE, PAGE = 20, 500  # roots per nested-calls query: a small first page, for a quick first screen


@dataclass
class Source:
    """Where one run's traces are: the trace server, entity/project, the run's experiment."""
    url: str  # the trace server (weave: <WANDB_BASE_URL>/traces, or trace.wandb.ai)
    project_id: str  # entity/project
    experiment: str
    estimate: Optional[int]  # trajectories per training step, as `check` estimated
    timeout: float
    key_where: str  # where the key came from (never the key)
    _auth: str = field(repr=False, default="")


@dataclass
class Filters:
    """What `traces` selects; None: any. steps: (first, last) ranges, either one matching."""
    steps: List[Tuple[int, Optional[int]]] = field(default_factory=list)  # (lo, None): lo on
    sample_index: Optional[int] = None
    rollout_n: Optional[int] = None
    validate: Optional[bool] = None
    experiment: Optional[str] = None  # None: the run's own
    limit: Optional[int] = None


def parse_step(text: str) -> Tuple[int, int]:
    """'3' -> (3, 3); '2:5' -> (2, 5). Bad input is exit 2, naming the flag."""
    m = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", str(text))
    if not m:
        raise RecipeError(f"{text!r} is not a step N or a range N:M", where="command line", key="--step")
    lo, hi = int(m[1]), int(m[2] if m[2] is not None else m[1])
    if hi < lo:
        raise RecipeError(f"{text!r} is an empty range (the end is before the start)", where="command line",
                          key="--step")
    return lo, hi


# ----------------------------------------------------------------------------- where the run's traces are
def source(run: dict, environ) -> Source:
    """The run's trace server, project and key, from its record and resolved recipe."""
    from . import state

    if state.tracking(run)[1] != "weave":
        raise RecipeError("the run was not traced (trace.backend is not weave): it has no trajectories to read",
                          where=run["run_dir"], key="trace.backend")
    wandb = wandb_of(run)
    base = (run.get("wandb_base_url") or wandb.get("base_url") or CLOUD_API).rstrip("/")
    url = (environ.get("WF_TRACE_SERVER_URL") or (CLOUD_TRACES if base == CLOUD_API else base + "/traces")).rstrip("/")
    key = secrets.find_key_at(base, wandb.get("api_key_file"), str(RunPaths(Path(run["run_dir"])).recipe), environ)
    if key is None or not key.value:
        raise RecipeError(f"no W&B API key to read the traces with: {secrets.WHERE_KEYS} ({secrets.host_of(base)})",
                          where=run["run_dir"], key="wandb")
    auth = "Basic " + base64.b64encode(f"api:{key.value}".encode()).decode()
    timeout = float(wandb.get("reach_timeout") or 10)
    entity = run.get("entity") or _default_entity(base, auth, timeout, key.where)
    return Source(url, f"{entity}/{run.get('project')}", run.get("experiment") or "", run.get("traces_per_step"),
                  timeout, key.where, auth)


def wandb_of(run: dict) -> dict:
    """The run's resolved wandb section (recipe.yaml in its run dir), {} if unreadable."""
    wandb = RunPaths(Path(run["run_dir"])).resolved_recipe().get("wandb")
    return wandb if isinstance(wandb, dict) else {}


def _default_entity(base: str, auth: str, timeout: float, key_where: str) -> str:
    """The key's default entity (where weave put the traces when wandb.entity was unset)."""
    answer = _post(base + "/graphql", {"query": "query DefaultEntity { viewer { username entity } }"},
                   auth, timeout, key_where)
    entity = ((answer.get("data") or {}).get("viewer") or {}).get("entity")
    if not entity:
        raise RemoteError(f"W&B at {base} did not say the key's default entity: set wandb.entity")
    return entity


# ----------------------------------------------------------------------------- Weave's HTTP API
def _request(url: str, body: dict, auth: str, accept: str) -> urllib.request.Request:
    return urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": auth, "Content-Type": "application/json", "Accept": accept})


def _open(url: str, body: dict, auth: str, timeout: float, key_where: str, accept: str = "application/json"):
    try:
        return urllib.request.urlopen(_request(url, body, auth, accept), timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise RecipeError(f"W&B at {url.rsplit('/', 2)[0]} rejected the key (HTTP {e.code}); keys are "
                              f"looked for in {secrets.WHERE_KEYS}", where=key_where, key="wandb") from None
        detail = e.read(300).decode(errors="replace").strip()
        raise RemoteError(f"{url} answered HTTP {e.code}: {detail}") from None
    except (urllib.error.URLError, socket.timeout, ConnectionError) as e:
        why = getattr(e, "reason", e)
        raise RemoteError(f"cannot reach Weave at {url} within {timeout:g} s (wandb.reach_timeout): {why}") from None


def _post(url: str, body: dict, auth: str, timeout: float, key_where: str) -> dict:
    with _open(url, body, auth, timeout, key_where) as resp:
        try:
            return json.loads(resp.read())
        except ValueError:
            raise RemoteError(f"{url} did not answer JSON") from None


def stream(src: Source, body: dict) -> Iterator[dict]:
    """Weave's calls/stream_query: one call per JSON line, as they arrive."""
    url = src.url + "/calls/stream_query"
    with _open(url, {"project_id": src.project_id, **body}, src._auth, src.timeout, src.key_where,
               accept="application/jsonl") as resp:
        try:
            for line in resp:
                if line.strip():
                    yield json.loads(line)
        except (socket.timeout, ConnectionError) as e:
            raise RemoteError(f"Weave at {src.url} stopped answering mid-stream: {e}") from None


def count(src: Source, filters: Filters) -> int:
    """How many trajectories FILTERS match (Weave's calls/query_stats)."""
    body = {"project_id": src.project_id, "filter": {"trace_roots_only": True}, "query": query(src, filters)}
    return int(_post(src.url + "/calls/query_stats", body, src._auth, src.timeout, src.key_where).get("count", 0))


# ----------------------------------------------------------------------------- the query
def _attr(name: str, to: str) -> dict:
    # Weave keeps attributes as JSON: convert before comparing, so a number compares as a number
    return {"$convert": {"input": {"$getField": f"attributes.{name}"}, "to": to}}


def _eq(name: str, value, to: str) -> dict:
    return {"$eq": [_attr(name, to), {"$literal": value}]}


def query(src: Source, f: Filters) -> dict:
    """FILTERS as Weave's query: {"$expr": ...} over the root calls' attributes."""
    conds: List[dict] = [{"$eq": [{"$getField": "attributes.experiment_name"},
                                  {"$literal": f.experiment or src.experiment}]}]
    if f.steps:
        ranges = [{"$and": [{"$gte": [_attr("step", "int"), {"$literal": lo}]},
                            {"$lte": [_attr("step", "int"), {"$literal": hi}]}]} if hi is not None
                  else {"$gte": [_attr("step", "int"), {"$literal": lo}]} for lo, hi in f.steps]
        conds.append(ranges[0] if len(ranges) == 1 else {"$or": ranges})
    for name, value in (("sample_index", f.sample_index), ("rollout_n", f.rollout_n)):
        if value is not None:
            conds.append(_eq(name, value, "int"))
    if f.validate is not None:
        conds.append(_eq("validate", f.validate, "bool"))
    return {"$expr": conds[0] if len(conds) == 1 else {"$and": conds}}


# ----------------------------------------------------------------------------- trajectories
LIST_COLUMNS = ["id", "op_name", "trace_id", "parent_id", "started_at", "attributes", "output.reward_score",
                "output.num_turns"]


def short_name(op_name: Optional[str]) -> str:
    """weave:///team/proj/op/SingleTurnAgentLoop.run:digest -> SingleTurnAgentLoop.run"""
    name = op_name or ""
    if name.startswith("weave:///"):
        name = name.rsplit("/", 1)[-1].split(":", 1)[0]
    return name


def trajectories(src: Source, f: Filters, nested: bool = False, call_ids: Optional[List[str]] = None) -> Iterator[dict]:
    """The trajectories FILTERS (or CALL_IDS) pick, oldest first, each with its nested calls
    (all their fields when NESTED, else only what the list shows)."""
    body: Dict[str, Any] = {"filter": {"trace_roots_only": True},
                            "sort_by": [{"field": "started_at", "direction": "asc"}]}
    if call_ids:
        body["filter"] = {"call_ids": list(call_ids)}
    else:
        body["query"] = query(src, f)
    if f.limit:
        body["limit"] = f.limit
    if not nested:
        body["columns"] = LIST_COLUMNS
    roots = stream(src, body)
    page: List[dict] = []
    size = FIRST_PAGE
    for root in roots:
        page.append(root)
        if len(page) >= size:
            yield from _with_calls(src, page, nested)
            page, size = [], PAGE
    if page:
        yield from _with_calls(src, page, nested)


def _with_calls(src: Source, roots: List[dict], nested: bool) -> Iterator[dict]:
    body: Dict[str, Any] = {"filter": {"trace_ids": [r["trace_id"] for r in roots]},
                            "sort_by": [{"field": "started_at", "direction": "asc"}]}
    if not nested:
        body["columns"] = ["id", "op_name", "trace_id", "parent_id", "started_at"]
    inside: Dict[str, List[dict]] = {}
    for call in stream(src, body):
        if call.get("parent_id"):
            inside.setdefault(call["trace_id"], []).append(call)
    for root in roots:
        yield trajectory(root, inside.get(root["trace_id"], []), nested)


def tool_executions(calls: List[dict], name=lambda c: short_name(c.get("op_name"))) -> List[dict]:
    """The tool executions among CALLS: each tool's `execute`, but not one inside another (a
    tool whose execute calls its base class's, both traced, ran once)."""
    ids = {c.get("id") for c in calls if name(c).endswith(".execute")}
    return [c for c in calls if name(c).endswith(".execute") and c.get("parent_id") not in ids]


def trajectory(root: dict, calls: List[dict], nested: bool = False) -> dict:
    """One trajectory as `traces` shows it (and --json prints it)."""
    a = root.get("attributes") or {}
    names = [short_name(c.get("op_name")) for c in calls]
    out = root.get("output") if isinstance(root.get("output"), dict) else {}
    t = {"call_id": root["id"], "trace_id": root.get("trace_id"), "op": short_name(root.get("op_name")),
         "step": a.get("step"), "sample_index": a.get("sample_index"), "rollout_n": a.get("rollout_n"),
         "validate": a.get("validate"), "experiment": a.get("experiment_name"),
         "turns": sum(n.endswith(".generate") for n in names),
         "tool_calls": len(tool_executions(calls)),
         "reward": out.get("reward_score"), "started_at": root.get("started_at")}
    if nested:
        t["inputs"], t["output"] = root.get("inputs"), root.get("output")
        t["calls"] = [{"op": short_name(c.get("op_name")), **{k: c.get(k) for k in (
            "id", "parent_id", "started_at", "ended_at", "inputs", "output", "exception")}} for c in calls]
    return t


# ----------------------------------------------------------------------------- did they all arrive?
def tally(src: Source, done: Optional[int]):
    """Training trajectories per step against the estimate (trace_tally.Tally), from stats
    requests over step ranges: a few, never a stream of the run's calls."""
    from .trace_tally import tally as by_ranges

    def training(lo: Optional[int], hi: Optional[int]) -> int:
        return count(src, Filters(steps=[] if lo is None else [(lo, hi)], validate=False))

    return by_ranges(training, src.estimate, done)


def why_none(run: dict) -> str:
    """Why a traced run likely has no trajectories, from what its job ran (its script's verl args)."""
    try:
        script = RunPaths(Path(run["run_dir"])).script.read_text()
    except OSError:
        script = ""
    reasons = []
    if "trainer.use_v1=false" not in script and "trainer.use_v1=False" not in script:
        reasons.append("verl's V1 trainer traces nothing in 0.9 (trainer.use_v1=false traces)")
    if "rollout.mode=sync" in script:
        reasons.append("the rollout is not async (only the agent loop traces)")
    if "max_samples_per_step_per_worker=0" in script:
        reasons.append("trace.max_samples_per_step_per_worker is 0")
    reasons.append(f"or they went to another project than {run.get('entity') or '<default entity>'}/"
                   f"{run.get('project')} (WANDB_ENTITY, WANDB_PROJECT or WF_TRACE_SERVER_URL in the job's env)")
    reasons.append("or the job never reached a training step, or Weave was unreachable from the nodes "
                   "(the job's trace-check phase says)")
    return "; ".join(reasons)


def flush_note(paths: RunPaths) -> Optional[str]:
    """The steps at which an agent-loop worker had not sent all its traces within
    trace.flush_timeout (templates/trace_flush.py's records, the latest run's), if any:
    'traces not all sent within trace.flush_timeout at steps 7, 8 (at least 3 uploads left)'. At
    least: Weave counts what waits in its queues, not the batch it is sending."""
    latest = paths.latest(RunPaths.TRACE_FLUSH)
    if latest is None:
        return None
    restart = latest.name.rsplit(".r", 1)[-1]  # this run's workers' files only
    late, left = [], 0
    for f in paths.where(RunPaths.TRACE_FLUSH).glob(RunPaths.glob(RunPaths.TRACE_FLUSH)):
        if not f.name.endswith(".r" + restart):
            continue
        try:
            records = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        except (OSError, ValueError):
            continue
        for r in records:
            if not r.get("flushed", True):
                late.append(r.get("step"))
                left += max(int(r.get("unsent") or 0), 0)
    if not late:
        return None
    steps = sorted({s for s in late if isinstance(s, int)})
    named = ", ".join(map(str, steps[:6])) + (", ..." if len(steps) > 6 else "")
    return (f"traces not all sent within trace.flush_timeout at step{'s' if len(steps) > 1 else ''} {named or '?'}"
            + (f" (at least {left} uploads left)" if left else ""))
