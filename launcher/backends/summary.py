"""What a cluster user weighs before queueing, for `check`: where the job goes (partition,
account, QOS), its size and time limit, the GPU-hours it may spend (restarts included), the
image or interpreter the nodes run, what it starts from (launcher.prior), and, where Slurm
answers, the partition's size and when the job would start (`sbatch --test-only`). It warns,
never refuses: `check`'s verdict stays submit's. Slurm is asked through launcher.backends.slurm_commands only."""

from __future__ import annotations

from typing import List, Optional, Tuple

from ..errors import SlurmError

Line = Tuple[str, str]  # (label, text); a label "WARNING" is a warning


def hours(limit: Optional[str]) -> Optional[float]:
    """A Slurm time limit in hours; None if unset, unlimited (0 included) or unreadable."""
    from ..checks.fields import _seconds

    secs = _seconds((limit or "").strip() or None)
    return None if secs is None else secs / 3600


def _gpu_hours(r, limit: Optional[str], where: str) -> str:
    c = r.cluster
    size = f"{c.nodes} node(s) x {c.gpus_per_node} GPU(s)"
    h = hours(limit)
    if h is None:
        return f"{size}, time limit {limit or 'unset'}{where}: GPU-hours unbounded by the job"
    gpus = c.nodes * c.gpus_per_node
    text = f"{size} for up to {limit}{where}: at most {gpus * h:g} GPU-hours"
    if c.requeue:
        runs = 1 + c.max_restarts
        text += f", {gpus * h * runs:g} with its restarts (cluster.max_restarts={c.max_restarts})"
    return text


def _image(r) -> List[Line]:
    image = r.container.image
    if not image:
        return [("nodes run", f"{r.runtime.python} (runtime.python; no container.image)"
                 + (f", after runtime.setup ({len(r.runtime.setup)} line(s))" if r.runtime.setup else ""))]
    from ..checks.fields import image_warnings

    local = image.startswith(("/", "."))
    lines = [("image", f"{image} ({'a squashfs on shared storage' if local else 'pulled by enroot on every node at each start'})")]
    return lines + [("WARNING", w) for w in image_warnings(r)]


def _trainer(r, verl_args) -> Optional[str]:
    """Which of verl's trainers runs; None where a version rule chose it (api.preflight's line
    already says which, and why)."""
    from ..base.verl_versions import rules_for

    if r.verl.entrypoint.split(".")[0] == "launcher":
        return f"{r.verl.entrypoint}: the launcher's stand-in driver, not verl"
    if any(rule.key == "trainer.use_v1" for rule in rules_for(r)):
        return None
    args = dict(a.split("=", 1) for a in verl_args if "=" in a)
    if args.get("trainer.use_v1") == "false":
        return f"{r.verl.entrypoint}, verl's legacy trainer (trainer.use_v1=false, the recipe's choice)"
    return f"{r.verl.entrypoint}, verl's V1 trainer (verl's default: with trace.backend=none nothing needs the legacy one)"


def _ray_auth(c) -> Line:
    """What the job's Ray accepts (docs/security.md, "The job's Ray cluster": measured on the sandbox)."""
    from ..checks.fields import ray_auth_warning

    if c.ray_auth_off is not None:
        return ("WARNING", ray_auth_warning(c))
    return ("ray", "token authentication: only the job's own processes join its Ray (a new token at each start, "
                   "0600 in the run directory); still open: Ray's metrics port (read-only), and the token and "
                   "Ray's traffic travel unencrypted (docs/security.md)")


def weigh(plan, had, script: Optional[str] = None, ask_slurm: bool = True) -> List[Line]:
    """The lines `check` prints before its verdict, of PLAN (plan.Plan) and HAD (what the
    experiment already has: prior.find); SCRIPT: the rendered job script, for
    `sbatch --test-only`; ASK_SLURM false: nothing is asked of Slurm, as for --local."""
    from . import slurm_commands as slurm

    r = plan.recipe
    c = r.cluster
    lines: List[Line] = []
    part, parts, slurm_said, unknown = None, [], None, []
    if ask_slurm:
        try:  # a list (p1,p2): Slurm starts the job in whichever can first
            for asked in (c.partition.split(",") if c.partition else [None]):
                found = slurm.partition(asked)
                if found is None:
                    unknown.append(f"cluster.partition: Slurm has no partition {asked!r}" if asked
                                   else "Slurm names no default partition: set cluster.partition")
                else:
                    parts.append(found)
        except SlurmError as e:
            slurm_said = str(e)
    part = parts[0] if parts else None
    name = c.partition or (part or {}).get("PartitionName")
    lines.append(("slurm", f"partition={name or '(the default)'} account={c.account or '(your default)'} "
                           f"qos={c.qos or '(default)'}"))
    limit, where = c.time, " (cluster.time)"
    if limit is None and part:
        default = part.get("DefaultTime") not in (None, "NONE")
        limit = part.get("DefaultTime") if default else part.get("MaxTime")
        where = f" (partition {part.get('PartitionName')}'s {'DefaultTime' if default else 'MaxTime'})"
    lines.append(("size", _gpu_hours(r, limit, where if limit else "")))
    lines += _image(r)
    trainer = _trainer(r, plan.verl_args)
    if trainer:
        lines.append(("trainer", trainer))
    if r.verl.version and plan.node_check.get("verl_version"):
        lines.append(("verl", f"{r.verl.version} (verl.version): confirmed on every node at job start"
                              + (", in the container" if r.container.image else "")))
    lines.append(("start", had.describe()))
    lines.append(_ray_auth(c))
    lines += [("WARNING", u) for u in unknown]
    room = [slurm.node_room(p) for p in parts]
    if parts and all(n is not None and c.nodes > n for n, _ in room):
        why = ", ".join(f"partition {p.get('PartitionName')} {what}" for p, (_, what) in zip(parts, room))
        lines.append(("WARNING", f"cluster.nodes={c.nodes}, but {why}: Slurm would keep the job pending for ever"))
    if ask_slurm and script is not None and slurm_said is None:
        try:
            ok, said = slurm.test_only(script)
            lines.append(("queue", f"would start at {said} (sbatch --test-only)") if ok
                         else ("WARNING", f"sbatch --test-only refuses it: {said}"))
        except SlurmError as e:
            slurm_said = str(e)
    if slurm_said:
        lines.append(("slurm?", f"not asked: {slurm_said}"))
    return lines
