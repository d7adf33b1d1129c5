"""The multi-GPU self-check's judgement, on synthetic class results (the real runs need a 2-GPU machine)."""

from types import SimpleNamespace

from fuselab.tools import multigpu_check

UUID_A, UUID_B = "GPU-aaaa", "GPU-bbbb"


def _result(student, device, fused=2.0, speed=4.0, holds=((0.0, 0.1),), uuid=UUID_A):
    return {"student": student, "lab": "lab0", "device": device, "gpu_holds": [list(h) for h in holds],
            "cells": {"test_fused": {"points": fused, "max_points": 2.0, "speed": []},
                      "test_speedup": {"points": speed, "max_points": 4.0,
                                       "speed": [{"status": "measured", "gpu_uuid": uuid}]}}}


def _class(results, workers, submissions_s, other_s=10.0, reference_holds=((0.2, 0.3), (0.4, 0.5))):
    # the instructor's reference runs: side by side on the first GPU, before the students
    reference = {f"lab{k}": {"device": "0", "gpu_holds": [list(hold)]} for k, hold in enumerate(reference_holds)}
    return SimpleNamespace(results=results, workers=workers, problems=[], reference=reference,
                           phase_seconds={"reference runs": other_s, "submissions": submissions_s})


def _single():
    return _class([_result("ann", "0", holds=[(1.0, 1.2)]), _result("bob", "0", holds=[(2.0, 2.1)])],
                  ["0", "0"], 100.0)


def _several(**changes):
    bob = dict(dict(student="bob", device="1", holds=[(1.05, 1.15)], uuid=UUID_B), **changes)
    return _class([_result("ann", "0", holds=[(1.0, 1.2)]), _result(**bob)], ["0", "1", "0", "1"], 40.0)


def test_two_gpus_that_agree_and_never_share_a_timing_pass():
    verdict = multigpu_check.verdict(_single(), _several(), expected=2)
    assert verdict["status"] == "ok", verdict["problems"]
    assert verdict["gpus"] == ["0", "1"] and verdict["physical_gpus"] == {"0": [UUID_A], "1": [UUID_B]}
    assert verdict["wall"]["submissions"]["ratio"] == 0.4 and verdict["wall"]["whole run"]["ratio"] == 50.0 / 110.0
    # the timings on different GPUs overlap in time (that is the point); on one GPU they never may
    assert [row["device"] for row in multigpu_check.timings(_several().results)] == ["0", "1"]
    assert [row["student"] for row in multigpu_check.timings(_several().results, _several().reference)] == \
        ["reference", "reference", "ann", "bob"]


def test_grades_must_agree_exactly_for_correctness_and_within_a_point_for_speed():
    assert multigpu_check.verdict(_single(), _several(speed=3.2))["status"] == "ok"   # within ±1
    verdict = multigpu_check.verdict(_single(), _several(speed=2.5))
    assert verdict["status"] == "MISS" and "speed points differ by more than 1" in verdict["problems"][0]
    verdict = multigpu_check.verdict(_single(), _several(fused=0.0))
    assert any("correctness points differ" in p for p in verdict["problems"])


def test_two_timings_on_one_gpu_at_once_are_caught():
    overlapping = _several(device="0", uuid=UUID_A)  # bob's timing on GPU 0 during ann's
    problems = multigpu_check.overlapping_timings(overlapping.results)
    assert len(problems) == 1 and problems[0].startswith("GPU 0: ann/lab0's timing")
    # with one worker per GPU only the reference runs (side by side on GPU 0) can collide: they count too
    colliding = _class(_several().results, ["0", "1"], 40.0, reference_holds=((0.2, 0.5), (0.4, 0.6)))
    verdict = multigpu_check.verdict(_single(), colliding)
    assert verdict["status"] == "MISS" and verdict["problems"][0].startswith("GPU 0: reference/lab0's timing")


def test_a_device_mix_up_and_a_missing_or_double_grade_are_caught():
    same_gpu = multigpu_check.verdict(_single(), _several(uuid=UUID_A, holds=[(3.0, 3.1)]))
    assert any("are the same GPU" in p for p in same_gpu["problems"])
    twice = _several()
    twice.results.append(_result("ann", "1", holds=[(5.0, 5.1)], uuid=UUID_B))
    assert any("graded 2 times" in p for p in multigpu_check.verdict(_single(), twice)["problems"])
    missing = _several()
    missing.results.pop()
    problems = multigpu_check.verdict(_single(), missing, expected=2)["problems"]
    assert "bob/lab0 graded on one GPU only" in problems and "several GPUs: 1 submissions graded, 2 in the class" \
        in problems


def test_a_submission_the_grader_failed_on_is_a_problem_even_if_both_runs_agree():
    single, several = _single(), _several()
    failed = SimpleNamespace(student="cy", lab="lab1", message="the grader failed on this submission: OSError()")
    single.problems.append(failed)
    several.problems.append(failed)
    verdict = multigpu_check.verdict(single, several)
    assert verdict["status"] == "MISS"
    assert verdict["problems"] == [f"{run}: not graded: cy/lab1: {failed.message}"
                                   for run in ("one GPU", "several GPUs")]


def test_too_slow_on_several_gpus_misses_the_target_without_other_problems():
    slow = _several()
    slow.phase_seconds["submissions"] = 61.0  # 0.61 of one GPU's
    verdict = multigpu_check.verdict(_single(), slow)
    assert verdict["problems"] == [] and verdict["status"] == "MISS"


def test_the_stage_says_it_needs_two_gpus(tmp_path, monkeypatch):
    from fuselab.tools.gpu_selfcheck.stages import by_name
    from fuselab.grading.gpus import schedule
    monkeypatch.setattr(schedule, "visible_gpus", lambda: ["0"])
    assert by_name()["multigpu"].run(tmp_path) == {"status": "skipped", "headline": "needs 2 GPUs, 1 visible"}
