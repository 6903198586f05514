"""The CI smoke recipe's assets, built here on the CPU: verl's own tokenizer and dataset code
load them, transformers loads the model and runs it, verl's rule-based reward scores the data,
and the recipe passes `check` (verl's preflight) against them. The GPU run itself is not
possible here."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import RECIPES


@pytest.fixture(scope="module")
def assets(smoke_assets):
    return smoke_assets, json.loads((smoke_assets / "smoke-assets.json").read_text())


def test_verl_loads_the_tokenizer_and_dataset(assets):
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
                               "cache_dir": str(out / "cache")})
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
