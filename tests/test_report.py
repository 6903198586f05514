"""`verl-launch report`: where a run's allocation went, from run directories written as jobs leave
them (tests/synthetic_run.py): the parts add up to each attempt's allocation, steps redone after a
requeue are lost with their seconds, steps saved but not logged are kept, the JSON round trip,
the picture, and what it says of missing or truncated files. The suite's requeued run is reported
in tests/test_verl_resume.py (Slurm's accounting, the watchdog's real step times)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest

from conftest import ROOT
from launcher.core.paths import RunPaths
from launcher.jobs import report
from synthetic_run import REST, TIMING, seconds, write_run

# Requeued twice: attempt 0 saves at 2, trains 3 and is requeued in step 4 (3 is redone);
# attempt 1 resumes from 2, saves at 4 and is preempted right after (4 saved, not logged);
# attempt 2 resumes from 4 and ends.
PLAN = [{"steps": [1, 2, 3], "saves": [2], "tail": 12.0, "ends": "teardown rc=143"},
        {"steps": [3], "saves": [4], "unlogged": 33.0, "tail": 0.5, "ends": "preempt"},
        {"steps": [5, 6, 7], "saves": [6, 7], "validate": [7], "tail": 4.0}]


def _report(tmp_path, plan=PLAN, **kw):
    allocs = write_run(tmp_path / "run", plan, **kw)
    paths = RunPaths(tmp_path / "run")
    return report.build(paths, paths.read_record(), allocs, price=2.0), allocs


def test_each_attempts_parts_add_up_to_its_allocation_and_redone_steps_are_lost(tmp_path):
    rep, allocs = _report(tmp_path)
    assert len(rep.attempts) == 3
    assert [g.split(":")[0] for g in rep.gaps] == ["attempt 1"] and "step 4 trained and saved" in rep.gaps[0]
    for a, al in zip(rep.attempts, allocs):
        assert a.source == "slurm" and a.node_seconds == pytest.approx((al["end"] - al["start"]) * 2)
        named = sum(v for k, v in a.parts.items() if k != "unaccounted")
        assert abs(named - a.seconds) <= 0.03 * a.seconds, (a.restart, a.parts, a.seconds)
        assert a.parts["verl-start"] == pytest.approx(100.0, abs=1.1)  # the watchdog sees a step within 1 s
    first, second, last = rep.attempts
    assert first.lost_steps == [3] and first.unlogged == []  # trained again by attempt 1
    assert first.parts["lost"] == pytest.approx(seconds(3) + 12.0, abs=1.1)  # step 3, and step 4 cut short
    assert second.unlogged == [4] and second.lost_steps == []
    assert second.training["rest"] == pytest.approx(REST + 33.0 + 0.5, abs=1.1)  # step 4 saved, not logged
    assert last.parts["validation"] == 4.0 and last.parts["checkpoint"] == 4.0
    assert last.parts["verl-end"] == pytest.approx(4.0, abs=1.1) and last.parts["lost"] == 0
    assert last.training["generation"] == 3 * TIMING["gen"]
    assert last.training["log-prob"] == 3 * (TIMING["old_log_prob"] + TIMING["ref"])
    d = rep.to_dict()
    assert d["steps_kept"] == 7 and d["steps_logged"] == 6  # 1, 2, 3 (again), 5, 6, 7; and 4 unlogged
    assert d["parts"]["lost"] == pytest.approx((seconds(3) + 12.0) * 2, abs=2.2)  # node-seconds
    assert 0 < d["goodput"] < 1
    assert d["goodput"] == pytest.approx(sum(a.parts["training"] * 2 for a in rep.attempts) / d["allocated_node_seconds"])
    timed = sum(seconds(s, PLAN[i]) for i, ss in ((0, [1, 2]), (1, [3]), (2, [5, 6, 7])) for s in ss) - 4.0
    assert d["tokens_per_gpu_second"] == pytest.approx(6 * 600 / timed / 2)  # verl's step timer: step 7's validation aside
    assert d["cost"] == pytest.approx(2.0 * d["allocated_node_seconds"] / 3600)
    assert d["cost_per_kept_step"] == pytest.approx(d["cost"] / 7)
    assert rep.attempts[1].queued == pytest.approx(10.0)
    assert "3 attempts" in rep.line() and "1 step redone" in rep.line()


def test_json_round_trip_through_the_cli(tmp_path, cli, clean_env):
    write_run(tmp_path / "run", PLAN)
    out = cli("report", str(tmp_path / "run"), "--json", env=clean_env)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert json.loads(json.dumps(report.Report.from_dict(d).to_dict())) == d
    # no Slurm here: the job's own marks time each attempt, and the report says so once
    assert d["gaps"][0].startswith("Slurm could not be asked") and len(d["gaps"]) == 2, d["gaps"]
    assert [a["source"] for a in d["attempts"]] == ["marks"] * 3
    text = cli("report", str(tmp_path / "run"), env=clean_env).stdout
    assert "attempt 1" in text and "redone later (3)" in text and "(4 saved, not logged)" in text
    assert text.count("|") == 6  # a terminal timeline per attempt


def test_the_picture_has_one_row_per_attempt(tmp_path, cli, clean_env):
    write_run(tmp_path / "run", PLAN)
    png = tmp_path / "timeline.png"
    out = cli("report", str(tmp_path / "run"), "--plot", str(png), env=clean_env)
    assert out.returncode == 0, out.stderr
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert width > 1000 and height > 300
    from launcher.jobs.report_plot import _segments

    rep = report.Report.from_dict(json.loads(cli("report", str(tmp_path / "run"), "--json", env=clean_env).stdout))
    for a in rep.attempts:  # what is drawn in each row covers the attempt, in order
        segs = _segments(a)
        assert all(s1 + d1 == pytest.approx(s2) for (_, s1, d1), (_, s2, _) in zip(segs, segs[1:]))
        assert segs[-1][1] + segs[-1][2] == pytest.approx(a.seconds - a.parts["unaccounted"], abs=0.5)


def test_plot_without_matplotlib_exits_2_naming_the_extra(tmp_path, clean_env):
    write_run(tmp_path / "run", PLAN)
    shim = tmp_path / "shim"
    (shim / "matplotlib").mkdir(parents=True)
    (shim / "matplotlib" / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    env = dict(clean_env, PYTHONPATH=f"{shim}:{ROOT}")
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "report", str(tmp_path / "run"), "--plot",
                           str(tmp_path / "t.png")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "verl-launch[plot]" in proc.stderr and "--plot" in proc.stderr
    assert not (tmp_path / "t.png").exists() and proc.stdout == ""


def test_missing_or_truncated_files_are_named_and_the_rest_is_printed(tmp_path, cli, clean_env):
    write_run(tmp_path / "run", PLAN)
    paths = RunPaths(tmp_path / "run")
    text = paths.phases.read_text()
    paths.phases.write_text(text[:-40])  # cut mid-line, as a node that died writing it
    paths.driver_log(1).unlink()
    paths.file(RunPaths.STEPS, restart=2).unlink()
    out = cli("report", str(tmp_path / "run"), "--json", env=clean_env)
    assert out.returncode == 0, out.stderr
    gaps = json.loads(out.stdout)["gaps"]
    assert any("unreadable line(s)" in g and "phases.jsonl" in g for g in gaps), gaps
    assert any("attempt 1: verl's log" in g and "missing" in g for g in gaps), gaps
    assert any("attempt 2: no step times" in g for g in gaps), gaps
    d = json.loads(out.stdout)
    assert [len(a["steps"]) for a in d["attempts"]] == [3, 0, 3]  # what could be read still counts


def test_a_run_that_never_started_and_one_that_does_not_exist(tmp_path, cli, clean_env):
    run = tmp_path / "run"
    run.mkdir()
    (run / RunPaths.RECORD).write_text(json.dumps({"job_id": "7", "run_dir": str(run), "nodes": 2}))
    out = cli("report", str(run), env=clean_env)
    assert out.returncode == 0, out.stderr
    assert "nothing yet (the job has not started)" in out.stdout and "phases.jsonl does not exist" in out.stdout
    gone = cli("report", str(tmp_path / "nowhere"), env=clean_env)
    assert gone.returncode == 2 and "no run with job id or run directory" in gone.stderr


def test_a_local_run_is_timed_by_its_own_marks_and_says_nothing_of_slurm(tmp_path):
    allocs = write_run(tmp_path / "run", [{"steps": [1, 2]}], nodes=1)
    paths = RunPaths(tmp_path / "run")
    rep = report.build(paths, paths.read_record(), None)
    assert rep.gaps == [] and rep.attempts[0].source == "marks"
    assert rep.attempts[0].seconds == pytest.approx(allocs[0]["end"] - allocs[0]["start"] - 1 - 4.9, abs=0.01)
    assert rep.attempts[0].parts["training"] > 0 and rep.goodput > 0


def test_without_step_times_the_steps_end_with_the_driver_and_it_is_said(tmp_path):
    rep, _ = _report(tmp_path, [{"steps": [1, 2], "tail": 0.0}], step_times=False)
    a = rep.attempts[0]
    assert a.steps[-1].end == pytest.approx([t for n, t in a.marks if n == "driver-end"][0])
    assert a.parts["verl-start"] == pytest.approx(100.0, abs=0.01)
    assert any("no step times" in g for g in rep.gaps)


def test_a_step_line_ray_cut_in_two_is_read_whole(tmp_path):
    log = tmp_path / "driver.r0.log"
    log.write_text("\x1b[36m(TaskRunner pid=9)\x1b[0m step:4 - timing_s/gen:np.float64(10.5) - timing_s/upd\n"
                   "ate_actor:2.0 - timing_s/step:14.0 - perf/total_num_tokens:300\n"
                   "(TaskRunner pid=9) Training Progress: 4/7\n")
    [s] = report.read_steps(log)
    assert (s.step, s.seconds, s.tokens) == (4, 14.0, 300)
    assert s.parts["generation"] == 10.5 and s.parts["update"] == 2.0 and s.parts["rest"] == 1.5


def test_a_step_line_cut_anywhere_is_read_whole(tmp_path):
    """Ray cuts a long line wherever its buffer ends: in a key, in a value (CI: `...0.0005427383` then
    `426839450999978 - timing_s/update_weights:...`), in the ` - ` between, in the last value."""
    body = ("timing_s/gen:np.float64(10.5) - timing_s/update_actor:-2.0 - timing_s/step:14.0 - "
            "perf/total_num_tokens:300")
    log = tmp_path / "driver.r0.log"
    for cut in range(1, len(body)):
        log.write_text(f"\x1b[36m(TaskRunner pid=9)\x1b[0m step:4 - {body[:cut]}\n{body[cut:]}\n"
                       "(TaskRunner pid=9) Training Progress: 4/7\nthe driver's own words: done\n")
        [s] = report.read_steps(log)
        assert (s.step, s.seconds, s.tokens) == (4, 14.0, 300), (cut, body[:cut], s)
        assert s.parts["generation"] == 10.5, (cut, s.parts)


def test_a_progress_bar_that_breaks_into_a_step_line_is_left_out(tmp_path):
    """As on the sandbox: verl's stdout cut at a buffer's end, tqdm's bar (stderr) in between."""
    log = tmp_path / "driver.r0.log"
    log.write_text("\x1b[36m(TaskRunner pid=9, ip=10.0.0.2)\x1b[0m step:5 - timing_s/gen:20.0 - timin"
                   "\x1b[36m(TaskRunner pid=9, ip=10.0.0.2)\x1b[0m \rTraining Progress:  71%|###  | 5/7 [00:36<01:13]\n"
                   "g_s/update_weights:0.5 - timing_s/step:30.0 - perf/total_num_tokens:574\n")
    [s] = report.read_steps(log)
    assert (s.step, s.seconds, s.tokens) == (5, 30.0, 574) and s.parts["weight-sync"] == 0.5


def test_hostile_lines_are_counted_not_fatal_and_a_bad_price_is_refused(tmp_path, cli, clean_env):
    """Files a job never writes (a hand edit, a disk that filled): the report names what it could
    not read and accounts the rest; a price that is no price is exit 2 naming the flag."""
    write_run(tmp_path / "run", PLAN)
    paths = RunPaths(tmp_path / "run")
    with paths.phases.open("a") as f:
        f.write('[]\n"x"\n{"phase": 3, "time": 1, "restart": 0}\n{"phase": "teardown", "time": "soon", "restart": 0}\n'
                '{"phase": "start", "time": NaN, "restart": 0}\n{"phase": "start", "time": 1e300, "restart": true}\n')
    with paths.file(RunPaths.STEPS, restart=0).open("a") as f:
        f.write('{"step": "2", "time": 5}\n{"step": 9}\n\xff\n')
    record = json.loads(paths.record.read_text())
    paths.record.write_text(json.dumps(dict(record, nodes="two", gpus_per_node=-3)))
    out = cli("report", str(tmp_path / "run"), "--json", env=clean_env)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert any("6 unreadable line(s)" in g and "phases.jsonl" in g for g in d["gaps"]), d["gaps"]
    assert any("3 unreadable line(s)" in g and "steps.r0.jsonl" in g for g in d["gaps"]), d["gaps"]
    assert [len(a["steps"]) for a in d["attempts"]] == [3, 1, 3] and d["gpus_per_node"] == 1
    for price in ("-1", "nan", "inf"):
        bad = cli("report", str(tmp_path / "run"), "--price", price, env=clean_env)
        assert bad.returncode == 2 and "--price" in bad.stderr and bad.stdout == "", (price, bad.stderr)


def test_a_run_directory_copied_elsewhere_is_reported_where_it_is(tmp_path, cli, clean_env):
    """A run dir copied from the cluster (its record names where it ran): read where it is now."""
    write_run(tmp_path / "run", PLAN)
    record = tmp_path / "run" / RunPaths.RECORD
    record.write_text(json.dumps(dict(json.loads(record.read_text()), run_dir="/cluster/runs/gone")))
    out = cli("report", str(tmp_path / "run"), "--json", env=clean_env)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["run_dir"] == str(tmp_path / "run") and len(d["attempts"]) == 3


def test_the_api_is_the_door(tmp_path, clean_env, monkeypatch):
    """launcher.run(ref).report(): what the CLI prints, from the API itself (no Slurm here)."""
    import launcher

    for k in list(os.environ):  # the test's environment, as the CLI tests' (no Slurm to ask)
        if k not in clean_env:
            monkeypatch.delenv(k)
    for k, v in clean_env.items():
        monkeypatch.setenv(k, v)
    write_run(tmp_path / "run", PLAN)
    png = tmp_path / "where.png"
    rep = launcher.run(str(tmp_path / "run")).report(price=3.0, plot=str(png))
    assert isinstance(rep, report.Report) and rep.steps_kept == 7 and rep.price == 3.0
    assert rep.cost == pytest.approx(3.0 * rep.allocated / 3600)
    assert rep.gaps[0].startswith("Slurm could not be asked")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the picture, drawn through the API
    d = rep.to_dict()  # what the CLI prints from: every part and kept training's split, in order
    assert list(d["parts"]) == list(report.PARTS) and list(d["training"]) == list(report.TRAINING)
    assert sum(d["training"].values()) == pytest.approx(d["parts"]["training"])


def test_the_cli_reaches_the_launcher_only_through_the_api():
    """Every command reaches the launcher through launcher.api: the CLI only parses and prints."""
    import ast

    for path in (ROOT / "launcher" / "cli").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 2 and node.module:
                assert node.module in ("checks.secrets",), (path.name, node.module)  # console's redaction only


def test_a_running_attempts_step_in_progress_is_training_not_lost(tmp_path):
    allocs = write_run(tmp_path / "run", [{"steps": [1, 2], "tail": 9.0}])
    paths = RunPaths(tmp_path / "run")
    lines = paths.phases.read_text().splitlines()
    paths.phases.write_text("\n".join(lines[:-2]) + "\n")  # no driver-end, no teardown yet
    allocs[0]["end"] -= 5.0 + 0.1  # the controller's "now": the driver still running
    rep = report.build(paths, paths.read_record(), allocs)
    a = rep.attempts[0]
    assert a.ended == "" and a.parts["lost"] == 0 and a.parts["teardown"] == 0
    # each step's own rest, and the step in progress: from step 2 (seen 1 s late) to now
    assert a.training["rest"] == pytest.approx(2 * REST + 9.0 - 0.1 - 1.0, abs=0.01), a.training
    assert any("is running" in g for g in rep.gaps), rep.gaps


def test_a_log_is_read_once_and_then_only_what_it_gained(tmp_path, monkeypatch):
    """status's goodput line reads the driver log at every call: what was read is kept beside it,
    and the next read parses only the bytes the log gained, from its last step line (whose rest Ray
    may still be writing) on; the steps are those a whole read finds, however the writes fell."""
    from launcher.jobs import step_lines
    from synthetic_run import step_line

    log, kept = tmp_path / "driver.r0.log", tmp_path / "steps-read.r0.json"
    parsed = []
    real = step_lines._parse
    monkeypatch.setattr(step_lines, "_parse", lambda data: parsed.append(len(data)) or real(data))
    text = "".join(step_line(n)[0] + "(TaskRunner pid=42) Training Progress: step done\n" for n in range(1, 201))
    cut = text.index("timing_s/old_log_prob", len(text) // 2)
    log.write_text(text[:cut])  # a step line half written: its rest comes later
    first = step_lines.read_steps(log, kept)
    with open(log, "a") as f:
        f.write(text[cut:] + step_line(201)[0])
    again = step_lines.read_steps(log, kept)
    whole = step_lines.read_steps(log)
    assert [s.step for s in again] == list(range(1, 202)) and again == whole
    assert first[-1].step < again[-1].step
    assert parsed[1] < len(text) - cut + 2 * len(step_line(201)[0]), parsed  # only what it gained, roughly
    # nothing new: only the last step line is read again
    assert step_lines.read_steps(log, kept) == whole and parsed[-1] <= len(step_line(201)[0]) + 1, parsed
    # replaced (a rotated log, or an edit): read from its start, never the old steps
    log.write_text(step_line(7)[0])
    assert [s.step for s in step_lines.read_steps(log, kept)] == [7]
    # cut shorter: read again too
    log.write_text(step_line(7)[0][:20])
    assert step_lines.read_steps(log, kept) == []
    # a record that cannot be written (another user's run): still read, whole
    assert [s.step for s in step_lines.read_steps(log.parent / "driver.r0.log", tmp_path / "no" / "x.json")] == []


def test_the_report_keeps_what_it_read_beside_each_attempts_log(tmp_path):
    write_run(tmp_path / "run", PLAN)
    paths = RunPaths(tmp_path / "run")
    first = report.build(paths, paths.read_record(), None).to_dict()
    kept = sorted(p.name for p in paths.logs.glob("steps-read.r*.json"))
    assert kept == [f"steps-read.r{r}.json" for r in range(len(PLAN))], kept
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in paths.logs.glob("steps-read.r*.json"))
    assert report.build(paths, paths.read_record(), None).to_dict() == first  # read from what was kept
