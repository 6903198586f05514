"""Test helper: real verl checkpoints, written by verl's own FSDP checkpoint manager on the CPU.

    python tests/fsdp_checkpoints.py DIR STEP...

For each STEP, DIR/global_step_STEP/actor as verl's trainer saves it (a tiny Qwen2 wrapped in
FSDP, world size 1 over gloo: model, optimizer and extra state, and the HF config), then
DIR/latest_checkpointed_iteration.txt holding the last STEP, as verl's trainer writes it after a
save. Prints one JSON line: {step: [files under global_step_STEP]}.
"""

import json
import os
import sys
from pathlib import Path


def main() -> int:
    root, steps = Path(sys.argv[1]), [int(s) for s in sys.argv[2:]]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"),
                      RANK="0", WORLD_SIZE="1")
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    model = FSDP(Qwen2ForCausalLM(Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64,
                                              num_hidden_layers=2, num_attention_heads=2,
                                              num_key_value_heads=2)),
                 device_id=torch.device("cpu"), use_orig_params=True)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    manager = FSDPCheckpointManager(model=model, optimizer=optim, lr_scheduler=None, processing_class=None,
                                    checkpoint_config={"save_contents": ["model", "optimizer", "extra"]})
    for step in steps:
        manager.save_checkpoint(str(root / f"global_step_{step}" / "actor"), global_step=step)
        (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    dist.destroy_process_group()
    print(json.dumps({s: sorted(str(p.relative_to(root / f"global_step_{s}"))
                                for p in (root / f"global_step_{s}").rglob("*") if p.is_file()) for s in steps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
