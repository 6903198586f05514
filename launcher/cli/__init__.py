"""The command line: parse the arguments and hand each command to its printer (run_cli: render,
check, submit, merge, image; jobs: list, status, logs, cancel), which calls the API."""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from .. import __version__
from .console import fail

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


REF_HELP = ("a job id (CLUSTER:JOB for another cluster's run: job ids repeat across clusters and after a "
            "cluster's state is reset; a bare id is this cluster's newest), a sweep's array job id, or a run directory")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="verl-launch",
        description="Render, check and submit VERL runs (Ray + Weave tracing) to Slurm, one run or a "
                    "sweep (-m, one job array); follow them: list, status, logs, cancel; read their traced "
                    "trajectories back (traces); and merge a run's checkpoint into a Hugging Face model.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"verl-launch {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def recipe_cmd(name: str, help: str, description: Optional[str] = None) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help, description=description or help, epilog=EPILOG,
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

    recipe_cmd("render", "print the sbatch script a recipe renders to",
               "print the sbatch script a recipe renders to, from the recipe's values alone: verl's own "
               "checks do not run, so where the script depends on what verl resolves itself (its defaults for "
               "keys the recipe leaves unset) it may differ; `submit --dry-run` prints it exactly as submit "
               "would send it")
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
                       help="continue the experiment: refuse (exit 2) unless verl would resume from its newest "
                            "complete checkpoint. Without a flag, verl's trainer.resume_mode=auto decides, and "
                            "`check` says which (and warns where verl would not load the newest complete one)")
    start.add_argument("--resume-from", metavar="STEP",
                       help="resume from that checkpoint: N, global_step_N, its directory, or latest-complete (the "
                            "newest complete one at each start, requeues included). The job writes verl's "
                            "latest_checkpointed_iteration.txt before verl starts and says so; exit 2 unless verl "
                            "could load it (cluster.resume_from)")
    s.add_argument("--wait", action="store_true",
                   help="follow the job until it ends (Ctrl-C detaches; the job stays queued or keeps running); "
                        "exit 0 if it COMPLETED, 1 otherwise, 3 if Slurm says it can never start (left queued)")

    ip = sub.add_parser("import", help="turn a verl command line into a recipe, then check it",
                        description="Write a recipe from a verl command line as your script runs it: put "
                                    "`verl-launch import -o my.yaml --` in front of the `python3 -m "
                                    "verl.trainer.main_ppo ...` line and run the script once (its shell resolves "
                                    "its variables). Nodes, GPUs, the W&B project and experiment, the loggers, the "
                                    "trace settings and the config name go to the launcher's fields; every other "
                                    "override goes to verl.overrides as given, in order, `+`/`++` kept; a relative "
                                    "path is made absolute from here. Then `check`'s verdict on it; a recipe check "
                                    "refuses is not written (exit 2).",
                        epilog="e.g.  verl-launch import -o grpo.yaml -- python3 -m verl.trainer.main_ppo "
                               "trainer.nnodes=2 data.train_files=$HOME/data/train.parquet ...",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    ip.add_argument("-o", "--output", required=True, metavar="RECIPE.yaml", help="the recipe to write")
    ip.add_argument("--force", action="store_true", help="replace RECIPE.yaml if it exists")
    ip.add_argument("argv", metavar="-- COMMAND", nargs="+",
                    help="the verl command line: python3 -m verl.trainer.main_ppo [--config-name N] override...")
    ls = sub.add_parser("list", help="recent runs: job id, name, experiment, state, nodes, elapsed, run dir",
                        description="Recent runs from the run registry, with their Slurm state (one batched query).")
    ls.add_argument("-n", type=_positive, default=20, metavar="N", help="how many runs (default 20)")
    ls.add_argument("--json", action="store_true", help="one JSON array")
    st = sub.add_parser("status", help="a run's Slurm state, in-job phase, exit code and W&B links",
                        description="A run's Slurm state, in-job phase, exit code and W&B links.")
    st.add_argument("ref", metavar="JOB|RUN_DIR", help=REF_HELP)
    st.add_argument("--json", action="store_true", help="one JSON object")
    lg = sub.add_parser("logs", help="print a run's output (-f: follow until the job ends)",
                        description="Print a run's batch output, or the driver's, or a node's Ray log.")
    lg.add_argument("ref", metavar="JOB|RUN_DIR", help=REF_HELP)
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
    from .traces import add_parser as traces_parser

    traces_parser(sub, REF_HELP)
    from .report import add_parser as report_parser

    report_parser(sub, REF_HELP)
    sy = sub.add_parser("sync", help="send a run's W&B metrics that stayed offline (wandb sync, once)",
                        description="Send a run's W&B metrics that stayed offline (W&B unreachable at the job's "
                                    "start with trace.on_unreachable=disable, or WANDB_MODE=offline) with wandb's own "
                                    "`wandb sync`, run by the run's runtime.python. What was sent is marked, so a "
                                    "second sync sends nothing. A run that logged online is refused (W&B has its "
                                    "metrics; a sync would send every row again), and so is a run still going, "
                                    "unless --wait. The key comes from where submit finds it, into wandb's "
                                    "environment only.")
    sy.add_argument("ref", metavar="JOB|RUN_DIR", help=REF_HELP)
    sy.add_argument("--wait", action="store_true", help="wait for the job to end first")
    sy.add_argument("--python", metavar="PATH", help="the interpreter with wandb (default: the run's runtime.python)")
    sy.add_argument("--json", action="store_true", help='print one JSON object: {"run_id", "synced", "already"}')
    cn = sub.add_parser("cancel", help="scancel a run and wait for its terminal state",
                        description="scancel a run, wait for its terminal state, and record it in the run.")
    cn.add_argument("ref", metavar="JOB|RUN_DIR", help=REF_HELP)
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
    from .. import api  # the one door: every command is an API call, printed

    try:
        if args.command in RECIPE_COMMANDS or args.command in ("merge", "image", "import"):
            from . import run as commands
        elif args.command == "traces":
            from . import traces as commands
        elif args.command == "report":
            from . import report as commands
        else:
            from . import jobs as commands  # the job toolkit
        return _flushed(getattr(commands, f"cmd_{args.command}")(args))
    except api.RecipeError as e:  # every problem of one try: the refusal, then its warnings
        said = [f"error: {e}", *(f"warning: {w}" for w in e.warnings)]
        if e.unchecked:
            said.append(f"not checked: {e.unchecked}")
        return fail("\n".join(said), api.EXIT_BAD_INPUT)
    except api.SlurmError as e:
        return fail(f"error: {e}", api.EXIT_FAILED)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`check R | head -1`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _flushed(code: int) -> int:
    sys.stdout.flush()  # here, not at exit: a closed pipe is then ours to handle
    return code


if __name__ == "__main__":
    sys.exit(main())
