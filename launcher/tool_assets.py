"""The tool-calling smoke model: a tiny Qwen2 taught on the CPU (1500 steps, about 2-3 minutes on
2 cores) to answer "What is 3 * 7?" with a calculator call in the hermes format verl's parser reads
(`<tool_call>{"name": "calculator", "arguments": {"expression": "3 * 7"}}</tool_call>`), and,
once the tool's response is in its context, with `#### <that result>`. A random model never
writes a tool call, so nothing else would make verl's ToolAgentLoop call a tool on the sandbox.

Built by `python -m launcher.smoke_assets` beside the other smoke assets: `tool-model/` (model,
tokenizer with `<tool_call>` tokens, a chat template that renders tools and the tool role) and
`data/tool-{train,test}.parquet` (rows with verl's `tools_kwargs` for the calculator, and an
`agent_name` column: verl picks each row's agent loop by it). Deterministic for a seed.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from launcher.smoke_reward import DATA_SOURCE

TOOL = "calculator"
QUESTION = "{q} Use the calculator."
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added tokens but not special ones, as in Qwen2.5: verl's reward decodes the response with
# skip_special_tokens=True, and the reward's credit for a well-formed call must see them.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
# Qwen2.5's chat format, the parts verl's ToolAgentLoop renders: tools named in a system turn
# (names only: the smoke model's prompts stay short), an assistant's tool calls in hermes
# format, and each tool response as a user turn. verl's Continuous Token builder diffs renders
# of growing message lists, so every message renders the same whatever follows it.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {% for t in tools %}{{ (t.function or t).name }}"
    "{% if not loop.last %}, {% endif %}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content or '' }}"
    "{% for c in (m.tool_calls or []) %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{% if c.function.arguments is string %}{{ c.function.arguments }}{% else %}{{ c.function.arguments | tojson }}"
    "{% endif %}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SCHEMA = {"type": "function", "function": {"name": TOOL, "description": "Evaluate arithmetic.",
                                           "parameters": {"type": "object", "properties": {
                                               "expression": {"type": "string"}}, "required": ["expression"]}}}


def problems(n: int, rng: random.Random) -> list:
    """Single digits: the model learns the 243 problems' calls outright, no copying to learn."""
    out = []
    for _ in range(n):
        a, b, op = rng.randint(1, 9), rng.randint(1, 9), rng.choice("+-*")
        out.append((f"What is {a} {op} {b}?", str({"+": a + b, "-": a - b, "*": a * b}[op])))
    return out


def expression(q: str) -> str:
    return q[len("What is "):-1]  # "What is 12 * 7?" -> "12 * 7"


def conversation(q: str, answer: str) -> list:
    """The whole exchange the model is taught: question, tool call, the tool's result, answer."""
    call = {"type": "function", "function": {"name": TOOL, "arguments": {"expression": expression(q)}}}
    return [{"role": "user", "content": QUESTION.format(q=q)},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": answer},
            {"role": "assistant", "content": f"#### {answer}"}]


# The training rows' agent loops, per 2 rows. recipes/sandbox-tool-agent.yaml reads them in order
# (data.shuffle false), 4 rows a step, 2 to each of its agent-loop workers (verl hands each worker
# a contiguous chunk): step 1's workers run tool_agent and the example loop, step 2's single
# turn and tool_agent. Every loop in 2 steps, and the tool in both workers (one on each node).
TRAIN_AGENTS = ("tool_agent", "checked_agent", "single_turn_agent", "tool_agent")


def rows(items: list, split: str, agents: tuple) -> list:
    """verl's row format; AGENTS cycles per row in blocks of two (the agent loop's name)."""
    return [{"data_source": DATA_SOURCE,
             "prompt": [{"role": "user", "content": QUESTION.format(q=q)}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": answer},
             "agent_name": agents[(i // 2) % len(agents)],
             "extra_info": {"split": split, "index": i, "question": q, "answer": answer,
                            "tools_kwargs": {TOOL: {"create_kwargs": {"ground_truth": answer}}}}}
            for i, (q, answer) in enumerate(items)]


def build_tokenizer(texts: list, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIAL,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, additional_special_tokens=SPECIAL[1:])
    fast.add_tokens(TOOL_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    model_config(fast).save_pretrained(out)
    # Taught with the tokenizer as verl and vLLM will load it, beside the model's config.json:
    # that makes transformers load Qwen2's tokenizer class, whose own pre-tokenizer splits the
    # same text differently (taught with the other, the model wrote garbled calls once loaded).
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(out)


def model_config(tokenizer):
    from transformers import Qwen2Config

    # head_dim 64: what vLLM's attention kernels support
    return Qwen2Config(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                       tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.eos_token_id)


def teach(tokenizer, texts: list, spans: list, out: Path, seed: int, steps: int, lr: float = 1.5e-3,
          log: list = None) -> float:
    """Train the tiny model on the whole exchanges, the loss on what the assistant writes (SPANS:
    per text, its [start, end) token ranges), and save it. Returns the last loss."""
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    model = Qwen2ForCausalLM(model_config(tokenizer))
    enc = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, enc))
    ids = torch.full((len(enc), width), tokenizer.pad_token_id)
    labels = torch.full((len(enc), width), -100)
    for i, (e, turns) in enumerate(zip(enc, spans)):
        ids[i, :len(e)] = torch.tensor(e)
        for start, end in turns:
            labels[i, start:end] = torch.tensor(e[start:end])
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    loss = None
    for _ in range(steps):
        batch = torch.randint(0, len(enc), (32,), generator=gen)
        # Right-padded: the causal mask alone keeps pads out of every real token's view.
        loss = model(input_ids=ids[batch], labels=labels[batch]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if log is not None and len(log) < 10000:
            log.append(round(float(loss.detach()), 3))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    return float(loss.detach())


CALL = re.compile(r"^<tool_call>\n(\{.*\})\n</tool_call>")


def greedy_calls(model, tokenizer, render, items: list) -> list:
    """(what the model writes first, whether it is the calculator call for the problem), greedy."""
    import torch

    out = []
    for q, _ in items:
        ids = tokenizer(render([{"role": "user", "content": QUESTION.format(q=q)}], True),
                        add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
        text = tokenizer.decode(gen[0, ids.shape[1]:], skip_special_tokens=False)
        m = CALL.match(text)
        try:
            ok = bool(m) and json.loads(m.group(1)) == {"name": TOOL, "arguments": {"expression": expression(q)}}
        except ValueError:
            ok = False
        out.append((text, ok))
    return out


def build(out: Path, seed: int = 0, train: int = 256, test: int = 32, steps: int = 1500,
          agents: tuple = TRAIN_AGENTS, check: bool = True) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed + 1)
    items = problems(train + test, rng)
    (out / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows(items[:train], "train", agents)), out / "data" / "tool-train.parquet")
    pq.write_table(pa.Table.from_pylist(rows(items[train:], "test", ("tool_agent",))),
                   out / "data" / "tool-test.parquet")
    # Taught on more problems than the data holds: the model copies numbers, it does not recall them.
    taught = problems(2048, random.Random(seed + 2))
    # The BPE merges come from the exchanges' text; what is taught is the chat template's render.
    plain = [f"Tools: {TOOL} {QUESTION.format(q=q)} <tool_call>" + json.dumps(
        {"name": TOOL, "arguments": {"expression": expression(q)}}) + f"</tool_call> #### {a}" for q, a in taught]
    tokenizer = build_tokenizer(plain, out / "tool-model")
    render = lambda msgs, gen: tokenizer.apply_chat_template(msgs, tools=[SCHEMA], tokenize=False,  # noqa: E731
                                                             add_generation_prompt=gen)
    texts = [render(conversation(q, a), False) for q, a in taught]
    length = lambda msgs, gen: len(tokenizer(render(msgs, gen), add_special_tokens=False)["input_ids"])  # noqa: E731
    spans = []
    for q, a in taught:
        c = conversation(q, a)  # each assistant turn: from the generation prompt to its <|im_end|>
        spans.append([(length(c[:1], True), length(c[:2], False) - 1), (length(c[:3], True), length(c, False) - 1)])
    # lr 1.5e-3: best of 6e-3 / 3e-3 / 1.5e-3 (loss 0.19 / 0.09 / 0.01 at 400 steps). 1500 steps
    # (loss 0.001): sampled at temperature 1, 96% of first turns parse as a call, against 89%
    # at 400 steps; the rest are single unlikely tokens anywhere in the call.
    loss = teach(tokenizer, texts, spans, out / "tool-model", seed, steps)
    # Checked as verl and vLLM will load it: from the files.
    from transformers import AutoModelForCausalLM

    calls = greedy_calls(AutoModelForCausalLM.from_pretrained(out / "tool-model").eval(), tokenizer, render,
                         items[train:][:16])
    wrong = [c for c in calls if not c[1]]
    if check and len(wrong) > len(calls) // 4:  # a model that does not call the tool would make every tool test moot
        raise RuntimeError(f"the tool model writes no well-formed calculator call for {len(wrong)} of "
                           f"{len(calls)} test problems (loss {loss:.3f}), e.g. {wrong[0][0]!r}")
    return {"tool_model": str(out / "tool-model"), "tool_train": str(out / "data" / "tool-train.parquet"),
            "tool_test": str(out / "data" / "tool-test.parquet"), "tool_loss": round(loss, 4),
            "tool_calls_greedy": f"{len(calls) - len(wrong)}/{len(calls)}"}


if __name__ == "__main__":  # the tool assets alone (smoke_assets builds them beside the others)
    import argparse

    ap = argparse.ArgumentParser(prog="python -m launcher.tool_assets", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--agents", default=",".join(TRAIN_AGENTS),
                    help="the training rows' agent loop names, comma-separated, cycled per 2 rows")
    ap.add_argument("--no-check", action="store_true", help="keep a model that writes no well-formed call")
    args = ap.parse_args()
    print(json.dumps(build(args.out, args.seed, steps=args.steps, agents=tuple(args.agents.split(",")),
                           check=not args.no_check)))
