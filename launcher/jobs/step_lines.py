"""verl's step lines in a driver log (the console logger's `step:N - key:value - ...`), read as
`report` and `status`'s goodput line need them: each step's wall time split by verl's own
timings, and its tokens.

A long run's log is large (a line of about 4 KB a step): what was read is kept beside it (a
small JSON, RunPaths.STEPS_READ), and the next read parses only what the log gained since, from
the start of its last step line (whose rest Ray may still be writing). The kept part is used only
for the same file grown: another inode, a shorter file or other first bytes (a rotated or
replaced log) is read again from its start; a requeue's attempt has a log, and a record, of its own.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

TRAINING = ("generation", "update", "log-prob", "weight-sync", "rest")  # a kept step, by verl's timings
# verl's timing keys for each part of a step (legacy and V1 trainers; a missing key is 0)
TIMINGS = {"generation": ("gen",), "update": ("update_actor", "update_critic"),
           "log-prob": ("old_log_prob", "ref", "values"), "weight-sync": ("update_weights", "sync_weights"),
           "validation": ("testing",), "checkpoint": ("save_checkpoint",)}
_STEP = re.compile(r"(?<![\w/])step:(\d+) - ([^\n]*)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RAY_PREFIX = re.compile(r"\((?:[\w.]+ )?pid=\d+[^)]*\) ")  # "(TaskRunner pid=12, ip=10.0.0.2) "
_CONTINUED = re.compile(r"^[\w/.\-]*:")
_NUM = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
FORMAT = 1  # of the kept record: another is read again from the start
HEAD = 256  # bytes of the log's start kept with the record: a replaced log differs there


@dataclass
class Step:
    step: int
    seconds: float  # verl's timing_s/step and the validation after it (timing_s/testing): the step's wall time
    parts: Dict[str, float]  # TRAINING + validation, checkpoint: seconds
    tokens: Optional[float] = None  # perf/total_num_tokens
    end: Optional[float] = None  # when it ended (the watchdog's record), epoch seconds
    kept: bool = True


def read_steps(log: Path, kept: Optional[Path] = None) -> List[Step]:
    """verl's step lines in LOG, the last of each step. KEPT: where what was read is kept, so
    that the next read parses only what LOG gained (None: all of it, each time)."""
    with open(log, "rb") as f:
        st = os.fstat(f.fileno())
        head = f.read(HEAD)
        before = _kept(kept, st, head) if kept else None
        by, start = ({s.step: s for s in before[0]}, before[1]) if before else ({}, 0)
        f.seek(start)
        data = f.read()
    new, safe = _parse(data)
    changed = before is None or safe > 0 or any(by.get(n) != s for n, s in new.items())
    by.update(new)
    steps = [by[s] for s in sorted(by)]
    if kept and changed:  # every step: those read again next time (from the last step line on) are replaced then
        _keep(kept, {"format": FORMAT, "inode": st.st_ino, "head": head.hex(), "offset": start + safe,
                     "steps": [_row(s) for s in steps]})
    return steps


_PARTS = (*TRAINING, "validation", "checkpoint")  # a kept step's parts, in a row's order


def _row(s: Step) -> list:
    return [s.step, s.seconds, s.tokens, *(s.parts.get(k) for k in _PARTS)]


def _unrow(row: list) -> Step:
    step, seconds, tokens, *parts = row
    return Step(step, seconds, {k: v for k, v in zip(_PARTS, parts) if v is not None}, tokens)


def _parse(data: bytes) -> Tuple[Dict[int, Step], int]:
    """The steps in DATA, and where the next read must start: at its last step line (Ray may
    still be writing its rest), else after its last whole line."""
    by: Dict[int, Step] = {}
    # bytes: decoding the whole would take the "\r" of tqdm's bar for line ends
    raw = data.split(b"\n")
    lines = [_ANSI.sub("", x.decode(errors="replace")) for x in raw]
    offsets, at = [], 0
    for x in raw:
        offsets.append(at)
        at += len(x) + 1
    found = [(i, m) for i, m in ((i, _STEP.search(x)) for i, x in enumerate(lines)) if m]
    # read again next time: the last, unended line, and the last step line on (its rest may come)
    safe = min([offsets[-1]] + [offsets[i] for i, _ in found[-1:]])
    for i, m in found:
        body = m.group(2)
        foreign = _RAY_PREFIX.search(body)  # another process's output broke into the line (tqdm's bar)
        if foreign:
            body = body[:foreign.start()]
        j = i + 1  # by index: a slice of the rest per step line made a long log's read quadratic
        while j < len(lines) and _continues(lines[j]):
            body += lines[j]
            j += 1
        step = _step(int(m.group(1)), body)
        if step is not None:
            by[step.step] = step
    return by, safe


def _step(n: int, body: str) -> Optional[Step]:
    metrics = {}
    for pair in body.split(" - "):
        key, _, value = pair.partition(":")
        num = _NUM.search(value.split("(", 1)[-1])
        if num:
            metrics[key.strip()] = float(num.group())
    timer = metrics.get("timing_s/step", metrics.get("perf/time_per_step"))
    if timer is None:
        return None
    t = {k: sum(metrics.get(f"timing_s/{n}", 0.0) for n in names) for k, names in TIMINGS.items()}
    # verl's step timer holds the save, not the validation after it (both trainers, 0.9)
    inside = sum(v for k, v in t.items() if k != "validation")
    parts = {k: t[k] for k in TRAINING if k in t}
    parts.update(rest=max(timer - inside, 0.0), validation=t["validation"], checkpoint=t["checkpoint"])
    return Step(n, timer + t["validation"], parts, metrics.get("perf/total_num_tokens"))


def _continues(rest: str) -> bool:
    """Whether REST is the rest of a step line that Ray cut, wherever the cut fell: in a key, a value
    (`426 - timing_s/...`, `(10.5) - ...`), the ` - ` between, or the last value (no space at all);
    never another process's line (Ray's prefix) nor the driver's own words."""
    if not rest or _RAY_PREFIX.match(rest):
        return False
    r = rest.lstrip(" -")
    head, sep, tail = r.partition(" - ")
    if not sep:
        return bool(r) and " " not in r.strip()  # the tail of the line's last value
    return " " not in head and bool(_CONTINUED.match(tail))


def _kept(path: Path, st: os.stat_result, head: bytes):
    """(steps, offset) kept for this same log, grown; None to read it from the start."""
    try:
        d = json.loads(path.read_text())
        if (d["format"], d["inode"], d["head"]) != (FORMAT, st.st_ino, head.hex()) or not 0 <= d["offset"] <= st.st_size:
            return None
        return [_unrow(r) for r in d["steps"]], int(d["offset"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _keep(path: Path, record: dict) -> None:
    """Written whole (a reader never sees half of it), 0600 as the run's files; one that cannot
    be written (another user's run) is no error: the next read parses the whole log again."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
