"""After training: a run's FSDP checkpoint becomes a Hugging Face model, with verl's own merger
(`python -m verl.model_merger merge --backend fsdp`), as a one-node job submitted with submitit.

The merger loads every shard into host RAM (about 4-5 bytes per parameter), so it runs on a
compute node, sized from the checkpoint, with the run's interpreter, setup, environment and
container. The merged model is written beside the target, checked (its config, its weights
load with transformers with no key missing or left over, its parameter count), then moved into
place whole, with a marker naming the step it came from; the run's run.json records it.

The serve check (--serve-check) then loads the merged model in vLLM, as evaluation and serving
will, and generates a few tokens from a prompt put through the model's own chat template: a
missing tokenizer file or chat template shows here, not on the serving side. Its result goes in
the marker; the job fails if it does (the merged model stays in place, marked). It asks for one
GPU where the run's nodes have GPUs.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from ..base.checkpoints import TRACKER  # verl writes it after each complete save
from ..errors import RecipeError
from ..core import paths
from ..core.paths import MERGED, RunPaths
SERVE_PROMPT = "What is 2 + 3?"
MARKER = MERGED  # in a merged model: where it came from (paths.MERGED)
CMDLINE = "command line"


@dataclass
class Checkpoint:
    root: Path  # verl's trainer.default_local_dir
    step: int
    world_size: int
    shard_bytes: int  # the model shards, on disk

    @property
    def actor(self) -> Path:
        return self.root / f"global_step_{self.step}" / "actor"


@dataclass
class MergeSpec:
    """What the merge job needs; pickled by submitit, so it holds no secret."""
    checkpoint: str  # the actor directory
    step: int
    target: str
    python: str  # the run's interpreter, which has verl
    env: dict = field(default_factory=dict)  # the recipe's env
    container: List[str] = field(default_factory=list)  # pyxis options: the merger runs in the image
    run_dir: Optional[str] = None
    serve_check: bool = False  # then load it in vLLM and generate (_SERVE)


# ----------------------------------------------------------------------------- finding it
def checkpoint_root(run: dict) -> Path:
    """A run's checkpoint directory, as submit recorded it; a run recorded before submit did: from
    its resolved recipe (trainer.default_local_dir, or verl's default under the run directory)."""
    if run.get("checkpoint_dir"):
        return Path(run["checkpoint_dir"])
    recipe = RunPaths(Path(run["run_dir"])).resolved_recipe()
    overrides = (recipe.get("verl") or {}).get("overrides") or {}
    flat = {k: v for k, v in overrides.items() if not isinstance(v, dict)}
    ckpt = flat.get("trainer.default_local_dir") or (overrides.get("trainer") or {}).get("default_local_dir")
    project = (recipe.get("wandb") or {}).get("project") or run.get("project")
    return Path(paths.checkpoint_root(ckpt, run["run_dir"], project, run.get("experiment")))


def find(ref: str, step: str = "latest"):
    """(the checkpoint, the run it belongs to or None) for RUN_DIR, JOB_ID or a checkpoint
    directory (verl's default_local_dir, one of its global_step_N, or that step's actor/)."""
    from ..base import registry
    from . import state

    run = None
    path = Path(ref).expanduser()
    if path.is_dir() and (path / TRACKER).exists() or any(path.glob("global_step_*")):
        root = path
    elif path.name == "actor" and path.parent.name.startswith("global_step_"):
        root, step = path.parent.parent, step if step != "latest" else path.parent.name.split("_")[-1]
    elif path.name.startswith("global_step_") and path.is_dir():
        root, step = path.parent, step if step != "latest" else path.name.split("_")[-1]
    else:
        run = state.find(ref)
        if run is None:
            raise RecipeError(f"{ref!r} is neither a run (job id or run directory in {registry.registry_file()}) "
                              "nor a checkpoint directory", where=CMDLINE)
        if run.get("kind") == "sweep":
            raise RecipeError(f"{ref} is a sweep: merge one of its points (e.g. {run['job_id']}_0)", where=CMDLINE)
        root = checkpoint_root(run)
    return inspect(root, step), run


def _steps(root: Path) -> list:
    """The steps verl started saving under ROOT (global_step_N), in order."""
    return sorted(int(p.name.split("_")[-1]) for p in root.glob("global_step_*") if p.name.split("_")[-1].isdigit())


def inspect(root: Path, step: str = "latest") -> Checkpoint:
    """The checkpoint at STEP under ROOT, complete; else exit 2 saying what is missing."""
    have = _steps(root)
    if not have and not (root / TRACKER).exists():  # --step N would find nothing either
        raise RecipeError(f"no checkpoint at all yet: nothing saved in {root} (the run's trainer.default_local_dir"
                          f"{'' if root.is_dir() else ', not created yet'}); verl saves one every trainer.save_freq "
                          "steps (and at the last step): wait for one, or set trainer.save_freq", where=CMDLINE)
    if step == "latest":
        try:
            text = (root / TRACKER).read_text().strip()
        except OSError:
            raise RecipeError(f"{root} has no {TRACKER}: verl has not finished saving a checkpoint there "
                              f"(steps started there: {', '.join(map(str, have))}; give --step N to take one "
                              "anyway)", where=CMDLINE) from None
        if not text.isdigit():
            raise RecipeError(f"{root / TRACKER} holds {text[:40]!r}, not a step", where=CMDLINE)
        n = int(text)
    elif str(step).isdigit():
        n = int(step)
    else:
        raise RecipeError(f"--step {step!r}: a step number or 'latest'", where=CMDLINE)
    actor = root / f"global_step_{n}" / "actor"
    if not actor.is_dir():
        raise RecipeError(f"no checkpoint of step {n} ({actor} is missing; steps here: "
                          f"{', '.join(map(str, have)) or 'none'})", where=CMDLINE)
    if (actor / "lora_train_meta.json").exists() or (actor / "lora_adapter").exists():
        raise RecipeError(f"{actor} is a LoRA checkpoint: verl's merger does not fold the adapter into the base "
                          "weights (it writes it apart, as lora_adapter/); merge it with peft's merge_and_unload "
                          "on the base model instead", where=CMDLINE)
    try:
        world = json.loads((actor / "fsdp_config.json").read_text())["world_size"]
    except (OSError, ValueError, KeyError, TypeError):
        if any(actor.glob("dist_ckpt")) or (actor / "model").is_dir():
            raise RecipeError(f"{actor} is a Megatron checkpoint: only FSDP checkpoints are merged here",
                              where=CMDLINE) from None
        raise RecipeError(f"{actor} is not a complete FSDP checkpoint: fsdp_config.json (world_size) is missing "
                          "or unreadable", where=CMDLINE) from None
    shards = [actor / f"model_world_size_{world}_rank_{r}.pt" for r in range(int(world))]
    missing = [s.name for s in shards if not s.is_file() or s.stat().st_size == 0]
    if missing:
        raise RecipeError(f"{actor} is a partial checkpoint: {len(missing)} of {world} model shards missing or "
                          f"empty ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})", where=CMDLINE)
    if not (actor / "huggingface" / "config.json").is_file():
        raise RecipeError(f"{actor} has no huggingface/config.json: verl saves the model's config there; "
                          "without it the merger cannot build the model", where=CMDLINE)
    return Checkpoint(root=root, step=n, world_size=int(world), shard_bytes=sum(s.stat().st_size for s in shards))


def target_for(ckpt: Checkpoint, target: Optional[str]) -> Path:
    """--target, or `huggingface_merged` beside the step's actor/. An existing one must be an
    earlier merge of this very step (then it is replaced); anything else is refused."""
    path = Path(target).expanduser().absolute() if target else ckpt.actor.parent / "huggingface_merged"
    if path.exists() or path.is_symlink():
        try:
            mark = json.loads((path / MARKER).read_text())
        except (OSError, ValueError):
            mark = {}
        if mark.get("checkpoint") != str(ckpt.actor) or mark.get("step") != ckpt.step:
            raise RecipeError(f"{path} exists and is not an earlier merge of step {ckpt.step} of {ckpt.actor}: "
                              "choose another --target (nothing was overwritten)", where=CMDLINE)
    return path


def mem_gb(ckpt: Checkpoint) -> int:
    """Host RAM for the merger: the shards (fp32 on disk) held whole, once more as they are
    merged, and the bf16 copy it saves, plus the interpreter (~4 GB)."""
    return max(8, math.ceil(ckpt.shard_bytes * 2.5 / 2**30) + 4)


# ----------------------------------------------------------------------------- the job
def run(spec: MergeSpec) -> str:
    """The merge job itself (on the compute node, through submitit): verl's merger into a
    temporary directory beside the target, the check, then the rename; returns the target."""
    target = Path(spec.target)
    tmp = target.parent / f".{target.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    env = dict(os.environ, **spec.env)
    merger = [spec.python, "-m", "verl.model_merger", "merge", "--backend", "fsdp",
              "--local_dir", spec.checkpoint, "--target_dir", str(tmp)]
    check = [spec.python, "-c", _CHECK, str(tmp)]
    serve = [spec.python, "-c", _SERVE, str(target), SERVE_PROMPT, str(target / ".serve-check.json")]
    if spec.container:  # the image has verl; this step runs it there
        merger, check, serve = (["srun", "--overlap", "--ntasks=1", *spec.container, *c] for c in (merger, check, serve))
    try:
        print(f"verl-launch merge: {' '.join(merger)}", flush=True)
        subprocess.run(merger, env=env, check=True, stdin=subprocess.DEVNULL)
        out = subprocess.run(check, env=env, check=True, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        report = json.loads(out.stdout.strip().splitlines()[-1])
        report.update(checkpoint=spec.checkpoint, step=spec.step, merged=time.time(),
                      job_id=os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID"))
        (tmp / MARKER).write_text(json.dumps(report, indent=2) + "\n")
        if target.exists():  # an earlier merge of this step (target_for checked)
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"verl-launch merge: {target} ({report['parameters']} parameters, {report['dtype']})", flush=True)
    if spec.serve_check:
        # Offline vLLM in one process: nothing is served over the network, and the engine core's
        # own process would import torch and vLLM again (the user's own setting is kept).
        _serve_check(serve, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **env}, target, report)
    return str(target)


def _serve_check(cmd: list, env: dict, target: Path, report: dict) -> None:
    """vLLM serves the merged model (_SERVE), or the job fails saying why; either way the
    marker records it."""
    out = target / ".serve-check.json"
    print(f"verl-launch merge: serve check: {' '.join(cmd[:2])} ... (vLLM loads {target})", flush=True)
    proc = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace")
    print(proc.stdout[-20000:], end="", flush=True)  # vLLM's own log, in the job's output
    try:
        result = json.loads(out.read_text())
        out.unlink()
    except (OSError, ValueError):
        last = [ln for ln in proc.stdout.splitlines() if ln.strip()][-1:] or ["no output"]
        result = {"ok": False, "error": f"exit {proc.returncode}: {last[0][:500]}"}
    report["serve_check"] = result
    (target / MARKER).write_text(json.dumps(report, indent=2) + "\n")
    if not result.get("ok"):
        raise RuntimeError(f"the merged model does not serve in vLLM: {result.get('error')}")
    print(f"verl-launch merge: vLLM served it: {result['prompt']!r} -> {result['output']!r} "
          f"({result['tokens']} tokens)", flush=True)


# Run by the run's interpreter on the merged model: its config, every weight loaded by
# transformers (none missing, none left over), the parameter count.
_CHECK = """
import json, sys
from transformers import AutoConfig, AutoModelForCausalLM
path = sys.argv[1]
config = AutoConfig.from_pretrained(path)
model, info = AutoModelForCausalLM.from_pretrained(path, torch_dtype="auto", output_loading_info=True)
bad = {k: sorted(v)[:5] for k, v in info.items() if k != "error_msgs" and v}
if bad or info.get("error_msgs"):
    sys.exit(f"the merged weights do not load cleanly: {bad or info['error_msgs']}")
print(json.dumps({"architectures": config.architectures, "parameters": sum(p.numel() for p in model.parameters()),
                  "dtype": str(model.dtype).replace("torch.", "")}))
"""


# Run by the run's interpreter on the merged model: its chat template on a prompt, then vLLM
# loads it and generates; the result (or why not) as JSON in argv[3].
_SERVE = """
import json, os, sys, time
path, prompt, out = sys.argv[1:4]
def done(**kw):
    with open(out, "w") as f:
        json.dump(kw, f)
    sys.exit(0 if kw.get("ok") else 1)
t0 = time.time()
try:
    from transformers import AutoConfig, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(path)
    if not tok.chat_template:
        done(ok=False, error="the merged model has no chat template (tokenizer_config.json): "
                             "prompts cannot be put in the model's own format")
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    import vllm
    from vllm import LLM, SamplingParams
    length = min(1024, getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", 1024))
    llm = LLM(model=path, max_model_len=length, enforce_eager=True, dtype="auto")
    got = llm.generate([text], SamplingParams(max_tokens=16, temperature=0))[0].outputs[0]
except Exception as e:
    done(ok=False, error=f"{type(e).__name__}: {str(e)[:800]}")
done(ok=bool(got.token_ids), engine=f"vllm {vllm.__version__}", prompt=prompt, chat_template=True,
     output=got.text, tokens=len(got.token_ids), seconds=round(time.time() - t0, 1),
     generation_config=os.path.exists(os.path.join(path, "generation_config.json")),
     error=None if got.token_ids else "vLLM generated no token")
"""


def has_vllm(python: str) -> Optional[bool]:
    """Whether PYTHON (the run's interpreter, here) imports vLLM; None if it cannot be run here."""
    try:
        proc = subprocess.run([python, "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)"],
                              capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.returncode == 0


def job_params(r, ckpt: Checkpoint, gpus: int = 0) -> dict:
    """submitit's parameters for the one-node merge job, wherever it runs: memory sized from the
    checkpoint (the backend adds its own: backends/slurm.py the recipe's partition, account,
    qos, setup). A container's pyxis options go to the merger's own step."""
    params = dict(name=f"{r.job.name if r else 'verl'}-merge", timeout_min=_minutes(r), mem_gb=mem_gb(ckpt),
                  cpus_per_task=min(8, r.cluster.cpus_per_task) if r else 8, nodes=1, tasks_per_node=1)
    if gpus:
        params["gpus_per_node"] = gpus
    return params


def _minutes(r) -> int:
    """Two hours, or the recipe's own limit if that is shorter."""
    if r is None or not r.cluster.time:
        return 120
    from ..checks.fields import _seconds

    secs = _seconds(r.cluster.time)
    return max(1, min(120, secs // 60)) if secs else 120


def spec_for(ckpt: Checkpoint, target: Path, r, run: Optional[dict]) -> MergeSpec:
    from ..core.plan import container_args

    python = r.runtime.python if r is not None else sys.executable
    resolved = shutil.which(python) or python
    return MergeSpec(checkpoint=str(ckpt.actor), step=ckpt.step, target=str(target), python=resolved,
                     env=dict(r.env) if r is not None else {}, container=container_args(r) if r is not None else [],
                     run_dir=run["run_dir"] if run else None)


def load_run_recipe(run: Optional[dict]):
    """The run's recipe as it ran (its resolved recipe.yaml), or None."""
    if run is None:
        return None
    from omegaconf import OmegaConf

    from ..base.schema import Recipe

    try:
        data = OmegaConf.load(RunPaths(Path(run["run_dir"])).recipe)
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Recipe), data))
    except Exception:  # noqa: BLE001 - an older or edited record: merge with the defaults
        return None


def record(run: Optional[dict], entry: dict) -> None:
    """The merge in the run's run.json (`merges`, newest last)."""
    if run is None:
        return

    def add(rec: dict) -> None:
        rec["merges"] = [m for m in rec.get("merges", []) if m.get("job_id") != entry.get("job_id")] + [entry]

    RunPaths(Path(run["run_dir"])).update_record(add)
