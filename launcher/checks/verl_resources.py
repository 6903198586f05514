"""The CPUs verl's Ray actors hold on each node, per trainer path and verl version.

Read off verl 0.9.1's source (single_controller/ray/base.py, trainer/main_ppo.py,
transfer_queue, agent_loop.py, vllm_async_server.py). verl checks GPUs before it asks Ray for
anything, never CPUs: with too few, a placement group or actor waits forever, silently
(verl#7398). The launcher refuses such a recipe before it is queued; the in-job watchdog
(templates/watch_ray.py) catches what this model does not cover.

- The trainer's resource pool: one placement group per node, STRICT_PACK, of
  ``n_gpus_per_node`` bundles of {CPU: max_colocate_count (3), GPU: 1}.
- V1 trainer only (``trainer.use_v1``, the default since 0.9): TransferQueue's controller
  (1 CPU, any node) and ``num_data_storage_units`` storage actors (1 CPU each, pinned round
  robin over all nodes, so ceil(units / nodes) on a node).
- Actors given no resources (the task runner, agent-loop and reward workers, the rollout
  servers) hold none, and Ray 2.60 places them on a node with no CPU free (seen on the
  sandbox and a local Ray): they add nothing.

On the sandbox, verl got past its placement with exactly this many CPUs per node on both trainer
paths (2 nodes x 2 GPUs), and trains with it (tests/test_verl_job.py: 2 x 1, the legacy
trainer, 3 per node, vLLM's servers beside); one fewer left a placement group or a storage actor
waiting forever.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ..base.verl_versions import NEWEST_CHECKED, parse

# verl's defaults for the keys the model reads (verl 0.9.1, trainer/config/*.yaml).
DEFAULTS: Dict[str, Any] = {
    "trainer.use_v1": True,
    "transfer_queue.backend.SimpleStorage.num_data_storage_units": 8,
    "actor_rollout_ref.rollout.agent.num_workers": 8,
    "reward.num_workers": 8,
    "actor_rollout_ref.rollout.n": 1,
}
MAX_COLOCATE_COUNT = 3  # ResourcePoolManager's default; no verl config key sets it
STORAGE_UNITS = "transfer_queue.backend.SimpleStorage.num_data_storage_units"


@dataclass
class Need:
    per_node: int  # CPUs every node must give Ray (cluster.cpus_per_task)
    trainer: str  # "V1" or "legacy"
    parts: List[str]  # what adds up, for the message

    def explain(self) -> str:
        return f"verl's {self.trainer} trainer holds {' + '.join(self.parts)} = {self.per_node} per node"


def has_v1(version: Optional[str]) -> bool:
    """verl 0.9 added the V1 trainer (and the trainer.use_v1 key)."""
    return parse(version or NEWEST_CHECKED)[:2] >= (0, 9)


def cpu_need(nodes: int, gpus_per_node: int, settings: Dict[str, Any], version: Optional[str]) -> Need:
    """CPUs per node for verl to start on ``nodes`` x ``gpus_per_node``; ``settings`` are
    verl's values by dotted key (resolved by verl where known, else the recipe's), over
    DEFAULTS. Counts must already be whole numbers."""
    v = {**DEFAULTS, **{k: x for k, x in settings.items() if x is not None}}
    v1 = has_v1(version) and bool(v["trainer.use_v1"])
    parts = []
    if gpus_per_node:
        parts.append(f"{MAX_COLOCATE_COUNT} x {gpus_per_node} GPU bundles")
    need = MAX_COLOCATE_COUNT * gpus_per_node
    if v1:
        units = v[STORAGE_UNITS]
        per = math.ceil(units / nodes)
        # The controller lands on any node: count it on each.
        parts += [f"{per} of {units} TransferQueue storage units", "1 TransferQueue controller"]
        need += per + 1
    return Need(per_node=max(need, 1), trainer="V1" if v1 else "legacy", parts=parts or ["1"])
