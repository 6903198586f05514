"""What the job checks and sets on every node, from the recipe: the allocation check's spec
(templates/check_node.py, phase inputs-check), the GPU vendor's variables, the checkpoint
limit enforced at a restart. Pure: the recipe and verl's effective values (checks.effective,
worked out once by plan.resolve) in, values for the plan out."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from .values import CKPT_DIR
from ..base.schema import Recipe

RAY_AUTH_SINCE = "2.52"  # the first Ray with token authentication (RAY_AUTH_MODE=token)

# verl settings that name local files or directories every node must read.
INPUT_KEYS = (
    "data.train_files", "data.val_files", "actor_rollout_ref.model.path",
    "actor_rollout_ref.model.tokenizer_path", "critic.model.path", "critic.model.tokenizer_path",
    "reward.reward_model.model_path", "reward.custom_reward_function.path", "custom_reward_function.path",
    "data.custom_cls.path", "actor_rollout_ref.rollout.multi_turn.tool_config_path",
    "actor_rollout_ref.rollout.agent.agent_loop_config_path",
)

# Per vendor: the variable Ray and verl read, its tool, and what Slurm's gres/gpu may set for
# other vendors in the same step (with no env flags in gres.conf it sets them all). verl's
# Worker refuses ROCR_VISIBLE_DEVICES beside CUDA_/HIP_VISIBLE_DEVICES; Ray's AMD support
# wants HIP_VISIBLE_DEVICES, not ROCR_.
VENDORS: Dict[str, Dict[str, Any]] = {
    "nvidia": {"var": "CUDA_VISIBLE_DEVICES", "tool": "nvidia-smi",
               "clear": ["ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ZE_AFFINITY_MASK", "GPU_DEVICE_ORDINAL"]},
    "amd": {"var": "HIP_VISIBLE_DEVICES", "tool": None,
            "clear": ["ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ZE_AFFINITY_MASK", "GPU_DEVICE_ORDINAL"]},
    "none": {"var": None, "tool": None, "clear": []},
}


def _local_paths(value: Any) -> List[str]:
    """Absolute (or ~) paths in a setting: a string or a list of them; hub ids, URLs and
    relative paths are not the nodes' files to check."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return [v for v in values if isinstance(v, str) and v.startswith(("/", "~"))]


def checkpoint_dir(v: Dict[str, Any]) -> Optional[str]:
    """verl's checkpoint directory in effective values V, if absolute."""
    ckpt = v.get(CKPT_DIR)
    return str(ckpt) if isinstance(ckpt, str) and ckpt.startswith("/") else None


def spec(r: Recipe, v: Dict[str, Any], ckpt: Optional[str]) -> Dict[str, Any]:
    """templates/check_node.py's argument; no key is checked whose switch is off."""
    c = r.node_checks
    inputs: List[Tuple[str, str]] = []
    if c.inputs:
        inputs = [(key, path) for key in INPUT_KEYS for path in _local_paths(v.get(key))]
    vendor = VENDORS[r.cluster.gpu_vendor]
    return {
        "inputs": inputs,
        "shared": c.shared_storage,
        "checkpoints": ckpt,
        "min_free_gb": c.min_free_gb,
        "gpus": r.cluster.gpus_per_node if c.gpus and vendor["var"] and r.cluster.gpus_per_node else None,
        "gpu_var": vendor["var"],
        "gpu_tool": vendor["tool"],
        # not for the launcher's own stand-in driver (the sandbox demo), which runs no verl
        "verl_version": (r.verl.version if c.verl_version and r.verl.version
                         and r.verl.entrypoint.split(".")[0] != "launcher" else None),
        "ray_auth": RAY_AUTH_SINCE if r.cluster.ray_auth_off is None else None,
    }


def needed(s: Dict[str, Any]) -> bool:
    return bool(s["inputs"] or s["shared"] or s["min_free_gb"] or s["gpus"] is not None or s["verl_version"]
                or s["ray_auth"])


def keep_checkpoints(v: Dict[str, Any]) -> int:
    """verl's checkpoint limit, applied by the job at a restart (verl forgets checkpoints from
    before a resume, verl#7395): the larger of the actor's and critic's, 0 to keep all."""
    limits = [v.get(k) for k in ("trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep")]
    limits = [x for x in limits if isinstance(x, int) and not isinstance(x, bool) and x > 0]
    return max(limits) if limits else 0
