"""The allocation check on the real sandbox (phase inputs-check): while Ray starts, every node
checks the inputs it must read, that the run and checkpoint dirs are the same storage as the
head node's, its GPUs and its free disk; a failure names the node, the field and the path, in
seconds, Ray is stopped and no driver starts. Each sandbox node has a node-local tmpfs at
$SANDBOX_DIR/local that the other nodes cannot see, as /scratch on a cluster."""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

import pytest

from conftest import RECIPES, submit_json
from sandbox_procs import job_processes


NODE_LOCAL = Path("/tmp/verl-launch-sandbox/local")  # tests/cluster/sandbox-up.sh


def _run(cli, sandbox, clean_env, tmp_path, *overrides) -> dict:
    env = sandbox.env(dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state")))
    info = submit_json(cli("submit", RECIPES / "sandbox-demo.yaml", f"runtime.python={sys.executable}",
                           f"paths.runs={tmp_path / 'runs'}", *overrides, "--json", env=env))
    info["state"] = sandbox.wait(info["job_id"], timeout=180)
    info["phases"] = [json.loads(x) for x in Path(info["run_dir"], "phases.jsonl").read_text().splitlines()]
    info["out"] = Path(info["stdout"]).read_text()
    info["status"] = json.loads(cli("status", info["job_id"], "--json", env=env).stdout)
    info["nodes"] = sandbox.nodes(info["job_id"])  # the head first: another test's job may hold node1
    return info


def _refused(info) -> str:
    """The job failed in the allocation check, before the driver, leaving no Ray; returns what it said."""
    assert info["state"] == "FAILED", info["out"][-3000:]
    assert not job_processes(info["job_id"])
    names = [p["phase"] for p in info["phases"] if p["phase"] != "bad-node"]
    assert names == ["start", "nodes", "inputs-check", "error", "teardown"], names
    why = [p["detail"] for p in info["phases"] if p["phase"] == "error"][0]
    assert why.startswith("allocation check: ") and "node_checks" in why
    assert info["status"]["stopped"] == f"error: {why}"
    return why


# runtime.setup, on the job's Nth node only (0: the head), by Slurm's own list of the job's nodes:
# the test cannot know beforehand which nodes its job will get. (Not SLURM_NODEID: it counts the
# step's nodes, and the Ray workers' step, which starts beside the check, begins at the second.)
def _on_node(n: int, cmd: str) -> str:
    return (f"""runtime.setup=['[ "$SLURMD_NODENAME" != "$(scontrol show hostnames "$SLURM_JOB_NODELIST" """
            f"""| sed -n {n + 1}p)" ] || {cmd}']""")


@pytest.mark.sandbox_shared
def test_data_staged_on_the_head_node_only_is_caught_on_the_other(cli, sandbox, clean_env, tmp_path):
    name = f"train-{secrets.token_hex(4)}.parquet"
    info = _run(cli, sandbox, clean_env, tmp_path, f"verl.overrides.data.train_files={NODE_LOCAL}/{name}",
                "verl.overrides.data.val_files=/no/such/dir/test.parquet", _on_node(0, f"echo data > {NODE_LOCAL}/{name}"))
    why, (head, other) = _refused(info), info["nodes"]
    assert f"{other}: data.train_files: {NODE_LOCAL}/{name}: not found on this node" in why
    assert f"{head}: data.val_files: /no/such/dir/test.parquet: not found on this node" in why
    assert f"{head}: data.train_files" not in why  # the head node has it


def test_a_container_image_one_node_cannot_see_fails_before_ray_naming_it(cli, sandbox, clean_env, tmp_path):
    """A squashfs container.image on node1's local disk only: the job looks for it on every node,
    on the host, before any step runs in the image (the sandbox has no pyxis: a step in the
    image would fail in srun's words), and names node2 and the path; check only warns here.
    Serial: the image is staged on node1 before the job, which must get node1 and node2 (with a
    container, runtime.setup runs in the image's steps only, after this check: it cannot stage it)."""
    image = NODE_LOCAL / f"verl-{secrets.token_hex(4)}.sqsh"
    made = sandbox.run("srun", "-w", "node1", "-N1", "bash", "-c", f"echo squashfs > {image}")
    assert made.returncode == 0, made.stderr
    mount = f"container.mounts=[{tmp_path}:{tmp_path}]"
    info = _run(cli, sandbox, clean_env, tmp_path, f"container.image={image}", mount)
    why = _refused(info)
    assert why.startswith(f"allocation check: container.image: {image} is not readable on node2 "), why
    assert [p["detail"] for p in info["phases"] if p["phase"] == "bad-node"] == [
        f"node2: inputs-check: container.image: {image} is not readable there"]
    assert f"container.image {image}" in [p["detail"] for p in info["phases"] if p["phase"] == "inputs-check"]


@pytest.mark.sandbox_shared
def test_a_node_local_checkpoint_dir_is_caught_and_the_check_can_be_turned_off(cli, sandbox, clean_env, tmp_path):
    ckpt = NODE_LOCAL / f"ckpt-{secrets.token_hex(4)}"
    info = _run(cli, sandbox, clean_env, tmp_path, f"verl.overrides.trainer.default_local_dir={ckpt}")
    why, (head, other) = _refused(info), info["nodes"]
    # Only the other node failed it: the failure is put down to it (excluded if the job requeued).
    assert [p["detail"][:60] for p in info["phases"] if p["phase"] == "bad-node"] == [
        f"{other}: inputs-check: {other}: trainer.default_local_dir: {ckpt}"[:60]]
    assert info["status"]["bad_nodes"][0]["node"] == other
    assert why.startswith(f"allocation check: {other}: trainer.default_local_dir: {ckpt}: not the storage the head "
                          "node writes to"), why
    assert f"{head}:" not in why
    off = _run(cli, sandbox, clean_env, tmp_path, f"verl.overrides.trainer.default_local_dir={ckpt}",
               "node_checks.shared_storage=false")
    assert off["state"] == "COMPLETED", off["out"][-2000:]
    assert "inputs-check" in [p["phase"] for p in off["phases"]]  # the other checks still ran


@pytest.mark.sandbox_shared
def test_a_node_with_a_gpu_gone_is_caught(cli, sandbox, clean_env, tmp_path):
    """The second node's nvidia-smi lists one GPU where Slurm gave two (one fell off the bus)."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text('#!/bin/sh\n[ "$1" = -L ] && echo "GPU 0: NVIDIA H100 (UUID: GPU-fake-0)"\n')
    (fake / "nvidia-smi").chmod(0o755)
    info = _run(cli, sandbox, clean_env, tmp_path, _on_node(1, f"export PATH={fake}:$PATH"))
    why = _refused(info)
    assert why.startswith(f"allocation check: {info['nodes'][1]}: cluster.gpus_per_node: CUDA_VISIBLE_DEVICES: "
                          "1 GPU(s) usable here (nvidia-smi lists 1), Slurm gave 2"), why


@pytest.mark.sandbox_shared
def test_too_little_free_disk_is_caught(cli, sandbox, clean_env, tmp_path):
    info = _run(cli, sandbox, clean_env, tmp_path, "node_checks.min_free_gb=1000000")
    why = _refused(info)
    assert info["status"]["bad_nodes"] == []  # every node: the recipe's doing, not a node's
    assert f"{info['nodes'][0]}: node_checks.min_free_gb: " in why and "GB free, below 1000000 GB" in why


def test_a_node_whose_setup_fails_is_named(cli, sandbox, clean_env, tmp_path):
    info = _run(cli, sandbox, clean_env, tmp_path, "cluster.nodes=3",
                """runtime.setup=['[ "$(hostname)" != node3 ] || { echo "no venv here" >&2; exit 7; }']""")
    why = _refused(info)
    assert why.startswith("allocation check: node3: runtime.setup or the check: Exited with exit code 7"), why
    assert "no venv here" in info["out"]


@pytest.mark.sandbox_shared
def test_a_verl_on_the_nodes_other_than_the_recipes_fails_the_job_naming_both(cli, sandbox, clean_env, tmp_path):
    """What the nodes' Python finds as verl (in the container, when there is one) against the
    recipe's verl.version: here a verl 0.8.5 first on the nodes' PYTHONPATH (runtime.setup: the
    nodes' only; the launcher's preflight sees this venv's verl 0.9.1)."""
    site = tmp_path / "site"
    (site / "verl" / "version").mkdir(parents=True)
    (site / "verl" / "__init__.py").write_text("")
    (site / "verl" / "version" / "version").write_text("0.8.5\n")
    env = sandbox.env(dict(clean_env, VERL_LAUNCH_STATE=str(tmp_path / "state")))
    info = submit_json(cli("submit", RECIPES / "sandbox-verl.yaml", f"runtime.python={sys.executable}",
                           f"paths.runs={tmp_path / 'runs'}", "node_checks.inputs=false",
                           f"runtime.setup=['export PYTHONPATH={site}']", "--json", env=env))
    info["state"] = sandbox.wait(info["job_id"], timeout=180)
    info["phases"] = [json.loads(x) for x in Path(info["run_dir"], "phases.jsonl").read_text().splitlines()]
    info["out"] = Path(info["stdout"]).read_text()
    info["status"] = json.loads(cli("status", info["job_id"], "--json", env=env).stdout)
    why, nodes = _refused(info), sandbox.nodes(info["job_id"])
    for node in nodes:
        assert f"{node}: verl.version: {site}/verl/__init__.py: this node's verl is 0.8.5, the recipe runs verl 0.9.1" in why, why
    assert f"; {nodes[1]}: " in why  # one problem after another, readably
