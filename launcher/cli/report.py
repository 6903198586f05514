"""`verl-launch report RUN`: where the run's allocation went, per attempt and for the run, with a
terminal timeline (one line per attempt); --json the same data; --plot FILE.png the picture
(matplotlib, the `plot` extra)."""

from __future__ import annotations

import json

from .. import api

# One letter per part for the terminal timeline, and what it says in the legend.
LETTERS = {"bring-up": "B", "checks": "C", "verl-start": "V", "training": "=", "validation": "E",
           "checkpoint": "S", "lost": "x", "verl-end": "v", "teardown": "T", "unaccounted": "?"}
WIDTH = 60


def add_parser(sub, ref_help: str) -> None:
    rp = sub.add_parser(
        "report", help="where a run's allocation went: bring-up, verl's start, training kept, work lost, ...",
        description="Where a run's allocated node-seconds went, per attempt (a requeued run's restarts are "
                    "attempts of one run) and in all: bring-up, checks, verl's start, training kept (split by "
                    "verl's own step timings), validation, checkpoint saves, work lost (steps redone after a "
                    "requeue, a step cut short), verl's end, teardown and what no record explains; the goodput "
                    "(kept training over allocated), tokens per second per GPU and, with cluster.gpu_hour_price "
                    "or --price, the cost per kept step. Reads the run's own files and Slurm's accounting. "
                    "What it cannot account is named; the exit code is 0 unless the run does not exist (2).")
    rp.add_argument("ref", metavar="JOB|RUN_DIR", help=ref_help)
    rp.add_argument("--json", action="store_true", help="one JSON object (every attempt, its parts and steps)")
    rp.add_argument("--plot", metavar="FILE.png", help="also draw the timeline (needs verl-launch[plot]: matplotlib)")
    rp.add_argument("--price", type=float, metavar="USD", help="price per GPU-hour (default: the recipe's "
                                                              "cluster.gpu_hour_price)")


def cmd_report(args) -> int:
    if args.price is not None and not 0 <= args.price < float("inf"):
        raise api.RecipeError(f"{args.price} is not a price (0 or more per GPU-hour)", where="command line",
                              key="--price")
    rep = api.run(args.ref).report(price=args.price, plot=args.plot)  # no matplotlib: exit 2 before any work
    if args.json:
        print(json.dumps(rep.to_dict()))
        return 0
    print(text(rep) + (f"\npicture    {args.plot}" if args.plot else ""))
    return 0


def _dur(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def text(rep) -> str:
    from .jobs import _cut  # the toolkit's, imported only when a report is printed

    d = rep.to_dict()
    alloc = d["allocated_node_seconds"]
    lines = [f"run        {rep.run_dir}" + (f" (job {rep.job_id})" if rep.job_id else "")]
    order = list(d["parts"])
    if not rep.attempts:
        lines.append("allocated  nothing yet (the job has not started)")
    for a in rep.attempts:
        q = f", queued {_dur(a.queued)} before" if a.queued is not None else ""
        src = "" if a.source == "slurm" else " (from the job's marks)"
        kept = sorted([s.step for s in a.steps if s.kept] + a.unlogged)
        steps = (f"steps {kept[0]}-{kept[-1]} kept" if len(kept) > 1 else f"step {kept[0]} kept" if kept else
                 "no step kept") + (f" ({', '.join(map(str, a.unlogged))} saved, not logged)" if a.unlogged else "")
        if a.lost_steps:
            steps += f", {len(a.lost_steps)} redone later ({', '.join(map(str, a.lost_steps))})"
        lines.append(f"attempt {a.restart}  {_dur(a.seconds)} x {a.nodes} node(s){src}{q}; {steps}"
                     + (f"; ended: {_cut(a.ended, 100)}" if a.ended else ""))
        lines.append(f"  {timeline(a, order)}")
    if rep.attempts:
        lines.append(f"{'part':<12} {'node-s':>10} {'share':>6}")
        for p, v in d["parts"].items():  # in the report's order
            if v or p in ("training", "lost", "unaccounted"):
                lines.append(f"{p:<12} {v:>10,.0f} {v / alloc if alloc else 0:>6.1%}")
                if p == "training":
                    for k, t in d["training"].items():
                        lines.append(f"  {k:<10} {t:>10,.0f} {t / alloc if alloc else 0:>6.1%}")
        lines.append(f"{'allocated':<12} {alloc:>10,.0f}")
        g, tps = d["goodput"], d["tokens_per_gpu_second"]
        lines.append(f"goodput    {g:.1%} (training kept, over allocated)" if g is not None else "goodput    -")
        if tps is not None:
            lines.append(f"tokens     {tps:,.1f} per second per GPU (verl's perf/total_num_tokens, kept steps)")
        if d["cost"] is not None:
            per = d["cost_per_kept_step"]
            lines.append(f"cost       {d['cost']:,.2f} at {rep.price:g}/GPU-hour"
                         + (f", {per:,.4f} per kept step" if per is not None else ""))
        lines.append("legend     " + " ".join(f"{LETTERS[p]} {p}" for p in d["parts"]))
    for gap in d["gaps"]:
        lines.append(f"not known  {gap}")
    return "\n".join(lines)


def timeline(a, parts) -> str:
    """One attempt as WIDTH characters, each of PARTS in proportion, in the order it was spent."""
    total = a.seconds
    if not total:
        return "(no allocation)"
    cells = []
    for p in (p for p in parts if p != "unaccounted"):
        n = round(WIDTH * a.parts.get(p, 0) / total)
        cells.append(LETTERS[p] * n)
    bar = "".join(cells)[:WIDTH]
    return "|" + bar.ljust(WIDTH, LETTERS["unaccounted"]) + "|"
