"""Test helper: real verl checkpoints, written by verl's own FSDP checkpoint manager on the CPU.

    python tests/fsdp_checkpoints.py DIR STEP... [--world-size N] [--full-state FILE] [--train]

For each STEP, DIR/global_step_STEP/actor as verl's trainer saves it (a tiny Qwen2 wrapped in
FSDP, world size N over gloo, 1 by default: every rank's model, optimizer and extra state
shard, and the HF config), then DIR/latest_checkpointed_iteration.txt holding the last STEP, as
verl's trainer writes it after a save. --train: one optimizer step before each save, so the
weights are not the initial ones. --full-state: the full (gathered) model state at the last
save, in bf16, as FILE (torch.save), to compare a merged model against. Prints one JSON line:
{step: [files under global_step_STEP]}.
"""

import argparse
import json
import os
import sys
from pathlib import Path


def rank_main(rank: int, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"),
                      RANK=str(rank), WORLD_SIZE=str(args.world_size), LOCAL_RANK=str(rank))
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel as FSDP, StateDictType
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    # A device mesh, as verl's FSDP workers give FSDP: shards are then saved as DTensors
    mesh = init_device_mesh("cpu", (args.world_size,), mesh_dim_names=("fsdp",))
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, architectures=["Qwen2ForCausalLM"])
    model = FSDP(Qwen2ForCausalLM(config),
                 device_id=torch.device("cpu"), device_mesh=mesh, use_orig_params=True)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    manager = FSDPCheckpointManager(model=model, optimizer=optim, lr_scheduler=None, processing_class=None,
                                    checkpoint_config={"save_contents": ["model", "optimizer", "extra"]})
    root = Path(args.dir)
    for step in args.steps:
        if args.train:
            ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(step * 10 + rank))
            model(input_ids=ids, labels=ids).loss.backward()
            optim.step()
            optim.zero_grad()
        manager.save_checkpoint(str(root / f"global_step_{step}" / "actor"), global_step=step)
        if rank == 0:
            (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    if args.full_state:
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                                  FullStateDictConfig(offload_to_cpu=False, rank0_only=False)):
            full = model.state_dict()
        if rank == 0:
            torch.save({k: v.to(torch.bfloat16) for k, v in full.items()}, args.full_state)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("steps", nargs="+", type=int)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--full-state")
    ap.add_argument("--train", action="store_true")
    args = ap.parse_args()
    if args.world_size == 1:
        rank_main(0, args)
    else:
        import torch.multiprocessing as mp

        mp.spawn(rank_main, args=(args,), nprocs=args.world_size, join=True)
    root = Path(args.dir)
    print(json.dumps({s: sorted(str(p.relative_to(root / f"global_step_{s}"))
                                for p in (root / f"global_step_{s}").rglob("*") if p.is_file()) for s in args.steps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
