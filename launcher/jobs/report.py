"""Where a run's allocation went (`verl-launch report`): per attempt (a requeued run's restarts
are attempts of one run, as its W&B run is one run), the allocated node-seconds split into
bring-up, checks, verl's start, training kept (by verl's own step timings), validation,
checkpoint saves, work lost (steps redone after a requeue, a step cut short), verl's end and the
teardown, with what no record explains shown as unaccounted.

Only local files and the allocation records it is given: the job's phases (phases.jsonl), verl's
step lines in each attempt's driver log (`step:N - timing_s/gen:... - ...`), the watchdog's
step times (logs/steps.rN.jsonl: when each step was first seen, within its 2 s poll) and the
run's record. Slurm's accounting (each attempt's start, end and nodes) comes from the backend;
where it has none, the job's own first and last marks stand in, and the report says so. What it
cannot account (a missing or truncated file) is named in `gaps`, never guessed silently.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from ..core.paths import RunPaths
from .step_lines import TRAINING, Step, read_steps  # verl's step lines in the driver logs

# The parts, in the order a run spends them; "lost" is work done and not kept.
PARTS = ("bring-up", "checks", "verl-start", "training", "validation", "checkpoint", "lost", "verl-end",
         "teardown", "unaccounted")
CHECKS = ("inputs-check", "resume-check", "wandb-check")  # each lasts until the next mark
RAY_MARKS = ("head-up", "workers-up", "ready")
DRIVER_ENDS = ("driver-end", "driver-error", "preempt", "hang", "ray-lost", "teardown")


@dataclass
class Attempt:
    restart: int
    start: Optional[float]  # the allocation (Slurm's accounting, else the job's first mark)
    end: Optional[float]
    nodes: int
    source: str  # "slurm" or "marks": where start and end come from
    queued: Optional[float] = None  # seconds waiting before this attempt (shown, not allocated)
    ended: str = ""  # how the driver ended: the mark and its detail
    parts: Dict[str, float] = field(default_factory=dict)
    training: Dict[str, float] = field(default_factory=dict)
    steps: List[Step] = field(default_factory=list)
    lost_steps: List[int] = field(default_factory=list)
    # steps trained and saved (a later attempt resumed after them) that verl had not logged when
    # the attempt ended (a requeue at the save): their time is training, not split by verl's timings
    unlogged: List[int] = field(default_factory=list)
    running: bool = False  # the run's last attempt, its driver not ended yet
    marks: List[tuple] = field(default_factory=list)  # (name, time) for the picture

    @property
    def seconds(self) -> float:
        return max((self.end or 0) - (self.start or 0), 0.0) if self.start and self.end else 0.0

    @property
    def node_seconds(self) -> float:
        return self.seconds * self.nodes


@dataclass
class Report:
    run_dir: str
    job_id: Optional[str]
    gpus_per_node: int
    attempts: List[Attempt]
    gaps: List[str]
    price: Optional[float] = None  # per GPU-hour

    def _kept(self) -> List[Step]:
        return [s for a in self.attempts for s in a.steps if s.kept]

    @property
    def steps_kept(self) -> int:
        """Steps whose training the run kept: logged and not redone, and saved but unlogged."""
        return len(self._kept()) + sum(len(a.unlogged) for a in self.attempts)

    @property
    def allocated(self) -> float:
        return sum(a.node_seconds for a in self.attempts)

    @property
    def goodput(self) -> Optional[float]:
        """Kept training (validation and saves aside) over allocated, in node-seconds."""
        kept = sum(a.parts.get("training", 0) * a.nodes for a in self.attempts)
        return kept / self.allocated if self.allocated else None

    @property
    def tokens_per_gpu_second(self) -> Optional[float]:
        steps = [s for s in self._kept() if s.tokens]
        secs = sum(s.seconds - s.parts.get("validation", 0.0) for s in steps)  # verl's step timer, as perf/throughput
        gpus = (self.attempts[-1].nodes if self.attempts else 0) * self.gpus_per_node
        return sum(s.tokens for s in steps) / secs / gpus if steps and secs and gpus else None

    @property
    def cost(self) -> Optional[float]:
        return self.price * self.allocated * self.gpus_per_node / 3600 if self.price is not None else None

    def to_dict(self) -> dict:
        kept = self._kept()
        out = {"run_dir": self.run_dir, "job_id": self.job_id, "gpus_per_node": self.gpus_per_node,
               "allocated_node_seconds": self.allocated, "goodput": self.goodput,
               "tokens_per_gpu_second": self.tokens_per_gpu_second, "steps_kept": self.steps_kept,
               "steps_logged": len(kept),
               "parts": {p: sum(a.parts.get(p, 0) * a.nodes for a in self.attempts) for p in PARTS},
               # kept training, by verl's own step timings (in TRAINING's order)
               "training": {k: sum(a.training.get(k, 0) * a.nodes for a in self.attempts) for k in TRAINING},
               "gpu_hour_price": self.price, "cost": self.cost,
               "cost_per_kept_step": self.cost / self.steps_kept if self.cost is not None and self.steps_kept else None,
               "gaps": self.gaps, "attempts": [asdict(a) for a in self.attempts]}
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "Report":
        attempts = [Attempt(**dict(a, steps=[Step(**s) for s in a["steps"]], marks=[tuple(m) for m in a["marks"]]))
                    for a in d["attempts"]]
        return cls(d["run_dir"], d["job_id"], d["gpus_per_node"], attempts, d["gaps"], d.get("gpu_hour_price"))

    def line(self) -> str:
        """status's goodput line: 'goodput 41% of 1,234 node-s allocated (2 attempts; 3 steps lost)'."""
        if not self.allocated:
            return "no allocation yet"
        lost = sum(len(a.lost_steps) for a in self.attempts)
        g = self.goodput
        text = (f"{g:.0%} of {self.allocated:,.0f} node-s allocated kept training" if g is not None else
                f"{self.allocated:,.0f} node-s allocated")
        more = [f"{len(self.attempts)} attempts"] if len(self.attempts) > 1 else []
        more += [f"{lost} step{'s' if lost != 1 else ''} redone"] if lost else []
        return text + (f" ({', '.join(more)})" if more else "") + " (verl-launch report)"


# ----------------------------------------------------------------------------- reading a run's files
def _jsonl(path: Path, gaps: List[str], what: str, fields: Dict[str, type]) -> List[dict]:
    """The JSON objects of PATH's lines whose FIELDS have those types (an int is a float's too);
    the others are counted in GAPS."""
    try:
        text = path.read_bytes().decode(errors="replace")
    except OSError as e:
        gaps.append(f"{what}: {path} cannot be read ({e.strerror or e})")
        return []
    out, bad = [], 0
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if isinstance(entry, dict) and all(_is(entry.get(k), t) for k, t in fields.items()):
            out.append(entry)
        elif line.strip():
            bad += 1
    if bad:
        gaps.append(f"{what}: {bad} unreadable line(s) in {path} (truncated?): what they held is not accounted")
    return out


def _is(value, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # not NaN
    return isinstance(value, kind) and not isinstance(value, bool)


def _count(value, default: int = 1) -> int:
    """A count from a record (nodes, GPUs): a positive int, else DEFAULT."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def build(paths: RunPaths, record: dict, allocations: Optional[List[dict]], price: Optional[float] = None) -> Report:
    """The report of the run in PATHS. ALLOCATIONS: Slurm's accounting, one per attempt in order
    ({start, end, nodes, submit} epoch seconds; [] where it has none; None: no scheduler, a local
    run, whose own marks are its times)."""
    gaps: List[str] = []
    scheduled = allocations is not None
    allocations = allocations or []
    marks = (_jsonl(paths.phases, gaps, "the job's phases", {"phase": str, "time": float, "restart": int})
             if paths.phases.exists() else [])
    if not paths.phases.exists():
        gaps.append(f"the job's phases: {paths.phases} does not exist (the job never started, or it was lost): "
                    "bring-up, checks and verl's start cannot be told apart")
    restarts = sorted({int(m.get("restart", 0)) for m in marks} | set(range(len(allocations))))
    attempts = []
    for r in restarts:
        mine = sorted(((m["phase"], float(m["time"]), m.get("detail", "")) for m in marks
                       if int(m.get("restart", 0)) == r and "time" in m), key=lambda x: x[1])
        alloc = allocations[r] if r < len(allocations) else None
        attempts.append(_attempt(paths, r, mine, alloc, _count(record.get("nodes")), gaps, scheduled))
    _mark_lost(attempts)
    if attempts and not attempts[-1].ended:
        attempts[-1].running = True
    for a in attempts:
        _split(a)
        if a.steps and a.running:
            gaps.append(f"attempt {a.restart} is running: the time since step {a.steps[-1].step} (its step in "
                        "progress) is counted as training, not yet split by verl's timings")
        if a.unlogged:
            after = f"after step {a.steps[-1].step}" if a.steps else "after the driver's start"
            gaps.append(f"attempt {a.restart}: step{'s' if len(a.unlogged) > 1 else ''} "
                        f"{', '.join(map(str, a.unlogged))} trained and saved (the next attempt resumed after "
                        f"{'them' if len(a.unlogged) > 1 else 'it'}) but not logged before the attempt ended: "
                        + ("the time " + after + " is training, not split by verl's timings" if a.steps else
                           "its time is counted as verl's start, not split"))
    for i, a in enumerate(attempts):
        before = allocations[i].get("submit") if i == 0 and allocations else (attempts[i - 1].end if i else
                                                                               record.get("submitted"))
        a.queued = max(a.start - before, 0.0) if a.start and before else None
    return Report(str(paths.run_dir), record.get("job_id"), _count(record.get("gpus_per_node")), attempts, gaps,
                  price if _is(price, float) and price >= 0 else None)


def _attempt(paths: RunPaths, r: int, marks: list, alloc: Optional[dict], nodes: int, gaps: List[str],
             scheduled: bool) -> Attempt:
    """SCHEDULED: Slurm allocated it (a local run is timed by its own marks, and says nothing of it)."""
    if alloc and alloc.get("start") and alloc.get("end"):
        a = Attempt(r, alloc["start"], alloc["end"], int(alloc.get("nodes") or nodes), "slurm")
    else:
        a = Attempt(r, marks[0][1] if marks else None, marks[-1][1] if marks else None, nodes, "marks")
        if marks and scheduled:
            gaps.append(f"attempt {r}: no allocation in Slurm's accounting: from the job's first mark to its last "
                        "(the time before the script's start and after its last mark is not counted)")
    a.marks = [(n, t) for n, t, _ in marks]
    log = paths.driver_log(r)
    if any(n == "driver-start" for n, _, _ in marks):
        if log.exists():
            a.steps = read_steps(log, paths.file(RunPaths.STEPS_READ, restart=r))
        else:
            gaps.append(f"attempt {r}: verl's log {log} is missing: its steps are not accounted")
    ends = [(n, t, d) for n, t, d in marks if n in DRIVER_ENDS and t >= _at(marks, "driver-start", 0)]
    a.ended = f"{ends[0][0]} {ends[0][2]}".strip() if ends else ""
    steps_file = paths.file(RunPaths.STEPS, restart=r)
    times: Dict[int, float] = {}
    for e in _jsonl(steps_file, gaps, "the watchdog's step times", {"step": int, "time": float}) \
            if steps_file.exists() else []:
        times.setdefault(e["step"], float(e["time"]))
    if a.steps and not any(s.step in times for s in a.steps):
        gaps.append(f"attempt {r}: no step times ({steps_file.name}): its steps are placed back to back, the "
                    "last ending with the driver")
        times[a.steps[-1].step] = ends[0][1] if ends else (a.end or 0)
    _place(a.steps, times)
    return a


def _place(steps: List[Step], times: Dict[int, float]) -> None:
    """Each step's end: the watchdog's time where it saw the step, else next to a neighbour's
    (it polls every 2 s: steps shorter than that may pass unseen), by verl's own step times."""
    for s in steps:
        s.end = times.get(s.step)
    for prev, s in zip(steps, steps[1:]):  # after a known one
        if s.end is None and prev.end is not None:
            s.end = prev.end + s.seconds
    for s, nxt in reversed(list(zip(steps, steps[1:]))):  # before one
        if s.end is None and nxt.end is not None:
            s.end = nxt.end - nxt.seconds


def _at(marks: list, name: str, default=None):
    return next((t for n, t, _ in marks if n == name), default)


def _mark_lost(attempts: List[Attempt]) -> None:
    """A step trained again by a later attempt was lost (after the attempt's last checkpoint);
    steps the later attempt resumed after, beyond what this one logged, were kept unlogged."""
    for i, a in enumerate(attempts):
        later = [s.step for b in attempts[i + 1:] for s in b.steps]
        first = min(later) if later else None
        for s in a.steps:
            s.kept = first is None or s.step < first
        a.lost_steps = [s.step for s in a.steps if not s.kept]
        last = max([s.step for s in a.steps], default=_before(attempts, i))
        if first is not None and last is not None and first - 1 > last and a.marks:
            a.unlogged = list(range(last + 1, first))


def _before(attempts: List[Attempt], i: int) -> Optional[int]:
    """The last step logged before attempt I (where it resumed), if any attempt logged one."""
    steps = [s.step for b in attempts[:i] for s in b.steps]
    return max(steps) if steps else None


def _split(a: Attempt) -> None:
    """The attempt's parts, in seconds of its allocation (x nodes for node-seconds)."""
    marks = [(n, t, "") for n, t in a.marks]
    p = dict.fromkeys(PARTS, 0.0)
    t = dict.fromkeys(TRAINING, 0.0)
    if a.start is None or a.end is None:
        a.parts, a.training = p, t
        return
    for i, (n, at, _) in enumerate(marks):
        # a check lasts until the next mark, unless that is Ray's: the job's checks run while Ray
        # starts, and the wait for Ray after them is bring-up
        if n in CHECKS and i + 1 < len(marks) and marks[i + 1][0] not in RAY_MARKS:
            p["checks"] += marks[i + 1][1] - at
    dstart = _at(marks, "driver-start")
    up_to = _at(marks, "ready") or dstart or (marks[-1][1] if marks else a.end)
    p["bring-up"] = max(min(up_to, a.end) - a.start - p["checks"], 0.0)
    dend = next((at for n, at, _ in marks if n in DRIVER_ENDS and dstart is not None and at >= dstart), None)
    if dstart is not None:
        dend = dend if dend is not None else a.end
        first = (a.steps[0].end - a.steps[0].seconds) if a.steps else dend
        p["verl-start"] = max(first - dstart, 0.0)
        for s in a.steps:
            if s.kept:
                for k in TRAINING:
                    t[k] += s.parts.get(k, 0.0)
                p["validation"] += s.parts.get("validation", 0.0)
                p["checkpoint"] += s.parts.get("checkpoint", 0.0)
            else:
                p["lost"] += s.seconds
        if a.steps:
            tail = max(dend - a.steps[-1].end, 0.0)
            # after the last logged step: steps trained and saved but not logged (kept), a step cut
            # short (lost), or verl's own end
            if a.unlogged or a.running:  # (running: the step in progress, as training)
                t["rest"] += tail
            else:
                p["verl-end" if a.ended.startswith("driver-end rc=0") else "lost"] += tail
        p["teardown"] = max(a.end - dend, 0.0)
    elif marks:
        p["teardown"] = max(a.end - up_to, 0.0)
    p["training"] = sum(t.values())
    p["unaccounted"] = a.seconds - sum(v for k, v in p.items() if k != "unaccounted")
    a.parts, a.training = p, t
