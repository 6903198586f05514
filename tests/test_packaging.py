"""The package finds its templates and shipped recipes both as an editable install and as
a wheel installed in a fresh virtual environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT

NEEDED = ["launcher/templates/sbatch.sh.j2", "launcher/templates/job/driver.sh.j2", "launcher/templates/wait_ready.py",
          "launcher/templates/sweep.sbatch.j2",
          "launcher/recipes/sandbox-demo.yaml", "launcher/recipes/gsm8k-grpo.yaml",
          "launcher/recipes/cluster/sandbox.yaml", "launcher/recipes/cluster/sunk.yaml",
          "launcher/checks/verl_schemas/verl-0.9.1.json"]


def test_editable_install_uses_the_checkout(tmp_path):
    code = ("import json, importlib.metadata as m, launcher.resources as r; "
            "d = m.distribution('verl-launch'); "
            "print(json.dumps([str(r.templates_dir()), str(r.shipped_recipes_dir()), d.read_text('direct_url.json')]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    templates, recipes, direct_url = json.loads(proc.stdout)
    assert Path(templates) == ROOT / "templates" and Path(recipes) == ROOT / "recipes"
    assert json.loads(direct_url)["dir_info"].get("editable") is True


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (whl,) = out.glob("verl_launch-*.whl")
    return whl


def test_wheel_carries_templates_and_recipes(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [n for n in NEEDED if n not in names]
    assert not missing, f"not in the wheel: {missing}"
    assert not any(n.startswith(("tests/", "launcher/tests")) for n in names)


def test_wheel_in_a_fresh_venv_renders_and_checks(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "-q", str(wheel)],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    exe = venv / "bin" / "verl-launch"
    where = subprocess.run([venv / "bin" / "python", "-c", "import launcher.resources as r; print(r.shipped_recipes_dir())"],
                           capture_output=True, text=True, cwd=tmp_path)
    recipes = Path(where.stdout.strip())
    assert recipes.is_relative_to(venv), recipes  # the installed copy, not the checkout
    for recipe in ("sandbox-demo.yaml", "gsm8k-grpo.yaml"):
        render = subprocess.run([exe, "render", recipes / recipe], capture_output=True, text=True, cwd=tmp_path)
        assert render.returncode == 0 and render.stdout.startswith("#!/bin/bash"), render.stderr
    # A user's own recipe elsewhere still composes the shipped cluster profile.
    mine = tmp_path / "mine.yaml"
    mine.write_text("defaults:\n  - cluster: sunk\njob:\n  name: mine\nwandb:\n  project: p\n"
                    "verl:\n  overrides:\n    actor_rollout_ref.rollout.name: vllm\npaths:\n  runs: /mnt/data/runs\n")
    env = dict(os.environ, WANDB_API_KEY="local-" + "0" * 40)
    check = subprocess.run([exe, "check", mine, "cluster.nodes=4"], capture_output=True, text=True, cwd=tmp_path,
                           env=env)
    assert check.returncode == 0, check.stderr
    assert "4 node(s) x 8 GPU(s), 112 CPUs" in check.stdout
    # verl's config snapshot travels in the wheel: a typo is found without verl
    typo = subprocess.run([exe, "check", mine, "+verl.overrides.trainer.total_epoch=2"], capture_output=True,
                          text=True, cwd=tmp_path, env=env)
    assert typo.returncode == 2 and "did you mean trainer.total_epochs?" in typo.stderr, typo.stderr


def test_make_installs_hand_pips_own_configuration_to_uv(tmp_path):
    """tests/tools/pip_install.py: uv gets pip's index, extra indexes, find-links, constraints and
    CA file as flags, pip's variables before its files, and the best version across indexes."""
    (tmp_path / "pip.conf").write_text("[global]\nfind-links = /from-file\nconstraint = /c.txt\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=str(tmp_path / "pip.conf"), PIP_FIND_LINKS="/w1 /w2",
               PIP_EXTRA_INDEX_URL="file:///idx1 file:///idx2", PIP_CERT="/ca.pem")
    code = ("import json, sys; sys.path.insert(0, 'tests/tools'); import pip_install as p; "
            "c = p.pip_config(); print(json.dumps([p.uv_command(['-r', 'req.txt'], c), c.get('cert')]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr
    cmd, cert = json.loads(proc.stdout)
    pairs = list(zip(cmd[4:], cmd[5:]))
    assert cmd[1:4] == ["pip", "install", "-q"] and cmd[-2:] == ["-r", "req.txt"]
    assert ("--find-links", "/w1") in pairs and ("--find-links", "/w2") in pairs
    assert ("--find-links", "/from-file") not in pairs  # the variable wins, as in pip
    assert ("--extra-index-url", "file:///idx1") in pairs and ("--extra-index-url", "file:///idx2") in pairs
    assert ("--constraint", "/c.txt") in pairs and ("--index-strategy", "unsafe-best-match") in pairs
    assert "--compile-bytecode" in cmd  # as pip does: else each process compiles torch at import
    assert cert == "/ca.pem"
