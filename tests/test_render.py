"""Rendering: golden files of every shipped recipe, bash -n and shellcheck, template hygiene."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RECIPES, ROOT
from launcher.core.paths import RunPaths
from launcher.core.recipe import load
from launcher.core.render import render

GOLDEN = ROOT / "tests" / "golden"
SHIPPED = sorted(RECIPES.glob("*.yaml"))
TEMPLATE = ROOT / "templates" / "sbatch.sh.j2"
# The job script's text: the top template and its rooms (templates/job/), all of them.
TEMPLATES = [TEMPLATE, *sorted((ROOT / "templates" / "job").glob("*.sh.j2"))]


def _render(path: Path, *overrides: str) -> str:
    return render(load(path, list(overrides)).plan).replace(str(ROOT), "<ROOT>")


@pytest.fixture(autouse=True)
def fixed_home(monkeypatch):
    monkeypatch.setenv("HOME", "/home/user")  # recipes interpolate ${oc.env:HOME}


@pytest.mark.parametrize("recipe", SHIPPED, ids=lambda p: p.stem)
def test_golden(recipe):
    """Rendered scripts of the shipped recipes, byte for byte (UPDATE_GOLDEN=1 rewrites them)."""
    got = _render(recipe)
    golden = GOLDEN / f"{recipe.stem}.sbatch"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(got)
    assert golden.exists(), f"no golden file for {recipe.name}: run UPDATE_GOLDEN=1 pytest {__file__}"
    assert got == golden.read_text(), f"{recipe.name} renders differently from {golden}"


# Variants beyond the shipped recipes' own settings: SUNK's containers (pyxis).
VARIANTS = {"gsm8k-grpo+sunk": (RECIPES / "gsm8k-grpo.yaml",
                                ["cluster=sunk", "cluster.partition=h100", "cluster.account=team", "runtime.setup=[]",
                                 "paths.runs=/mnt/data/runs",
                                 "verl.overrides.trainer.default_local_dir=/mnt/data/ckpt/gsm8k",
                                 "container.workdir=/mnt/data/work", "container.env=[HF_TOKEN]"])}


@pytest.mark.parametrize("name", VARIANTS)
def test_golden_variants(name):
    recipe, overrides = VARIANTS[name]
    got = _render(recipe, *overrides)
    golden = GOLDEN / f"{name}.sbatch"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(got)
    assert got == golden.read_text(), f"{name} renders differently from {golden}"


def test_golden_sweep_array():
    """A sweep's job-array script (gsm8k-grpo on SUNK, 8 points, at most 3 at once)."""
    from launcher.core.render import render_array

    recipe, overrides = VARIANTS["gsm8k-grpo+sunk"]
    got = render_array(load(recipe, overrides).plan, "gsm8k-grpo-sweep-20261201-120000-abcd", 8, 3) \
        .replace(str(ROOT), "<ROOT>")
    golden = GOLDEN / "gsm8k-grpo+sunk.sweep.sbatch"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(got)
    assert got == golden.read_text(), f"the sweep's array script renders differently from {golden}"
    assert "#SBATCH --array=0-7%3" in got and "#SBATCH --output=%a/slurm-%A_%a.out" in got
    assert "--output=slurm-%j.out" not in got  # the point's own output name would fight the array's


def test_container_steps_run_in_the_image_and_the_nodes_step_on_the_host():
    recipe, overrides = VARIANTS["gsm8k-grpo+sunk"]
    script = render(load(recipe, overrides).plan)
    assert '--container-name="verl-launch-$JOB_ID"' in script
    commands = [c for c in script.replace("\\\n", " ").splitlines() if "srun --overlap" in c]
    in_image = [c for c in commands if '"${CONTAINER[@]}"' in c]
    on_host = [c for c in commands if c not in in_image]
    # teardown (W&B finish, temp dirs), last words, resume check, allocation check, reach check, head, workers,
    # readiness, driver, watchdog
    assert len(in_image) == 11, commands
    # the address probe needs the host's `ip`; the image check looks for the squashfs before any step mounts it
    assert len(on_host) == 2 and "node_ip" in on_host[1] and "image-check" in on_host[0], on_host
    plain = render(load(RECIPES / "gsm8k-grpo.yaml").plan)
    assert "CONTAINER=()" in plain and "--container" not in plain


@pytest.mark.parametrize("recipe", [*SHIPPED, *VARIANTS], ids=str)
def test_rendered_script_passes_bash_n_and_shellcheck(recipe, tmp_path):
    path, overrides = VARIANTS.get(recipe, (recipe, []))
    script = tmp_path / "job.sbatch"
    script.write_text(render(load(path, overrides).plan))  # as rendered: paths not replaced by <ROOT>
    subprocess.run(["bash", "-n", str(script)], check=True)
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed (make system-deps installs it)")
    proc = subprocess.run(["shellcheck", "--severity=info", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_every_template_value_goes_through_the_quoting_filter():
    # Code inserted as code, by design: the recipe's trusted setup lines and the readiness poller.
    code = {"line", "wait_ready_py", "reach_wandb_py", "check_node_py", "watch_ray_py", "last_words_py", "checkpoints_py", "wandb_service_py",
            "trace_flush_py"}
    # The launcher's own file names (paths.py checks them: safe characters, $RESTART to expand).
    name = re.compile(r'paths\.(in_job|glob)\(paths\.[A-Z_]+(, node="(\$1|%N|%w)")?\)')
    exprs = re.findall(r"{{(.*?)}}", "".join(t.read_text() for t in TEMPLATES))
    assert exprs
    for e in exprs:
        e = e.strip()
        assert e.endswith("| q") or e in code or name.fullmatch(e), f"unquoted template value: {{{{ {e} }}}}"


def test_template_never_traces_or_dumps_the_environment():
    text = "".join(t.read_text() for t in TEMPLATES)
    assert not re.search(r"^\s*set\s+-[a-z]*x", text, re.M)
    for dump in ("printenv", "env |", "declare -x", "export -p"):
        assert dump not in text


def test_the_job_template_is_a_table_of_contents_of_small_rooms():
    """sbatch.sh.j2 only includes its rooms, each under about 150 lines and each included once."""
    top = [x for x in TEMPLATE.read_text().splitlines() if x.startswith("{%")]
    included = [re.fullmatch(r'{% include "job/(\w+)\.sh\.j2" %}', x) for x in top if "include" in x]
    assert all(included) and len(included) == len(TEMPLATES) - 1
    assert sorted(m.group(1) for m in included) == sorted(t.name[:-len(".sh.j2")] for t in TEMPLATES[1:])
    for t in TEMPLATES[1:]:
        assert len(t.read_text().splitlines()) <= 150, t


def test_log_names_match_run_paths():
    text = _render(RECIPES / "sandbox-demo.yaml")
    p = RunPaths(Path("/r"))
    head = p.file(p.HEAD_LOG, 0).name.replace("r0", "r$RESTART")
    worker = p.file(p.WORKER_LOG, 0, node="%N").name.replace("r0", "r$RESTART")
    driver = p.driver_log(0).name.replace("r0", "r$RESTART")
    assert f'"$LOG_DIR/{head}"' in text and f'"$LOG_DIR/{worker}"' in text and f'"$LOG_DIR/{driver}"' in text
    assert f"#SBATCH --output={p.stdout('%j').name}" in text


def test_setup_lines_and_env_reach_the_script_in_order():
    text = _render(RECIPES / "gsm8k-grpo.yaml")
    assert "\n  source ~/venvs/verl/bin/activate\n" in text
    assert "\nexport TOKENIZERS_PARALLELISM=false\n" in text
    assert text.index("source ~/venvs") < text.index("phase nodes ")


def test_rendering_imports_no_node_packages(tmp_path):
    code = ("import sys; from launcher.cli import main; rc = main(['render', sys.argv[1]]); "
            "bad = [m for m in ('ray', 'torch', 'verl', 'weave', 'wandb') if m in sys.modules]; "
            "sys.exit(f'imported {bad}' if bad else rc)")
    proc = subprocess.run([sys.executable, "-c", code, str(RECIPES / "gsm8k-grpo.yaml")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash")


def test_key_in_environment_never_reaches_the_script(cli, clean_env, wandb_key):
    proc = cli("render", RECIPES / "gsm8k-grpo.yaml", env=clean_env)
    assert proc.returncode == 0, proc.stderr
    assert wandb_key not in proc.stdout
    # The script only ever assigns the key from a file or ~/.netrc read on the node.
    assert not re.search(r"WANDB_API_KEY=(?!\$\()\S", proc.stdout)


def test_dry_run_prints_command_and_script_and_writes_nothing(cli, clean_env, tmp_path):
    runs = tmp_path / "runs"
    proc = cli("submit", RECIPES / "sandbox-demo.yaml", f"paths.runs={runs}", "--dry-run", env=clean_env)
    assert proc.returncode == 0, proc.stderr
    first, rest = proc.stdout.split("\n", 1)
    assert re.match(rf"# would run: cd {re.escape(str(runs))}/sandbox-demo/\S+ && sbatch --parsable job\.sbatch$", first)
    assert rest.startswith("#!/bin/bash")
    assert not runs.exists()


def test_help_and_version(cli):
    for args in (["--help"], ["render", "--help"], ["check", "--help"], ["submit", "--help"]):
        proc = cli(*args)
        assert proc.returncode == 0 and "usage: verl-launch" in proc.stdout, args
    assert "--dry-run" in cli("submit", "--help").stdout
    from launcher import __version__

    assert cli("--version").stdout.strip() == f"verl-launch {__version__}"


def test_recipe_path_with_a_newline_cannot_break_out_of_the_header_comment(tmp_path):
    d = tmp_path / "b\necho INJECTED #"
    d.mkdir()
    recipe = d / "r.yaml"
    recipe.write_text((RECIPES / "sandbox-demo.yaml").read_text())
    text = render(load(recipe).plan)
    assert "\necho INJECTED" not in text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_comment_only_setup_still_renders_valid_bash():
    text = _render(RECIPES / "sandbox-demo.yaml", "runtime.setup=['# nothing to do']")
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_command_line_verl_values_resolve_like_the_file(monkeypatch):
    r = load(RECIPES / "sandbox-demo.yaml", ["verl.overrides.trainer.default_local_dir=${oc.env:HOME}/ckpt/${job.name}"]).recipe
    assert r.verl.overrides["trainer.default_local_dir"] == "/home/user/ckpt/sandbox-demo"


WHY_LOGS = {
    # The driver's own traceback ends with the cause; the actor's output, streamed late, follows.
    "actor lines after the driver's": (
        "(TaskRunner pid=7) \x1b[36mstarting\x1b[0m\n"
        "ray.exceptions.RayTaskError: ray::vLLMHttpServer.launch_server() (pid=9, ip=10.0.0.2, actor_id=ab)\n"
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
        "  Value error, Sleep mode is not supported on current platform. [type=value_error, input_value=x]\n"
        "    For further information visit https://errors.pydantic.dev/2.14/v/value_error\n"
        "(vLLMHttpServer pid=9) During handling of the above exception, another exception occurred:\n"
        "(vLLMHttpServer pid=9) TypeError: cannot pickle 'pydantic_core._pydantic_core.ArgsKwargs' object\n",
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig; Value error, Sleep mode "
        "is not supported on current platform. (in ray::vLLMHttpServer.launch_server() on node2)"),
    "only an actor's": (
        "(WorkerDict pid=5, ip=10.0.0.2) ValueError: vllm version None not supported\n"
        "(WorkerDict pid=5, ip=10.0.0.2) ray::WorkerDict.init() (pid=5, ip=10.0.0.2, actor_id=cd)\n",
        "ValueError: vllm version None not supported (in ray::WorkerDict.init() on node2)"),
    "the driver's own": (
        "Traceback (most recent call last):\nRuntimeError: the demo driver failed as asked\n",
        "RuntimeError: the demo driver failed as asked"),
}


@pytest.mark.parametrize("case", WHY_LOGS)
def test_why_the_driver_failed_is_its_own_last_error_with_pydantics_detail(case, tmp_path):
    """The job's one-line reason (phase driver-error, `status`'s stopped line), read from the
    driver's log by the rendered script's own why_failed."""
    log, want = WHY_LOGS[case]
    (tmp_path / "driver.log").write_text(log)
    (tmp_path / RunPaths.NODES).write_text("node1 10.0.0.1\nnode2 10.0.0.2\n")
    script = render(load(RECIPES / "sandbox-demo.yaml").plan)
    fn = re.search(r"^why_failed\(\) \{.*?^\}\n", script, re.M | re.S).group(0)
    got = subprocess.run(["bash", "-c", f'redact() {{ printf "%s" "$1"; }}\n{fn}\nwhy_failed "$1"', "x",
                          str(tmp_path / "driver.log")], capture_output=True, text=True,
                         env={"LOG_DIR": str(tmp_path), "PATH": os.environ["PATH"]})
    assert got.stdout == want, got.stderr


# Ray's own lines about deaths, as they reach the driver's log, and the node each must blame
# (issue 65: the raylet's prefix on a worker's death named a healthy node2).
WORKER_DIED = ("\x1b[36m(raylet, ip=10.0.0.2)\x1b[0m A worker died or was killed while executing a task by an "
               "unexpected system error. To troubleshoot the problem, check the logs for the dead worker. RayTask "
               "ID: ffff Worker ID: 4d1c Node ID: 9a8b Worker IP address: 10.0.0.2 Worker port: 10010 Worker PID: "
               "2942 Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection "
               "error code 2. End of file.")
DEATH_LINES = {
    "a worker's death, by the raylet": (WORKER_DIED, ""),
    "an actor's death, in the driver's traceback": ("ray.exceptions.ActorDiedError: The actor died unexpectedly "
                                                   "before finishing this task.\n\tclass_name: RolloutShard\n"
                                                   "\tip: 10.0.0.2\nThe actor is dead because its worker process "
                                                   "has died. Worker exit type: SYSTEM_ERROR", ""),
    "a node marked dead": ("(autoscaler +2m) The node with node id: 9a8b and address: 10.0.0.2 and node name: "
                           "10.0.0.2 has been marked dead because the detector has missed too many heartbeats "
                           "from it.", "node2\n"),
    "a node's raylet died": ("(raylet, ip=10.0.0.1) ray.exceptions.NodeDiedError: the raylet at 10.0.0.2 died",
                             "node2\n"),
}


@pytest.mark.parametrize("case", DEATH_LINES)
def test_only_a_nodes_own_death_in_the_driver_log_blames_it(case, tmp_path):
    """The rendered script's node_in_driver_log: a node is blamed from the driver's log only where
    Ray says that node died, never for a worker's or an actor's death on it (the node was healthy)."""
    log, want = DEATH_LINES[case]
    (tmp_path / "driver.log").write_text(f"step:1 - loss:0.5\n{log}\nTraceback (most recent call last):\n")
    (tmp_path / RunPaths.NODES).write_text("node1 10.0.0.1\nnode2 10.0.0.2\n")
    script = render(load(RECIPES / "sandbox-demo.yaml").plan)
    fn = re.search(r"^node_in_driver_log\(\) \{.*?^\}\n", script, re.M | re.S).group(0)
    got = subprocess.run(["bash", "-c", f'{fn}\nnode_in_driver_log "$1"', "x", str(tmp_path / "driver.log")],
                         capture_output=True, text=True, env={"LOG_DIR": str(tmp_path), "PATH": os.environ["PATH"]})
    assert (got.stdout, got.stderr) == (want, ""), case


def test_the_job_turns_rays_token_authentication_on_and_off_only_with_a_reason(cli, clean_env):
    """Every job writes its own Ray token in the run dir and exports its path, never the token; Ray's
    temp dir sits under a 0700 dir; cluster.ray_auth_off (a reason) turns it off, and check warns."""
    on = _render(RECIPES / "gsm8k-grpo.yaml")
    assert "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$RAY_TOKEN_FILE" in on
    assert 'RAY_TOKEN_FILE=$RUN_DIR/.ray-token.r$RESTART' in on and "RAY_AUTH_MODE=disabled" not in on
    assert 'mkdir -m 700 "$d"' in on and '[[ -d $d && ! -L $d && -O $d ]] && chmod 700 "$d"' in on
    assert 'echo "$(ray_home)/r"' in on
    off = _render(RECIPES / "gsm8k-grpo.yaml", "cluster.ray_auth_off=a debugger of ours joins the head")
    assert "export RAY_AUTH_MODE=disabled" in off and "RAY_TOKEN_FILE" not in off
    said = cli("check", RECIPES / "gsm8k-grpo.yaml", "runtime.python=/usr/bin/python3", env=clean_env).stdout
    assert re.search(r"^ray +token authentication: only the job's own processes join", said, re.M), said
    said = cli("check", RECIPES / "gsm8k-grpo.yaml", "runtime.python=/usr/bin/python3",
               "cluster.ray_auth_off=a debugger of ours joins the head", env=clean_env).stdout
    assert re.search(r"^WARNING +Ray's token authentication is off \(cluster.ray_auth_off: a debugger of ours", said, re.M)
