"""Intake: folders, per-student zips and LMS bulk downloads become (student, lab) submissions; malformed ones
become problems with a clear message, never a crash."""

import json
import zipfile

from fuselab.grading import intake

LABS = {"lab0": "lab0.ipynb", "lab1": "lab1.ipynb"}
NB = json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": []})


def _write(path, text=NB):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _found(submissions):
    return sorted((s.student, s.lab) for s in submissions)


def test_folder_layouts(tmp_path):
    root = tmp_path / "in"
    _write(root / "alice" / "lab0" / "lab0.ipynb")
    _write(root / "alice" / "lab1.ipynb")
    _write(root / "bob" / "Lab0 (1).ipynb")
    _write(root / "bob" / ".ipynb_checkpoints" / "lab0-checkpoint.ipynb")
    _write(root / "John Smith_1234_assignsubmission_file_" / "lab0.ipynb")
    subs, problems = intake.collect(root, tmp_path / "staging", LABS)
    assert _found(subs) == [("John_Smith", "lab0"), ("alice", "lab0"), ("alice", "lab1"), ("bob", "lab0")]
    assert problems == []
    staged = tmp_path / "staging" / "bob" / "lab0" / "lab0.ipynb"
    assert staged.exists() and any(s.notebook == staged for s in subs)


def test_zips_per_student_and_canvas_bulk_download(tmp_path):
    root = tmp_path / "in"
    root.mkdir()
    with zipfile.ZipFile(root / "carol.zip", "w") as zf:
        zf.writestr("work/lab0/lab0.ipynb", NB)
        zf.writestr("__MACOSX/work/lab0/._lab0.ipynb", "junk")
    bulk = tmp_path / "canvas.zip"
    with zipfile.ZipFile(bulk, "w") as zf:
        zf.writestr("smithjane_123_456_lab0.ipynb", NB)
        zf.writestr("doejohn_LATE_124_457_lab1-1.ipynb", NB)
    subs, problems = intake.collect(root, tmp_path / "s1", LABS)
    assert _found(subs) == [("carol", "lab0")] and problems == []
    subs, problems = intake.collect(bulk, tmp_path / "s2", LABS)
    assert _found(subs) == [("doejohn", "lab1"), ("smithjane", "lab0")] and problems == []


def test_malformed_submissions_are_problems_not_crashes(tmp_path):
    root = tmp_path / "in"
    _write(root / "dave" / "lab0" / "lab0.ipynb", "{not json")
    _write(root / "erin" / "homework.ipynb")
    _write(root / "frank" / "lab0.ipynb")
    _write(root / "frank" / "lab0" / "lab0.ipynb")
    _write(root / "gina" / "lab0.ipynb", json.dumps({"nbformat": 3, "worksheets": []}))
    _write(root / "loose.ipynb")
    with zipfile.ZipFile(root / "mallory.zip", "w") as zf:
        zf.writestr("../../escape/lab0.ipynb", NB)
    (root / "oscar.zip").write_bytes(b"not a zip")
    _write(root / "ok" / "lab0.ipynb")
    subs, problems = intake.collect(root, tmp_path / "staging", LABS)
    assert _found(subs) == [("ok", "lab0")]
    text = "\n".join(f"{p.student}: {p.message}" for p in problems)
    assert "dave: not a valid notebook" in text
    assert "erin: cannot tell which lab" in text
    assert "frank: 2 notebooks for lab0" in text
    assert "gina: not a Jupyter notebook in format 4" in text
    assert "top level" in text
    assert "mallory: " in text and "unsafe path" in text
    assert "oscar: " in text and "not a readable zip" in text
    assert not (tmp_path / "escape").exists()


def test_filters_and_student_ids(tmp_path):
    root = tmp_path / "in"
    for student in ("a", "b"):
        _write(root / student / "lab0.ipynb")
        _write(root / student / "lab1.ipynb")
    subs, _ = intake.collect(root, tmp_path / "staging", LABS, students=["b"], only_labs=["lab1"])
    assert _found(subs) == [("b", "lab1")]
    assert intake.student_id("Zoë O'Neil ") == "Zo_O_Neil"
