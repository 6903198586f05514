"""The CI smoke recipe's assets, built here on the CPU: verl's own tokenizer and dataset code
load them, transformers loads the model and runs it, verl's rule-based reward scores the data,
and the recipe passes `check` (verl's preflight) against them. The GPU run itself is not
possible here."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import RECIPES
from smoke_cache import passive_omp


@pytest.fixture(scope="module")
def assets(smoke_assets):
    return smoke_assets, json.loads((smoke_assets / "smoke-assets.json").read_text())


def test_verl_loads_the_tokenizer_and_dataset(assets, tmp_path):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tokenizer.tokenizer import hf_tokenizer

    out, info = assets
    tok = hf_tokenizer(info["model"])
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert tok.decode(tok("What is 12 * 7? #### 84")["input_ids"]) == "What is 12 * 7? #### 84"
    config = OmegaConf.create({"max_prompt_length": 64, "truncation": "error", "filter_overlong_prompts": True,
                               "cache_dir": str(tmp_path / "cache")})  # the assets are read-only
    ds = RLHFDataset(info["train"], tok, config)
    assert len(ds) == 256  # none longer than the recipe's 64-token prompt limit
    row = ds[0]
    assert row["raw_prompt"][0]["role"] == "user" and "####" in row["raw_prompt"][0]["content"]
    assert row["reward_model"]["ground_truth"] and row["data_source"] == "openai/gsm8k"


def test_transformers_loads_the_model_and_it_runs(assets):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, info = assets
    model = AutoModelForCausalLM.from_pretrained(info["model"])
    tok = AutoTokenizer.from_pretrained(info["model"])
    assert model.config.model_type == "qwen2" and model.config.num_hidden_layers == 2
    assert model.config.vocab_size == len(tok)
    ids = tok("What is 1 + 1?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok)) and torch.isfinite(logits.float()).all()


def test_verls_rule_based_reward_scores_the_data(assets):
    import pyarrow.parquet as pq
    from verl.utils.reward_score import default_compute_score

    _, info = assets
    row = pq.read_table(info["test"]).to_pylist()[0]
    truth = row["reward_model"]["ground_truth"]
    assert default_compute_score(row["data_source"], f"so #### {truth}", truth) == 1.0
    assert default_compute_score(row["data_source"], f"so #### {int(truth) + 1}", truth) == 0.0


def test_the_shipped_reward_agrees_with_verls_rule_and_varies_where_it_gives_zero(assets):
    """verl loads reward.py from its file (verl's own loader); a right answer scores as verl's
    GSM8K rule does, and wrong answers get partial credit that differs between responses."""
    import pyarrow.parquet as pq
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.utils.reward_score import default_compute_score

    _, info = assets
    fn = get_custom_reward_fn(OmegaConf.create({"reward": {"custom_reward_function": {
        "path": info["reward"], "name": "compute_score"}}}))
    row = pq.read_table(info["test"]).to_pylist()[0]
    truth, src = row["reward_model"]["ground_truth"], row["data_source"]
    assert fn(src, f"so #### {truth}", truth) == default_compute_score(src, f"so #### {truth}", truth) == 1.0
    wrong = ["the answer is 12 and 7", "no digits here at all", "3 3 3"]
    assert [default_compute_score(src, w, truth) for w in wrong] == [0.0] * 3
    scores = [fn(src, w, truth) for w in wrong]
    assert len(set(scores)) == 3 and all(0 <= s < 1 for s in scores), scores


def test_the_smoke_recipe_passes_verls_preflight(cli, clean_env, assets):
    out, _ = assets
    proc = cli("check", RECIPES / "ci-smoke-1gpu.yaml", f"runtime.python={sys.executable}",
               env=dict(clean_env, VERL_SMOKE_DIR=str(out)), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "preflight   ok: verl 0.9.1" in proc.stdout
    assert f"actor_rollout_ref.model.path={out}/model" in proc.stdout


def test_the_tool_model_loaded_as_verl_loads_it_writes_the_calculator_call(assets):
    """The tool model, loaded from its files with verl's tokenizer loader (as the job's workers
    load it), writes hermes calls with the problem's expression, read greedily here by the
    project's own pattern of verl's hermes format (launcher/tool_assets.CALL); verl's own hermes
    parser reading vLLM's sampled calls is tests/test_tool_model.py's (the node environment). The
    data rows carry verl's tools_kwargs and an agent loop name each."""
    import random

    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM
    from verl.utils.tokenizer.tokenizer import hf_tokenizer

    from launcher import tool_assets as ta

    _, info = assets
    tok, model = hf_tokenizer(info["tool_model"]), AutoModelForCausalLM.from_pretrained(info["tool_model"]).eval()
    rows = pq.read_table(info["tool_test"]).to_pylist()
    assert {r["agent_name"] for r in rows} == {"tool_agent"}
    # the training rows, in order: each pair picks one loop, step by step as the tool recipe reads them
    train = [r["agent_name"] for r in pq.read_table(info["tool_train"]).to_pylist()]
    assert train[:10] == ["tool_agent"] * 2 + ["checked_agent"] * 2 + ["single_turn_agent"] * 2 + ["tool_agent"] * 4
    assert all(r["extra_info"]["tools_kwargs"]["calculator"]["create_kwargs"]["ground_truth"] ==
               r["reward_model"]["ground_truth"] for r in rows)
    # verl's reward decodes with special tokens skipped: the call's markers must survive that.
    assert tok.decode(tok("<tool_call>\n{}\n</tool_call>")["input_ids"], skip_special_tokens=True) \
        == "<tool_call>\n{}\n</tool_call>"
    items = [(r["extra_info"]["question"], r["extra_info"]["answer"]) for r in rows[:8]]
    items += ta.problems(8, random.Random(99))  # and problems it was not built with
    render = lambda msgs, gen: tok.apply_chat_template(msgs, tools=[ta.SCHEMA], tokenize=False,  # noqa: E731
                                                       add_generation_prompt=gen)
    calls = ta.greedy_calls(model, tok, render, items)
    assert sum(ok for _, ok in calls) >= 14, calls


@pytest.mark.verl  # builds the tool assets
def test_the_tool_assets_are_the_same_bytes_for_the_same_seed(tmp_path):
    """Built twice, each in a process of its own: model, tokenizer and data byte-identical. (A
    short teaching, the build's own code otherwise: the whole one takes minutes.)"""
    import hashlib
    import subprocess

    files = ["tool-model/model.safetensors", "tool-model/tokenizer.json", "tool-model/tokenizer_config.json",
             "data/tool-train.parquet", "data/tool-test.parquet"]
    outs = (tmp_path / "a", tmp_path / "b")
    # Side by side, each a process of its own: their OpenMP threads asleep when idle (without,
    # the two spun against each other: 94 s for what takes 15 s alone).
    procs = [subprocess.Popen([sys.executable, "-m", "launcher.tool_assets", str(out), "--steps", "40", "--no-check"],
                              env=passive_omp(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL)
             for out in outs]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    digests = [[hashlib.sha256((out / f).read_bytes()).hexdigest() for f in files] for out in outs]
    assert digests[0] == digests[1]


def test_the_tool_reward_gives_partial_credit_for_the_call_and_the_format(assets):
    """verl loads it from reward.py as the tool recipe names it; partial credit for a
    well-formed calculator call and for the answer's format, full for the right answer, and
    a little noise so that rollouts alike still differ."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    _, info = assets
    fn = get_custom_reward_fn(OmegaConf.create({"reward": {"custom_reward_function": {
        "path": info["reward"], "name": "compute_score_tool"}}}))
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3 + 4"}}\n</tool_call>'
    cases = {  # response -> the score without the noise
        f"{call}\n<tool_response>\n7\n</tool_response>\n#### 7": 1.0,
        f"{call}\n<tool_response>\n7\n</tool_response>\n#### 8": 0.5,
        f"{call} no answer": 0.25,
        "#### 8": 0.25,
        '<tool_call>\n{"name": "calculator", "arguments": "3 + 4"}\n</tool_call> #### 8': 0.25,
        '<tool_call>\n{"name": "calc", "arguments": {"expression": "3"}}\n</tool_call>': 0.0,
        "<tool_call>\nnot json\n</tool_call>": 0.0,
        "": 0.0,
    }
    for text, want in cases.items():
        got = [fn("openai/gsm8k", text, "7") for _ in range(6)]
        assert all(want <= g < want + 0.05 for g in got) and len(set(got)) > 1, (text, got)
