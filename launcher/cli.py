"""The command line: parse arguments, call recipe/render/slurm, print, pick the exit code."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import List, Optional

from . import __version__
from .console import fail as _fail
from .errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_NEVER_STARTS, RecipeError, SlurmError

EPILOG = """\
Overrides use Hydra's grammar, e.g.  cluster.nodes=4  wandb.experiment=try2
verl.overrides.trainer.total_epochs=2  verl.overrides.data.seed=7
A `+` adds a key verl's config lacks, which only free-form sections take, e.g.
+verl.overrides.actor_rollout_ref.model.override_config.attention_dropout=0.0
(verl's keys are checked against a snapshot of its config: a typo is exit 2, with a suggestion).

Flags may come anywhere among the overrides (submit R --dry-run cluster.nodes=3).
Exit codes: 0 ok, 1 a Slurm command or the job failed, 2 bad input (nothing written, nothing
queued), 3 --wait on a job Slurm can never start (it stays queued).
The W&B key comes from $WANDB_API_KEY, wandb.api_key_file or ~/.netrc; it is never written anywhere.
"""


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return n


class _Parser(argparse.ArgumentParser):
    """argparse, saying what to type where a recipe command got no recipe (not argparse's
    `the following arguments are required: RECIPE, OVERRIDE`). Exit 2, as any usage error."""

    def error(self, message: str):
        if "required: RECIPE" in message and self.prog.split()[-1] in RECIPE_COMMANDS:
            message = f"give a recipe file, e.g. {self.prog} recipes/sandbox-demo.yaml"
        super().error(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="verl-launch",
        description="Render, check and submit VERL runs (Ray + Weave tracing) to Slurm, one run or a "
                    "sweep (-m, one job array); follow them: list, status, logs, cancel; and merge a run's "
                    "checkpoint into a Hugging Face model.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"verl-launch {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def recipe_cmd(name: str, help: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help, description=help, epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        c.add_argument("recipe", metavar="RECIPE", help="recipe YAML file")
        c.add_argument("overrides", metavar="OVERRIDE", nargs="*", help="Hydra override, key=value")
        return c

    def sweep_flags(c: argparse.ArgumentParser) -> None:
        c.add_argument("-m", "--multirun", action="store_true",
                       help="a sweep: overrides in Hydra's sweep grammar (lr=1e-6,1e-5  n=range(2,9,2)  "
                            "x=choice(a,b)) expand to one run per point, all in one Slurm job array")
        c.add_argument("--max-points", type=_positive, default=256, metavar="N",
                       help="refuse a sweep of more than N points (default 256)")

    recipe_cmd("render", "print the sbatch script a recipe renders to")
    ck = recipe_cmd("check", "validate a recipe (verl's keys against a snapshot of verl's config), run verl's "
                             "own checks on its overrides (in runtime.python, cached), and show what would run; "
                             "the exit code is submit's verdict (0 it would queue, 2 it would refuse)")
    sweep_flags(ck)
    s = recipe_cmd("submit", "check (as `check`), write a run directory and submit the script with sbatch")
    sweep_flags(s)
    s.add_argument("--max-parallel", type=_positive, metavar="K",
                   help="with -m: at most K points run at once (the array's %%K)")
    s.add_argument("--local", action="store_true",
                   help="run the same script here, without Slurm: one node, this machine's GPUs "
                        "(CUDA_VISIBLE_DEVICES), free ports; for a one-box smoke run (CI)")
    s.add_argument("--no-check", action="store_true",
                   help="skip verl's own checks (the launcher's checks still run)")
    s.add_argument("--dry-run", action="store_true",
                   help="print the exact command and script; write and submit nothing")
    s.add_argument("--json", action="store_true", help="print one JSON object (job_id, run_dir, script, stdout, ...)")
    start = s.add_mutually_exclusive_group()
    start.add_argument("--fresh", action="store_const", const="fresh", dest="start", default="auto",
                       help="start the experiment from scratch: refuse (exit 2) if it already has checkpoints "
                            "or an earlier run logging to its W&B run")
    start.add_argument("--resume", action="store_const", const="resume", dest="start",
                       help="continue the experiment: refuse (exit 2) unless it has a checkpoint verl resumes "
                            "from. Without either, verl's trainer.resume_mode=auto decides, and `check` says which")
    s.add_argument("--wait", action="store_true",
                   help="follow the job until it ends (Ctrl-C detaches; the job stays queued or keeps running); "
                        "exit 0 if it COMPLETED, 1 otherwise, 3 if Slurm says it can never start (left queued)")

    ls = sub.add_parser("list", help="recent runs: job id, name, experiment, state, nodes, elapsed, run dir",
                        description="Recent runs from the run registry, with their Slurm state (one batched query).")
    ls.add_argument("-n", type=_positive, default=20, metavar="N", help="how many runs (default 20)")
    ls.add_argument("--json", action="store_true", help="one JSON array")
    st = sub.add_parser("status", help="a run's Slurm state, in-job phase, exit code and W&B links",
                        description="A run's Slurm state, in-job phase, exit code and W&B links.")
    st.add_argument("ref", metavar="JOB|RUN_DIR")
    st.add_argument("--json", action="store_true", help="one JSON object")
    lg = sub.add_parser("logs", help="print a run's output (-f: follow until the job ends)",
                        description="Print a run's batch output, or the driver's, or a node's Ray log.")
    lg.add_argument("ref", metavar="JOB|RUN_DIR")
    lg.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    which = lg.add_mutually_exclusive_group()
    which.add_argument("--driver", action="store_true", help="the driver's log")
    which.add_argument("--node", metavar="NODE", help="that node's Ray log")
    im = sub.add_parser("image", help="container images for pyxis/enroot (SUNK)",
                        description="Container images for pyxis/enroot.")
    imsub = im.add_subparsers(dest="image_command", metavar="ACTION", required=True)
    imp = imsub.add_parser("import", help="turn IMAGE into a squashfs on shared storage, once",
                           description="Run `enroot import` on this (login) node, once: the nodes then mount "
                                       "the file (container.image=PATH) instead of each pulling the image. "
                                       "An existing file is reused.")
    imp.add_argument("image", metavar="IMAGE", help="e.g. verlai/verl:tag or nvcr.io/nvidia/pytorch:24.01-py3")
    imp.add_argument("-o", "--output", metavar="DIR", default=".",
                     help="directory on shared storage for the .sqsh (default: here)")
    imp.add_argument("--dry-run", action="store_true", help="print the command and the path; run nothing")
    mg = sub.add_parser("merge", help="turn a run's FSDP checkpoint into a Hugging Face model (verl's merger, "
                                      "as a one-node job)",
                        description="Merge a run's FSDP checkpoint into a Hugging Face model with verl's own merger "
                                    "(python -m verl.model_merger merge --backend fsdp), as a one-node Slurm job "
                                    "submitted with submitit, sized from the checkpoint, with the run's interpreter, "
                                    "setup and container. The result is checked (config, weights load, parameter "
                                    "count) and recorded in the run's run.json. --serve-check then loads it in vLLM "
                                    "and generates from the model's own chat template.")
    mg.add_argument("ref", metavar="RUN|CHECKPOINT_DIR",
                    help="a run (job id or run directory) or a checkpoint directory (verl's default_local_dir, "
                         "a global_step_N in it, or its actor/)")
    mg.add_argument("--step", default="latest", metavar="N|latest",
                    help="which checkpoint (default: latest, from latest_checkpointed_iteration.txt)")
    mg.add_argument("--target", metavar="DIR", help="where the model goes (default: huggingface_merged beside "
                                                    "the step's actor/)")
    mg.add_argument("--local", action="store_true", help="run it here (submitit's local executor), not under Slurm")
    mg.add_argument("--wait", action="store_true", help="wait for it; exit 0 if the merge succeeded, 1 otherwise")
    mg.add_argument("--serve-check", action="store_true",
                    help="then load the merged model in vLLM (the run's interpreter) and generate a few tokens from "
                         "a prompt in its chat template; the job asks for 1 GPU where the run's nodes have GPUs")
    mg.add_argument("--dry-run", action="store_true", help="say what would be submitted (checkpoint, target, "
                                                           "memory, GPUs, interpreter); submit nothing")
    mg.add_argument("--json", action="store_true", help='print one JSON object: {"job_id", "target", "step"}')
    cn = sub.add_parser("cancel", help="scancel a run and wait for its terminal state",
                        description="scancel a run, wait for its terminal state, and record it in the run.")
    cn.add_argument("ref", metavar="JOB|RUN_DIR")
    return p


RECIPE_COMMANDS = ("render", "check", "submit")


def _parse(argv: Optional[List[str]]) -> argparse.Namespace:
    """Flags anywhere, as people type them (`submit R --dry-run cluster.nodes=3`): what argparse
    leaves after a flag is more overrides, in order; anything else is argparse's usage error."""
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command in RECIPE_COMMANDS and not any(a.startswith("-") for a in rest):
        args.overrides += rest
        return args
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = _parse(argv)
    try:
        if getattr(args, "max_parallel", None) and not args.multirun:
            raise RecipeError("--max-parallel is for a sweep (-m)", where="command line")
        if getattr(args, "multirun", False) and getattr(args, "start", "auto") != "auto":
            raise RecipeError(f"--{args.start} is for one run, not a sweep (-m): each point is an experiment "
                              "of its own", where="command line")
        if getattr(args, "multirun", False):
            from . import sweep_cli

            return _flushed(getattr(sweep_cli, f"cmd_{args.command}")(args))
        own = {"render": cmd_render, "check": cmd_check, "submit": cmd_submit, "image": cmd_image,
               "merge": cmd_merge}
        if args.command in own:
            code = own[args.command](args)
        else:
            from . import jobs  # the job toolkit: not loaded for rendering

            code = getattr(jobs, f"cmd_{args.command}")(args)
        return _flushed(code)
    except RecipeError as e:
        return _fail(f"error: {e}", EXIT_BAD_INPUT)
    except SlurmError as e:
        return _fail(f"error: {e}", EXIT_FAILED)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`check R | head -1`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _flushed(code: int) -> int:
    sys.stdout.flush()  # here, not at exit: a closed pipe is then ours to handle
    return code


def _load(args):
    from .api import load

    return load(args.recipe, args.overrides, getattr(args, "local", False), os.environ, notes=sys.stderr)


def cmd_render(args) -> int:
    from .render import render

    sys.stdout.write(render(_load(args).plan))
    return 0


def cmd_check(args) -> int:
    """Everything `submit` checks, in the same order, with what would run; the exit code and
    the last line are `submit`'s verdict (a missing key: 2, as `submit` refuses)."""
    from .overrides import verl_args
    from .secrets import SecretInRecipe, find_key, needs_key, require

    loaded = _load(args)
    r = loaded.recipe
    try:
        require(r, os.environ)
        refusal = None
    except SecretInRecipe:  # at once: what would be shown holds the secret
        raise
    except RecipeError as e:  # shown last: what submit would say, after what it would run
        refusal = e
    try:
        pre = _preflight(loaded, sys.stdout)
    except RecipeError as e:
        if refusal is None:
            raise
        print(f"preflight   {e}")
        return _fail(f"error: {refusal}", EXIT_BAD_INPUT)
    c = r.cluster
    print(f"recipe      {r.source}")
    print(f"job         {r.job.name}: {c.nodes} node(s) x {c.gpus_per_node} GPU(s), "
          f"{c.cpus_per_task} CPUs per node" + (f", requeue (USR1 {c.signal_seconds} s before the limit)"
                                               if c.requeue else ""))
    print(f"entrypoint  {r.runtime.python} -m {r.verl.entrypoint}")
    print(f"verl keys   {loaded.verl_keys}")
    print(f"W&B         project={r.wandb.project} entity={r.wandb.entity or '(key default)'} "
          f"experiment={r.experiment} logging={'on' if r.wandb.enabled else 'off'}")
    print(f"trace       backend={r.trace.backend} token2text={r.trace.token2text} "
          f"max_samples_per_step_per_worker={r.trace.max_samples_per_step_per_worker}")
    if needs_key(r):
        try:
            src = find_key(r, os.environ)
            print(f"W&B key     {src.where if src else 'MISSING: export WANDB_API_KEY, set wandb.api_key_file or use ~/.netrc'}")
        except RecipeError:  # a malformed key: said below
            print("W&B key     refused (see below)")
    for name in r.secrets:
        print(f"secret      {name}: {'set' if os.environ.get(name) else 'NOT SET in your environment'}")
    from .slurm import plan
    from .summary import weigh

    local = getattr(args, "local", False)
    for label, text in weigh(loaded, None if local else plan(loaded).script, ask_slurm=not local):
        print(f"{label:<11} {text}")
    print("verl args")
    for a in verl_args(r):
        print(f"  {a}")
    if refusal is not None:
        return _fail(f"error: {refusal}", EXIT_BAD_INPUT)
    print("ok: submit would queue this job" + ("" if pre.status in ("ok", "skipped") else
                                                 f" (launcher checks only: verl's {pre.status})"))
    return 0


def _preflight(loaded, out):
    from .api import preflight

    return preflight(loaded, os.environ, out)


def cmd_image(args) -> int:
    import shlex
    from pathlib import Path

    from .images import import_command, import_image

    out = Path(args.output).expanduser().absolute()
    cmd = import_command(args.image, out)
    if args.dry_run:
        print(f"# would run: {shlex.join(cmd)}")
        print(f"container.image={cmd[3]}")
        return 0
    existed = Path(cmd[3]).exists()
    path = import_image(args.image, out)
    print(f"{'already imported' if existed else 'imported'}: {path}")
    print(f"use it with: container.image={path}")
    return 0


def cmd_merge(args) -> int:
    from .api import merge, plan_merge, wait_merge

    out = sys.stderr if args.json else sys.stdout
    if args.dry_run:
        p = plan_merge(args.ref, args.step, args.target, args.local, args.serve_check)
        spec = p["spec"]
        print(f"would merge step {p['ckpt'].step} of {spec.checkpoint} "
              f"{'here (submitit local executor)' if args.local else 'as a one-node Slurm job'}: "
              f"{p['mem_gb']} GB of memory, {p['gpus']} GPU(s)", file=out)
        print(f"  target       {spec.target}", file=out)
        print(f"  interpreter  {spec.python}", file=out)
        if args.serve_check:
            print(f"  serve check  vLLM loads the merged model and generates ({p['vllm']})"
                  + ("; it asks for 1 GPU: the run's nodes have GPUs" if p["gpus"] else ""), file=out)
        if args.json:
            print(json.dumps({"dry_run": True, "step": p["ckpt"].step, "checkpoint": spec.checkpoint,
                              "target": spec.target, "mem_gb": p["mem_gb"], "gpus": p["gpus"],
                              "python": spec.python, "serve_check": args.serve_check}))
        return 0
    job = merge(args.ref, args.step, args.target, args.local, args.serve_check)
    info = job.verl_launch
    where = "here (submitit's local executor)" if args.local else f"as Slurm job {info['job_id']}"
    print(f"merging step {info['step']} of {info['checkpoint']} {where}, {info['mem_gb']} GB of memory"
          + (f", {info['gpus']} GPU" if info["gpus"] else ""), file=out)
    print(f"  target  {info['target']}", file=out)
    print(f"  output  {job.paths.stdout}", file=out)
    if args.serve_check:
        print("  then    vLLM loads it and generates from its chat template (--serve-check)", file=out)
    result = {"job_id": info["job_id"], "target": info["target"], "step": info["step"]}
    if not args.wait:  # it goes on without us: say how to follow it
        from .registry import find

        where = (f"it runs here in the background, pid {info['job_id']}" if args.local
                 else f"Slurm job {info['job_id']}")
        status = f"`verl-launch status {args.ref}` shows the result; " if find(args.ref) else ""
        print(f"Follow it: tail -f {job.paths.stdout}   ({where}; {status}merge ... --wait waits for it)",
              file=out)
    if args.wait:
        try:
            wait_merge(job, on_change=lambda state: print(f"  {state}", file=out, flush=True))
        except SlurmError as e:
            return _fail(f"error: {e}", EXIT_FAILED)
        print(f"merged: {info['target']}", file=out)
        served = _served(info["target"])
        if served:
            print(f"served: vLLM answered {served['prompt']!r} with {served['output']!r}", file=out)
            result["serve_check"] = served
    if args.json:
        print(json.dumps(result))
    return 0


def _served(target: str) -> Optional[dict]:
    from .merge_job import MARKER

    try:
        return json.loads(Path(target, MARKER).read_text()).get("serve_check")
    except (OSError, ValueError):
        return None


def cmd_submit(args) -> int:
    from .api import prepare
    from .slurm import schedule

    loaded, req = prepare(args.recipe, args.overrides, args.local, not args.no_check, os.environ, sys.stderr,
                          start=args.start)
    if args.dry_run:
        command = f"bash {req.paths.SCRIPT} (here, without Slurm, in {req.paths.run_dir})" if args.local else str(req)
        if args.json:
            print(json.dumps({"dry_run": True, "command": command, "run_dir": str(req.paths.run_dir),
                              "script": req.script}))
        else:
            print(f"# would run: {command}")
            sys.stdout.write(req.script)
        return 0
    if args.local:
        return _run_local(req, loaded.plan, args)
    try:
        done = schedule(req)
    except SlurmError as e:
        return _fail(f"error: {e}", EXIT_FAILED)
    except OSError as e:
        return _fail(f"error: {e}", EXIT_FAILED)
    info = done.as_dict()
    if args.json and not args.wait:
        print(json.dumps(info))
        return 0
    out = sys.stderr if args.json else sys.stdout
    print(f"Submitted batch job {done.job_id}", file=out)
    print(f"  run dir  {info['run_dir']}", file=out)
    print(f"  script   {info['script']}", file=out)
    print(f"  output   {info['stdout']}", file=out)
    print(f"  ray logs {info['logs']}", file=out)
    if not args.wait:
        print(f"Follow it: verl-launch logs -f {done.job_id}   (state: verl-launch status {done.job_id}, "
              f"stop: verl-launch cancel {done.job_id})", file=out)
        return 0
    final = _wait(done, out)
    info.update(state=final.get("JobState"), exit_code=final.get("ExitCode"))
    if args.json:
        print(json.dumps(info))
    return 0 if final.get("JobState") == "COMPLETED" else EXIT_FAILED


def _run_local(req, plan, args) -> int:
    from . import local

    out = sys.stderr if args.json else sys.stdout
    print(f"Running locally (no Slurm) in {req.paths.run_dir}", file=out, flush=True)
    rec = local.run(req, plan, os.environ, out)
    print(f"local run {rec['job_id']} {rec['final_state']} exit code {rec['exit_code']} in {rec['elapsed']} s; "
          f"output in {req.paths.stdout(rec['job_id'])}", file=out)
    if args.json:
        print(json.dumps({k: rec[k] for k in ("job_id", "run_dir", "final_state", "exit_code", "leftovers")}))
    return 0 if rec["final_state"] == "COMPLETED" else EXIT_FAILED


def _wait(done, out) -> dict:
    import time

    from .secrets import redact

    from .slurm import job_info, never_starts, watch

    t0 = time.monotonic()
    live = out.isatty()  # a terminal: the driver's progress is one line, rewritten in place
    open_line = [False]

    def show(text: str) -> None:
        line = redact(f"  [{time.monotonic() - t0:6.1f}s] {text}")
        if live and text.startswith(("RUNNING: driver-start - ", "RUNNING: training - ")):
            print(f"\r\033[K{line}", end="", file=out, flush=True)
            open_line[0] = True
            return
        print(("\n" if open_line[0] else "") + line, file=out, flush=True)
        open_line[0] = False

    try:
        final = watch(done.job_id, done.paths, show, stop_if_never_starts=True)
    except SlurmError as e:
        print(f"error: {e}; job {done.job_id} keeps running", file=out)
        raise SystemExit(EXIT_FAILED)
    except KeyboardInterrupt:
        try:
            info = job_info(done.job_id) or {}
        except (SlurmError, KeyboardInterrupt):
            info = {}
        if open_line[0]:
            print(file=out)
        print(f"\n{_detached(done.job_id, info.get('JobState'))}", file=out)
        raise SystemExit(0)
    why = never_starts(final)
    if why:  # left queued: someone may change the partition or the job (scontrol update)
        print(("\n" if open_line[0] else "") + redact(
            f"job {done.job_id} will not start: {why}. Stopped waiting; the job stays queued "
            f"(remove it: verl-launch cancel {done.job_id})"), file=out)
        raise SystemExit(EXIT_NEVER_STARTS)
    why = done.paths.stop_reason() if final.get("JobState") != "COMPLETED" else None
    print(redact(f"job {done.job_id} {final.get('JobState')} exit code {final.get('ExitCode')}"
                 + (f" - {why}" if why else "") + f"; output in {done.paths.stdout(done.job_id)}"), file=out)
    return final


def _detached(job_id: str, state: Optional[str]) -> str:
    """What Ctrl-C on --wait leaves: a queued job stays queued, a running one keeps running."""
    if state == "PENDING":
        return f"detached; job {job_id} stays queued (remove it: verl-launch cancel {job_id})"
    return f"detached; job {job_id} keeps running (stop it: verl-launch cancel {job_id})"


if __name__ == "__main__":
    sys.exit(main())
