"""The class's grades and report: ``grades.csv``, ``report.md`` / ``report.html`` with figures.

grades.csv has one row per student of the course (``term.standings``: every student any run met or the roster
lists): per lab the total (after nbgrader's late penalty), its status (graded, "not graded: why", "missing"),
whether it was late, the late penalty and when it was handed in, every test's points and every measured speedup. The report shows, per lab, the score distribution,
the speedups against the policy's threshold, the tests failed most often, a row per student with the reason for
lost points (or for no grade) and a link to their feedback page, and everything a teaching assistant must look
at: flagged tampering (never shown to the student: the TA decides), crashes and timeouts, malformed submissions.
"""

from __future__ import annotations

import csv
import datetime
import re
import urllib.parse
from pathlib import Path

from ..gpus import schedule
from ..records import term
from ..records.handgrading import hand_graded, totals
from ..records.intake import printable
from ..records.nbgrader_run import SET_ASIDE
from ..records.results import SubmissionResult
from .feedback import reference_runs, shown_flags, telling_line
from .terminal import shown, spreadsheet_cell


def _md(text, limit: int | None = None) -> str:
    """Any text (a student's folder name, a flag, a path) as one line of markdown that shows as written: bytes
    that are not UTF-8 as ``\\xNN``, controls, escape sequences and bidirectional overrides as their escapes
    (``terminal.shown``: a report shown with ``cat`` or in a browser is not rewritten), markdown's and HTML's
    punctuation (tables' ``|`` too) backslashed."""
    text = shown(" ".join(printable(text).split()))
    if limit is not None and len(text) > limit:
        text = text[:limit] + "…"
    return _md_punctuation(text)


def _md_punctuation(text: str) -> str:
    # ``_`` stays: student ids are full of it, and at worst it italicises a word
    return re.sub(r"([\\`*\[\]!|~<>&])", r"\\\1", text)


def _typed(results) -> list:
    return [SubmissionResult.of(r) for r in results]


def _graded_standings(results) -> list:
    return [term.Standing(r.student, r.lab, term.GRADED, result=r) for r in _typed(results)]


def _load_loss(retry: dict) -> str:
    """What a retried test's first try ran into, in the report's words."""
    from ..recheck.clean import GPU_MEMORY_RAN_OUT
    return "ran out of the shared GPU's memory" if retry.get("first_try") == GPU_MEMORY_RAN_OUT else \
        "ran past a wall-clock limit"


def status_text(standing, limit: int | None = 300) -> str:
    """grades.csv's and the report's word for a standing: graded, "not graded: why", missing. A reason longer
    than ``limit`` is cut, saying where it is whole (the report's "Why not graded" list)."""
    if standing.status == term.GRADED:
        return "graded"
    if standing.status == term.MISSING:
        return "missing"
    why = " ".join(printable(standing.why).split())
    if limit is not None and len(why) > limit:
        why = why[:limit] + "… (the whole reason: report.html, \"Why not graded\")"
    return f"not graded: {why}"


def lost_points(result) -> str:
    """Why a graded submission lost points, one short line: each test short of full points and its reason."""
    reasons: dict = {}  # one reason, the tests it cost (a build error costs every test that needed it)
    for grade_id, cell in result.cells.items():
        if cell.points < cell.max_points:
            line = telling_line(cell.message or "")
            reason = f"{cell.status}" + (f" ({_cut(line, 160)})" if line else "")
            reasons.setdefault(reason, []).append(grade_id)
    return "; ".join(f"{', '.join(tests)}: {reason}" for reason, tests in reasons.items())


def write_grades_csv(results: list, path: Path, standings: list | None = None,
                     gradebook_db: Path | None = None) -> Path:
    """One row per student: ``standings`` (``term.standings``, the whole course), else ``results`` alone. Each
    lab's maximum is ``lab_maxima``'s (the course gradebook beside ``path``, ``course/gradebook.db``, unless
    ``gradebook_db`` says where), the same on every row: graded, not graded or missing."""
    results = _typed(results)
    gradebook_db = gradebook_db or Path(path).parent / "course" / "gradebook.db"
    standings = _graded_standings(results) if standings is None else standings
    labs = sorted({s.lab for s in standings if s.lab != term.UNKNOWN_LAB})
    tests = {lab: list(next((r for r in results if r.lab == lab), SubmissionResult("", lab)).cells) for lab in labs}
    known = lab_maxima(results, gradebook_db)
    maxima = {lab: known.get(lab) for lab in labs}
    hand = {lab: sorted({g for r in results if r.lab == lab for g in hand_graded(r)}) for lab in labs}
    speed_tests = {lab: [t for t in tests[lab] if any(t in c.cells and c.cells[t].speed for c in results
                                                      if c.lab == lab)] for lab in labs}
    header = ["student", "name", "lms id"]
    for lab in labs:
        header += [f"{lab} total", f"{lab} max", f"{lab} status", f"{lab} late", f"{lab} late penalty",
                   f"{lab} submitted"] + \
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
        if standing.result is None:  # its lab's maximum, as a graded row's: the points it did not get
            row[f"{lab} max"] = f"{maxima[lab]:g}" if maxima[lab] is not None else ""
            row["max"] += maxima[lab] or 0.0
            if standing.status == term.MISSING:
                row[f"{lab} total"] = "0"
            else:  # not graded: its points are not known, so neither is the student's total (blank, as the lab's)
                row["pending"] = True
    for r in results:
        row = rows.setdefault(r.student, {"student": r.student, "total": 0.0, "max": 0.0, "flags": 0})
        row.setdefault(f"{r.lab} status", "graded")
        total, _ = totals(r)  # with the written answers graded by hand
        maximum = maxima.get(r.lab)
        maximum = totals(r)[1] if maximum is None else maximum
        row[f"{r.lab} total"] = f"{total:g}"  # after the late penalty, its own column
        row[f"{r.lab} late penalty"] = f"{r.late_penalty:g}" if r.late_penalty else ""
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
            row["total"] = "" if row.pop("pending", False) else f"{row['total']:g}"
            row["max"] = f"{row['max']:g}"
            # a folder name's escape sequence or right-to-left override never reaches a terminal or a spreadsheet
            writer.writerow({key: spreadsheet_cell(shown(value)) if isinstance(value, str) else value
                             for key, value in row.items()})
    return path


def score_points(results, lab, maxima: dict) -> tuple:
    """The score histogram's data: each submission's points with the written answers graded so far, and where
    its axis ends, the lab's maximum as grades.csv shows it (``lab_maxima``: the tests and the written answers)."""
    mine = [r for r in results if r.lab == lab]
    maximum = maxima.get(lab) or max(totals(r)[1] for r in mine) or 1
    return [totals(r)[0] for r in mine], maximum


def _figures(results, lab, folder: Path, maxima: dict) -> list:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    mine = [r for r in results if r.lab == lab]
    made = []
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
    scores, maximum = score_points(results, lab, maxima)
    axes[0].hist(scores, bins=min(20, max(5, len(mine))), range=(0, maximum), color="#4c72b0")
    axes[0].set_xlabel(f"points of {maximum:g} (written answers as graded so far)")
    axes[0].set_ylabel("students"); axes[0].set_title(f"{lab}: score distribution")
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


def _gpu_line(results) -> list:
    gpus = sorted({s.get("gpu") for r in results for c in r.cells.values() for s in c.speed if s.get("gpu")})
    notes = sorted({s.get("policy_note") for r in results for c in r.cells.values() for s in c.speed
                    if s.get("policy_note")})
    if not gpus:
        return [_t("No GPU: correctness was graded through the CPU emulation; speed tests are "),
                _b("not measured (no GPU)"), _t(" and score 0.")]
    line = f"Speedups measured on {', '.join(gpus)}."
    if notes:
        line += " " + " ".join(notes)
    return [_t(line)]


# A line of the report is a list of parts, each ("text" | "bold" | "em" | "code", text) or ("link", text, href):
# the templates (templates/report.md.j2, report.html.j2) say how each looks; the text in them is escaped there
def _t(text) -> tuple:
    return ("text", text)


def _b(text) -> tuple:
    return ("bold", text)


def _cut(text, limit: int) -> str:
    """``text`` as one line, cut at ``limit`` characters with "…" (the templates escape it, this only shortens)."""
    text = " ".join(printable(text).split())
    return text[:limit] + "…" if len(text) > limit else text


def lab_maxima(results, gradebook_db: Path | None = None) -> dict:
    """Each lab's maximum, the one grades.csv, the report and ``fuselab export`` all show: nbgrader's (its
    assignment's maximum: the tests and the written answers) where the course gradebook has the lab, else the
    largest a graded result of it counts (``handgrading.totals``)."""
    maxima: dict = {}
    for r in _typed(results):
        maxima[r.lab] = max(maxima.get(r.lab, 0.0), totals(r)[1])
    if gradebook_db is not None and Path(gradebook_db).is_file():
        from nbgrader.api import Gradebook
        with Gradebook(f"sqlite:///{gradebook_db}") as gradebook:
            for assignment in gradebook.assignments:
                if assignment.max_score:
                    maxima[assignment.name] = float(assignment.max_score)
    return maxima


def _gradebook_of(out) -> Path | None:
    return Path(out) / "course" / "gradebook.db" if out is not None else None


def view(class_result) -> dict:
    """What the report says, as data for its templates: the summary, what the TA must look at (first), the
    instructor's reference runs, a table per lab, the whole reasons a submission was not graded, throughput."""
    standings = getattr(class_result, "standings", None) or _graded_standings(class_result.results)
    results = [s.result for s in standings if s.result is not None]
    maxima = lab_maxima(results, _gradebook_of(class_result.out))
    counted = {status: sum(1 for s in standings if s.status == status)
               for status in (term.GRADED, term.NOT_GRADED, term.MISSING)}
    summary = (f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {len(results)} submission(s), "
               f"{len({s.student for s in standings})} student(s); of each student's labs, "
               f"{counted[term.GRADED]} graded, {counted[term.NOT_GRADED]} not graded, {counted[term.MISSING]} missing."
               + (f" This run graded {class_result.graded_now} of them." if class_result.graded_now else ""))
    # every reason a submission was not graded, whole, below the tables; the table and the list link to it
    reasons, anchors = [], {}
    for s in standings:
        if s.status == term.NOT_GRADED:
            anchors[(s.student, s.lab)] = f"why-{len(reasons) + 1}"
            reasons.append({"anchor": anchors[(s.student, s.lab)],
                            "who": f"{s.student}/{s.lab}" if s.lab != term.UNKNOWN_LAB else s.student,
                            "lines": printable(s.why).splitlines() or [""]})

    def whole(student, lab) -> list:
        anchor = anchors.get((student, lab))
        if anchor is None and not lab:  # a problem of no lab: the one entry the course gave it, if one
            of_theirs = [a for (who, _), a in anchors.items() if who == student]
            anchor = of_theirs[0] if len(of_theirs) == 1 else None
        return [_t(" ("), ("link", "the whole reason", f"#{anchor}"), _t(")")] if anchor else []

    reference = []
    for lab, ref in sorted(_references(class_result, standings).items()):
        total = sum(c["points"] for c in ref["cells"].values())
        maximum = sum(c["max_points"] for c in ref["cells"].values())
        state = [_b("BROKEN: " + ", ".join(ref["broken"]) + " failed — fix the machine before trusting grades")] \
            if ref["broken"] else [_t("all correctness tests pass")]
        reference.append([_t(f"{lab}: {total:g} / {maximum:g} (")] + state + [_t(")")])
    pages = getattr(class_result, "feedback", None) or {}
    labs = []
    for lab in sorted({s.lab for s in standings if s.lab != term.UNKNOWN_LAB}):
        mine = [s for s in standings if s.lab == lab]
        graded = [s.result for s in mine if s.result is not None]
        tests = list(graded[0].cells) if graded else []
        maximum = f"{maxima[lab]:g}" if lab in maxima else "?"
        rows = []
        for standing in mine:
            r = standing.result
            late = [_t("late" + (f" ({standing.submitted})" if standing.submitted else ""))] if standing.late else []
            if r is None:
                total = "0" if standing.status == term.MISSING else "-"
                rows.append({"student": standing.student, "cells": [[_t("-")] for _ in tests],
                             "total": [_t(f"{total} / {maximum}")], "late": late, "penalty": [],
                             "reason": [_t(_cut(status_text(standing, limit=None), 300))] +
                             whole(standing.student, lab), "feedback": [], "time": []})
                continue
            cells = []
            for t in tests:
                c = r.cells.get(t)
                if c is None:
                    cells.append([_t("-")])
                    continue
                measured = c.measured_speedup()
                cell = [_t(f"{c.points:g}" + (f" ({measured['speedup']:.2f}x)" if measured else ""))]
                if c.by_hand:  # a teaching assistant's score in formgrader: the grader's status is not its
                    cell += [_t(" "), ("em", f"by a TA (grader: {_number(c.by_hand.get('grader')):g})")]
                elif c.status not in ("passed",):
                    cell += [_t(" "), ("em", c.status)]
                cells.append(cell)
            page = pages.get(lab, {}).get(r.student)
            link = _relative_link(page, class_result.out) if page else ""
            total, _ = totals(r)  # with the written answers graded by hand
            rows.append({"student": r.student, "cells": cells, "total": [_b(f"{total:g}"), _t(f" / {maximum}")],
                         "penalty": [_t(f"-{r.late_penalty:g}")] if r.late_penalty else [],
                         "late": late, "reason": [_t(_cut(lost_points(r), 400))],
                         "feedback": [("link", "page", link)] if link else [], "time": [_t(f"{r.seconds or 0:.0f} s")]})
        labs.append({"name": lab, "figure": f"{lab}-figures.png" if graded else None, "tests": tests,
                     "maximum": maximum, "rows": rows, "penalties": any(r.late_penalty for r in graded)})
    unknown = [[_t(f"{s.student}: {_cut(status_text(s, limit=None), 500)}")] + whole(s.student, s.lab)
               for s in standings if s.lab == term.UNKNOWN_LAB]
    return {"summary": summary, "gpu": _gpu_line(results), "attention": _attention(class_result, standings, whole),
            "reference": reference, "labs": labs, "unknown": unknown, "reasons": reasons,
            "throughput": _throughput(class_result)}


def _references(class_result, standings) -> dict:
    """lab → the instructor's reference run: this run's, and for the course's other labs the one kept in its
    folder (``reference/<lab>/reference.json``), so that a week's report still says how lab 0's went."""
    found = dict(class_result.reference or {})
    out = getattr(class_result, "out", None)
    others = sorted({s.lab for s in standings if s.lab != term.UNKNOWN_LAB} - set(found))
    for lab, saved in (reference_runs(out, others) if out is not None else {}).items():
        cells, broken = saved.get("cells"), saved.get("broken")
        if (isinstance(cells, dict) and isinstance(broken, list) and all(isinstance(b, str) for b in broken)
                and all(isinstance(c, dict) and isinstance(c.get("points"), (int, float))
                        and isinstance(c.get("max_points"), (int, float)) for c in cells.values())):
            found[lab] = saved
    return found


def _attention(class_result, standings, whole) -> list:
    """Everything a TA must look at, for the top of the report: flags (never on the student's
    page: the TA decides), the grader's notes, crashes and timeouts, tests run again alone, what could not be
    graded (this run's problems, and the course's entries an earlier run could not grade), feedback problems."""
    attention = []
    out = getattr(class_result, "out", None)
    shown_to_student = shown_flags(out) if out is not None else set()  # flags-shown.txt: the TA decided
    for r in [s.result for s in standings if s.result is not None]:
        who = f"{r.student}/{r.lab}: "
        where = ("on the student's page: flags-shown.txt names them" if (r.student, r.lab) in shown_to_student
                 else "not on the student's page: yours to decide")
        attention += [[_t(who), _b("flag"), _t(f" ({where}): {_cut(f, 500)}")] for f in r.flags]
        # what the grader noticed about the run itself (a GPU other programs kept busy, which of two notebooks was
        # graded); flattened and cut
        attention += [[_t(f"{who}note: {_cut(n, 300)}")] for n in r.notes]
        attention += [[_t(f"{who}{c.status} in {t}: " + (_cut(c.message.splitlines()[0], 200) if c.message else ""))]
                      for t, c in r.cells.items() if c.status in ("crashed", "timed out")]
        # a test that may have lost to the load (a wall-clock limit stopped it, or the shared GPU's memory ran out)
        # was run again alone before it could score 0; its first try says which
        attention += [[_t(f"{who}{t} {_load_loss(c.retry)} and was "), _b("run again alone"),
                       _t(f": {_cut(c.retry.get('retry', 'not run'), 200)} (first try: "
                          f"{_cut(c.retry.get('first_try', ''), 200)})")]
                      for t, c in r.cells.items() if isinstance(c.retry, dict) and c.retry]
    this_run = set()
    for p in class_result.problems:
        this_run.add((p.student, p.lab or ""))
        attention.append([_t(f"{p.student or '?'}{'/' + p.lab if p.lab else ''}: "),
                          _b("note" if p.note else "not graded"),
                          _t(f": {_cut(p.where, 300)}: {_cut(p.message, 500)}")] + whole(p.student, p.lab or ""))
    for s in standings:  # what an earlier run of the term could not grade: still to look at
        if s.status == term.NOT_GRADED and (s.student, s.lab) not in this_run and (s.student, "") not in this_run:
            attention.append([_t(f"{s.student}{'/' + s.lab if s.lab else ''}: "), _b("not graded"),
                              _t(f" (an earlier run): {_cut(s.why, 300)}")] + whole(s.student, s.lab))
    attention += [[_t(f"{student}/{lab}: feedback: {_cut(problem, 300)}")]
                  for student, lab, problem in getattr(class_result, "feedback_problems", [])]
    # a hand grade given on an earlier upload that a newer one made stale, until a person grades the cell again:
    # out of the gradebook, kept in the course folder's record of them (``nbgrader_run.SET_ASIDE``)
    attention += [[_t(f"{a.student}/{a.lab}: "), _b("hand grade set aside"),
                   _t(f": {a.cell}: {'' if a.points is None else f'{a.points:g} points'}"
                      f"{', ' if a.points is not None and a.comment else ''}"
                      f"{f'comment {_cut(a.comment, 200)!r}' if a.comment else ''} given on an earlier upload; "
                      f"{a.why}. Grade it again in formgrader (for a test whose new score stands, enter that "
                      f"score): said here until you do (kept in course/{SET_ASIDE})")]
                  for a in getattr(class_result, "hand_grades_set_aside", [])]
    return attention + _not_on_the_roster(standings) + _left_the_roster(standings) + to_grade_by_hand(standings)


def _not_on_the_roster(standings) -> list:
    """One line for the students a kept roster does not list (someone who joined after its download): graded as
    any other, but without a name, and the LMS may not take their row."""
    if not any(s.person for s in standings):  # no roster given
        return []
    strangers = sorted({s.student for s in standings if not s.person and s.status != term.MISSING
                        and not s.student.startswith(term.NOBODY)})
    if not strangers:
        return []
    return [[_b("not on the roster"), _t(f": {len(strangers)} student(s) graded whom the kept roster does not list "
                                         f"({_first_five(strangers)}): download the LMS's grade export again and give it as "
                                         "--roster on the next run (docs/ta-guide.md)")]]


def _left_the_roster(standings) -> list:
    """One line for the students an earlier roster listed and the last one given does not (they dropped the
    course): their graded labs stay in every output, and no later lab counts them "missing" (0)."""
    left = sorted({s.student for s in standings if s.person.get("left")})
    if not left:
        return []
    return [[_b("left the roster"), _t(f": {len(left)} student(s) an earlier --roster listed and the last one does "
                                       f"not ({_first_five(left)}): their graded labs stay; no later lab counts them missing. "
                                       "Back on a later roster, they are counted again")]]


def _first_five(names: list) -> str:
    """``names`` (sorted) as a line of To look at names them: the first five, then how many more."""
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def to_grade_by_hand(standings) -> list:
    """One line per lab whose written answers wait for a person (formgrader): how many submissions, who first."""
    waiting: dict = {}
    for r in [s.result for s in standings if s.result is not None]:
        if any(h.get("points") is None for h in hand_graded(r).values()):
            waiting.setdefault(r.lab, []).append(r.student)
    lines = []
    for lab, students in sorted(waiting.items()):
        lines.append([_t(f"{lab}: "), _b("to grade by hand"),
                      _t(f": written answers of {len(students)} submission(s) still to be graded in formgrader "
                         f"(docs/ta-guide.md): {_first_five(sorted(students))}")])
    return lines


def _environment(kind: str):
    """The templates' Jinja2 environment. Every value a template shows is escaped for its format on the way out
    (``finalize``), whatever it holds: made one printable line first (``terminal.shown``: no control, escape
    sequence or bidirectional override), then HTML-escaped (report.html, Jinja2's autoescaping) or given
    markdown's backslashes (report.md, ``_md``). What the templates build from parts (their macros) is not
    escaped twice."""
    import jinja2
    from markupsafe import Markup

    def one_line(value):
        if isinstance(value, Markup):
            return value
        text = shown(re.sub(r"\s+", " ", printable(value)))  # one line; its spaces at either end stay
        return Markup(_md_punctuation(text)) if kind == "md" else text

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True, finalize=one_line,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                              undefined=jinja2.StrictUndefined)


TEMPLATES = Path(__file__).parent / "templates"


def render(class_result, kind: str) -> str:
    """The report as markdown (``kind`` "md") or a page of HTML ("html")."""
    template = _environment(kind).get_template(f"report.{kind}.j2")
    return template.render(report=view(class_result), line=shown)


def markdown(class_result) -> str:
    return render(class_result, "md")


def _relative_link(page, out) -> str:
    """A feedback page as a link from the report (both in the course folder), each part URL-quoted."""
    try:
        relative = Path(page).resolve().relative_to(Path(out).resolve())
    except (ValueError, OSError, TypeError):
        return ""
    return "/".join(urllib.parse.quote(printable(part)) for part in relative.parts)


def median_steps(results) -> dict:
    """Per lab, the median seconds of each step of a submission: the clean recheck's cells and process starts
    (``clean_timeline``), the phases of its speed tests (``speed: …``), and the recheck's total."""
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
        for label, seconds in {**(r.clean_timeline or {}), **speed_phases,
                               "clean total": r.clean_seconds or 0.0}.items():
            steps.setdefault(label, []).append(seconds)
    return {lab: {label: round(statistics.median(v), 2) for label, v in steps.items()} for lab, steps in by_lab.items()}


def _throughput(class_result) -> dict | None:
    """The report's throughput section: the class's pace, each submission's time, and where it goes."""
    results = _typed(class_result.results)
    seconds = [r.seconds for r in results if r.seconds]
    if not seconds:
        return None
    before = []
    phase = class_result.phase_seconds.get("submissions")
    if class_result.graded_now and phase:
        before.append([_t(f"This run graded {class_result.graded_now} submission(s) in {phase:.0f} s, "
                          f"{phase / class_result.graded_now:.1f} s per submission, "
                          f"{len(class_result.workers)} at a time ({schedule.describe(class_result.workers)}).")])
    before.append([_t(f"Each submission took {sum(seconds) / len(seconds):.1f} s on average (slowest "
                      f"{max(seconds):.0f} s): its clean recheck.")])
    rows = []
    for lab, steps in sorted(median_steps(results).items()):
        cells = {k: v for k, v in steps.items() if not k.startswith("speed: ") and k != "clean total"}
        slowest = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(cells.items(), key=lambda kv: -kv[1])[:3])
        rows.append([lab, f"{steps['clean total']:.1f} s", slowest])
    more = [("code", "--cpu-workers")] if None in class_result.workers else \
        [("code", "--jobs-per-gpu"), _t("; each graded timing still has the GPU to itself")]
    after = [_t("Medians per lab. More submissions at a time raise the pace while the CPU cores and memory have "
                "room (")] + more + [_t(").")]
    return {"before": before, "header": ["lab", "clean recheck", "its slowest steps"], "rows": rows, "after": after}


def write_report(class_result, out: Path) -> Path:
    """``report.md`` and ``report.html`` (templates/report.*.j2) and each lab's figures, in ``out``."""
    out = Path(out)
    standings = getattr(class_result, "standings", None)
    results = [s.result for s in standings if s.result is not None] if standings else _typed(class_result.results)
    maxima = lab_maxima(results, _gradebook_of(class_result.out))
    for lab in sorted({r.lab for r in results}):
        _figures(results, lab, out, maxima)
    # any text from a submission (a file name's undecodable bytes, a note) is written as escapes, never a crash
    (out / "report.md").write_text(render(class_result, "md"), encoding="utf-8", errors="backslashreplace")
    (out / "report.html").write_text(render(class_result, "html"), encoding="utf-8", errors="backslashreplace")
    return out / "report.md"
