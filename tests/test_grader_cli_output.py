"""What ``fuselab grade`` prints: a submission's text never breaks the summary's lines, and an ``--out`` it cannot
write ends in one clear line and a non-zero exit, never a traceback (as root and as a plain user)."""

import contextlib
import io
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fuselab.grading.run import cli, pipeline
from fuselab.grading.records import intake
from fuselab.grading.records.results import CellResult, SubmissionResult
from fuselab.grading.outputs.terminal import shown

FAKE = "ALL SUBMISSIONS PASSED"
# a newline, a carriage return, an escape sequence that clears the line, a right-to-left override
EVIL = f"mallory\n{FAKE}\r\x1b[2K\u202e"


def _grade_cli(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(["grade", *map(str, args)])
        except SystemExit as exc:  # argparse
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def _clean(text):
    lines = text.splitlines()
    assert FAKE not in [line.strip() for line in lines], text
    assert not any(c in text for c in "\r\x1b\u202e"), repr(text)


def test_shown_escapes_every_control_and_override():
    assert shown(EVIL) == "mallory\\nALL SUBMISSIONS PASSED\\r\\x1b[2K\\u202e"
    assert shown("tab\there\x85\u2028\x7f") == "tab\\there\\x85\\u2028\\x7f"
    assert shown("ünïcode ok/lab0") == "ünïcode ok/lab0"
    assert shown(b"bad\xff".decode("utf-8", "surrogateescape")) == "bad\\xff"


def test_the_summary_prints_no_line_a_submission_wrote(tmp_path, monkeypatch):
    # a folder name with newlines reaches the summary through a problem's place and message, and (were intake
    # ever to keep it) through a student's id, a test's name, a retry's reason
    cell = CellResult(points=0, max_points=1, status="timed out", message=EVIL,
                      retry={"first_try": EVIL, "retry": f"passed\n{FAKE}"})
    result = SubmissionResult(student=EVIL, lab="lab0", cells={f"test_\n{FAKE}": cell}, total=0, max_total=1)
    problem = intake.Problem(where=str(tmp_path / EVIL / "lab0"), message=f"no notebook in {EVIL}")

    def fake_grade(source, settings):
        return pipeline.ClassResult(out=settings.out, results=[result], problems=[problem],
                                    grades_csv=settings.out / "grades.csv")

    monkeypatch.setattr(pipeline, "grade", fake_grade)
    (tmp_path / "submissions").mkdir()
    code, out, err = _grade_cli(tmp_path / "submissions", "--out", tmp_path / "run")
    assert code == 0
    _clean(out + err)
    assert "mallory\\nALL SUBMISSIONS PASSED" in out  # shown, escaped, where it belongs
    assert "not graded: " in out and "run again alone" in out


def test_a_folder_named_with_newlines_prints_one_line(tmp_path, monkeypatch):
    # a class whose only entry is a student folder named with newlines and no notebook: intake's own problem
    # for it, printed by the command's summary
    from fuselab import course
    from fuselab.grading.records import nbgrader_run
    source = tmp_path / "submissions"
    (source / EVIL / "lab0").mkdir(parents=True)
    (source / EVIL / "lab0" / "notes.txt").write_text("no notebook here")
    names = {lab: nbgrader_run.notebook_name(lab) for lab in course.lab_names()}
    submissions, problems = intake.collect(source, tmp_path / "taken", names)
    assert submissions == [] and problems and any("\n" in p.where + p.message for p in problems)

    def fake_grade(source, settings):
        return pipeline.ClassResult(out=settings.out, results=[], problems=problems,
                                    grades_csv=settings.out / "grades.csv")

    monkeypatch.setattr(pipeline, "grade", fake_grade)
    code, out, err = _grade_cli(source, "--out", tmp_path / "run")
    assert code == 0 and "Traceback" not in out + err
    _clean(out + err)
    assert "mallory\\nALL SUBMISSIONS PASSED" in out, out


def _no_traceback(code, out, err):
    assert code == 3, (code, out, err)
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fuselab grade: --out "), err
    return lines[0]


def test_an_out_that_is_a_file_or_under_one(tmp_path):
    (tmp_path / "submissions").mkdir()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    line = _no_traceback(*_grade_cli(tmp_path / "submissions", "--out", blocker))
    assert "is a file, not a folder" in line
    line = _no_traceback(*_grade_cli(tmp_path / "submissions", "--out", blocker / "deeper" / "run"))
    assert f"{blocker} is a file" in line


def test_an_out_under_a_read_only_folder(tmp_path):
    # as whoever runs the tests (root in CI): a read-only bind mount of the parent, which root cannot write either
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is needed for a read-only mount (apt-get install bubblewrap)")
    parent = tmp_path / "read-only"
    parent.mkdir()
    (tmp_path / "submissions").mkdir()
    code = ("import sys; from fuselab.grading.run import cli; "
            f"sys.exit(cli.main(['grade', {str(tmp_path / 'submissions')!r}, '--out', {str(parent / 'run')!r}]))")
    result = subprocess.run(["bwrap", "--dev-bind", "/", "/", "--ro-bind", str(parent), str(parent),
                             "--unshare-user", "--uid", str(os.geteuid()), "--gid", str(os.getegid()), "--",
                             sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            cwd=Path(pipeline.course.REPO))
    line = _no_traceback(result.returncode, result.stdout, result.stderr)
    assert "cannot be written: Read-only file system" in line or "may not write there" in line, line
    assert not (parent / "run").exists()


def test_an_out_a_plain_user_may_not_write(tmp_path):
    """As a plain user (made here when the tests run as root): an --out in a folder of someone else's."""
    shared = Path(tempfile.mkdtemp(prefix="fuselab-out-test-"))  # a folder others may enter: the TA's server's
    shared.chmod(0o755)
    (shared / "submissions").mkdir(mode=0o755)
    parent = shared / "not-yours"
    parent.mkdir(mode=0o755)
    made = None
    if os.geteuid() == 0:
        made = f"fuselab-out-{os.getpid()}"
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", made], check=True,
                       capture_output=True)
    try:
        uid, gid = (pwd.getpwnam(made).pw_uid, pwd.getpwnam(made).pw_gid) if made else (None, None)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the plain user: the check runs in this process, as it would in the command
            try:
                os.close(read)
                if uid is not None:
                    os.setgroups([])
                    os.setgid(gid)
                    os.setuid(uid)
                code, out, err = _grade_cli(shared / "submissions", "--out", parent / "run")
                os.write(write, repr((code, out, err)).encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as handle:
            reply = handle.read()
        os.waitpid(pid, 0)
        code, out, err = eval(reply)  # noqa: S307 - our own child's repr of a tuple of an int and two strings
    finally:
        if made:
            subprocess.run(["userdel", made], capture_output=True)
    line = _no_traceback(code, out, err)
    assert "may not write there" in line and (made or "") in line
    assert not (parent / "run").exists()
    shutil.rmtree(shared)


def test_an_io_error_while_grading_is_one_line_and_says_how_to_resume(tmp_path, monkeypatch):
    import errno

    def full_disk(source, settings):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(settings.out / "work" / "result.json"))

    monkeypatch.setattr(pipeline, "grade", full_disk)
    (tmp_path / "submissions").mkdir()
    code, out, err = _grade_cli(tmp_path / "submissions", "--out", tmp_path / "run")
    assert code == 4 and "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "No space left on device" in lines[0] and "run the same command to resume" in lines[0]


def test_ctrl_c_while_grading_is_one_line_that_says_how_to_finish(tmp_path, monkeypatch):
    # Ctrl-C once printed KeyboardInterrupt's traceback: now one line, and the shell's status for it (130)
    def interrupted(source, settings):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "grade", interrupted)
    (tmp_path / "submissions").mkdir()
    code, out, err = _grade_cli(tmp_path / "submissions", "--out", tmp_path / "run")
    assert code == 130 and "Traceback" not in out + err and "KeyboardInterrupt" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [f"fuselab grade: interrupted. What was graded is kept in {shown(tmp_path / 'run')}: run the "
                     "same command again to finish"], lines


def test_a_run_whose_grader_failed_on_a_submission_does_not_exit_as_a_success(tmp_path, monkeypatch):
    # a sandbox that failed for every submission (its check passed) once saved nothing and exited 0: the TA saw a
    # success; the grader's own failures now end in exit status 5 and a line saying to run the same command again
    problems = [intake.Problem(where=str(tmp_path / "a.ipynb"), message="the grader failed on this submission: X",
                               student="alice", lab="lab0", grader_failed=True),
                intake.Problem(where=str(tmp_path / "b.html"), message="wrong file type", student="bob", lab="lab0")]

    def fake_grade(source, settings):
        return pipeline.ClassResult(out=settings.out, results=[], problems=problems,
                                    grades_csv=settings.out / "grades.csv")

    monkeypatch.setattr(pipeline, "grade", fake_grade)
    (tmp_path / "submissions").mkdir()
    code, out, err = _grade_cli(tmp_path / "submissions", "--out", tmp_path / "run")
    assert code == 5 and "the grader failed on 1 submission(s)" in err and "run the same command again" in err
    problems.pop(0)
    code, _, _ = _grade_cli(tmp_path / "submissions", "--out", tmp_path / "run")
    assert code == 0  # a student's wrong upload is the class's business, not a failed run
