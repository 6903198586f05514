"""Test-only (see README.md): a "cpu" platform for verl 0.9.1's platform registry.

verl registers cuda/npu/rocm only and falls back to "nvidia" when none is present; with this
registered and VERL_PLATFORM=cpu set before verl resolves its platform, the device is "cpu"
and the collective backend "gloo".
"""
import contextlib
import types

import torch

from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

# torch.cpu lacks empty_cache/manual_seed*/get_rng_state, which verl calls through
# get_torch_device(); give it a small shim module.
_cpu_mod = types.SimpleNamespace(
    empty_cache=lambda: None,
    synchronize=lambda *a, **k: None,
    is_available=lambda: True,
    device_count=lambda: 1,
    current_device=lambda: "cpu",
    set_device=lambda *a, **k: None,
    manual_seed=torch.manual_seed,
    manual_seed_all=torch.manual_seed,
    get_rng_state=torch.get_rng_state,
    set_rng_state=torch.set_rng_state,
    memory_allocated=lambda *a, **k: 0,
    memory_reserved=lambda *a, **k: 0,
    max_memory_allocated=lambda *a, **k: 0,
    max_memory_reserved=lambda *a, **k: 0,
    mem_get_info=lambda *a, **k: (0, 0),
    reset_peak_memory_stats=lambda *a, **k: None,
    get_device_name=lambda *a, **k: "CPU",  # verl/utils/flops_counter.py:80 names the device
)


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    @property
    def device_name(self):
        return "cpu"

    @property
    def vendor_name(self):
        return "cpu"

    @property
    def device_module(self):
        return _cpu_mod

    def is_available(self):
        return True

    def current_device(self):
        return torch.device("cpu")

    def device_count(self):
        return 1

    def set_device(self, device_index):
        pass

    def synchronize(self, device_index=None):
        pass

    def manual_seed(self, seed):
        torch.manual_seed(seed)

    def manual_seed_all(self, seed):
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings):
        pass

    def empty_cache(self):
        pass

    def get_device_capability(self, device_index=0):
        return None, None

    def communication_backend_name(self):
        return "gloo"

    def visible_devices_envvar(self):
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg):
        yield

    def profiler_start(self):
        pass

    def profiler_stop(self):
        pass

    def ray_resource_name(self):
        return "GPU"  # the sandbox's Ray nodes advertise fake GPUs: one worker per GPU slot

    def ray_noset_envvars(self):
        return []

    def is_ipc_supported(self):
        return False

    def cudart(self):
        return None
