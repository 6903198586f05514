"""TEST-ONLY: the smoke assets' tool model driven by verl's own ToolAgentLoop, with vLLM's CPU
build generating, in the node environment (tests/test_tool_model.py runs it). No Ray and no
trainer: verl's loop with the real calculator tool (recipes/tools/calculator.yaml), its hermes
parser and its Continuous Token builder, and a server manager that is an offline vLLM engine.

    python tests/tool_model_probe.py ASSETS TOOL_CONFIG EPISODES

Prints one line, "@@probe " and JSON: each episode's first turn as text, whether verl's hermes parser read a
calculator call with JSON arguments holding an expression, its number of turns, the tool's
response and the final text."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

MAX_TOKENS = 48


class VLLMServer:
    """What ToolAgentLoop calls as its server manager: generate(prompt_ids, sampling_params)."""

    def __init__(self, model: str):
        from vllm import LLM

        self.llm = LLM(model=model, enforce_eager=True, dtype="bfloat16", max_model_len=256, seed=0,
                       gpu_memory_utilization=0.5)
        self.first: dict = {}  # request id -> the first turn's token ids

    async def generate(self, request_id, prompt_ids, sampling_params, **_):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from verl.workers.rollout.replica import TokenOutput

        params = SamplingParams(temperature=sampling_params.get("temperature", 1.0), top_p=1.0, max_tokens=MAX_TOKENS,
                                stop_token_ids=sampling_params.get("stop_token_ids"), skip_special_tokens=False)
        out = self.llm.generate([TokensPrompt(prompt_token_ids=list(prompt_ids))], params, use_tqdm=False)
        ids = list(out[0].outputs[0].token_ids)
        self.first.setdefault(request_id, ids)
        return TokenOutput(token_ids=ids, stop_reason="completed")


def main() -> int:
    import pyarrow.parquet as pq
    from omegaconf import OmegaConf
    from transformers import AutoConfig
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
    from verl.experimental.agent_loop.tool_parser import ToolParser
    from verl.tools.tool_registry import load_all_tools
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tokenizer.tokenizer import hf_tokenizer

    assets, tool_config, episodes = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    model = str(assets / "tool-model")
    tok = hf_tokenizer(model)
    server = VLLMServer(model)
    # The keys ToolAgentLoop reads, as recipes/sandbox-tool-agent.yaml sets them.
    cfg = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {
            "prompt_length": 64, "response_length": 64, "full_determinism": False,
            "multi_turn": {"enable": True, "max_user_turns": None, "max_assistant_turns": 2, "max_parallel_calls": 1,
                           "max_tool_response_length": 256, "tool_response_truncate_side": "middle",
                           "format": "hermes", "tool_config_path": tool_config, "function_tool_path": None}}},
        "data": {"apply_chat_template_kwargs": {}, "mm_processor_kwargs": {}}})
    tools = load_all_tools(tool_config, None)
    rows = pq.read_table(assets / "data" / "tool-test.parquet").to_pylist()
    parser = ToolParser.get_tool_parser("hermes", tok)
    out = []

    async def run():
        # verl's agent loop keeps the event loop it was built on: build it inside this one.
        loop = ToolAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=server, tokenizer=tok, processor=None,
                             dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data),
                             hf_model_type=AutoConfig.from_pretrained(model).model_type, tools=ToolListWrap(tools))
        for i in range(episodes):
            row = rows[i % len(rows)]
            before = set(server.first)
            res = await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": False},
                                 raw_prompt=list(row["prompt"]), tools_kwargs=row["extra_info"]["tools_kwargs"],
                                 extra_info=row["extra_info"])
            first = server.first[next(iter(set(server.first) - before))]
            _, calls = await parser.extract_tool_calls(first, [t.tool_schema for t in tools])
            try:
                args = json.loads(calls[0].arguments) if calls else None
            except ValueError:
                args = None
            out.append({"first": tok.decode(first), "call": calls[0].name if calls else None,
                        "expression": args.get("expression") if isinstance(args, dict) else None,
                        "num_turns": res.num_turns, "response": tok.decode(res.response_ids, skip_special_tokens=True),
                        "mask": "".join(map(str, res.response_mask)), "truth": row["reward_model"]["ground_truth"],
                        # the response's tokens the loss sees (mask 1) and those it does not (0)
                        "masked": tok.decode([t for t, m in zip(res.response_ids, res.response_mask) if not m]),
                        "unmasked": tok.decode([t for t, m in zip(res.response_ids, res.response_mask) if m]),
                        "tool_rewards": res.extra_fields.get("tool_rewards")})

    asyncio.run(run())
    print("@@probe " + json.dumps({"episodes": out}), flush=True)
    return 0


if __name__ == "__main__":  # vLLM's engine starts processes that import this file again
    sys.exit(main())
