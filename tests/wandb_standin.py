"""A loopback stand-in for W&B and Weave's trace server, for tests.

The real weave client (weave 0.54) and the real wandb client (wandb 0.31, whose runs are
sent by its Go service wandb-core) run against it when a process has
``WANDB_BASE_URL=<stand-in url>``, ``WANDB_API_KEY=<its key>`` and ``WANDB_ENTITY``.
It answers only what ``weave.init`` and call tracing, and a wandb run (``wandb.init`` with
or without ``id=``/``resume=``, ``wandb.log``, ``wandb.finish``, online mode) need, and
records what it gets:

    with StandIn(api_key=key) as w:                 # host="169.254.77.1" for sandbox nodes
        env["WANDB_BASE_URL"] = w.url
        ...run something that traces...
        w.wait_for(lambda s: any(c["op_name"].endswith("execute") for c in s.calls))
        w.calls      # every finished call: op_name, attributes, inputs, output, entity,
                     # project, auth_ok (+ short_name, id, trace_id, parent_id, exception)
        w.runs       # wandb runs by run id: entity, project, name, config, tags, group,
                     # job_type, history (logged rows in order, with _step), summary,
                     # output (console lines), files (uploaded name -> bytes),
                     # exit_code (None until wandb.finish), resumed (times resumed),
                     # ends (every finish's exit code, in order)
        w.requests   # every request: (method, path, authorized)
        w.forget(lambda c: c["attributes"].get("step") == 2)   # a fault: calls the server lost

Endpoints (weave's paths all sit under ``/traces``, as weave derives its trace server
URL as ``<WANDB_BASE_URL>/traces``):

- ``GET  /traces/server_info``                      version handshake
- ``POST /graphql``                                 weave: viewer, project, upsertModel,
  serverInfo; wandb-core, by operation name: RunResumeStatus (a known run id is
  resumed: history/console offsets continue), UpsertBucket (creates/updates the run:
  name, config, tags, group, job type), CreateRunFiles (upload URLs back to this
  stand-in), ServerFeaturesQuery (no features), OrganizationCoreWeaveOrganizationID,
  Viewer
- ``POST /files/<entity>/<project>/<run_id>/file_stream``  wandb-core's file stream:
  ``{"files": {name: {"offset", "content": [lines]}}, "complete", "exitcode"}`` with
  wandb-history.jsonl, wandb-summary.json, output.log, wandb-events.jsonl (counted only)
- ``PUT  /upload/<entity>/<project>/<run_id>/<file>``  run files (config.yaml,
  wandb-metadata.json, requirements.txt, ...) at the URLs CreateRunFiles gave
- ``POST /traces/v2/<entity>/<project>/calls/complete``  batch of finished calls (default path)
- ``POST /traces/call/upsert_batch``                the legacy start/end batch
- ``POST /traces/v2/<entity>/<project>/call/start|end``  eager single start/end
- ``POST /traces/obj/create``, ``/traces/file/create``, ``/traces/table/create``
- ``POST /traces/service/projects_info``            (only with client-side digests on)
- ``POST /traces/calls/stream_query``, ``/traces/calls/query_stats``, ``/traces/call/read``:
  reads over the recorded calls, in the subset of Weave's query language that
  tests/standin_query.py names (what the real client writes, it reads back)
Anything else gets a 404 and lands in ``.unknown`` (an unknown GraphQL operation as
``("POST /graphql", <its first line>)``), so a newer client that needs more shows up
there instead of silently losing data. Not answered: artifacts (so a logged wandb.Table,
which wandb turns into one, leaves ArtifactType/CreateArtifact there; the run still
finishes), sweeps, wandb.Api() reads (QueryRunInfo, HistoryPage, ...).

Every request must carry ``Authorization: Basic base64("api:<key>")``; others get a 401
and are still recorded (``authorized`` False), so a test can assert the key was used;
they change no run in ``.runs`` (their bodies are in ``.bodies`` all the same).
wandb-core sends no credentials to upload URLs (W&B's are signed storage URLs), only
the ``uploadHeaders`` CreateRunFiles returns; the stand-in returns the caller's own
Authorization there, so uploads are checked like the rest. A wrong key fails
``wandb.init`` at once (wandb-core does not retry a 401).
``mode="silent"`` accepts TCP connections and never answers, for reachability timeouts;
``stall_uploads.set()`` makes a running stand-in stop answering trace uploads (reads still answer).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
import socket
import threading
import time
import urllib.parse
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import standin_query

# weave refuses a server whose version it does not know to be compatible; a high
# version with a low client requirement passes every check.
SERVER_INFO = {"min_required_weave_python_version": "0.0.1", "trace_server_version": "99.0.0"}

_V2_PATH = re.compile(r"^/traces/v2/(?P<entity>[^/]+)/(?P<project>[^/]+)/(?P<rest>.+)$")
_FILE_STREAM_PATH = re.compile(r"^/files/(?P<entity>[^/]+)/(?P<project>[^/]+)/(?P<run>[^/]+)/file_stream$")
_UPLOAD_PATH = re.compile(r"^/upload/(?P<entity>[^/]+)/(?P<project>[^/]+)/(?P<run>[^/]+)/(?P<name>.+)$")


class StandIn:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, api_key: str,
                 mode: str = "answer", username: str = "standin-user",
                 default_entity: str = "standin-entity"):
        if mode not in ("answer", "silent"):
            raise ValueError(f"mode must be 'answer' or 'silent', not {mode!r}")
        self.api_key = api_key
        self.mode = mode
        self.username = username
        # What the viewer query reports: the entity weave uses when WANDB_ENTITY is unset.
        self.default_entity = default_entity
        self.calls: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, bool]] = []
        self.unknown: list[tuple[str, str]] = []   # (method, path) this stand-in cannot answer
        self.bodies: list[tuple[str, Any]] = []    # (path, parsed JSON body) of every POST
        # Bytes received per path, as sent (compressed if it was) and decoded: what a run costs.
        self.received: dict[str, list[int]] = {}
        self.runs: dict[str, dict[str, Any]] = {}  # wandb runs by run id, see _new_run
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._expected_auth = "Basic " + base64.b64encode(f"api:{api_key}".encode()).decode()
        self._held: list[socket.socket] = []       # silent mode: connections kept open
        # Set: trace uploads (calls, objects) are read and never answered until stop(), as a
        # Weave server that stops answering mid-run; the reads still answer.
        self.stall_uploads = threading.Event()
        self._stopping = threading.Event()
        self._starts: dict[str, tuple[dict, str | None, str | None]] = {}  # unpaired call starts

        if mode == "silent":
            # A plain listening socket: the kernel completes the TCP handshake, nobody reads.
            self._sock = socket.create_server((host, port), backlog=64)
            self._server = None
        else:
            self._server = ThreadingHTTPServer((host, port), _make_handler(self))
            self._server.daemon_threads = True
            self._sock = self._server.socket
        self.host, self.port = self._sock.getsockname()[:2]
        self.url = f"http://{self.host}:{self.port}"
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> "StandIn":
        if self._server:
            # A short poll keeps stop() quick (serve_forever checks for shutdown per poll).
            target = lambda: self._server.serve_forever(poll_interval=0.05)  # noqa: E731
        else:
            target = self._accept_and_hold
        self._thread = threading.Thread(target=target, name="wandb-standin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # stalled handlers give up their connections
        if self._server:
            self._server.shutdown()
            self._server.server_close()
        else:
            # close() alone does not wake a thread blocked in accept() on Linux; shutdown does.
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
            for conn in self._held:
                conn.close()
        if self._thread:
            self._thread.join(timeout=5)

    def __enter__(self) -> "StandIn":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _accept_and_hold(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:       # closed by stop()
                return
            self._held.append(conn)

    # -- what tests read -----------------------------------------------------------------

    def wait_for(self, predicate: Callable[["StandIn"], bool], timeout: float = 10.0) -> bool:
        """Block until predicate(self) holds (re-checked on every request); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def forget(self, predicate: Callable[[dict], bool]) -> int:
        """Drop the recorded calls PREDICATE holds for (traces a server lost); how many."""
        with self._changed:
            kept = [c for c in self.calls if not predicate(c)]
            gone, self.calls[:] = len(self.calls) - len(kept), kept
            return gone

    def calls_named(self, suffix: str) -> list[dict[str, Any]]:
        """Calls whose op name ends with suffix (weave turns op names into refs)."""
        return [c for c in self.calls if _op_short_name(c["op_name"]).endswith(suffix)]

    # -- recording (called from handler threads) -------------------------------------------

    def _record_request(self, method: str, path: str, authorized: bool) -> None:
        with self._changed:
            self.requests.append((method, path, authorized))
            self._changed.notify_all()

    def _record(self, *, calls=(), body=None, path=None, unknown=None, size=None) -> None:
        with self._changed:
            self.calls.extend(calls)
            if path is not None:
                self.bodies.append((path, body))
            if size is not None:
                total = self.received.setdefault(path, [0, 0])
                total[0], total[1] = total[0] + size[0], total[1] + size[1]
            if unknown is not None:
                self.unknown.append(unknown)
            self._changed.notify_all()

    def _update_run(self, run_id: str, update: Callable[[dict], Any]) -> Any:
        """Apply update to the run's record (made on first sight) under the lock."""
        with self._changed:
            run = self.runs.setdefault(run_id, _new_run())
            result = update(run)
            self._changed.notify_all()
            return result


_READS = ("/traces/calls/stream_query", "/traces/calls/query_stats", "/traces/call/read")


def _chain(first, rest):
    if first is not None:
        yield first
        yield from rest


def _new_run() -> dict[str, Any]:
    return {
        "entity": None, "project": None,
        "name": None,          # the display name (wandb.init(name=...)); the key is the run id
        "config": {},          # as passed to wandb.init / run.config, without wandb's own "_wandb"
        "tags": [], "group": None, "job_type": None,
        "history": [],         # one dict per wandb.log row (with _step, _runtime, _timestamp)
        "summary": {},         # the latest wandb-summary.json
        "output": [],          # console lines (output.log)
        "files": {},           # name -> bytes of the run files uploaded (config.yaml, ...)
        "exit_code": None,     # set by the file stream's final "complete" request
        "resumed": 0,          # how often a finished run was resumed (same run id again)
        "ends": [],            # the exit code of every "complete" request, in order (one per finish)
        "_upserted": False,    # UpsertBucket seen: what "inserted" answers
        "_raw_config": {},     # config as sent ({"key": {"value": ...}}), for resuming
        "_events": 0,          # system-metrics lines received (only their count is kept)
    }


def _op_short_name(op_name: str) -> str:
    # Published ops arrive as refs: weave:///team/proj/op/CalculatorTool.execute:<digest>
    if op_name.startswith("weave:///"):
        return op_name.rsplit("/", 1)[-1].split(":", 1)[0]
    return op_name


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


def _decode_body(raw: bytes, encoding: str) -> Any:
    """The body as JSON, whatever Content-Type says; None if it is not JSON."""
    encoding = encoding.lower().strip()
    try:
        if encoding == "gzip" or raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        elif encoding == "deflate":
            raw = zlib.decompress(raw)
        return json.loads(raw)
    except (OSError, zlib.error, UnicodeDecodeError, json.JSONDecodeError):
        return None   # e.g. file/create's multipart upload


def _call_record(start: dict, end: dict | None, entity: str, project: str, auth_ok: bool,
                 client: str | None = None) -> dict:
    end = end or {}
    return {
        "op_name": start.get("op_name"),
        "short_name": _op_short_name(start.get("op_name") or ""),
        "attributes": start.get("attributes") or {},
        "inputs": start.get("inputs") or {},
        "output": end.get("output"),
        "exception": end.get("exception"),
        "id": start.get("id"),
        "display_name": start.get("display_name"),
        "started_at": start.get("started_at"),
        "ended_at": end.get("ended_at"),
        "summary": end.get("summary"),
        "wb_run_id": start.get("wb_run_id"),
        "wb_user_id": start.get("wb_user_id"),
        "trace_id": start.get("trace_id"),
        "parent_id": start.get("parent_id"),
        "entity": entity,
        "project": project,
        "auth_ok": auth_ok,
        "client": client,  # the sender's address: which node traced it
    }


def _split_project_id(project_id: str | None) -> tuple[str | None, str | None]:
    if not project_id or "/" not in project_id:
        return None, project_id
    entity, project = project_id.split("/", 1)
    return entity, project


def _make_handler(standin: StandIn):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"   # keep-alive, as httpx expects

        def log_message(self, *args):   # keep pytest output quiet
            pass

        def handle(self):
            try:
                super().handle()
            except (ConnectionResetError, BrokenPipeError):
                pass                        # wandb-core exits with keep-alive connections open

        def _reply(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _read_body(self) -> bytes:
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _authorized(self) -> bool:
            return self.headers.get("Authorization") == standin._expected_auth

        def do_GET(self):
            self._handle("GET")

        def do_POST(self):
            self._handle("POST")

        def do_PUT(self):             # run file uploads, at the URLs CreateRunFiles hands out
            self._handle("PUT")

        def _handle(self, method: str) -> None:
            path = self.path.split("?", 1)[0]
            raw = self._read_body()          # always drain, or keep-alive breaks
            ok = self._authorized()
            standin._record_request(method, path, ok)
            body = _decode_body(raw, self.headers.get("Content-Encoding", "")) if raw else None
            if method == "POST":
                standin._record(body=body, path=path, size=(len(raw), len(json.dumps(body)) if body else 0))
            if method == "POST" and path in _READS:
                return self._read(path, body, ok)
            if method == "POST" and path.startswith("/traces/") and standin.stall_uploads.is_set():
                standin._stopping.wait()
                self.close_connection = True
                return
            # Routed even without the key, so calls sent with a wrong key are recorded
            # (auth_ok False) and a test can see what would have leaked; the answer is 401.
            status, payload = self._route(method, path, body, raw, ok, self.client_address[0])
            if not ok:
                status, payload = 401, {"errors": [{"message": "stand-in: missing or wrong API key"}]}
            self._reply(status, payload)

        def _read(self, path: str, body: Any, ok: bool) -> None:
            """A read: nothing without the key; stream_query's lines go out as they are made."""
            if not ok:
                return self._reply(401, {"errors": [{"message": "stand-in: missing or wrong API key"}]})
            with standin._lock:
                calls = list(standin.calls)
            body = body if isinstance(body, dict) else {}
            try:
                if path == "/traces/calls/query_stats":
                    return self._reply(200, standin_query.stats(calls, body))
                if path == "/traces/call/read":
                    return self._reply(200, {"call": standin_query.read(calls, body.get("project_id"), body.get("id"))})
                lines = standin_query.select(calls, body)
                first = next(lines, None)   # a bad query is a 400, before any line is sent
            except (standin_query.QueryError, KeyError, TypeError) as e:
                return self._reply(400, {"detail": f"stand-in: {e}"})
            self.send_response(200)
            self.send_header("Content-Type", "application/jsonl")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = []
            for call in _chain(first, lines):
                chunk.append(json.dumps(call) + "\n")
                if len(chunk) >= 64:
                    self._chunk("".join(chunk).encode())
                    chunk = []
            if chunk:
                self._chunk("".join(chunk).encode())
            self.wfile.write(b"0\r\n\r\n")

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

        def _route(self, method: str, path: str, body: Any, raw: bytes, ok: bool,
                   client: str) -> tuple[int, Any]:
            if method == "GET" and path == "/traces/server_info":
                return 200, SERVER_INFO
            if method == "POST" and path == "/graphql":
                return 200, _graphql(standin, body or {}, ok)
            # A wandb run changes only with the key (what was refused is still in .bodies).
            fs = _FILE_STREAM_PATH.match(path)
            if method == "POST" and fs:
                if ok:
                    _file_stream(standin, fs["entity"], fs["project"], fs["run"], body or {})
                return 200, {}
            up = _UPLOAD_PATH.match(path)
            if method == "PUT" and up:
                name = urllib.parse.unquote(up["name"])
                if ok:
                    standin._update_run(up["run"], lambda run: run["files"].update({name: raw}))
                return 200, {}
            if method == "POST":
                v2 = _V2_PATH.match(path)
                if v2:
                    return _v2(v2["entity"], v2["project"], v2["rest"], body or {}, ok, client)
                if path == "/traces/call/upsert_batch":
                    return 200, _upsert_batch(body or {}, ok)
                if path == "/traces/obj/create":
                    return 200, {"digest": _digest(raw)}
                if path == "/traces/file/create":
                    return 200, {"digest": _digest(raw)}
                if path == "/traces/table/create":
                    rows = ((body or {}).get("table") or {}).get("rows") or []
                    return 200, {"digest": _digest(raw),
                                 "row_digests": [_digest(json.dumps(r, sort_keys=True).encode())
                                                 for r in rows]}
                if path == "/traces/service/projects_info":
                    return 200, []   # no internal ids: weave falls back to server-side digests
            standin._record(unknown=(method, path))
            return 404, {"detail": f"stand-in does not implement {method} {path}"}

    # The call endpoints need the stand-in too; closures keep them next to the handler.
    def _v2(entity: str, project: str, rest: str, body: dict, ok: bool, client: str) -> tuple[int, Any]:
        if rest == "calls/complete":
            # Each item is a whole call: the start fields plus ended_at/output/exception.
            standin._record(calls=[_call_record(item, item, entity, project, ok, client)
                                   for item in body.get("batch") or []])
            return 200, {}
        if rest == "call/start":
            start = body.get("start") or {}
            standin._starts[start.get("id")] = (start, entity, project)
            return 200, {"id": start.get("id"), "trace_id": start.get("trace_id")}
        if rest == "call/end":
            end = body.get("end") or {}
            start, e, p = standin._starts.pop(end.get("id"), ({}, entity, project))
            standin._record(calls=[_call_record(start, end, e, p, ok, client)])
            return 200, {}
        standin._record(unknown=("POST", f"/traces/v2/{entity}/{project}/{rest}"))
        return 404, {"detail": f"stand-in does not implement v2 {rest}"}

    def _upsert_batch(body: dict, ok: bool) -> dict:
        # Legacy path: starts and ends arrive separately, possibly in different batches.
        finished, res = [], []
        for item in body.get("batch") or []:
            req = item.get("req") or {}
            if item.get("mode") == "start":
                start = req.get("start") or {}
                entity, project = _split_project_id(start.get("project_id"))
                standin._starts[start.get("id")] = (start, entity, project)
                res.append({"id": start.get("id"), "trace_id": start.get("trace_id")})
            elif item.get("mode") == "end":
                end = req.get("end") or {}
                start, entity, project = standin._starts.pop(end.get("id"), ({}, None, None))
                finished.append(_call_record(start, end, entity, project, ok))
                res.append({})
        standin._record(calls=finished)
        return {"res": res}

    return Handler


def _graphql(standin: StandIn, body: dict, ok: bool) -> dict:
    """Answer the few W&B GraphQL queries weave and wandb-core send.

    wandb-core's operations are picked by name, weave's by what the query asks for; any
    other operation (wandb's artifact queries, say) is unknown rather than taken for weave's.
    """
    query = body.get("query") or ""
    variables = body.get("variables") or {}
    name = body.get("operationName")
    if not name:
        m = re.match(r"\s*(?:query|mutation)\s+(\w+)", query)
        name = m and m[1]
    if name in _RUN_OPS:
        return {"data": _RUN_OPS[name](standin, variables) if ok else None}
    answer = _weave_graphql(standin, query, variables) if name in _WEAVE_OPS else None
    if answer is not None:
        return answer
    standin._record(unknown=("POST /graphql", query.strip().split("\n", 1)[0]))
    return {"data": None, "errors": [{"message": "stand-in does not know this query"}]}


# What weave's wandb shim (weave/compat/wandb/wandb_thin) names its queries; None: unnamed.
_WEAVE_OPS = {None, "ServerInfo", "DefaultEntity", "Project", "Entity", "UpsertModel"}


def _weave_graphql(standin: StandIn, query: str, variables: dict) -> dict | None:
    if "viewer" in query:
        return {"data": {"viewer": {
            "id": "standin-viewer", "username": standin.username, "entity": standin.default_entity,
            "defaultEntity": {"name": standin.default_entity}, "teams": {"edges": []},
        }}}
    if "upsertModel" in query:
        name = variables.get("name") or variables.get("project")
        return {"data": {"upsertModel": {"model": {"name": name, "description": ""},
                                         "inserted": True}}}
    if "project(" in query:
        return {"data": {"project": {"name": variables.get("name") or variables.get("projectName"),
                                     "entity": {"name": variables.get("entityName")}}}}
    if "serverInfo" in query:
        return {"data": {"serverInfo": {"frontendHost": standin.url}}}
    return None


# -- wandb runs (wandb-core's GraphQL operations and file stream) -------------------------

def _json_or(text: Any, default: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else default
    except json.JSONDecodeError:
        return default


def _storage_id(run_id: str) -> str:
    return "standin-run:" + run_id


def _bucket(run_id: str, run: dict) -> dict:
    """A run as UpsertBucket and RunResumeStatus return it (JSON fields as JSON strings)."""
    return {
        "id": _storage_id(run_id), "name": run_id, "displayName": run["name"],
        "description": None, "notes": None, "tags": run["tags"], "sweepName": None,
        "config": json.dumps(run["_raw_config"]),
        "project": {"id": "standin-project:" + str(run["project"]), "name": run["project"],
                    "entity": {"id": "standin-entity:" + str(run["entity"]), "name": run["entity"]}},
        "summaryMetrics": json.dumps(run["summary"]),
        "historyLineCount": len(run["history"]),
        "eventsLineCount": run["_events"],
        "logLineCount": len(run["output"]),
        "historyTail": json.dumps([json.dumps(row) for row in run["history"][-1:]]),
        "eventsTail": "[]",
        # wandb-core resumes only a run whose wandbConfig has "t" (i.e. that really started).
        "wandbConfig": json.dumps({"t": ((run["_raw_config"].get("_wandb") or {}).get("value")
                                         or {}).get("t", {})}),
    }


def _upsert_bucket(standin: StandIn, v: dict) -> dict:
    # "name" is the run id; updates later in the run may name it by storage "id" only.
    run_id = v.get("name") or (v.get("id") or "").removeprefix("standin-run:")

    def update(run: dict) -> dict:
        inserted, run["_upserted"] = not run["_upserted"], True
        for key, field in (("entity", "entity"), ("project", "project"), ("name", "displayName"),
                           ("group", "groupName"), ("job_type", "jobType"), ("tags", "tags")):
            if v.get(field) is not None:
                run[key] = v[field]
        if v.get("config") is not None:
            run["_raw_config"] = _json_or(v["config"], {})
            run["config"] = {k: (c or {}).get("value") for k, c in run["_raw_config"].items()
                             if k != "_wandb" and isinstance(c, dict)}
        if v.get("summaryMetrics") is not None:
            run["summary"] = _json_or(v["summaryMetrics"], run["summary"])
        run["entity"] = run["entity"] or standin.default_entity
        return {"upsertBucket": {"bucket": _bucket(run_id, run), "inserted": inserted}}

    return standin._update_run(run_id, update)


def _run_resume_status(standin: StandIn, v: dict) -> dict:
    project, entity = v.get("project"), v.get("entity") or standin.default_entity
    with standin._lock:
        run = standin.runs.get(v.get("name"))
        known = run is not None and (run["project"], run["entity"]) == (project, entity)
        bucket = _bucket(v["name"], run) if known else None   # None: a new run
    return {"model": {"id": "standin-project:" + str(project), "name": project,
                      "entity": {"id": "standin-entity:" + entity, "name": entity},
                      "bucket": bucket}}


def _create_run_files(standin: StandIn, v: dict) -> dict:
    # Upload URLs point back here. wandb-core sends no credentials of its own to upload URLs
    # (W&B's are signed storage URLs), only the "Name:value" uploadHeaders given here; these
    # carry the caller's own key, so the PUTs are checked like every other request.
    base = f"{standin.url}/upload/{v.get('entity')}/{v.get('project')}/{v.get('run')}/"
    return {"createRunFiles": {
        "runID": _storage_id(v.get("run") or ""),
        "uploadHeaders": ["Authorization:" + standin._expected_auth],
        "files": [{"name": f, "uploadUrl": base + urllib.parse.quote(f)}
                  for f in v.get("files") or []]}}


_RUN_OPS: dict[str, Callable[[StandIn, dict], dict]] = {
    "UpsertBucket": _upsert_bucket,
    "RunResumeStatus": _run_resume_status,
    "CreateRunFiles": _create_run_files,
    "ServerFeaturesQuery": lambda standin, v: {"serverInfo": {"features": []}},
    "Viewer": lambda standin, v: {"viewer": {
        "id": "standin-viewer", "entity": standin.default_entity, "username": standin.username,
        "email": None, "flags": None, "teams": {"edges": []}}},
    # Asked for every run's entity; no organization means not on CoreWeave.
    "OrganizationCoreWeaveOrganizationID": lambda standin, v: {"entity": {"organization": None}},
}


def _file_stream(standin: StandIn, entity: str, project: str, run_id: str, body: dict) -> None:
    """wandb-core's file stream: {"files": {name: {"offset", "content": [lines]}}, ...}."""
    def update(run: dict) -> None:
        run["entity"], run["project"] = run["entity"] or entity, run["project"] or project
        for name, chunk in (body.get("files") or {}).items():
            offset, lines = chunk.get("offset") or 0, chunk.get("content") or []
            if name == "wandb-history.jsonl":
                run["history"][offset:offset + len(lines)] = [_json_or(x, x) for x in lines]
            elif name == "wandb-summary.json" and lines:
                run["summary"] = _json_or(lines[-1], run["summary"])
            elif name == "output.log":
                run["output"][offset:offset + len(lines)] = lines
            elif name == "wandb-events.jsonl":
                run["_events"] = max(run["_events"], offset + len(lines))
            else:
                standin.unknown.append(("file_stream file", name))
        if body.get("complete"):
            run["exit_code"] = body.get("exitcode")
            run["ends"].append(body.get("exitcode"))
        elif run["exit_code"] is not None:   # a finished run streams again: it was resumed
            run["exit_code"] = None
            run["resumed"] += 1

    standin._update_run(run_id, update)
