"""Intake: folders, per-student zips and LMS bulk downloads become (student, lab) submissions; malformed ones
become problems with a clear message, never a crash."""

import json
import os
import zipfile
from pathlib import Path

from fuselab.grading.records import intake

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
    assert _found(subs) == [("John_Smith_1234", "lab0"), ("alice", "lab0"), ("alice", "lab1"), ("bob", "lab0")]
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
    assert _found(subs) == [("doejohn_124", "lab1"), ("smithjane_123", "lab0")] and problems == []


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
    # the same name as a Mac writes it (a letter and a combining mark): the same student
    assert intake.student_id("Zoe\u0308 O'Neil ") == intake.student_id("Zo\u00eb O'Neil") == "Zo_O_Neil"


def test_a_moodle_name_that_holds_another_participants_number_is_never_theirs(tmp_path):
    """A Moodle entry is "<Full Name>_<number>_assignsubmission_<plugin>_", and a student who may edit their full
    name could make it "Victim_1234_assignsubmission_file": their folder then read as Victim's (1234), and Victim's
    own lab was refused as two notebooks. A name holding two participants' numbers is refused, folder or file."""
    root = tmp_path / "moodle"
    _write(root / "Victim_1234_assignsubmission_file_" / "lab0.ipynb")
    _write(root / "Victim_1234_assignsubmission_file_999_assignsubmission_file_" / "lab0.ipynb")
    _write(root / "Victim_1234_assignsubmission_file_998_assignsubmission_file_lab1.ipynb")
    subs, problems = intake.collect(root, tmp_path / "staging", LABS)
    assert _found(subs) == [("Victim_1234", "lab0")]
    assert sorted(p.where for p in problems) == ["Victim_1234_assignsubmission_file_998_assignsubmission_file_lab1.ipynb",
                                                 "Victim_1234_assignsubmission_file_999_assignsubmission_file_/lab0.ipynb"]
    assert all("two Moodle participants' numbers" in p.message for p in problems)


def test_lms_ids_keep_students_with_one_name_apart_and_one_id_is_never_two_names(tmp_path):
    root = tmp_path / "moodle"
    _write(root / "Wei Zhang_1001_assignsubmission_file_" / "lab0.ipynb")
    _write(root / "Wei Zhang_1002_assignsubmission_file_" / "lab0.ipynb")
    subs, problems = intake.collect(root, tmp_path / "s1", LABS)
    assert _found(subs) == [("Wei_Zhang_1001", "lab0"), ("Wei_Zhang_1002", "lab0")] and problems == []
    canvas = tmp_path / "canvas.zip"
    with zipfile.ZipFile(canvas, "w") as zf:
        zf.writestr("zhangwei_1001_501_lab0.ipynb", NB)
        zf.writestr("zhangwei_1002_502_lab0.ipynb", NB)
    subs, problems = intake.collect(canvas, tmp_path / "s2", LABS)
    assert _found(subs) == [("zhangwei_1001", "lab0"), ("zhangwei_1002", "lab0")] and problems == []
    clash = tmp_path / "clash"
    _write(clash / "Zoë" / "lab0.ipynb")
    _write(clash / "Zo_" / "lab0.ipynb")
    subs, problems = intake.collect(clash, tmp_path / "s3", LABS)
    assert subs == [] and "become student id 'Zo'" in problems[0].message  # both refused, never merged


def test_canvas_takes_the_latest_upload_by_its_numbering_and_lists_the_earlier_ones(tmp_path):
    """Canvas renames a notebook uploaded again (lab0.ipynb, lab0-1.ipynb, lab0-2.ipynb): the one graded is the
    highest -N, whatever the files' times, and the others are named on it as not graded."""
    canvas = tmp_path / "canvas"  # the zip unpacked: the files' times are the unpacker's, never the uploads'
    _write(canvas / "smithjohn_1002_9001_lab0.ipynb")
    _write(canvas / "smithjohn_1002_9007_lab0-2.ipynb", NB.replace('"metadata": {}', '"metadata": {"latest": 1}'))
    _write(canvas / "smithjohn_1002_9003_lab0-1.ipynb")
    _write(canvas / "doejane_1003_9101_lab0.ipynb")
    os.utime(canvas / "smithjohn_1002_9001_lab0.ipynb", (2e9, 2e9))  # the first upload, the newest file time
    subs, problems = intake.collect(canvas, tmp_path / "s", LABS)
    assert problems == [] and _found(subs) == [("doejane_1003", "lab0"), ("smithjohn_1002", "lab0")]
    john = next(s for s in subs if s.student == "smithjohn_1002")
    assert john.origin == "smithjohn_1002_9007_lab0-2.ipynb" and json.loads(john.notebook.read_text())["metadata"]
    assert john.warnings == ["Canvas's latest upload for lab0 was graded: smithjohn_1002_9007_lab0-2.ipynb; not "
                             "graded, as earlier uploads: smithjohn_1002_9001_lab0.ipynb, "
                             "smithjohn_1002_9003_lab0-1.ipynb"]
    assert [s.warnings for s in subs if s.student == "doejane_1003"] == [[]]


def test_canvas_uploads_that_are_not_one_notebook_uploaded_again_are_all_listed_and_none_graded(tmp_path):
    canvas = tmp_path / "canvas.zip"
    with zipfile.ZipFile(canvas, "w") as zf:
        zf.writestr("aa_1_11_lab0.ipynb", NB)  # two names: which is the submission is the student's to say
        zf.writestr("aa_1_12_lab0_final.ipynb", NB)
        zf.writestr("bb_2_22_lab0.ipynb", NB)  # -1 uploaded before the plain name: Canvas's numbers disagree
        zf.writestr("bb_2_21_lab0-1.ipynb", NB)
        zf.writestr("cc_3_31_lab0.ipynb", "{not json")  # the latest cannot be read: the earlier one is named
        zf.writestr("cc_3_32_lab0-1.ipynb", "{not json")
        zf.writestr("cc_3_30_lab1.ipynb", NB)
    subs, problems = intake.collect(canvas, tmp_path / "s", LABS)
    assert _found(subs) == [("cc_3", "lab1")]
    said = {p.student: (p.where, p.message) for p in problems}
    assert said["aa_1"] == ("aa_1_11_lab0.ipynb, aa_1_12_lab0_final.ipynb", "2 notebooks for lab0: keep exactly one")
    assert said["bb_2"] == ("bb_2_21_lab0-1.ipynb, bb_2_22_lab0.ipynb", "2 notebooks for lab0: keep exactly one")
    where, message = said["cc_3"]
    assert where == "cc_3_32_lab0-1.ipynb" and message.startswith("not a valid notebook")
    assert message.endswith("; it is Canvas's latest upload for lab0, so the earlier uploads were not graded "
                            "either: cc_3_31_lab0.ipynb")


def test_a_class_zip_of_one_student_is_that_student(tmp_path):
    one = tmp_path / "one.zip"
    with zipfile.ZipFile(one, "w") as zf:
        zf.writestr("alice/lab0/lab0.ipynb", NB)
        zf.writestr("alice/lab1/lab1.ipynb", NB)
    subs, problems = intake.collect(one, tmp_path / "s1", LABS)
    assert _found(subs) == [("alice", "lab0"), ("alice", "lab1")] and problems == []
    wrapped = tmp_path / "class.zip"
    with zipfile.ZipFile(wrapped, "w") as zf:
        zf.writestr("class/alice/lab0/lab0.ipynb", NB)
        zf.writestr("class/bob/lab0.ipynb", NB)
    subs, problems = intake.collect(wrapped, tmp_path / "s2", LABS)
    assert _found(subs) == [("alice", "lab0"), ("bob", "lab0")] and problems == []


def _encrypted(archive):
    """Mark every member encrypted (Python's zipfile writes no encryption; the flag is what readers go by)."""
    data = bytearray(archive.read_bytes())
    for signature, flag_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        start = data.find(signature)
        while start != -1:
            data[start + flag_at] |= 0x1
            start = data.find(signature, start + 4)
    archive.write_bytes(bytes(data))


def test_hostile_names_members_links_and_json_are_listed_and_the_class_is_graded(tmp_path):
    import os
    from fuselab import course
    root = tmp_path / "in"
    _write(root / "ok" / "lab0.ipynb")
    with zipfile.ZipFile(root / "mallory.zip", "w") as zf:
        zf.writestr("x" * 300 + "/lab0.ipynb", NB)
    with zipfile.ZipFile(root / "oscar.zip", "w") as zf:
        zf.writestr("lab1/lab1.ipynb", NB)
    _encrypted(root / "oscar.zip")
    with zipfile.ZipFile(root / "trudy.zip", "w") as zf:
        zf.writestr("lab0.ipynb", "a file here")
        zf.writestr("lab0.ipynb/lab0.ipynb", NB)  # and a folder of the same name
    _write(root / "deep" / "lab0.ipynb", "[" * 100_000 + "]" * 100_000)
    _write(root / "shapes" / "lab0.ipynb", json.dumps({"nbformat": 4, "cells": [{"cell_type": "code",
                                                                                  "metadata": []}]}))
    _write(root / "..." / "lab0.ipynb")
    os.makedirs(os.path.join(os.fsencode(root), b"caf\xe9"))
    _write(Path(os.fsdecode(os.path.join(os.fsencode(root), b"caf\xe9"))) / "lab0.ipynb")
    (root / "eve").mkdir()
    (root / "eve" / "lab0.ipynb").symlink_to(course.SOLUTIONS / "lab0" / "lab0.ipynb")
    (root / "ivan").symlink_to(course.SOLUTIONS / "lab0")
    subs, problems = intake.collect(root, tmp_path / "staging", LABS)
    assert _found(subs) == [("caf", "lab0"), ("ok", "lab0")]
    text = "\n".join(f"{p.student}: {p.where}: {p.message}" for p in problems)
    assert text.encode("utf-8")  # printable whatever the file names were
    assert "mallory: " in text and "could not unpack" in text and "oscar: " in text and "encrypted" in text
    assert "trudy: " in text and "could not unpack" in text
    assert "deep: " in text and "nested" in text
    assert "shapes: " in text and "cell 0 has metadata that is not an object" in text
    assert ".../lab0.ipynb: in a hidden file or folder" in text
    assert "eve: eve/lab0.ipynb: a link that leads out of the student's own folder" in text
    assert "ivan: ivan: a link to a folder: not followed" in text


def test_the_report_survives_names_that_are_not_utf8(tmp_path):
    import os
    from fuselab.grading.outputs import report
    from fuselab.grading.run.pipeline import ClassResult
    where = os.fsdecode(b"caf\xe9/lab0.ipynb")
    result = ClassResult(out=tmp_path, results=[], problems=[intake.Problem(where, "no notebook found", "caf")])
    text = report.write_report(result, tmp_path).read_text()
    assert "caf\\\\xe9/lab0.ipynb" in text  # the undecodable byte as an escape, its backslash escaped for markdown
    assert "caf\\xe9/lab0.ipynb" in (tmp_path / "report.html").read_text()


def test_a_notebook_too_large_to_parse_and_duplicate_zip_members_are_listed_not_read(tmp_path, monkeypatch):
    """JSON costs memory per value: a small zip can unpack to a notebook of millions of empty lists that would take
    gigabytes to parse (and a MemoryError stopped the class). Such a notebook, and one over the size limit, is a
    problem with its reason, read no further; two zip members of one name are neither chosen silently."""
    root = tmp_path / "in"
    _write(root / "ok" / "lab0.ipynb")
    monkeypatch.setattr(intake, "MAX_JSON_VALUES", 20_000)  # the real limits, scaled down 50 and 1000 times
    monkeypatch.setattr(intake, "MAX_NOTEBOOK_BYTES", 100_000)
    bomb = NB[:-1] + ', "x": [' + "[]," * 20_000 + "[]]}"
    with zipfile.ZipFile(root / "mallory.zip", "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("lab0/lab0.ipynb", bomb)
    assert (root / "mallory.zip").stat().st_size < len(bomb) / 100
    _write(root / "big" / "lab0.ipynb", NB[:-1] + ', "x": "' + "y" * 200_000 + '"}')
    with zipfile.ZipFile(root / "dup.zip", "w") as zf:
        zf.writestr("lab0/lab0.ipynb", NB)
        zf.writestr("lab0/lab0.ipynb", NB.replace('"cells": []', '"cells": [], "other": 1'))
    read, loads = [], json.loads
    monkeypatch.setattr(intake.json, "loads", lambda text, *a, **k: read.append(len(text)) or loads(text, *a, **k))
    subs, problems = intake.collect(root, tmp_path / "staging", LABS)
    assert _found(subs) == [("ok", "lab0")]
    text = "\n".join(f"{p.student}: {p.where}: {p.message}" for p in problems)
    assert "mallory: " in text and "values (the limit is" in text, text
    assert "big: " in text and "too large to grade" in text, text
    assert "dup: " in text and "2 files named 'lab0/lab0.ipynb'; none of them was unpacked" in text, text
    assert max(read) < 1000  # neither large notebook was parsed


def test_a_student_id_never_reads_as_an_option(tmp_path):
    """A folder named `--force` or `-rf` is a student, and nbgrader's command line must not take it for an option:
    ids never start with '-'; one that then equals another student's is refused like any two names of one id."""
    assert [intake.student_id(n) for n in ("--force", "-rf", "-.-x", "a-b-")] == ["force", "rf", "x", "a-b-"]
    root = tmp_path / "in"
    _write(root / "--force" / "lab0.ipynb")
    _write(root / "-rf" / "lab0.ipynb")
    _write(root / "rf" / "lab0.ipynb")
    subs, problems = intake.collect(root, tmp_path / "staging", LABS)
    assert _found(subs) == [("force", "lab0")]
    assert any("-rf" in p.where and "rf" in p.where and "become student id 'rf'" in p.message for p in problems)


def test_zips_inside_a_zip_write_only_notebooks_and_the_class_has_one_budget(tmp_path, monkeypatch):
    """A class zip of student zips: each inner zip counts at its compressed size when the class zip is unpacked,
    so a few MB of nested zips of zeros wrote gigabytes. Only notebooks (and the zips that hold them) are written,
    a notebook too large to grade is never written, and all archives of one intake share one budget."""
    import io
    monkeypatch.setattr(intake, "MAX_CLASS_UNZIPPED_BYTES", 3_000_000)  # scaled down, like the class below
    monkeypatch.setattr(intake, "MAX_NOTEBOOK_BYTES", 200_000)
    root = tmp_path / "in"
    root.mkdir()

    def inner(padding_name, padding_bytes):
        data = io.BytesIO()
        with zipfile.ZipFile(data, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("lab0/lab0.ipynb", NB)
            zf.writestr(padding_name, b"\0" * padding_bytes)
        return data.getvalue()

    with zipfile.ZipFile(root / "class.zip", "w") as zf:
        zf.writestr("alice.zip", inner("zeros.bin", 2_000_000))     # not a notebook: never written
        zf.writestr("bob.zip", inner("lab1/lab1.ipynb", 400_000))   # a notebook too large to grade
        for n in range(3):                                           # together past the class's budget
            zf.writestr(f"m{n}.zip", inner("lab1/big.ipynb", 900_000))
    subs, problems = intake.collect(root / "class.zip", tmp_path / "staging", LABS)
    written = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".zip")
    text = "\n".join(f"{p.student}: {p.where}: {p.message}" for p in problems)
    assert ("alice", "lab0") in _found(subs) and ("bob", "lab0") in _found(subs), text
    assert "bob: " in text and "too large to grade" in text, text
    assert "would pass what the whole class may unpack" in text, text
    assert written < 3_000_000 + 100_000, written  # the zeros and the refused notebooks never reached the disk


def test_only_a_download_with_moodle_names_or_inner_zips_may_hold_moodle(tmp_path):
    """``may_hold_moodle`` lets the Moodle identity check skip unpacking a Canvas download or a class folder a
    second time; any Moodle name, in a folder or a zip, at any depth, and any zip inside say it may."""
    canvas = tmp_path / "canvas.zip"
    with zipfile.ZipFile(canvas, "w") as zf:
        zf.writestr("smithjohn_1002_5002_lab0.ipynb", NB)
        zf.writestr("jonesmary_LATE_1003_5003_lab0-1.ipynb", NB)
    folder = tmp_path / "class"
    _write(folder / "alice" / "lab0" / "lab0.ipynb")
    assert not intake.may_hold_moodle(canvas) and not intake.may_hold_moodle(folder)
    moodle = tmp_path / "moodle.zip"
    with zipfile.ZipFile(moodle, "w") as zf:
        zf.writestr("lab0/John Smith_1234_assignsubmission_file_/lab0.ipynb", NB)
    flat = tmp_path / "flat"
    _write(flat / "wrapper" / "John Smith_1234_assignsubmission_file_lab0.ipynb")
    inner = tmp_path / "inner"
    _write(inner / "alice.zip", "")
    assert intake.may_hold_moodle(moodle) and intake.may_hold_moodle(flat) and intake.may_hold_moodle(inner)


def test_a_zip_member_nested_past_any_layout_is_said_and_the_class_is_graded(tmp_path):
    """A student's zip holding a file 1500 folders deep made Python's mkdir recurse past its limit, and nobody in
    the class was graded, on every run: such a member is now skipped with a problem, the rest of the zip kept."""
    root = tmp_path / "in"
    _write(root / "alice" / "lab0" / "lab0.ipynb")
    with zipfile.ZipFile(root / "mallory.zip", "w") as zf:
        zf.writestr("lab0/lab0.ipynb", NB)
        zf.writestr("b/" * 1500 + "x.txt", "x")
        zf.writestr("c/" * 1500 + "lab0.ipynb", NB)
    subs, problems = intake.collect(root, tmp_path / "s", LABS)
    assert _found(subs) == [("alice", "lab0"), ("mallory", "lab0")]
    assert len(problems) == 2 and all("1501 folders deep (at most 64)" in str(p) for p in problems), problems
    assert all(len(str(p)) < 600 for p in problems)  # the 3 KB name cut to its start and end


def test_which_upload_is_older_by_canvas_numbers_or_times_handed_in():
    """Canvas numbers every upload, a later one larger (a notebook in an uploaded zip is the zip's upload); where
    either upload has no Canvas number, the times handed in decide, and where nothing tells, no upload is older."""
    from fuselab.grading.records import intake
    assert intake.canvas_upload_number("parkkim_LATE_1005_5006_lab0-1.ipynb") == 5006
    assert intake.canvas_upload_number("parkkim_1005_5005_work.zip:lab0/lab0.ipynb") == 5005
    for name in ("ann/lab0/lab0.ipynb", "ann.zip:lab0/lab0.ipynb", "Ann Lee_12_assignsubmission_file_lab0.ipynb"):
        assert intake.canvas_upload_number(name) is None, name
    older = intake.older_than_graded
    assert older("p_1005_5005_work.zip:lab0.ipynb", None, ("p_1005_5006_lab0.ipynb", None))
    assert not older("p_1005_5007_lab0.ipynb", "2026-01-01T00:00:00", ("p_1005_5006_lab0.ipynb", "2026-09-01T00:00:00"))
    assert older("ann/lab0/lab0.ipynb", "2026-09-14T10:00:00", ("ann/lab0/lab0.ipynb", "2026-09-15T10:00:00+00:00"))
    assert not older("ann/lab0/lab0.ipynb", "2026-09-16T10:00:00", ("ann/lab0/lab0.ipynb", "2026-09-15T10:00:00"))
    assert not older("ann/lab0/lab0.ipynb", None, ("ann/lab0/lab0.ipynb", "2026-09-15T10:00:00"))
    assert not older("ann/lab0/lab0.ipynb", "not a time", ("ann/lab0/lab0.ipynb", "2026-09-15T10:00:00"))


def test_a_timestamp_txt_in_an_lms_download_is_the_students_file_not_a_time(tmp_path):
    """nbgrader's collected layout says when each notebook was handed in (``timestamp.txt``); in Moodle's download
    that file is one more upload of the student's, whose date would set their late penalty and which of two
    uploads counts as older: it is never read there."""
    source = tmp_path / "class"
    for folder in ("ann/lab0", "Bo Li_77_assignsubmission_file_/lab0"):
        _write(source / folder / "lab0.ipynb")
        (source / folder / "timestamp.txt").write_text("2030-01-01 00:00:00 UTC")
    subs, problems = intake.collect(source, tmp_path / "staging", LABS)
    when = {s.student: s.submitted for s in subs}
    assert when == {"ann": "2030-01-01T00:00:00", "Bo_Li_77": None}, (when, problems)


def test_an_empty_zip_or_folder_is_a_note_of_the_run_not_a_student(tmp_path):
    # An empty download unpacked to no folder at all, which the walk reported as an unreadable upload of
    # "(no student) ." kept in the term's records for good. It is a note about this run, and nobody's row.
    empty_zip = tmp_path / "empty.zip"
    zipfile.ZipFile(empty_zip, "w").close()
    empty_folder = tmp_path / "empty"
    empty_folder.mkdir()
    for source, kind in ((empty_zip, "zip"), (empty_folder, "folder")):
        subs, problems = intake.collect(source, tmp_path / f"staging-{kind}", LABS)
        assert subs == []
        [problem] = problems
        assert problem.note and problem.student is None
        assert f"the {kind} holds no files" in problem.message
    # a zip holding only a folder is not empty of students' files: its folder is said as it is
    only_folder = tmp_path / "folder-only.zip"
    with zipfile.ZipFile(only_folder, "w") as zf:
        zf.writestr("alice/lab0.ipynb", json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                                    "nbformat_minor": 5}))
    subs, problems = intake.collect(only_folder, tmp_path / "staging-one", LABS)
    assert not any("holds no files" in p.message for p in problems)
