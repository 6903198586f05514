"""templates/check_node.py (the allocation check each node runs), on this machine, for the cases
the sandbox cannot make: GPUs counted with and without Slurm's variable, and the vendor's tool.
The sandbox tests (test_node_checks.py) run it for real on every node."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPT = ROOT / "templates" / "check_node.py"


def check(tmp_path, spec: dict, env: dict, lists: int = None, python=(sys.executable,)) -> list:
    """Run it as the job does; `lists` GPUs from a stand-in nvidia-smi (None: none on PATH)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "nvidia-smi"
    tool.unlink(missing_ok=True)
    if lists is not None:
        tool.write_text("#!/bin/sh\n" + "".join(f'echo "GPU {i}: NVIDIA H100 (UUID: GPU-{i})"\n' for i in range(lists)))
        tool.chmod(0o755)
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    (run_dir / ".token").write_text("t-1\n")
    full = {"inputs": [], "shared": True, "checkpoints": None, "min_free_gb": 0, "gpus": None,
            "gpu_var": "CUDA_VISIBLE_DEVICES", "gpu_tool": "nvidia-smi", **spec}
    base = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    proc = subprocess.run([*python, str(SCRIPT), json.dumps(full), str(run_dir), ".token", "t-1"],
                          env={**base, "PATH": f"{bin_dir}:/usr/bin:/bin", "SLURMD_NODENAME": "nodeX", **env},
                          capture_output=True, text=True, timeout=60)
    lines = proc.stdout.splitlines()
    assert proc.returncode == (1 if lines else 0), proc.stderr
    assert all(line.startswith("@problem ") for line in lines), lines  # what the job script picks out
    return [line[len("@problem "):] for line in lines]


@pytest.mark.parametrize("env, lists, expect", [
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, 8, None),  # gres gave 2 of the node's 8
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, None, None),  # no tool: Slurm's word
    ({"CUDA_VISIBLE_DEVICES": "0"}, 8, "Slurm gave this step 1 GPU(s), expected 2"),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, 1, "1 GPU(s) usable here (nvidia-smi lists 1), Slurm gave 2"),
    ({}, 8, None),  # no gres: Ray takes 2 of the 8
    ({}, 1, "nvidia-smi: 1 GPU(s) here, expected 2"),
    ({}, None, "cannot count this node's GPUs: no CUDA_VISIBLE_DEVICES from Slurm, no nvidia-smi"),
])
def test_gpu_count(tmp_path, env, lists, expect):
    got = check(tmp_path, {"gpus": 2}, env, lists)
    assert got == ([] if expect is None else [f"nodeX: cluster.gpus_per_node: {'' if 'nvidia-smi:' in expect else 'CUDA_VISIBLE_DEVICES: '}{expect}"]), got


def test_inputs_shared_storage_and_free_disk(tmp_path):
    data = tmp_path / "train.parquet"
    data.write_text("x")
    unreadable = tmp_path / "secret.parquet"
    unreadable.write_text("x")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()  # no token there: another storage than the head's
    spec = {"inputs": [["data.train_files", str(data)], ["data.val_files", str(tmp_path / "nope.parquet")],
                       ["actor_rollout_ref.model.path", str(tmp_path)]],
            "checkpoints": str(ckpt), "min_free_gb": 10 ** 9}
    got = check(tmp_path, spec, {})
    assert got[0] == f"nodeX: data.val_files: {tmp_path / 'nope.parquet'}: not found on this node"
    assert got[1].startswith(f"nodeX: trainer.default_local_dir: {ckpt}: not the storage the head node writes to")
    assert got[2].startswith(f"nodeX: node_checks.min_free_gb: {ckpt}: ") and "GB free, below 1000000000 GB" in got[2]
    assert len(got) == 3  # the run dir has the head's token; the data file and model dir are readable
    (ckpt / ".token").write_text("t-1\n")
    assert check(tmp_path, dict(spec, min_free_gb=0), {}) == got[:1]
    if os.geteuid() != 0:  # root reads anything
        unreadable.chmod(0)
        assert check(tmp_path, {"inputs": [["data.train_files", str(unreadable)]]}, {}) == [
            f"nodeX: data.train_files: {unreadable}: not readable (Permission denied)"]


def test_a_check_that_never_returns_is_named_and_does_not_hold_the_job(tmp_path):
    """A hung mount: the check blocks in open() (here, a FIFO nobody writes); it reports the
    field and path after its time limit and exits, though the blocked thread cannot."""
    fifo = tmp_path / "hung.parquet"
    os.mkfifo(fifo)
    script = SCRIPT.read_text().replace("TIME_LIMIT = 60", "TIME_LIMIT = 2")
    limited = tmp_path / "check_node.py"
    limited.write_text(script)
    spec = {"inputs": [["data.train_files", str(fifo)]], "shared": False, "checkpoints": None, "min_free_gb": 0,
            "gpus": None, "gpu_var": "CUDA_VISIBLE_DEVICES", "gpu_tool": None}
    proc = subprocess.run([sys.executable, str(limited), json.dumps(spec), str(tmp_path), ".t", "x"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [f"@problem {os.uname().nodename}: data.train_files: {fifo}: "
                                        "did not answer within 2 s (a hung mount?)"]


def _verl_at(root, version) -> str:
    """A verl package that is only its version file (what the check reads, without importing)."""
    (root / "verl" / "version").mkdir(parents=True)
    (root / "verl" / "__init__.py").write_text("raise SystemExit('the check must not import verl')\n")
    if version is not None:
        (root / "verl" / "version" / "version").write_text(version + "\n")
    return str(root)


@pytest.mark.parametrize("want, have, expect", [
    ("0.9.1", "0.9.1", None),
    ("0.9", "0.9.1", None),  # a minor version matches its patches
    ("0.9.1", "0.9.1.dev0", None),
    ("0.9.1", "0.8.5", "this node's verl is 0.8.5, the recipe runs verl 0.9.1"),
    ("0.9.1", "0.9.10", "this node's verl is 0.9.10, the recipe runs verl 0.9.1"),
    ("0.9.1", "", "cannot tell this verl's version (the recipe runs verl 0.9.1)"),
    ("0.9.1", None, "no verl installed for this Python (the recipe runs verl 0.9.1)"),
])
def test_the_nodes_verl_is_the_recipes(tmp_path, want, have, expect):
    site = _verl_at(tmp_path / "site", have or None) if have is not None else ""
    # -S: without site-packages (this venv has a verl of its own); PYTHONPATH still counts
    got = check(tmp_path, {"shared": False, "verl_version": want}, {"PYTHONPATH": site}, python=(sys.executable, "-S"))
    if expect is None:
        assert got == [], got
    else:
        assert len(got) == 1 and got[0].startswith("nodeX: verl.version: ") and expect in got[0], got
