"""The GPU self-check's stages, declared (CPU, a few seconds): each stage once, the labs' stages from the
registry, the command line as ``bash .ci/gpu-selfcheck`` calls it. The stages themselves need the H200."""

import json
import subprocess
import sys
from dataclasses import replace
from functools import partial

import pytest

from fuselab.labs import registry
from fuselab.tools.gpu_selfcheck import command, stages

from .conftest import REPO

# the stages and their order (the names on the command line and in selfcheck.json): a new stage is added, never
# renamed or moved
BEFORE_LABS = ["env", "build", "timing", "emulation", "transfer"]
AFTER_LABS = ["counters", "grade", "notebooks", "samples", "throughput", "multigpu", "tests"]


def test_every_stage_is_declared_once():
    names = [stage.name for stage in stages.STAGES]
    assert len(names) == len(set(names)), names
    assert list(stages.by_name()) == names


def test_the_stages_keep_their_names_and_order():
    assert [stage.name for stage in stages.STAGES] == BEFORE_LABS + registry.lab_names() + AFTER_LABS
    assert stages.default_names() == BEFORE_LABS + registry.lab_names() + AFTER_LABS


def test_the_lab_stages_follow_the_registry(monkeypatch, tmp_path):
    lab_stages = [stage for stage in stages.STAGES if stage.name.startswith("lab")]
    assert [stage.name for stage in lab_stages] == registry.lab_names()
    for stage in lab_stages:
        declared = registry.lab(stage.name)
        assert stage.needs == (stages.GPU,) and declared.title in stage.checks
        # a lab's stage is its lab_checks module's run(out)
        monkeypatch.setattr(stages.lab_check(declared.name), "run", lambda out, lab=stage.name: {"ran": lab, "out": out})
        assert stage.run(tmp_path) == {"ran": stage.name, "out": tmp_path}


def test_every_stage_says_what_it_needs_and_checks():
    known = {stages.GPU, stages.TWO_GPUS, stages.NBGRADER, stages.NBCLIENT}
    for stage in stages.STAGES:
        assert stage.checks and callable(stage.run), stage.name
        assert set(stage.needs) <= known, stage.name
    assert stages.TWO_GPUS in stages.by_name()["multigpu"].needs


def test_an_unknown_stage_is_refused_before_any_stage_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        command.main(["--stages", "env,lab9,gpu", "--out", str(tmp_path)])
    assert stopped.value.code == 2
    message = capsys.readouterr().err
    assert "unknown stage(s): 'lab9', 'gpu'; the stages are: env, build" in message
    assert not (tmp_path / "selfcheck.json").exists()


def test_the_command_runs_the_chosen_stages_and_writes_their_results(tmp_path, monkeypatch, capsys):
    ran = []
    fake = {"timing": {"goal_spread_ok": True, "goal_do_bench_ok": True, "spread_pct": 0.3, "vs_do_bench_pct": 0.1},
            "samples": {"status": "MISS", "headline": "25/26 samples graded as they deserve"}}
    declared = [stage for stage in stages.STAGES if stage.name in fake]

    def fake_run(name, out):
        ran.append(name)
        if name == "samples":
            raise RuntimeError("the grader fell over")
        return dict(fake[name])

    monkeypatch.setattr(stages, "STAGES", [replace(s, run=partial(fake_run, s.name)) for s in declared])
    assert command.main(["--stages", "samples,timing", "--out", str(tmp_path)]) == 1
    assert ran == ["samples", "timing"]
    written = json.loads((tmp_path / "selfcheck.json").read_text())
    assert list(written) == ["samples", "timing"]
    assert "RuntimeError: the grader fell over" in written["samples"]["error"]
    assert set(written["timing"]) == set(fake["timing"]) | {"stage_seconds"}
    table = capsys.readouterr().out.split("stage      status  result\n")[1].splitlines()
    assert table == ["samples    ERROR   RuntimeError: the grader fell over",
                     "timing     ok      spread 0.30%, vs do_bench +0.10%"]


def test_the_grade_rows_report_the_autograded_notebooks_too():
    result = {"seconds": 12.0, "notebooks": {"lab0": {"errors": [], "stderr": []}},
              "scores": {"solution": {"lab0": {"autograded_score": 10, "autograded_max": 10}}}}
    assert stages.by_name()["grade"].table_rows(result) == [
        ("grade", "ok", "solution/lab0 10/10 (12s)"), ("graded nb", "ok", "ran headless: lab0")]


def test_the_module_runs_as_the_ci_script_calls_it():
    listed = subprocess.run([sys.executable, "-m", "fuselab.tools.gpu_selfcheck", "--list"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines() if not line.startswith(" ")] == \
        [stage.name for stage in stages.STAGES]
