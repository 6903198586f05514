"""The W&B stand-in's reads: the subset of Weave's call query (``/traces/calls/stream_query``,
``/traces/calls/query_stats``, ``/traces/call/read``) over the calls it recorded.

Weave's request body: ``project_id`` ("entity/project"), ``filter`` (op_names, trace_ids,
call_ids, parent_ids, trace_roots_only), ``query`` ({"$expr": ...} with $and $or $not $eq
$gt $gte $lt $lte $in $contains $getField $literal $convert), ``sort_by`` ([{field,
direction}]), ``limit``, ``offset``, ``columns``. Anything else in a request is refused with
a 400 naming it, so a client that relies on more shows up in a test instead of being
answered wrongly. Field paths are dotted (``attributes.step``, ``output.num_turns``); a
missing field is None, as a JSON null is in Weave.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Iterator, List, Optional

# The fields of weave's CallSchema that a recorded call has; what a query may return or select.
CALL_FIELDS = ("id", "project_id", "op_name", "display_name", "trace_id", "parent_id", "started_at",
               "ended_at", "attributes", "inputs", "output", "summary", "exception", "wb_user_id",
               "wb_run_id", "deleted_at")
ALWAYS = ("id", "project_id", "op_name", "trace_id", "parent_id", "started_at")  # returned whatever columns say
KNOWN_KEYS = {"project_id", "filter", "query", "sort_by", "limit", "offset", "columns", "expand_columns",
              "include_costs", "include_feedback", "include_storage_size", "include_total_storage_size",
              "include_usernames", "return_expanded_column_values", "latest_only"}
FILTER_KEYS = {"op_names", "trace_ids", "call_ids", "parent_ids", "trace_roots_only"}


class QueryError(ValueError):
    """What the stand-in cannot answer (a 400 with this text)."""


def as_call(rec: dict) -> dict:
    """A recorded call as Weave's query returns it."""
    call = {k: rec.get(k) for k in CALL_FIELDS}
    call["project_id"] = f"{rec.get('entity')}/{rec.get('project')}"
    call["summary"] = call["summary"] or {}
    return call


def get_field(call: dict, path: str) -> Any:
    value: Any = call
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _convert(value: Any, to: str) -> Any:
    if to == "exists":
        return value is not None
    if value is None:
        return None
    try:
        if to == "int":
            return int(float(value)) if not isinstance(value, bool) else int(value)
        if to == "double":
            return float(value)
        if to == "bool":
            return value if isinstance(value, bool) else str(value).lower() in ("true", "1")
        if to == "string":
            return json.dumps(value) if isinstance(value, (dict, list, bool)) else str(value)
    except (TypeError, ValueError):
        return None
    raise QueryError(f"$convert to {to!r} is not one of double, string, int, bool, exists")


def _compare(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def cmp(a, b):
        if a is None or b is None:
            return False
        try:
            return op(a, b)
        except TypeError:  # a string against a number: as in SQL, no match
            return False
    return cmp


_BINARY = {
    "$eq": lambda a, b: a == b and isinstance(a, bool) == isinstance(b, bool),  # true is not 1
    "$gt": _compare(lambda a, b: a > b), "$gte": _compare(lambda a, b: a >= b),
    "$lt": _compare(lambda a, b: a < b), "$lte": _compare(lambda a, b: a <= b),
}


def evaluate(expr: Any, call: dict) -> Any:
    """The value of a Weave query expression for one call."""
    if not isinstance(expr, dict) or len(expr) != 1:
        raise QueryError(f"not an operation: {json.dumps(expr)[:200]}")
    (op, arg), = expr.items()
    if op == "$literal":
        return arg
    if op == "$getField":
        return get_field(call, arg)
    if op == "$convert":
        return _convert(evaluate(arg["input"], call), arg["to"])
    if op == "$and":
        return all(evaluate(e, call) for e in arg)
    if op == "$or":
        return any(evaluate(e, call) for e in arg)
    if op == "$not":
        return not evaluate(arg[0], call)
    if op in _BINARY:
        a, b = (evaluate(e, call) for e in arg)
        return bool(_BINARY[op](a, b))
    if op == "$in":
        a, options = evaluate(arg[0], call), [evaluate(e, call) for e in arg[1]]
        return a in options
    if op == "$contains":
        text, sub = evaluate(arg["input"], call), evaluate(arg["substr"], call)
        if text is None or sub is None:
            return False
        text, sub = str(text), str(sub)
        if arg.get("case_insensitive"):
            text, sub = text.lower(), sub.lower()
        return sub in text
    raise QueryError(f"operation {op} is not in the stand-in's subset of Weave's query language")


def _op_matches(op_name: str, wanted: Iterable[str]) -> bool:
    for w in wanted:
        if w.endswith(":*") and op_name.startswith(w[:-1]) or op_name == w:
            return True
    return False


def select(calls: List[dict], req: dict) -> Iterator[dict]:
    """The calls REQ asks for, in its order, cut to its columns (weave's stream_query)."""
    req = {k: v for k, v in req.items() if v is not None}   # the client sends every field, null when unset
    unknown = set(req) - KNOWN_KEYS
    if unknown:
        raise QueryError(f"the stand-in does not answer {sorted(unknown)}")
    f = {k: v for k, v in (req.get("filter") or {}).items() if v is not None}
    if set(f) - FILTER_KEYS:
        raise QueryError(f"the stand-in does not filter on {sorted(set(f) - FILTER_KEYS)}")
    entity, _, project = (req.get("project_id") or "").partition("/")
    sets = {field: set(f[k]) for k, field in (("trace_ids", "trace_id"), ("call_ids", "id"), ("parent_ids", "parent_id"))
            if f.get(k) is not None}
    expr = (req.get("query") or {}).get("$expr")
    found = []
    for rec in calls:
        if (rec.get("entity"), rec.get("project")) != (entity, project):
            continue
        if f.get("trace_roots_only") and rec.get("parent_id"):
            continue
        if f.get("op_names") and not _op_matches(rec.get("op_name") or "", f["op_names"]):
            continue
        if any(rec.get(field) not in ids for field, ids in sets.items()):
            continue
        call = as_call(rec)
        if expr is not None and not evaluate(expr, call):
            continue
        found.append(call)
    for s in reversed(req.get("sort_by") or [{"field": "started_at", "direction": "asc"}]):
        # None sorts first ascending, as ClickHouse's NULLS FIRST for asc
        found.sort(key=lambda c: _sort_key(get_field(c, s["field"])), reverse=s.get("direction") == "desc")
    offset = req.get("offset") or 0
    limit = req.get("limit")
    found = found[offset:None if limit is None else offset + limit]
    columns = req.get("columns")
    for call in found:
        yield _cut(call, columns) if columns else call


def _cut(call: dict, columns: List[str]) -> dict:
    """CALL with only COLUMNS (dotted ones: that part of the field) and what is always sent."""
    out = {k: call.get(k) for k in ALWAYS}
    for col in columns:
        head, _, rest = col.partition(".")
        if head not in CALL_FIELDS:
            raise QueryError(f"column {col!r} is not a call field")
        if not rest:
            out[head] = call.get(head)
            continue
        value = get_field(call, col)
        node = out.setdefault(head, {})
        if not isinstance(node, dict):
            continue  # the whole field is already there
        parts = rest.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


def _sort_key(value: Any) -> tuple:
    if value is None:
        return (0, 0, "")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (1, value, "")
    return (2, 0, str(value))


def stats(calls: List[dict], req: dict) -> dict:
    """weave's query_stats: how many calls the filter and query match (up to limit)."""
    body = {k: v for k, v in req.items() if k not in ("include_total_storage_size",)}
    n = sum(1 for _ in select(calls, {**body, "columns": ["id"]}))
    out = {"count": n}
    if req.get("include_total_storage_size"):
        out["total_storage_size_bytes"] = sum(len(json.dumps(c)) for c in select(calls, {**body, "limit": None}))
    return out


def read(calls: List[dict], project_id: str, call_id: str) -> Optional[dict]:
    for c in select(calls, {"project_id": project_id, "filter": {"call_ids": [call_id]}}):
        return c
    return None
