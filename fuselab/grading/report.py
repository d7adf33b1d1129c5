"""The class's grades and report: ``grades.csv``, ``report.md`` / ``report.html`` with figures.

grades.csv has one row per student of the course (``term.standings``: every student any run met or the roster
lists): per lab the total, its status (graded, "not graded: why", "missing"), whether it was late and when it was
handed in, every test's points and every measured speedup. The report shows, per lab, the score distribution,
the speedups against the policy's threshold, the tests failed most often, a row per student with the reason for
lost points (or for no grade) and a link to their feedback page, and everything a teaching assistant must look
at: disagreements between the notebook run and the clean recheck, flagged tampering (never shown to the student:
the TA decides), crashes and timeouts, malformed submissions.
"""

from __future__ import annotations

import csv
import datetime
import html
import re
import urllib.parse
from pathlib import Path

from . import schedule, term
from .handgrading import hand_graded, totals
from .intake import printable
from .results import SubmissionResult
from .terminal import shown


def _md(text, limit: int | None = None) -> str:
    """Any text (a student's folder name, a flag, a path) as one line of markdown that shows as written: bytes
    that are not UTF-8 as ``\\xNN``, controls, escape sequences and bidirectional overrides as their escapes
    (``terminal.shown``: a report shown with ``cat`` or in a browser is not rewritten), markdown's and HTML's
    punctuation (tables' ``|`` too) backslashed."""
    text = shown(" ".join(printable(text).split()))
    if limit is not None and len(text) > limit:
        text = text[:limit] + "…"
    # ``_`` stays: student ids are full of it, and at worst it italicises a word
    return re.sub(r"([\\`*\[\]!|~<>&])", r"\\\1", text)


def _typed(results) -> list:
    return [SubmissionResult.of(r) for r in results]


def _graded_standings(results) -> list:
    return [term.Standing(r.student, r.lab, term.GRADED, result=r) for r in _typed(results)]


def status_text(standing) -> str:
    """grades.csv's and the report's word for a standing: graded, "not graded: why", missing."""
    if standing.status == term.GRADED:
        return "graded"
    if standing.status == term.MISSING:
        return "missing"
    return f"not graded: {' '.join(printable(standing.why).split())[:300]}"


def lost_points(result) -> str:
    """Why a graded submission lost points, one short line: each test short of full points and its reason."""
    reasons: dict = {}  # one reason, the tests it cost (a build error costs every test that needed it)
    for grade_id, cell in result.cells.items():
        if cell.points < cell.max_points:
            message = (cell.message or "").strip().splitlines()
            reason = f"{cell.status}" + (f" ({message[-1][:160]})" if message else "")
            reasons.setdefault(reason, []).append(grade_id)
    return "; ".join(f"{', '.join(tests)}: {reason}" for reason, tests in reasons.items())


def write_grades_csv(results: list, path: Path, standings: list | None = None) -> Path:
    """One row per student: ``standings`` (``term.standings``, the whole course), else ``results`` alone."""
    results = _typed(results)
    standings = _graded_standings(results) if standings is None else standings
    labs = sorted({s.lab for s in standings if s.lab != term.UNKNOWN_LAB})
    tests = {lab: list(next((r for r in results if r.lab == lab), SubmissionResult("", lab)).cells) for lab in labs}
    maxima = {lab: next((totals(r)[1] for r in results if r.lab == lab), None) for lab in labs}
    hand = {lab: sorted({g for r in results if r.lab == lab for g in hand_graded(r)}) for lab in labs}
    speed_tests = {lab: [t for t in tests[lab] if any(t in c.cells and c.cells[t].speed for c in results
                                                      if c.lab == lab)] for lab in labs}
    header = ["student", "name", "lms id"]
    for lab in labs:
        header += [f"{lab} total", f"{lab} max", f"{lab} status", f"{lab} late", f"{lab} submitted"] + \
                  [f"{lab}/{t}" for t in tests[lab] + hand[lab]] + [f"{lab}/{t} speedup" for t in speed_tests[lab]]
    unknown_lab = [s for s in standings if s.lab == term.UNKNOWN_LAB]
    header += ["total", "max", "flags"] + (["not graded (lab unknown)"] if unknown_lab else [])
    rows = {}
    for standing in standings:
        row = rows.setdefault(standing.student, {"student": standing.student, "total": 0.0, "max": 0.0,
                                                 "flags": 0})
        row["name"] = row.get("name") or standing.person.get("name", "")
        row["lms id"] = row.get("lms id") or standing.lms_id or ""
        if standing.lab == term.UNKNOWN_LAB:
            row["not graded (lab unknown)"] = status_text(standing)
            continue
        lab = standing.lab
        row[f"{lab} status"] = status_text(standing)
        row[f"{lab} late"] = "late" if standing.late else ""
        row[f"{lab} submitted"] = standing.submitted or ""
        if standing.result is None:
            row[f"{lab} max"] = f"{maxima[lab]:g}" if maxima[lab] is not None else ""
            if standing.status == term.MISSING:
                row[f"{lab} total"] = "0"
                row["max"] += maxima[lab] or 0.0
    for r in results:
        row = rows.setdefault(r.student, {"student": r.student, "total": 0.0, "max": 0.0, "flags": 0})
        row.setdefault(f"{r.lab} status", "graded")
        total, maximum = totals(r)  # with the written answers graded by hand
        row[f"{r.lab} total"] = f"{total:g}"
        row[f"{r.lab} max"] = f"{maximum:g}"
        for test, cell in r.cells.items():
            row[f"{r.lab}/{test}"] = f"{cell.points:g}"
            if test in speed_tests[r.lab]:
                measured = cell.measured_speedup()
                row[f"{r.lab}/{test} speedup"] = f"{measured['speedup']:.3f}" if measured else \
                    ("not measured (no GPU)" if cell.status == "not measured (no GPU)" else "")
        for grade_id, entry in hand_graded(r).items():  # blank until a person grades it in formgrader
            row[f"{r.lab}/{grade_id}"] = "" if entry["points"] is None else f"{entry['points']:g}"
        row["total"] += total
        row["max"] += maximum
        row["flags"] += r.attention
    # a name the file system gave as bytes that are not UTF-8 is written as \\xNN, not a crash
    with open(path, "w", newline="", encoding="utf-8", errors="backslashreplace") as handle:
        writer = csv.DictWriter(handle, fieldnames=header)
        writer.writeheader()
        for student in sorted(rows):
            row = rows[student]
            row["total"], row["max"] = f"{row['total']:g}", f"{row['max']:g}"
            # a folder name's escape sequence or right-to-left override never reaches a terminal or a spreadsheet
            writer.writerow({key: shown(value) if isinstance(value, str) else value for key, value in row.items()})
    return path


def _figures(results, lab, folder: Path) -> list:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    mine = [r for r in results if r.lab == lab]
    made = []
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
    maximum = max(r.max_total for r in mine) or 1
    axes[0].hist([r.total for r in mine], bins=min(20, max(5, len(mine))), range=(0, maximum), color="#4c72b0")
    axes[0].set_xlabel("points"); axes[0].set_ylabel("students"); axes[0].set_title(f"{lab}: score distribution")
    speeds, thresholds = [], []
    for r in mine:
        for cell in r.cells.values():
            measured = cell.measured_speedup()
            if measured:
                speeds.append(measured["speedup"])
                thresholds.append(measured.get("threshold"))
    if speeds:
        axes[1].hist(speeds, bins=min(20, max(5, len(speeds))), color="#55a868")
        for t in sorted({t for t in thresholds if t}):
            axes[1].axvline(t, color="k", ls="--", label=f"full points from {t:.2f}x")
        axes[1].axvline(1.0, color="r", ls=":", label="1.0x: no points")
        axes[1].legend(fontsize=8)
        axes[1].set_xlabel("speedup over the lab's unfused reference")
    else:
        axes[1].text(0.5, 0.5, "speedups not measured\n(no GPU)", ha="center", va="center", fontsize=12)
        axes[1].set_xticks([]); axes[1].set_yticks([])
    axes[1].set_title(f"{lab}: speedups against the threshold")
    tests = list(mine[0].cells)
    failed = [sum(1 for r in mine if r.cells[t].points < r.cells[t].max_points) / len(mine) for t in tests]
    order = sorted(range(len(tests)), key=lambda i: -failed[i])
    axes[2].barh([tests[i] for i in order][::-1], [failed[i] for i in order][::-1], color="#c44e52")
    axes[2].set_xlim(0, 1); axes[2].set_xlabel("fraction of submissions short of full points")
    axes[2].set_title(f"{lab}: tests failed most often")
    fig.tight_layout()
    path = folder / f"{lab}-figures.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    made.append(path)
    return made


def _gpu_line(results) -> str:
    gpus = sorted({s.get("gpu") for r in results for c in r.cells.values() for s in c.speed if s.get("gpu")})
    notes = sorted({s.get("policy_note") for r in results for c in r.cells.values() for s in c.speed
                    if s.get("policy_note")})
    if not gpus:
        return "No GPU: correctness was graded through the CPU emulation; speed tests are **not measured (no GPU)** " \
               "and score 0."
    line = f"Speedups measured on {', '.join(gpus)}."
    if notes:
        line += " " + " ".join(notes)
    return line


def markdown(class_result) -> str:
    standings = getattr(class_result, "standings", None) or _graded_standings(class_result.results)
    results = [s.result for s in standings if s.result is not None]
    counted = {status: sum(1 for s in standings if s.status == status)
               for status in (term.GRADED, term.NOT_GRADED, term.MISSING)}
    lines = [f"# Grading report", "", f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {len(results)} submission(s), "
             f"{len({s.student for s in standings})} student(s): {counted[term.GRADED]} graded, "
             f"{counted[term.NOT_GRADED]} not graded, {counted[term.MISSING]} missing."
             + (f" This run graded {class_result.graded_now} of them." if class_result.graded_now else ""),
             "", _gpu_line(results), ""]
    if class_result.reference:
        lines += ["## The instructor's solution on this machine", ""]
        for lab, ref in class_result.reference.items():
            total = sum(c["points"] for c in ref["cells"].values())
            maximum = sum(c["max_points"] for c in ref["cells"].values())
            state = "**BROKEN: " + ", ".join(ref["broken"]) + " failed — fix the machine before trusting grades**" \
                if ref["broken"] else "all correctness tests pass"
            lines.append(f"- {lab}: {total:g} / {maximum:g} ({state})")
        lines.append("")
    pages = getattr(class_result, "feedback", None) or {}
    for lab in sorted({s.lab for s in standings if s.lab != term.UNKNOWN_LAB}):
        mine = [s for s in standings if s.lab == lab]
        graded = [s.result for s in mine if s.result is not None]
        tests = list(graded[0].cells) if graded else []
        lines += [f"## {lab}", ""] + ([f"![{lab}]({lab}-figures.png)", ""] if graded else []) + [
                  "| student | " + " | ".join(tests) + " | total | late | reason | feedback | time |",
                  "| --- | " + " | ".join("---" for _ in tests) + " | --- | --- | --- | --- | --- |"]
        for standing in mine:
            r = standing.result
            late = "late" + (f" ({_md(standing.submitted)})" if standing.submitted else "") if standing.late else ""
            if r is None:
                lines.append(f"| {_md(standing.student)} | " + " | ".join("-" for _ in tests) +
                             f" | {'0' if standing.status == term.MISSING else '-'} | {late} | "
                             f"{_md(status_text(standing), 400)} | | |")
                continue
            cells = []
            for t in tests:
                c = r.cells.get(t)
                if c is None:
                    cells.append("-")
                    continue
                measured = c.measured_speedup()
                text = f"{c.points:g}" + (f" ({measured['speedup']:.2f}x)" if measured else "")
                if c.status not in ("passed",):
                    text += f" *{_md(c.status)}*"
                cells.append(text)
            page = pages.get(lab, {}).get(r.student)
            link = f"[page]({_relative_link(page, class_result.out)})" if page else ""
            total, maximum = totals(r)  # with the written answers graded by hand
            lines.append(f"| {_md(r.student)} | " + " | ".join(cells) +
                         f" | **{total:g}** / {maximum:g} | {late} | {_md(lost_points(r), 400)} | {link} "
                         f"| {r.seconds or 0:.0f} s |")
        lines.append("")
    unknown = [s for s in standings if s.lab == term.UNKNOWN_LAB]
    if unknown:
        lines += ["## Not graded, lab unknown", ""]
        lines += [f"- {_md(s.student)}: {_md(status_text(s), 500)}" for s in unknown] + [""]
    attention = []
    for r in results:
        who = _md(f"{r.student}/{r.lab}")
        attention += [f"- {who}: **disagreement**: {_md(d, 500)}" for d in r.disagreements]
        attention += [f"- {who}: **flag** (not on the student's page: yours to decide): {_md(f, 500)}"
                      for f in r.flags]
        # what the grader noticed about the run itself (a GPU other programs kept busy, a notebook nbgrader could
        # not finish, which of two notebooks was graded), as in the student's feedback; flattened and cut, as a
        # note may end with nbgrader's output: text the student's run printed
        attention += [f"- {who}: note: {_md(n, 300)}" for n in r.notes]
        attention += [f"- {who}: {_md(c.status)} in {_md(t)}: "
                      f"{_md(c.message.splitlines()[0], 200) if c.message else ''}"
                      for t, c in r.cells.items() if c.status in ("crashed", "timed out")]
        # a test a wall-clock limit stopped (a busy machine, or a hang) was run again alone before it could score 0
        attention += [f"- {who}: {_md(t)} ran past a wall-clock limit and was **run again alone**: "
                      f"{_md(c.get('retry').get('retry', 'not run'), 200)} (first try: "
                      f"{_md(c.get('retry').get('first_try', ''), 200)})"
                      for t, c in r.cells.items() if isinstance(c.get("retry"), dict) and c.get("retry")]
    attention += [f"- {_md(p.student or '?')}{'/' + _md(p.lab) if p.lab else ''}: **not graded**: "
                  f"{_md(p.where, 300)}: {_md(p.message, 500)}" for p in class_result.problems]
    attention += [f"- {_md(student)}/{_md(lab)}: feedback: {_md(problem, 300)}"
                  for student, lab, problem in getattr(class_result, "feedback_problems", [])]
    lines += ["## To look at", ""] + (attention or ["Nothing."]) + [""]
    lines += _throughput(class_result)
    return "\n".join(lines)


def _relative_link(page, out) -> str:
    """A feedback page as a link from the report (both in the course folder), each part URL-quoted."""
    try:
        relative = Path(page).resolve().relative_to(Path(out).resolve())
    except (ValueError, OSError, TypeError):
        return ""
    return "/".join(urllib.parse.quote(printable(part)) for part in relative.parts)


def median_steps(results) -> dict:
    """Per lab, the median seconds of each step of a submission: the clean recheck's cells and process starts
    (``clean_timeline``), the phases of its speed tests (``speed: …``), nbgrader's phases, and both runs' totals."""
    import statistics
    by_lab = {}
    for r in _typed(results):
        steps = by_lab.setdefault(r.lab, {})
        speed_phases = {}
        for cell in r.cells.values():
            for record in cell.speed or []:
                for label, seconds in (record.get("phases") or {}).items() if isinstance(record, dict) else ():
                    if isinstance(seconds, (int, float)):
                        speed_phases[f"speed: {label}"] = speed_phases.get(f"speed: {label}", 0.0) + seconds
        notebook_run = {f"nbgrader {k}": v for k, v in (r.nbgrader_phases or {}).items()}
        if r.nbgrader_seconds is not None:  # nbgrader's run (--notebook-run)
            notebook_run["nbgrader total"] = r.nbgrader_seconds
        for label, seconds in {**(r.clean_timeline or {}), **speed_phases, **notebook_run,
                               "clean total": r.clean_seconds or 0.0}.items():
            steps.setdefault(label, []).append(seconds)
    return {lab: {label: round(statistics.median(v), 2) for label, v in steps.items()} for lab, steps in by_lab.items()}


def _throughput(class_result) -> list:
    """The report's throughput section: the class's pace, each submission's time, and where it goes."""
    results = _typed(class_result.results)
    seconds = [r.seconds for r in results if r.seconds]
    if not seconds:
        return []
    lines = ["## Throughput", ""]
    phase = class_result.phase_seconds.get("submissions")
    if class_result.graded_now and phase:
        lines.append(f"This run graded {class_result.graded_now} submission(s) in {phase:.0f} s, "
                     f"{phase / class_result.graded_now:.1f} s per submission, "
                     f"{len(class_result.workers)} at a time ({schedule.describe(class_result.workers)}).")
    notebook_runs = any(r.nbgrader_seconds is not None for r in results)
    lines += [f"Each submission took {sum(seconds) / len(seconds):.1f} s on average (slowest {max(seconds):.0f} s)" +
              (", its nbgrader run beside its clean recheck from the recheck's speed tests on." if notebook_runs
               else ": its clean recheck (no nbgrader run of the notebook: `--notebook-run`)."), "",
              "| lab | clean recheck | its slowest steps | nbgrader run | nbgrader + kernel start |",
              "| --- | --- | --- | --- | --- |"]

    def seconds_of(value):
        return f"{value:.1f} s" if value is not None else "-"
    for lab, steps in sorted(median_steps(results).items()):
        cells = {k: v for k, v in steps.items() if not k.startswith(("nbgrader", "speed: ")) and k != "clean total"}
        slowest = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(cells.items(), key=lambda kv: -kv[1])[:3])
        lines.append(f"| {lab} | {steps['clean total']:.1f} s | {slowest} | {seconds_of(steps.get('nbgrader total'))} "
                     f"| {seconds_of(steps.get('nbgrader start'))} |")
    more = ("`--cpu-workers`" if None in class_result.workers else
            "`--jobs-per-gpu`; each graded timing still has the GPU to itself")
    return lines + ["", f"Medians per lab. More submissions at a time raise the pace while the CPU cores and "
                    f"memory have room ({more}).", ""]


def write_report(class_result, out: Path) -> Path:
    out = Path(out)
    standings = getattr(class_result, "standings", None)
    results = [s.result for s in standings if s.result is not None] if standings else _typed(class_result.results)
    for lab in sorted({r.lab for r in results}):
        _figures(results, lab, out)
    # any text from a submission (a file name's undecodable bytes, a note) is written as escapes, never a crash
    text = printable(markdown(class_result))
    (out / "report.md").write_text(text, encoding="utf-8", errors="backslashreplace")
    try:
        import mistune
        body = mistune.create_markdown(plugins=["table"])(text)
    except Exception:  # noqa: BLE001 - an old mistune: plain text is still a report
        body = f"<pre>{html.escape(text)}</pre>"
    page = ("<!doctype html><meta charset='utf-8'><title>fuselab grading report</title>"
            "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}"
            "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}"
            "</style>" + body)
    (out / "report.html").write_text(page, encoding="utf-8", errors="backslashreplace")
    return out / "report.md"
