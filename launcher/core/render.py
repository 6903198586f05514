"""Render: a recipe's plan in (core/plan.py), the sbatch script text out. Pure: no I/O but the
templates; it works nothing out, it fills the template from the plan."""

from __future__ import annotations

import json
import re
import shlex
from functools import lru_cache
from pathlib import Path
from typing import Optional

import jinja2

from .. import __version__
from ..base.overrides import TRACE_FLUSH_MODULE
from .paths import RunPaths
from .plan import Plan
from ..resources import templates_dir
from ..checks.secrets import SECRET_NAME

TEMPLATE = "sbatch.sh.j2"
SWEEP_TEMPLATE = "sweep.sbatch.j2"
# What a failed run keeps of each dead Ray worker's logs (templates/last_words.py): the last
# 64 KiB of each file, of at most 8 workers a node (a few hundred KiB a node at most).
LAST_WORDS_BYTES, LAST_WORDS_FILES = 65536, 8


def q(value) -> str:
    """The one shell-quoting filter: every value that reaches the script passes here."""
    return shlex.quote(str(value))


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        # bash's ${#array[@]} would open a Jinja comment
        comment_start_string="<%#",
        comment_end_string="#%>",
    )
    env.filters["q"] = q
    return env


def render(p: Plan) -> str:
    """The complete sbatch script for plan ``p`` (recipe.load's Loaded.plan)."""
    rt, ray, rs = p.runtime, p.ray, p.restarts
    ctx = dict(
        version=__version__, recipe_file=_comment_safe(rt.source), paths=RunPaths,
        directives=p.directives, setup=rt.setup, python=rt.python, entrypoint=rt.entrypoint,
        env=p.env, wandb_needed=p.wandb_needed, api_key_file=rt.api_key_file, wandb_host=p.wandb_host,
        secrets=rt.secrets, wandb_env=p.wandb_env, verl_args=p.verl_args,
        nodes=ray.nodes, gpus=ray.gpus, cpus=ray.cpus, object_store_memory=ray.object_store_memory,
        ready_timeout=ray.ready_timeout, ray_start_retries=ray.start_retries, ray_monitor=ray.monitor,
        requeue=rs.requeue, exclude_bad_nodes=p.exclude_bad_nodes,
        signal_seconds=rs.signal_seconds, max_restarts=rs.max_restarts,
        network_interface=ray.network_interface, port_min=ray.port_min, worker_ports=ray.worker_ports,
        port_slots=p.port_slots, wait_ready_py=_embedded("wait_ready.py"), container_args=p.container_args,
        image_file=p.image_file, ray_auth=p.ray_auth, reach_timeout=p.reach_timeout, on_unreachable=p.on_unreachable,
        reach_weave="weave" if p.reach_weave else "-", reach_wandb_py=_embedded("reach_wandb.py"),
        gpu_vendor=ray.gpu_vendor, gpu_clear=p.gpu_clear,
        node_check=p.node_check if p.node_check_needed else None, node_check_spec=p.node_check_json,
        check_node_py=_embedded("check_node.py"), keep_checkpoints=p.keep_checkpoints,
        node_check_ckpt=p.checkpoint_dir or "", secret_name_re=SECRET_NAME.pattern,
        pending_timeout=rs.pending_timeout, stall_timeout=p.stall_timeout, death_grace=rs.death_grace,
        watch_ray_py=_embedded("watch_ray.py"), last_words_py=_embedded("last_words.py"),
        last_words_bytes=LAST_WORDS_BYTES, last_words_files=LAST_WORDS_FILES,
        resume_check=_resume_check(p), checkpoints_py=_embedded("checkpoints.py", Path(__file__).parent.parent / "base"),
        wandb_service=p.wandb_service, wandb_finish_timeout=p.recipe.wandb.finish_timeout,
        wandb_service_py=_embedded("wandb_service.py"),
        trace_flush=p.trace_flush, trace_flush_py=_embedded("trace_flush.py"), trace_flush_module=TRACE_FLUSH_MODULE,
    )
    return _env().get_template(TEMPLATE).render(ctx)


def render_array(p: Plan, name: str, count: int, max_parallel=None) -> str:
    """A sweep's job-array script: the points' shared #SBATCH lines (point 0's plan), one task a point."""
    from .paths import SweepPaths

    lines = [d for d in p.directives if not d.startswith("--output=")]
    lines += [f"--output={SweepPaths.OUTPUT}",
              f"--array=0-{count - 1}" + (f"%{max_parallel}" if max_parallel else "")]
    return _env().get_template(SWEEP_TEMPLATE).render(
        version=__version__, recipe_file=_comment_safe(p.runtime.source), name=name, count=count,
        directives=lines, paths=RunPaths)


def _comment_safe(text: str) -> str:
    return re.sub(r"[\x00-\x1f\x7f]", "?", text)  # it sits in a comment line


@lru_cache(maxsize=None)
def _embedded(name: str, where: Optional[Path] = None) -> str:
    """A helper script the job runs (from templates/, or WHERE), inserted verbatim in a quoted heredoc."""
    return ((where or templates_dir()) / name).read_text().rstrip("\n")


def _resume_check(p: Plan) -> Optional[dict]:
    """templates/job/resume_check's arguments; None where verl does not resume by its tracker
    in a directory the job knows."""
    if not p.checkpoint_dir or p.resume_mode != "auto":
        return None
    return {"dir": p.checkpoint_dir, "layout": json.dumps(p.checkpoint_layout, separators=(",", ":")),
            "mode": p.resume_from or "auto"}
