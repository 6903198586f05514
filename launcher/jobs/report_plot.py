"""`report --plot FILE.png`: the run's allocation as a picture, one row per attempt, time across,
each part in its own colour, requeues and checkpoints marked. matplotlib is an optional extra
(`pip install verl-launch[plot]`), imported only here."""

from __future__ import annotations

from ..errors import RecipeError
from .report import PARTS, Report

COLOURS = {"bring-up": "#9e9e9e", "checks": "#bdbdbd", "verl-start": "#ffb74d", "training": "#43a047",
           "validation": "#1e88e5", "checkpoint": "#8e24aa", "lost": "#e53935", "verl-end": "#ffe082",
           "teardown": "#616161", "unaccounted": "#ffffff"}
LABELS = {"bring-up": "bring-up (allocation to Ray ready)", "checks": "the job's checks",
          "verl-start": "verl's start (imports, model, vLLM)", "training": "training kept",
          "validation": "validation", "checkpoint": "checkpoint saves", "lost": "work lost (redone, cut short)",
          "verl-end": "verl's end", "teardown": "teardown", "unaccounted": "not accounted"}


def need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise RecipeError("--plot needs matplotlib: pip install 'verl-launch[plot]' (or drop --plot: the "
                          "terminal timeline is always printed)", where="command line", key="--plot") from None


def _segments(a):
    """(part, start, seconds) in the order the attempt spent them, from its allocation's start:
    steps one by one, each kept step's validation and save at its end."""
    t, out = 0.0, []
    for p in ("bring-up", "checks", "verl-start"):
        out.append((p, t, a.parts.get(p, 0)))
        t += a.parts.get(p, 0)
    for s in a.steps:
        if s.kept:
            train = s.seconds - s.parts.get("validation", 0) - s.parts.get("checkpoint", 0)
            for p, secs in (("training", train), ("checkpoint", s.parts.get("checkpoint", 0)),
                            ("validation", s.parts.get("validation", 0))):  # verl saves in the step, validates after
                out.append((p, t, secs))
                t += secs
        else:
            out.append(("lost", t, s.seconds))
            t += s.seconds
    redone = sum(s.seconds for s in a.steps if not s.kept)
    logged = sum(s.seconds - s.parts.get("validation", 0) - s.parts.get("checkpoint", 0) for s in a.steps if s.kept)
    for p, secs in (("training", a.parts.get("training", 0) - logged),  # saved, not logged (a.unlogged)
                    ("lost", a.parts.get("lost", 0) - redone), ("verl-end", a.parts.get("verl-end", 0)),
                    ("teardown", a.parts.get("teardown", 0))):
        out.append((p, t, secs))
        t += secs
    return [x for x in out if x[2] > 1e-6]


def plot(rep: Report, path: str) -> None:
    need_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # a file, never a window
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    n = max(len(rep.attempts), 1)
    fig, ax = plt.subplots(figsize=(13, 1.8 + 0.7 * n))
    used = set()
    for row, a in enumerate(rep.attempts):
        y = n - 1 - row
        for p, start, secs in _segments(a):
            ax.barh(y, secs, left=start, height=0.6, color=COLOURS[p], edgecolor="black", linewidth=0.3)
            used.add(p)
        saves, t = [], sum(a.parts.get(p, 0) for p in ("bring-up", "checks", "verl-start"))
        for s in a.steps:
            t += s.seconds
            if s.kept and s.parts.get("checkpoint"):
                saves.append((t - s.parts.get("validation", 0), f"ckpt {s.step}"))
        if a.unlogged:  # saved as the attempt ended, before verl logged it
            saves.append((t + a.parts.get("training", 0) - sum(
                s.seconds - s.parts.get("validation", 0) - s.parts.get("checkpoint", 0) for s in a.steps if s.kept),
                f"ckpt {a.unlogged[-1]}"))
        span = max([b.seconds for b in rep.attempts] + [1])
        last_at = None
        for at, label in saves:
            ax.plot([at, at], [y - 0.38, y + 0.38], color="#4a148c", linewidth=2)
            high = last_at is not None and at - last_at < span / 40  # close to the last label: above it
            ax.annotate(label, (at, y + (0.5 if high else 0.36)), fontsize=7, ha="center", va="bottom")
            last_at = None if high else at
        last = row == len(rep.attempts) - 1
        end = ("" if last else "requeued: ") + (a.ended.split(";")[0][:40] if a.ended else "")
        if end:
            ax.annotate(end, (a.seconds, y), fontsize=7, ha="left", va="center", xytext=(4, 0),
                        textcoords="offset points", color="black" if last else "#b71c1c")
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"attempt {a.restart}" for a in reversed(rep.attempts)] or ["(none)"])
    ax.set_xlabel("seconds from the attempt's allocation")
    g = rep.goodput
    ax.set_title(f"Where the allocation went: {rep.allocated:,.0f} node-seconds"
                 + (f", goodput {g:.0%}" if g is not None else ""))
    ax.set_xlim(0, max([a.seconds for a in rep.attempts] + [1]) * 1.18)  # room for how each ended
    ax.legend(handles=[Patch(facecolor=COLOURS[p], edgecolor="black", label=LABELS[p]) for p in PARTS if p in used],
              loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
