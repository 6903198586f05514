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

        def init_process_group(*a, backend=None, **k):
            if isinstance(backend, str) and "," in backend:  # "cpu:gloo,cpu:gloo" on a cpu platform
                backend = ",".join(dict.fromkeys(backend.split(",")))
            out = orig(*a, backend=backend, **k)
            import socket
            print(f"[cpu-platform] init_process_group rank={mod.get_rank()} world={mod.get_world_size()} "
                  f"host={socket.gethostname()} backend={mod.get_backend()} "
                  f"master={os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} "
                  f"GLOO_SOCKET_IFNAME={os.environ.get('GLOO_SOCKET_IFNAME')}", flush=True)
            return out
        mod.init_process_group = init_process_group

    _after("verl.plugin.platform.platform_manager", _register)
    _after("torch.distributed.fsdp._init_utils", _fsdp)
    _after("torch.distributed", _dist)
