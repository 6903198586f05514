"""Build what `recipes/ci-smoke-1gpu.yaml` trains on, with nothing from a model hub: a tiny
Qwen2 (the real architecture, random weights, 2 layers), a small BPE tokenizer trained here
with `tokenizers`, and an arithmetic dataset in verl's parquet format whose reward is verl's
own rule-based GSM8K scorer ("#### <answer>"), a tiny model taught to call a calculator tool
(launcher/tool_assets.py: tool-model/ and data/tool-*.parquet), and reward.py, a reward that varies even for a
random model (launcher/smoke_reward.py: GSM8K's rule plus partial credit), for GRPO steps whose
gradients are not all zero.

    python -m launcher.smoke_assets --out ~/verl-smoke      # about 3 minutes on 2 CPU cores

Needs torch, transformers, tokenizers and pyarrow (all in a verl environment). Deterministic
for a given --seed.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path

from launcher import tool_assets  # the model that calls a tool (recipes/sandbox-tool-agent.yaml)
from launcher.smoke_reward import DATA_SOURCE  # "#### 42" at the end, as the GSM8K rule reads it
INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."
# Qwen2's chat format, the subset verl uses (system/user/assistant, a generation prompt).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def problems(n: int, rng: random.Random) -> list:
    out = []
    for _ in range(n):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        op = rng.choice("+-*")
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        out.append((f"What is {a} {op} {b}?", str(answer)))
    return out


def rows(items: list, split: str) -> list:
    return [{"data_source": DATA_SOURCE,
             "prompt": [{"role": "user", "content": f"{q} {INSTRUCTION}"}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": answer},
             "extra_info": {"split": split, "index": i, "question": q, "answer": answer}}
            for i, (q, answer) in enumerate(items)]


def build_tokenizer(texts: list, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, additional_special_tokens=SPECIAL[1:])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(tokenizer, out: Path, seed: int) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    # head_dim 64: what vLLM's attention kernels support; small enough for any GPU.
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, torch_dtype="bfloat16",
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.eos_token_id)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out, safe_serialization=True)


def build(out: Path, seed: int = 0, train: int = 256, test: int = 32) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    items = problems(train + test, rng)
    (out / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows(items[:train], "train")), out / "data" / "train.parquet")
    # recipes/sandbox-verl.yaml's: the same rows, every other one picking the example agent loop
    # (launcher/examples/agent_loop.py, recipes/agents/checked.yaml) by its agent_name
    picked = [dict(r, agent_name="checked_agent" if i % 2 else "single_turn_agent")
              for i, r in enumerate(rows(items[:train], "train"))]
    pq.write_table(pa.Table.from_pylist(picked), out / "data" / "train-agents.parquet")
    pq.write_table(pa.Table.from_pylist(rows(items[train:], "test")), out / "data" / "test.parquet")
    texts = [f"{q} {INSTRUCTION} #### {a}" for q, a in items] + [INSTRUCTION] * 8
    tokenizer = build_tokenizer(texts, out / "model")
    build_model(tokenizer, out / "model", seed)
    shutil.copyfile(Path(__file__).with_name("smoke_reward.py"), out / "reward.py")
    info = {"model": str(out / "model"), "train": str(out / "data" / "train.parquet"),
            "train_agents": str(out / "data" / "train-agents.parquet"),
            "test": str(out / "data" / "test.parquet"), "reward": str(out / "reward.py"),
            "vocab": len(tokenizer), "seed": seed}
    info.update(tool_assets.build(out, seed))
    (out / "smoke-assets.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m launcher.smoke_assets", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="directory for model/ and data/")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    info = build(args.out.expanduser().absolute(), args.seed)
    print(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
