"""Command-line entry points: ``fuselab grade``, ``fuselab export``, ``fuselab calibrate``, ``fuselab samples``.

``python -m grader`` (from the repository root) is ``fuselab grade``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

from ..outputs.terminal import shown


def _count(text: str) -> int:
    """A number of submissions at once: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {value}")
    return value


def add_parsers(sub) -> None:
    grade = sub.add_parser("grade", help="grade a folder or zip of submissions: gradebook, grades.csv, feedback, "
                                         "class report")
    grade.add_argument("submissions", nargs="?",
                       help="a folder of <student>/<lab>/*.ipynb, <student>.zip files, or an LMS zip")
    grade.add_argument("--labs", nargs="+", help="only these labs")
    grade.add_argument("--students", nargs="+", help="only these students")
    grade.add_argument("--force", action="store_true", help="regrade submissions already graded in --out (the "
                                                            "instructor's reference runs kept there are reused)")
    grade.add_argument("--remeasure-references", action="store_true",
                       help="run the instructor's reference runs again even where --out keeps them for this "
                            "machine, torch and course code (they are rerun by themselves when any of those change)")
    grade.add_argument("--out", help="the term's course folder (default: grader/runs/term): every run adds to it "
                                     "(labs, students, regrades); the same one resumes a stopped run")
    grade.add_argument("--roster", help="the LMS's class list (Canvas gradebook export or Moodle grading "
                                        "worksheet, CSV): who submitted nothing is listed as missing with 0; "
                                        "kept in the course folder")
    grade.add_argument("--due", action="append", default=[], metavar="LAB=WHEN",
                       help="a lab's due date and time, e.g. lab0=2026-09-14T23:59 (UTC, or with an offset: "
                            "2026-09-14T23:59-05:00), once per lab: "
                            "kept in the course's gradebook for nbgrader's late penalty; LAB:STUDENT=WHEN gives "
                            "one student their own (an extension), kept until another is given")
    grade.add_argument("--gpus", default="auto", help="'auto' (every visible GPU), a count, or a list like 0,2")
    grade.add_argument("--jobs-per-gpu", type=_count, default=None,
                       help="submissions graded side by side on each GPU; their timings still take the GPU one at "
                            "a time (default: two per three CPU cores, at most one per 6 GiB of GPU memory, at "
                            "most 16)")
    grade.add_argument("--cpu-workers", type=_count, default=None,
                       help="submissions graded side by side without a GPU (default: one per CPU core, at most one "
                            "per 2 GiB of available memory)")
    grade.add_argument("--cell-timeout", type=float, default=300,
                       help="seconds of its own time per test: the CPU time of the processes that run it and the "
                            "time they wait (for anything but a CPU), at most the wall-clock time (default 300). A "
                            "test still running after five times as long by the clock is stopped and, before it "
                            "scores 0, run again alone")
    grade.add_argument("--submission-timeout", type=float, default=1200,
                       help="seconds of its own time per submission, all of it (default 1200)")
    grade.add_argument("--memory-gb", type=float, default=16, help="resident memory per submission (default 16)")
    grade.add_argument("--sandbox", action=argparse.BooleanOptionalAction, default=True,
                       help="run each submission under bubblewrap as a user without rights: no network, sees only "
                            "its own folder (the default; grading is refused where it does not work). "
                            "--no-sandbox runs submissions with your rights")
    grade.add_argument("--no-feedback", action="store_true", help="skip the feedback pages")
    grade.add_argument("--expect-samples", action="store_true",
                       help="the submissions are the sample class: check every verdict against its sample")
    add_slurm_arguments(grade)
    cal = sub.add_parser("calibrate", help="measure the plain solutions on this GPU and write its policy entry")
    cal.add_argument("--labs", nargs="+")
    cal.add_argument("--repeats", type=int, default=3)
    cal.add_argument("--policy", help="policy file (default: fuselab/speed/policy.json or $FUSELAB_POLICY)")
    cal.add_argument("--dry-run", action="store_true", help="measure and print, write nothing")
    cal.add_argument("--set-threshold", nargs="+", metavar="TEST=SPEEDUP",
                     help="set a test's full-points threshold by hand instead of measuring (no GPU needed), e.g. "
                          "lab0.add_relu_mul=1.6")
    cal.add_argument("--gpu", help="with --set-threshold: the GPU model's entry (default: NVIDIA H200, which GPUs "
                                   "without an entry are graded with)")
    export = sub.add_parser("export", help="write the course's grades as Canvas and Moodle grade-import CSVs")
    export.add_argument("course", nargs="?", default=None, help="the course folder (default: grader/runs/term)")
    export.add_argument("--to", help="folder for the files (default: <course>/export)")
    export.add_argument("--lms", choices=["canvas", "moodle", "all"], default="all",
                        help="the LMS to write for (default: every LMS the course has ids for); one named that "
                             "cannot be written is an error")
    export.add_argument("--scale", action="store_true",
                        help="where Canvas's points for a lab differ from the lab's maximum, write the points "
                             "scaled to Canvas's (else the export stops and says so)")
    samples = sub.add_parser("samples", help="write the sample class (grader/examples) from the labs' recipes")
    samples.add_argument("--out", help="folder (default: grader/examples)")


def add_slurm_arguments(grade) -> None:
    """``fuselab grade --slurm``: the class as a Slurm job array (``slurm.py``; docs/grading.md)."""
    group = grade.add_argument_group("on a Slurm cluster (--out must be on a file system every node sees)")
    group.add_argument("--slurm", action="store_true",
                       help="submit the grading as a Slurm job array (a shard of submissions per task) and a "
                            "merge job after it, then return; the same command again finishes what is missing")
    group.add_argument("--status", metavar="OUT", help="what a --slurm run in OUT has done, is running, has failed")
    group.add_argument("--shards", type=int, help="array tasks (default: one per 40 submissions)")
    group.add_argument("--partition", help="sbatch --partition")
    group.add_argument("--account", help="sbatch --account")
    group.add_argument("--gpus-per-task", type=int, default=1,
                       help="GPUs per array task (sbatch --gres=gpu:N; default 1); 0 grades on the CPU emulation")
    group.add_argument("--cpus-per-task", type=int, help="sbatch --cpus-per-task (the cluster's default if unset)")
    group.add_argument("--time", help="sbatch --time per task, e.g. 1:00:00")
    group.add_argument("--sbatch-args", default="", help="more sbatch options for every job, e.g. --sbatch-args='--qos=short --mem=64G'")


def run(args) -> int:
    from ...course import without_iri_grammar
    without_iri_grammar()  # this process imports nbgrader: without a grammar build it never uses
    if args.command == "grade":
        if args.slurm or args.status:
            problem = out_problem(Path(args.out)) if args.slurm and args.out else None
            if problem:
                print(f"fuselab grade: {problem}", file=sys.stderr)
                return 3
            from .slurm import main_cli
            return main_cli(args, due=_due_arguments(args.due))
        if args.submissions is None:
            raise SystemExit("fuselab grade: give the submissions (a folder or zip)")
        return main_grade(args)
    if args.command == "export":
        from ..outputs.export import main as export_main
        from .pipeline import default_out
        args.course = args.course or default_out()
        return export_main(args)
    if args.command == "calibrate":
        from .calibrate import calibrate, set_thresholds
        if args.set_threshold:
            try:
                lines = set_thresholds(args.set_threshold, args.gpu, args.policy, write=not args.dry_run)
            except ValueError as problem:
                print(f"fuselab calibrate: {problem}", file=sys.stderr)
                return 2
            print("\n".join(lines))
            return 0
        for line in calibrate(args.labs, args.repeats, args.policy, write=not args.dry_run):
            print(line)
        return 0
    if args.command == "samples":
        from ...course import sample_class
        root = Path(args.out) if args.out else sample_class.EXAMPLES
        written = sample_class.write_examples(root)
        print(f"wrote {len(written)} sample submission(s) under {root}")
        return 0
    return 2


def out_problem(out: Path) -> str | None:
    """Why grading cannot write into ``out``, said so a teaching assistant can fix it; None if it can. ``out`` (and
    any missing parent) is made, a file is written into it and removed, and the folders made for the probe are
    removed again: a run refused later (a sandbox that does not work) leaves nothing behind."""
    shown_out = shown(out)
    made = [p for p in [out, *out.parents] if not p.exists()]
    try:
        if out.exists() and not out.is_dir():
            return f"--out {shown_out} is a file, not a folder: give a folder (a new one is made)"
        out.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".fuselab-write-test-", dir=out)
        os.close(handle)
        os.unlink(probe)
        for folder in made:  # deepest first
            folder.rmdir()
    except (NotADirectoryError, FileExistsError):
        file = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
        return f"--out {shown_out} cannot be made: {shown(file) if file else 'a part of its path'} is a file"
    except PermissionError:
        return f"--out {shown_out}: you ({_user()}) may not write there: choose a folder you can write to, or ask " \
               "its owner for write permission"
    except OSError as exc:
        return f"--out {shown_out} cannot be written: {shown(exc.strerror or exc)}: choose another folder"
    return None


def _user() -> str:
    try:
        import pwd
        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return f"uid {os.geteuid()}"


def main_grade(args) -> int:
    from .pipeline import default_out
    out = Path(args.out) if args.out else default_out()
    try:
        return _grade_into(args, out)
    except KeyboardInterrupt:
        # Ctrl-C. Caught here, at the top, so the pipeline unwinds as it always did (each submission's children
        # stopped, --out's lock released, the sandbox's cgroups removed at exit); only the traceback is replaced.
        # Each graded submission was saved as it finished: the same command resumes from there.
        print(f"\nfuselab grade: interrupted. What was graded is kept in {shown(out)}: run the same command again to "
              "finish", file=sys.stderr)
        return 130  # the shell's status for a command stopped by Ctrl-C (128 + SIGINT)


def _grade_into(args, out: Path) -> int:
    from .pipeline import GradingRefused, Settings, check_out, grade
    try:
        check_out(out, Path(args.submissions))
    except GradingRefused as refused:
        print(f"fuselab grade: {shown(refused)}", file=sys.stderr)
        return 3
    problem = out_problem(out)
    if problem:
        print(f"fuselab grade: {problem}{'' if args.out else ' (the default --out; give another with --out)'}",
              file=sys.stderr)
        return 3

    import torch

    from . import samplecheck
    settings = Settings(out=out, labs=args.labs, students=args.students,
                        force=args.force, remeasure_references=args.remeasure_references, gpus=args.gpus,
                        jobs_per_gpu=args.jobs_per_gpu, cpu_workers=args.cpu_workers,
                        cell_timeout=args.cell_timeout, submission_timeout=args.submission_timeout,
                        memory_bytes=int(args.memory_gb * 2**30), sandbox=args.sandbox,
                        feedback=not args.no_feedback,
                        roster=Path(args.roster) if args.roster else None, due=_due_arguments(args.due))
    try:
        result = grade(args.submissions, settings)
    except GradingRefused as refused:
        print(f"fuselab grade: {shown(refused)}", file=sys.stderr)
        return 3
    except OSError as exc:  # a disk that filled, an --out made read-only meanwhile: what was saved is kept there
        where = f" ({shown(exc.filename)})" if exc.filename else ""
        print(f"fuselab grade: grading stopped: {shown(exc.strerror or exc)}{where}. What was graded is saved in "
              f"{shown(out)}: fix the cause and run the same command to resume", file=sys.stderr)
        return 4
    print()
    if args.expect_samples:
        rows = samplecheck.compare(result.results, on_gpu=torch.cuda.is_available())
        print(samplecheck.table(rows))
        failed = [r for r in rows if not r["ok"]]
    else:
        # the tests alone (a TA's score from formgrader counts): grades.csv, the report and the export add the written
        # answers
        print("tests (a score given in formgrader counts; grades.csv, the report and fuselab export add the written "
              "answers graded by hand):")
        print(grade_table(result.results))
        failed = []
    retried = retry_lines(result.results)
    if retried:
        print("\nran past a wall-clock limit (a busy machine?) or out of the shared GPU's memory, and were run again "
              "alone:\n" + "\n".join(retried))
    for problem in result.problems:
        print(f"{'note' if problem.note else 'not graded'}: {shown(problem.where)}: {shown(problem.message)}")
    if not args.students:  # a regrade of some students says nothing of the others
        line = missing_line(result.standings, {r.lab for r in result.results} | set(args.labs or []))
        if line:
            print(line)
    print(f"\ngrades:   {shown(result.grades_csv)}\nreport:   {shown(result.out / 'report.html')}\n"
          f"feedback: {shown(result.out / 'feedback')}\ngradebook: {shown(result.out / 'course' / 'gradebook.db')}")
    broken = [p for p in result.problems if p.grader_failed]
    if broken:  # never a quiet success: these submissions have no grade yet
        print(f"fuselab grade: the grader failed on {len(broken)} submission(s) (listed above as not graded): fix "
              "the cause and run the same command again to grade them", file=sys.stderr)
        return 5
    return 1 if failed else 0


def _due_arguments(pairs) -> dict:
    """``--due LAB=WHEN`` and ``--due LAB:STUDENT=WHEN`` as ``{key: WHEN}``; a key given twice with two dates is
    refused (which one the TA meant cannot be told)."""
    due = {}
    for pair in pairs:
        key, equals, when = pair.partition("=")
        key, when = key.strip(), when.strip()
        if not equals or not key or not when:
            print(f"fuselab grade: --due {pair}: write it as LAB=WHEN, e.g. lab0=2026-09-14T23:59 (one student's "
                  "own: lab0:alice=2026-09-16T23:59)", file=sys.stderr)
            raise SystemExit(3)
        if due.get(key, when) != when:
            print(f"fuselab grade: --due {key} is given twice, {due[key]} and {when}: give it once", file=sys.stderr)
            raise SystemExit(3)
        due[key] = when
    return due


def grade_table(results) -> str:
    from ..records.results import SubmissionResult
    lines = []
    for r in map(SubmissionResult.of, results):
        tests = " ".join(f"{shown(k.replace('test_', ''))}={c.points:g}/{c.max_points:g}" for k, c in r.cells.items())
        flags = r.attention
        # nbgrader's late penalty comes off the whole lab (grades.csv's total): said beside the tests' points
        late = f"  late penalty -{r.late_penalty:g} (grades.csv)" if r.late_penalty else ""
        lines.append(f"{shown(r.student + '/' + r.lab):<32} {r.total:>5g}/{r.max_total:<4g} {tests}{late}"
                     f"{'  [' + str(flags) + ' flag(s)]' if flags else ''}")
    return "\n".join(lines)


def missing_line(standings, labs, most: int = 20) -> str:
    """The students with nothing for a lab of this run (the roster's, or graded in another lab): one line, as
    grades.csv and the report have them ("missing", 0)."""
    from ..records import term
    missing = [f"{s.student}/{s.lab}" for s in standings if s.status == term.MISSING and s.lab in labs]
    if not missing:
        return ""
    more = f" and {len(missing) - most} more (report.html)" if len(missing) > most else ""
    return f"missing (nothing submitted, 0 in grades.csv): {', '.join(shown(m) for m in missing[:most])}{more}"


def retry_lines(results) -> list:
    """One line per test run again alone (past a wall-clock limit, or out of the shared GPU's memory): its first
    try, and what the retry alone gave."""
    from ..records.results import SubmissionResult
    lines = []
    for r in map(SubmissionResult.of, results):
        for grade_id, cell in r.cells.items():
            retry = cell.retry
            if isinstance(retry, dict) and retry:
                lines.append(f"  {shown(r.student + '/' + r.lab)} {shown(grade_id)}: "
                             f"retry: {shown(retry.get('retry', 'not run'))}; first try: "
                             f"{shown(retry.get('first_try', ''))}")
    return lines


def parse(parser, argv):
    """``parser.parse_args(argv)``, but a date and time given to ``--due`` as two words (``--due lab0=2026-09-14
    23:59``) is said as such, not as argparse's "unrecognized arguments" (or the time taken for the submissions)."""
    args, _ = parser.parse_known_args(argv)
    if getattr(args, "due", None):
        words = list(sys.argv[1:] if argv is None else argv)
        for i, word in enumerate(words):
            value = words[i - 1][len("--due="):] if i >= 1 and words[i - 1].startswith("--due=") else \
                words[i - 1] if i >= 2 and words[i - 2] == "--due" else None
            if value and "=" in value and re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?(Z|[+-]\d{2}:?\d{2})?", word):
                parser.exit(2, f"fuselab grade: --due {value} {word}: a date and its time are one word, joined by "
                               f"a T: --due {value}T{word}\n")
    return parser.parse_args(argv)  # argparse's own reading, and its error for anything else


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader")
    sub = parser.add_subparsers(dest="command")
    add_parsers(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("grade", "export", "calibrate", "samples", "-h", "--help"):
        argv = ["grade", *argv]
    return run(parse(parser, argv))
