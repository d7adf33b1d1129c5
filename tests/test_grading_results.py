"""Typed grading results: result.json files load and are written back byte for byte (CPU, under a second).

The fixture is a real result.json of the grader's sample class: a GPU run of a kernel that faults.
"""

import json
from pathlib import Path

from fuselab.grading.run import pipeline
from fuselab.grading.recheck import clean as recheck
from fuselab.grading.outputs import report
from fuselab.grading.records.results import CellResult, SubmissionResult

FIXTURES = Path(__file__).parent / "fixtures"
CURRENT = FIXTURES / "result-gpu-fault-lab0.json"


def test_a_result_json_is_written_back_byte_for_byte(tmp_path):
    text = CURRENT.read_text()
    result = SubmissionResult.from_json(json.loads(text))
    assert json.dumps(result.to_json(), indent=1) == text
    assert isinstance(result.cells["test_fused"], CellResult) and result.cells["test_fused"].status == "failed"
    pipeline._write_result(tmp_path / "result.json", result)
    assert (tmp_path / "result.json").read_text() == text
    assert SubmissionResult.from_json(json.loads((tmp_path / "result.json").read_text())) == result


def test_totals_attention_and_the_fields():
    data = json.loads(CURRENT.read_text())
    result = SubmissionResult.from_json(data)
    assert result.total == sum(result.points.values()) == data["total"]
    assert result.max_total == sum(c.max_points for c in result.cells.values()) == data["max_total"]
    assert result.attention == len(data["flags"])
    assert result.full_marks is (data["total"] == data["max_total"])
    # every key of result.json is a field of the same name, read as an attribute (there is no dict view)
    for key, value in data.items():
        if key != "cells":
            assert getattr(result, key) == value
    assert result.cells["test_fused"].points == data["cells"]["test_fused"]["points"]
    assert not hasattr(result, "get") and not hasattr(result, "__getitem__")


def test_a_retry_and_a_tas_grades_are_fields_written_only_when_set():
    data = json.loads(CURRENT.read_text())
    retry = {"first_try": "timed out", "retry": "passed, 2 of 2 points in 1.0 s"}
    data["cells"]["test_fused"]["retry"] = retry
    data["cells"]["test_fused"]["by_hand"] = {"points": 1.0, "grader": 0.0}
    data["hand_graded"] = {"answer": {"points": 1.0, "max_points": 2.0, "comment": ""}}
    result = SubmissionResult.from_json(data)
    assert result.cells["test_fused"].retry == retry and result.cells["test_fused"].extra == {}
    assert result.hand_graded["answer"]["points"] == 1.0 and result.extra == {}
    assert json.dumps(result.to_json(), indent=1) == json.dumps(data, indent=1)  # same keys, same order
    plain = SubmissionResult.from_json(json.loads(CURRENT.read_text())).to_json()
    assert "hand_graded" not in plain and all("retry" not in c and "by_hand" not in c for c in plain["cells"].values())


def test_a_result_missing_keys_takes_their_defaults_and_keeps_keys_it_does_not_know():
    # no timings, no sandbox, no device; a key this grader does not write (an earlier one's) is kept, not lost
    bare = {"student": "s", "lab": "lab0", "cells": {"test_fused": {"points": 1.0, "max_points": 2.0,
                                                                    "status": "partial"}},
            "flags": ["x: y"], "disagreements": [], "someday": 1}
    old = SubmissionResult.from_json(bare)
    assert (old.total, old.max_total, old.attention, old.seconds, old.sandbox) == (1.0, 2.0, 1, None, None)
    assert old.to_json()["someday"] == 1 and old.extra["someday"] == 1


def test_combine_writes_result_json_key_for_key():
    sub = type("Sub", (), {"student": "s", "lab": "lab0"})()
    speed = recheck.CellVerdict("test_speedup", 3.0, 4.0, "partial", speed=[{"status": "measured", "speedup": 2.5}],
                                seconds=1.5, requires_failed=[])
    check = recheck.CellVerdict("test_fused", 0.0, 2.0, "failed", message="wrong", output="out", seconds=0.2)
    clean = recheck.CleanResult(cells={"test_speedup": speed, "test_fused": check}, flags=["f: g"], restarts=1,
                                seconds=9.0, gpu_wait_s=0.5, gpu_held_s=1.0, gpu_holds=[[1.0, 2.0]],
                                timeline={"setup": 1.0})
    result = pipeline.combine(sub, clean, ["a note"], hand_graded=["answer"])
    # result.json as the grader writes it, key for key and in order
    expected = {"student": "s", "lab": "lab0", "cells": {
        "test_speedup": {"points": 3.0, "max_points": 4.0, "status": "partial", "message": "",
                         "speed": [{"status": "measured", "speedup": 2.5}], "seconds": 1.5, "output": "",
                         "requires_failed": []},
        "test_fused": {"points": 0.0, "max_points": 2.0, "status": "failed", "message": "wrong", "speed": [],
                       "seconds": 0.2, "output": "out", "requires_failed": []}},
        "total": 3.0, "max_total": 6.0, "manual_cells": ["answer"], "flags": ["f: g"], "notes": ["a note"],
        "restarts": 1, "clean_seconds": 9.0, "gpu_wait_seconds": 0.5, "gpu_held_seconds": 1.0,
        "gpu_holds": [[1.0, 2.0]], "clean_timeline": {"setup": 1.0}}
    finished = dict(device="0", seconds=20.0, notebook_sha="abc", notebook="n.ipynb", origin="s/lab0.ipynb",
                    sandbox=True)
    for key, value in finished.items():
        setattr(result, key, value)
    assert json.dumps(result.to_json(), indent=1) == json.dumps(dict(expected, **finished), indent=1)
    assert result.attention == 1


def test_the_readers_take_typed_results_and_saved_dicts_alike(tmp_path):
    data = json.loads(CURRENT.read_text())
    typed = SubmissionResult.from_json(data)
    report.write_grades_csv([typed], tmp_path / "typed.csv")
    report.write_grades_csv([data], tmp_path / "dict.csv")
    assert (tmp_path / "typed.csv").read_text() == (tmp_path / "dict.csv").read_text()
    assert report.median_steps([typed]) == report.median_steps([data])
