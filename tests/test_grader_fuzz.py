"""Property-based checks that no file name, zip member or JSON shape stops the class: intake lists what it cannot
grade, and whatever it accepts every later step can read."""

import json
import os
import tempfile
import zipfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from fuselab.grading.records import intake
from fuselab.grading.recheck import clean as recheck

LABS = {"lab0": "lab0.ipynb", "lab1": "lab1.ipynb"}
NB = json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": []})
INSTRUCTOR = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
    {"cell_type": "code", "source": "def answer():\n    return 42", "outputs": [], "execution_count": None,
     "metadata": {"nbgrader": {"grade_id": "solution", "solution": True, "grade": False}}},
    {"cell_type": "code", "source": "assert answer() == 42", "outputs": [], "execution_count": None,
     "metadata": {"nbgrader": {"grade_id": "test", "grade": True, "points": 1, "solution": False}}}]}
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8)
nbgrader_meta = st.fixed_dictionaries({}, optional={
    "grade_id": st.sampled_from(["solution", "test", ""]) | json_values, "solution": st.booleans() | json_values,
    "grade": st.booleans() | json_values, "points": st.integers(0, 3) | json_values})
cells = st.fixed_dictionaries({}, optional={
    "cell_type": st.sampled_from(["code", "markdown", "raw"]) | json_values,
    "source": st.text(max_size=30) | st.lists(st.text(max_size=10), max_size=3) | json_values,
    "metadata": st.fixed_dictionaries({}, optional={"nbgrader": nbgrader_meta | json_values}) | json_values,
    "outputs": json_values, "execution_count": json_values}) | json_values
notebooks = st.fixed_dictionaries({"nbformat": st.just(4) | json_values,
                                   "cells": st.lists(cells, max_size=4) | json_values},
                                  optional={"metadata": json_values, "nbformat_minor": json_values})


@settings(FUZZ, max_examples=100)
@given(notebook=notebooks | json_values, raw=st.binary(max_size=40), as_raw=st.booleans())
def test_any_notebook_json_is_refused_with_a_reason_or_read_by_every_step(notebook, raw, as_raw):
    with tempfile.TemporaryDirectory() as folder:
        path, staged = Path(folder) / "lab0.ipynb", Path(folder) / "staged.ipynb"
        if as_raw:
            path.write_bytes(raw)
        else:
            path.write_text(json.dumps(notebook))
        why = intake.check_notebook(path)
        if why is not None:
            assert isinstance(why, str) and why
            return
        intake._staged_copy(path, staged)
        student = json.loads(staged.read_text())
        cells, flags = recheck.clean_plan(INSTRUCTOR, student)
        assert [c["grade_id"] for c in cells] == ["solution", "test"] and all(isinstance(f, str) for f in flags)


names = (st.text(st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)), min_size=1, max_size=12)
         | st.binary(min_size=1, max_size=8).filter(lambda b: b"/" not in b and b"\x00" not in b).map(os.fsdecode)
         | st.sampled_from(["...", "lab0", "lab1", "Lab0 (2).ipynb", "__MACOSX", "x" * 250,
                            "Wei Zhang_1001_assignsubmission_file_", "zhangwei_1001_501_lab0.ipynb"])
         ).filter(lambda n: n not in (".", ".."))
contents = st.sampled_from(["notebook", "garbage", "deep", "zip"])
entries = st.lists(st.tuples(names, st.lists(names, max_size=2), st.sampled_from(["lab0.ipynb", "lab1.ipynb", "x.ipynb",
                                                                                 "a.zip", "notes.txt"]) | names,
                             contents), min_size=1, max_size=6)


def _write(path: Path, kind: str, member_names) -> None:
    if kind == "zip" or path.suffix == ".zip":
        with zipfile.ZipFile(path, "w") as zf:
            for number, name in enumerate(member_names):
                try:
                    zf.writestr(f"{name}/lab{number % 2}.ipynb", NB)
                except (ValueError, UnicodeEncodeError):
                    pass
        return
    path.write_bytes({"notebook": NB.encode(), "garbage": b"\xff\xfe{", "deep": b"[" * 5000 + b"]" * 5000}[kind])


@FUZZ
@given(entries=entries, member_names=st.lists(names, max_size=3), as_zip=st.booleans())
def test_intake_takes_any_tree_of_files_and_accounts_for_every_notebook(entries, member_names, as_zip):
    with tempfile.TemporaryDirectory() as folder:
        root, written = Path(folder) / "class", []
        for student, middle, name, kind in entries:
            path = root.joinpath(student, *middle, name)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                if not path.exists():
                    _write(path, kind, member_names)
                    written.append(path.relative_to(root))
            except OSError:  # a name the disk refuses, a file where a folder was asked: not a submission
                continue
        source = root
        if as_zip:
            source = Path(folder) / "class.zip"
            with zipfile.ZipFile(source, "w") as zf:
                for relative in written:
                    try:
                        zf.write(root / relative, f"class/{relative}")
                    except (ValueError, UnicodeEncodeError):
                        pass
        subs, problems = intake.collect(source, Path(folder) / "staging", LABS)
        for problem in problems:
            (problem.where + problem.message).encode("utf-8")
        for sub in subs:
            assert intake.check_notebook(sub.notebook) is None
        if as_zip:
            return
        mentioned = " ".join([s.origin for s in subs] + [p.where for p in problems])
        for relative in written:
            if relative.suffix.lower() in (".ipynb", ".zip") and not any(p in intake._IGNORED for p in relative.parts):
                assert intake.printable(relative.parts[0]) in mentioned, f"{relative} was skipped without a word"
