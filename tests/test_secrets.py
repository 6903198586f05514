"""Secrets never leak and recipe values cannot inject: refused key sources, redaction, and on
the real sandbox, hostile values arriving byte for byte and the key nowhere but in the env."""

from __future__ import annotations

import hashlib
import json
import os
import string
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import RECIPES, refusal, submit_json

DEMO = RECIPES / "sandbox-demo.yaml"


def _no_key_env(env: dict) -> dict:
    return {k: v for k, v in env.items() if k != "WANDB_API_KEY"}


def _key_file(tmp_path: Path, content: str, mode: int = 0o600) -> Path:
    path = tmp_path / "wandb.key"
    path.write_text(content + "\n")
    path.chmod(mode)
    return path


# ----------------------------------------------------------------------------- key sources
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_group_or_world_readable_key_file_is_refused(cli, clean_env, tmp_path, wandb_key, mode):
    key = _key_file(tmp_path, wandb_key, mode)
    proc = cli("submit", DEMO, f"wandb.api_key_file={key}", f"paths.runs={tmp_path / 'runs'}",
               env=_no_key_env(clean_env))
    assert proc.returncode == 2, proc.stderr
    assert "chmod 600" in proc.stderr and "wandb.api_key_file" in proc.stderr
    assert wandb_key not in proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()


def test_key_file_of_another_user_is_refused(cli, clean_env, tmp_path, wandb_key):
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    key = _key_file(tmp_path, wandb_key)
    os.chown(key, 65534, 65534)
    proc = cli("submit", DEMO, f"wandb.api_key_file={key}", env=_no_key_env(clean_env))
    assert proc.returncode == 2 and "not owned by you" in proc.stderr
    assert wandb_key not in proc.stderr


@pytest.mark.parametrize("content", ["0123456789abcdef", "has spaces in it " * 4, "tab\tkey" + "x" * 40])
def test_malformed_key_file_is_refused_without_echoing_it(cli, clean_env, tmp_path, content):
    key = _key_file(tmp_path, content)
    proc = cli("submit", DEMO, f"wandb.api_key_file={key}", env=_no_key_env(clean_env))
    assert proc.returncode == 2 and "does not look like a W&B API key" in proc.stderr
    assert content.strip() not in proc.stderr


def test_missing_key_file_is_refused(cli, clean_env, tmp_path):
    proc = cli("submit", DEMO, f"wandb.api_key_file={tmp_path / 'nope.key'}", env=_no_key_env(clean_env))
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_no_key_anywhere_is_refused(cli, clean_env, tmp_path):
    proc = cli("submit", DEMO, f"paths.runs={tmp_path / 'runs'}", env=_no_key_env(clean_env))
    assert proc.returncode == 2
    assert "WANDB_API_KEY" in proc.stderr and "netrc" in proc.stderr
    assert not (tmp_path / "runs").exists()


def _netrc(env: dict, text: str, mode: int) -> Path:
    home = Path(env["HOME"])
    home.mkdir(parents=True, exist_ok=True)
    netrc = home / ".netrc"
    netrc.write_text(text)
    netrc.chmod(mode)
    return netrc


def test_netrc_entry_for_the_wandb_host_is_a_key_source(cli, clean_env, tmp_path, wandb_key):
    _netrc(clean_env, f"machine wandb.example.com\n  login user\n  password {wandb_key}\n", 0o600)
    env = _no_key_env(clean_env)
    # Only the entry for the recipe's W&B host counts.
    proc = cli("check", DEMO, env=env)  # submit's verdict: no key, refused
    assert proc.returncode == 2 and "W&B key     MISSING" in proc.stdout, proc.stderr
    assert refusal(proc.stderr).splitlines()[-1].startswith("error: ") and "WANDB_API_KEY" in proc.stderr
    proc = cli("check", DEMO, "wandb.base_url=https://wandb.example.com", env=env)
    assert proc.returncode == 0 and "~/.netrc (wandb.example.com)" in proc.stdout
    proc = cli("submit", DEMO, "wandb.base_url=https://wandb.example.com", "--dry-run", env=env)
    assert proc.returncode == 0, proc.stderr
    assert wandb_key not in proc.stdout and "WANDB_HOST=wandb.example.com" in proc.stdout


def test_readable_netrc_is_refused_and_parse_errors_do_not_echo(cli, clean_env, wandb_key):
    netrc = _netrc(clean_env, f"machine api.wandb.ai login user password {wandb_key}\n", 0o644)
    env = _no_key_env(clean_env)
    proc = cli("submit", DEMO, "--dry-run", env=env)
    assert proc.returncode == 2 and "chmod 600" in proc.stderr and wandb_key not in proc.stderr
    netrc.write_text("machine github.com login me password hunter2 Secr3tPart\n")
    netrc.chmod(0o600)
    proc = cli("check", DEMO, env=env)
    assert proc.returncode == 2 and "cannot parse" in proc.stderr
    assert "Secr3tPart" not in proc.stderr and "hunter2" not in proc.stderr


def test_check_refuses_a_secret_value_in_the_recipe(cli, clean_env, wandb_key):
    proc = cli("check", DEMO, f"env.OTHER={wandb_key}", env=clean_env)
    assert proc.returncode == 2 and "env.OTHER" in proc.stderr and wandb_key not in proc.stderr


def test_declared_secret_must_be_set_and_is_never_written(cli, clean_env, tmp_path):
    token = "hf_" + "T0k3n" * 8
    proc = cli("submit", DEMO, "secrets=[HF_TOKEN]", "--dry-run", env=clean_env)
    assert proc.returncode == 2 and "HF_TOKEN" in proc.stderr
    proc = cli("submit", DEMO, "secrets=[HF_TOKEN]", "--dry-run", env=dict(clean_env, HF_TOKEN=token))
    assert proc.returncode == 0, proc.stderr
    assert token not in proc.stdout and "SECRETS=( HF_TOKEN )" in proc.stdout


@pytest.mark.parametrize("field", ["env.OTHER", "wandb.project", "verl.overrides.data.note", "wandb.experiment"])
def test_secret_value_inside_the_recipe_is_refused(cli, clean_env, tmp_path, wandb_key, field):
    proc = cli("submit", DEMO, f"{field}={wandb_key}", f"paths.runs={tmp_path / 'runs'}", env=clean_env)
    assert proc.returncode == 2, proc.stdout
    assert field in proc.stderr and "secret" in proc.stderr
    assert wandb_key not in proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()


def test_error_messages_redact_secret_values(cli, clean_env, wandb_key):
    token = "ghp_" + "s3cr3t" * 7
    env = dict(clean_env, GITHUB_TOKEN=token)
    for bad in (f"cluster.partition='{wandb_key} x'", f"cluster.qos='{token};'"):
        proc = cli("check", DEMO, bad, env=env)
        assert proc.returncode == 2
        assert "<redacted>" in proc.stderr, proc.stderr
        assert wandb_key not in proc.stderr and token not in proc.stderr


# ----------------------------------------------------------------------------- on the sandbox
def _job_files_and_tables(sandbox, info) -> str:
    run_dir = Path(info["run_dir"])
    blobs = [p.read_bytes().decode(errors="replace") for p in run_dir.rglob("*") if p.is_file()]
    blobs.append(sandbox.run("scontrol", "show", "job", info["job_id"]).stdout)
    blobs.append(sandbox.run("squeue", "-h", "-j", info["job_id"], "-o", "%all").stdout)
    return "\n".join(blobs)


def _all_cmdlines() -> str:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                out.append((p / "cmdline").read_bytes().decode(errors="replace"))
            except OSError:
                pass
    return "\n".join(out)


@pytest.mark.sandbox_shared
def test_key_is_only_in_the_environment_while_the_job_runs(cli, sandbox, clean_env, tmp_path, wandb_key):
    proc = cli("submit", DEMO, f"runtime.python={sys.executable}", f"paths.runs={tmp_path / 'runs'}",
               "verl.overrides.demo.hold=8", "--json", env=sandbox.env(clean_env))
    info = submit_json(proc)
    phases = Path(info["phases"])
    deadline = time.monotonic() + 120
    while not (phases.exists() and '"driver-start"' in phases.read_text()):
        assert time.monotonic() < deadline, Path(info["stdout"]).read_text()
        time.sleep(0.3)
    time.sleep(1)
    assert wandb_key not in _all_cmdlines()  # sbatch, srun, ray, raylet, python: none has it
    assert wandb_key not in _job_files_and_tables(sandbox, info)
    assert sandbox.wait(info["job_id"]) == "COMPLETED"
    assert wandb_key not in _job_files_and_tables(sandbox, info)
    report = json.loads((Path(info["run_dir"]) / "demo-report.r0.json").read_text())
    digest = hashlib.sha256(wandb_key.encode()).hexdigest()[:12]
    # ...and it is in the environment of Ray's workers on every node.
    assert [n["wandb_api_key"]["sha256_12"] for n in report["nodes"]] == [digest, digest]


# Values that would run something if any layer (YAML, Hydra, Jinja, bash, srun) evaluated them.
def _hostile(marker: Path) -> st.SearchStrategy:
    payloads = [f"$(touch {marker})", f"`touch {marker}`", f"'; touch {marker}; '", f'"; touch {marker}; "',
                f"\n touch {marker}\n", "{{ 7*7 }}", "{% raw %}", "${HOME}", "\\", "'", '"', ",", "=",
                "[a,b]", "{k: v}", "$1", "!!", "é日本", "-n", "%s", "#", "*", "~", "&", ";"]
    piece = st.one_of(st.sampled_from(payloads), st.text(string.printable, max_size=5))
    return st.lists(piece, min_size=1, max_size=6).map("".join).filter(
        lambda s: "\x00" not in s and s.strip() != "???" and "\\${" not in s and not s.endswith("\\"))


@pytest.mark.sandbox_shared
@settings(max_examples=2, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_hostile_values_arrive_byte_for_byte(cli, sandbox, clean_env, tmp_path, data):
    marker = tmp_path / "INJECTED"
    values = data.draw(st.lists(_hostile(marker), min_size=4, max_size=4))
    experiment = data.draw(_hostile(marker).filter(lambda s: len(s) <= 128 and s.isprintable()))
    recipe = yaml.safe_load(DEMO.read_text())
    # In YAML, `${` would be an interpolation of the recipe: write it escaped, as a user would.
    esc = lambda s: s.replace("${", "\\${")  # noqa: E731
    recipe["env"].update({f"DEMO_ECHO_{i}": esc(v) for i, v in enumerate(values)})
    recipe["verl"]["overrides"].update({f"demo.s{i}": esc(v) for i, v in enumerate(values)})
    recipe["wandb"]["experiment"] = esc(experiment)
    path = tmp_path / f"hostile-{len(list(tmp_path.glob('hostile-*')))}.yaml"
    path.write_text(yaml.safe_dump(recipe, allow_unicode=True))
    proc = cli("submit", path, f"runtime.python={sys.executable}", f"paths.runs={tmp_path / 'runs'}",
               "--json", env=sandbox.env(clean_env))
    info = submit_json(proc)
    subprocess.run(["bash", "-n", info["script"]], check=True)
    assert sandbox.wait(info["job_id"]) == "COMPLETED", Path(info["stdout"]).read_text()
    report = json.loads((Path(info["run_dir"]) / "demo-report.r0.json").read_text())
    for seen in [report["driver"], *report["nodes"]]:  # the environment, on every node
        assert seen["echo"] == {f"DEMO_ECHO_{i}": v for i, v in enumerate(values)}
        assert seen["WANDB_NAME"] == experiment
    # verl's config holds exactly the strings (argv parsed by Hydra, interpolations resolved).
    assert report["config"]["demo"] == {f"s{i}": v for i, v in enumerate(values)}
    assert report["config"]["trainer"]["experiment_name"] == experiment
    assert not marker.exists()
