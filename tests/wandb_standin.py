"""A loopback stand-in for W&B and Weave's trace server, for tests.

The real weave client (weave 0.54) runs against it when a process has
``WANDB_BASE_URL=<stand-in url>``, ``WANDB_API_KEY=<its key>`` and ``WANDB_ENTITY``.
It answers only what ``weave.init`` and call tracing need, and records what it gets:

    with StandIn(api_key=key) as w:                 # host="169.254.77.1" for sandbox nodes
        env["WANDB_BASE_URL"] = w.url
        ...run something that traces...
        w.wait_for(lambda s: any(c["op_name"].endswith("execute") for c in s.calls))
        w.calls      # every finished call: op_name, attributes, inputs, output, entity,
                     # project, auth_ok (+ short_name, id, trace_id, parent_id, exception)
        w.requests   # every request: (method, path, authorized)

Endpoints (weave's paths all sit under ``/traces``, as weave derives its trace server
URL as ``<WANDB_BASE_URL>/traces``):

- ``GET  /traces/server_info``                      version handshake
- ``POST /graphql``                                 viewer, project, upsertModel, serverInfo
- ``POST /traces/v2/<entity>/<project>/calls/complete``  batch of finished calls (default path)
- ``POST /traces/call/upsert_batch``                the legacy start/end batch
- ``POST /traces/v2/<entity>/<project>/call/start|end``  eager single start/end
- ``POST /traces/obj/create``, ``/traces/file/create``, ``/traces/table/create``
- ``POST /traces/service/projects_info``            (only with client-side digests on)
Anything else gets a 404 and lands in ``.unknown``, so a newer weave that needs more
shows up there instead of silently losing traces.

Every request must carry ``Authorization: Basic base64("api:<key>")``; others get a 401
and are still recorded (``authorized`` False), so a test can assert the key was used.
``mode="silent"`` accepts TCP connections and never answers, for reachability timeouts.
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
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

# weave refuses a server whose version it does not know to be compatible; a high
# version with a low client requirement passes every check.
SERVER_INFO = {"min_required_weave_python_version": "0.0.1", "trace_server_version": "99.0.0"}

_V2_PATH = re.compile(r"^/traces/v2/(?P<entity>[^/]+)/(?P<project>[^/]+)/(?P<rest>.+)$")


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
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._expected_auth = "Basic " + base64.b64encode(f"api:{api_key}".encode()).decode()
        self._held: list[socket.socket] = []       # silent mode: connections kept open
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

    def calls_named(self, suffix: str) -> list[dict[str, Any]]:
        """Calls whose op name ends with suffix (weave turns op names into refs)."""
        return [c for c in self.calls if _op_short_name(c["op_name"]).endswith(suffix)]

    # -- recording (called from handler threads) -------------------------------------------

    def _record_request(self, method: str, path: str, authorized: bool) -> None:
        with self._changed:
            self.requests.append((method, path, authorized))
            self._changed.notify_all()

    def _record(self, *, calls=(), body=None, path=None, unknown=None) -> None:
        with self._changed:
            self.calls.extend(calls)
            if path is not None:
                self.bodies.append((path, body))
            if unknown is not None:
                self.unknown.append(unknown)
            self._changed.notify_all()


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

        def _handle(self, method: str) -> None:
            path = self.path.split("?", 1)[0]
            raw = self._read_body()          # always drain, or keep-alive breaks
            ok = self._authorized()
            standin._record_request(method, path, ok)
            body = _decode_body(raw, self.headers.get("Content-Encoding", "")) if raw else None
            if method == "POST":
                standin._record(body=body, path=path)
            # Routed even without the key, so calls sent with a wrong key are recorded
            # (auth_ok False) and a test can see what would have leaked; the answer is 401.
            status, payload = self._route(method, path, body, raw, ok, self.client_address[0])
            if not ok:
                status, payload = 401, {"errors": [{"message": "stand-in: missing or wrong API key"}]}
            self._reply(status, payload)

        def _route(self, method: str, path: str, body: Any, raw: bytes, ok: bool,
                   client: str) -> tuple[int, Any]:
            if method == "GET" and path == "/traces/server_info":
                return 200, SERVER_INFO
            if method == "POST" and path == "/graphql":
                return 200, _graphql(standin, body or {})
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


def _graphql(standin: StandIn, body: dict) -> dict:
    """Answer the few W&B GraphQL queries weave sends, by what the query asks for."""
    query = body.get("query") or ""
    variables = body.get("variables") or {}
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
    standin._record(unknown=("POST /graphql", query.strip().split("\n", 1)[0]))
    return {"data": None, "errors": [{"message": "stand-in does not know this query"}]}
