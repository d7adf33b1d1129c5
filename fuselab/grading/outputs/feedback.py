"""Per-student feedback: one HTML page per submission, built only from what the student may see.

The page has three sources, and nothing else reaches it:

1. the student's **own submitted notebook**: their cells with the outputs they themselves submitted. Cells the
   lab provides (tests, setup, anything not a solution cell) are shown as the lab's **release** version
   (``labs/<lab>/<lab>.ipynb``, which ``nbgrader generate_assignment`` wrote without the hidden tests), whatever
   the submission holds in their place;
2. the **grader's verdicts** (``result.json``, from the clean recheck): points, status, a bounded message, the
   speed records' numbers, the flags and notes of that submission, and the written answers' scores and comments
   a teaching assistant entered in formgrader;
3. the grader's own **reference run** of the lab's solution in the same grading run (``reference/<lab>/
   reference.json``, written before any student's code ran): the plain and tuned solutions' speedups and the copy
   bandwidth measured on that GPU. With the speed record's numbers they draw each measured speed test as a picture
   (PNG, ``plots.plot_standing``): the student's kernel beside the lab's unfused reference, the plain and tuned
   solutions, the threshold for full marks and the floor (the op's fewest bytes, ``labs/floors.py``, at that copy bandwidth). The
   picture is drawn from numbers alone; a speed test not measured (no GPU) says so instead.

The page is rendered by ``templates/feedback.html`` (Jinja2, autoescaping on): the code here gathers text and
numbers, and the template escapes every one of them.

Nothing printed while the grader ran the student's code (the workers' output, the clean recheck's stdout) is
read. That is what keeps the hidden tests and the grading machine's files and
environment out of the page: a cell that prints IPython's ``In`` history, or a launcher that reads
``solutions/``, runs only in the grader's runs, whose output the page never sees. The one text of a run that
does reach the page is a failed test's message (an exception's type and message, which may quote the student's
own values): it is cut short, and lines of it that quote a hidden test or a value of the grader's environment
are replaced, as a second line of defence.

Flags (what looks like tampering) are the teaching assistant's: they are in the report, and on the page only once a
TA decides they should be (``student/lab`` in ``flags-shown.txt`` of the course folder, ``shown_flags``); then
each is said next to the test it concerns (a flag on a solution cell next to the tests that use what that cell
defines). Notes (what the grader noticed about the run itself) are always said. A notebook that cannot be read or
rendered (not JSON, not UTF-8, any JSON shape, huge outputs) still gets a page with the verdicts and a line saying
what could not be shown; building feedback never raises.

nbgrader's own feedback (``generate_feedback``, formgrader's *Generate feedback*) renders the copy in
``course/autograded/``: the notebook as submitted, its hidden tests cut (``nbgrader_run.record``).
"""

from __future__ import annotations

import ast
import base64
import binascii
import functools
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ... import config, course
from ... import notebook as ipynb
from ..records.results import SubmissionResult
from ..sandbox import untrusted

MAX_NOTEBOOK_BYTES = 64 * 2**20     # a lab notebook with its outputs is a few MB
MAX_PAGE_BYTES = 4 * MAX_NOTEBOOK_BYTES  # a page holds the notebook's outputs and the grader's pictures
MAX_SOURCE_CHARS = 20_000           # per cell
MAX_OUTPUT_CHARS = 10_000           # per cell, all its text outputs together
MAX_IMAGE_BYTES = 2 * 2**20         # per image (base64)
MAX_PAGE_CHARS = 8 * 2**20          # the notebook part of a page; past it, cells are counted, not shown
MAX_MESSAGE_CHARS = 600             # a verdict's message
MAX_NOTE_CHARS = 400                # a flag or note
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

STATUS_WORDS = {
    "passed": "passed",
    "partial": "partly passed",
    "failed": "failed: the test raised an error (or wrote to stderr) with your code",
    "crashed": "crashed: the test's process died (for example an illegal memory access or a segfault in your "
               "kernel); the later tests ran in a fresh process",
    "timed out": "timed out: the test ran past its time limit (a kernel that never ends, or one far too slow)",
    "not run": "not run: something earlier stopped the notebook before this test",
    "not measured (no GPU)": "not measured: the grading machine has no GPU, so speed could not be measured "
                             "and scores 0 here",
}
HOW_GRADED = ("The grader does not run your notebook as it is. It takes what your solution cells define "
              "(functions, classes, constants such as kernel sources, imports of computing modules) and runs "
              "the lab's tests, hidden tests included, on them in a clean copy of the lab's notebook. Other code "
              "in a solution cell (prints, experiments) is left out; the points below come from that run.")


@dataclass
class LabSources:
    """What the grader knows of one lab, read from the repository before any student code runs."""
    release: dict = field(default_factory=dict)        # grade_id → the release notebook's cell
    uses: dict = field(default_factory=dict)           # test grade_id → solution cells whose names it uses
    hidden_lines: frozenset = frozenset()              # lines of the hidden tests (for the message check)
    problem: str = ""                                  # why the release notebook could not be read


# ---------------------------------------------------------------------------------------------- reading


_text = ipynb.text   # a notebook field as text, whatever the notebook's shape


def clean_text(text, limit: int) -> str:
    """Printable text of at most ``limit`` characters: no lone surrogates, no control characters, no ANSI."""
    text = text if isinstance(text, str) else str(text)
    if len(text) > 4 * limit:
        text = text[: 4 * limit]
    if _has_surrogates(text):
        text = text.encode("utf-8", "replace").decode("utf-8")
    text = _CONTROL.sub("", _ANSI.sub("", text))
    if len(text) > limit:
        text = text[:limit] + f"\n… ({len(text) - limit:,}+ more characters not shown)"
    return text


_COMPILER_ERROR = re.compile(r":\d+(?::\d+)?:\s*(?:fatal )?error\b")  # file:line:col: error: ...


def telling_line(message: str) -> str:
    """The line of a test's message that says why: a compiler's own error (``file:line:col: error: ...``), never
    the caret or source line under it; else the headline, the message's first line with words (``Type: what
    failed``), followed, where more follows, by what the message says next up to its next blank line (a check's
    first failing case, or the pattern its cases show), as one line: a test of many cases says what failed and
    its first failing case, not whichever case came last. A Python traceback's headline is its exception's line,
    the first one after its last frame."""
    lines = message.strip().splitlines()
    compiler = next((line.strip() for line in lines if _COMPILER_ERROR.search(line)), None)
    if compiler:
        return compiler
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if starts:  # the frames are indented; the exception's own text is not
        lines = lines[starts[-1] + 1:]
        lines = lines[next((i for i, line in enumerate(lines) if line.strip() and not line[:1].isspace()), 0):]
    worded = [i for i, line in enumerate(lines) if _worded(line)]
    if not worded:
        return next((line.strip() for line in lines if line.strip()), "")
    headline, rest = lines[worded[0]].strip(), lines[worded[0] + 1:]
    rest = rest[next((i for i, line in enumerate(rest) if _worded(line)), len(rest)):]
    detail = " ".join(line.strip() for line in rest[:next((i for i, line in enumerate(rest) if not line.strip()),
                                                          len(rest))] if _worded(line))
    return f"{headline} {_DETAIL} {detail}" if detail else headline


_DETAIL = "—"  # between a headline and what the message says after it


def _worded(line: str) -> bool:
    """A line with words, not a compiler's source line (``  4 |  code``) or caret line."""
    return bool(re.search(r"[A-Za-z]{2}", line)) and not re.match(r"^\s*\d*\s*\|", line)


def short_reason(message: str, limit: int) -> str:
    """A test's message in one line of at most ``limit`` characters for the page's table: the whole message where
    it fits, else, for a build that failed, the compiler's own error on the student's line (the whole message is
    at the test, below), so that a cut never stops before it."""
    flat = " ".join(message.split())
    line = telling_line(message)
    if len(flat) > limit and _COMPILER_ERROR.search(line):
        return _flat(line, limit) + " (the whole message: at the test, below)"
    return _flat(message, limit)


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _flat(text, limit: int) -> str:
    return clean_text(" ".join(str(text).split()), limit)


_meta = ipynb.nbgrader


def _grade_id(cell):
    grade_id = ipynb.grade_id(cell)
    return grade_id if isinstance(grade_id, str) and grade_id else None


def load_notebook(path, expected_sha: str | None = None) -> tuple:
    """``(notebook dict or None, problem)``: the submitted notebook, or why it cannot be shown."""
    try:
        path = Path(path)
        size = path.stat().st_size
        if size > MAX_NOTEBOOK_BYTES:
            return None, f"your notebook is {size / 2**20:.0f} MB, more than this page shows " \
                         f"({MAX_NOTEBOOK_BYTES // 2**20} MB)"
        data = path.read_bytes()
    except (OSError, TypeError, ValueError) as exc:
        return None, f"your notebook could not be read ({type(exc).__name__})"
    if expected_sha and hashlib.sha256(data).hexdigest() != expected_sha:
        return None, "the notebook file changed after it was graded, so it is not shown"
    try:
        nb = json.loads(data)
    except UnicodeDecodeError:
        try:
            nb = json.loads(data.decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            return None, "your notebook is not valid JSON (and not UTF-8 text)"
    except (ValueError, RecursionError):
        return None, "your notebook is not valid JSON: Jupyter cannot open it either"
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        return None, "your notebook has no list of cells"
    return nb, ""


def _names(source: str) -> tuple:
    """``(defined, used)`` top-level names of a cell's code; ``None, None`` if it does not parse."""
    lines = [("pass" if line.lstrip().startswith(("%", "!")) else line) for line in source.splitlines()]
    try:
        tree = ast.parse("\n".join(lines))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None, None
    defined, used = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else defined).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return defined, used


def test_uses(cells: list) -> dict:
    """Test grade_id → the solution cells (grade_ids) it depends on, following names from cell to cell.

    ``FUSED_SOURCE`` (a solution cell) → ``fused_mod`` (a build cell) → ``test_fused``: a flag on the solution
    cell is shown next to the tests that use it. A test cell that does not parse depends on every solution cell
    before it.
    """
    origin: dict = {}                # name → solution cells it was computed from
    seen_solutions: list = []
    uses = {}
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        meta, grade_id = _meta(cell), _grade_id(cell)
        defined, used = _names(_text(cell.get("source")))
        if defined is None:
            depends = set(seen_solutions)
            defined = set()
        else:
            depends = set().union(*(origin.get(name, set()) for name in used))
        if meta.get("solution") and grade_id:
            depends.add(grade_id)
            seen_solutions.append(grade_id)
        for name in defined:
            origin[name] = depends
        if meta.get("grade") and grade_id:
            uses[grade_id] = sorted(depends)
    return uses


def hidden_test_lines(instructor_nb: dict) -> frozenset:
    """Every line of the instructor's ``### BEGIN HIDDEN TESTS`` blocks that is long enough to mean something."""
    lines = set()
    for cell in instructor_nb.get("cells", []) if isinstance(instructor_nb, dict) else []:
        source = _text(cell.get("source")) if isinstance(cell, dict) else ""
        for block in ipynb.hidden_test_blocks(source):
            lines |= {line.strip() for line in block.splitlines() if len(line.strip()) >= 12}
    return frozenset(lines)


def lab_sources(labs) -> dict:
    """lab → ``LabSources``, read from ``labs/`` and ``solutions/``. The grader reads them before grading any
    student, so nothing a submission does to the repository's files reaches a page."""
    sources = {}
    for lab in labs:
        found = LabSources()
        try:
            release = json.loads(next((course.LABS / lab).glob("*.ipynb")).read_text())
            cells = [c for c in release.get("cells", []) if isinstance(c, dict)]
            if any(ipynb.has_hidden_tests(_text(c.get("source"))) for c in cells):
                raise ValueError("labs/ holds hidden tests: run `fuselab release`")
            found.release = {_grade_id(c): c for c in cells if _grade_id(c)}
            found.uses = test_uses(cells)
        except (OSError, StopIteration, ValueError) as exc:
            found.problem = f"the lab's release notebook could not be read ({exc})"
        try:
            found.hidden_lines = hidden_test_lines(json.loads(next((course.SOLUTIONS / lab).glob("*.ipynb")).read_text()))
        except (OSError, StopIteration, ValueError):
            pass
        sources[lab] = found
    return sources


def written_answers(gradebook_db: Path) -> dict:
    """``{(student, lab): {grade_id: {"score", "max", "comment"}}}`` from the course gradebook (``handgrading.read``):
    what a person entered in formgrader (written answers' scores, comments on any cell), else nbgrader's own score.
    Empty if it cannot be read."""
    from ..records.handgrading import read, score
    try:
        entered = read(gradebook_db)
    except Exception:  # noqa: BLE001 - a gradebook that cannot be read leaves the written answers "to be graded"
        return {}
    return {key: {grade_id: {"max": cell["max"], "score": score(cell),
                             **({"comment": cell["comment"]} if (cell["comment"] or "").strip() else {})}
                  for grade_id, cell in cells.items()}
            for key, cells in entered.items()}


# ---------------------------------------------------------------------------------------------- verdicts


def _number(value, default=0.0) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value) -> list:
    return value if isinstance(value, list) else []


class MessageScrub:
    """Replace the lines of a run's message that quote a hidden test or a value of the grader's environment."""

    def __init__(self, hidden_lines, environ=None):
        self.hidden = [line for line in hidden_lines if line]
        environ = os.environ if environ is None else environ
        self.secrets = sorted({v for v in environ.values() if isinstance(v, str) and len(v) >= 8}, key=len,
                              reverse=True)

    def __call__(self, text: str) -> str:
        lines = []
        for line in text.splitlines():
            if "HIDDEN TESTS" in line or any(hidden in line for hidden in self.hidden):
                line = "(a line of a hidden test: not shown)"
            for secret in self.secrets:
                if secret in line:
                    line = line.replace(secret, "(the grading machine's setting: not shown)")
            lines.append(line)
        return "\n".join(lines)


def _split_prefixed(items, known: set) -> tuple:
    """``({grade_id: [text]}, [unprefixed text])`` for ``"grade_id: text"`` strings."""
    by_id, other = {}, []
    for item in _list(items):
        item = item if isinstance(item, str) else json.dumps(item, default=str)
        grade_id, sep, rest = item.partition(": ")
        if sep and grade_id in known:
            by_id.setdefault(grade_id, []).append(rest)
        else:
            other.append(item)
    return by_id, other


def _speed_line(records) -> str:
    parts = []
    for record in _list(records):
        record = _dict(record)
        speedup, threshold = record.get("speedup"), record.get("threshold")
        if isinstance(speedup, (int, float)) and not isinstance(speedup, bool):
            text = f"measured speedup {speedup:.2f}x over the lab's unfused reference"
            ci = _list(record.get("ci"))
            if len(ci) == 2 and all(isinstance(c, (int, float)) for c in ci):
                text += f" (95% interval {ci[0]:.2f}x to {ci[1]:.2f}x)"
            if isinstance(threshold, (int, float)):
                text += f"; 0 points at 1.0x, full points from {threshold:.2f}x"
            shape = record.get("shape")
            if isinstance(shape, list) and all(isinstance(s, int) for s in shape):
                text += f", at shape {shape}"
            parts.append(text)
        elif isinstance(record.get("status"), str):
            parts.append("speed: " + _flat(record["status"], 300))
    return "; ".join(parts)


def _student_notes(result: dict) -> list:
    """The grader's notes as the page says them (``_grader_notes`` scrubs and cuts them): a busy GPU's other
    programs are not named."""
    return [re.sub(r"process\(es\).*?:", "other programs:", note) if note.startswith("GPU ") else note
            for note in map(str, _list(result.get("notes")))]


@dataclass
class _Verdicts:
    """One submission's verdicts, read defensively (the result's format may gain fields)."""
    cells: dict
    flags_by_cell: dict
    other_flags: list
    notes: list
    uses: dict

    @classmethod
    def of(cls, result: dict, sources: LabSources):
        cells = {str(k): _dict(v) for k, v in _dict(result.get("cells")).items()}
        known = set(cells) | set(sources.release) | {g for gs in sources.uses.values() for g in gs}
        flags, other = _split_prefixed(result.get("flags"), known)
        return cls(cells, flags, other, _student_notes(result), sources.uses)

    def flags_for_test(self, grade_id) -> list:
        """``[(cell, text)]``: the flags on this test, and on the solution cells it uses."""
        found = [(grade_id, f) for f in self.flags_by_cell.get(grade_id, [])]
        for cell in self.uses.get(grade_id, []):
            if cell != grade_id:
                found += [(cell, f) for f in self.flags_by_cell.get(cell, [])]
        return found

    def tests_using(self, cell_id) -> list:
        return [t for t in self.cells if cell_id in self.uses.get(t, [])]


# ---------------------------------------------------------------------------------------------- rendering
# Python gathers the page's content as plain data (strings and numbers); templates/feedback.html renders it with
# Jinja2's autoescaping, so no text of a submission or a run reaches the page unescaped, whatever its path here.

TEMPLATES = Path(__file__).parent / "templates"
_STYLE = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;vertical-align:top}
pre{white-space:pre-wrap;word-break:break-word;background:#f6f8fa;padding:6px;margin:0;font-size:90%}
.cell{border-left:3px solid #ddd;margin:1em 0;padding-left:8px}.cell.test{border-color:#4c72b0}
.label{font-size:80%;color:#666}.out pre{background:#fff;border:1px dashed #ccc}
.verdict{background:#eef3fb;padding:6px;margin:4px 0}.ok{color:#2a7a2a}.lost{color:#b02a2a}
.flag{background:#fff4e0;padding:4px 6px;margin:3px 0}.md pre{background:#fff;font-family:inherit}
.standing{max-width:100%}.speed{margin:.5em 0}
"""



@functools.lru_cache(maxsize=None)
def _environment():
    """One environment a process: it keeps each template compiled (a fresh one compiled the page's template again
    for every page, 40 ms of a page's 0.2 s on the 2-core machine), and checks the file's time before each use."""
    import jinja2
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def _render(name: str, **context) -> str:
    return _environment().get_template(name).render(**context)


def _points(cell: dict) -> tuple:
    return _number(cell.get("points")), _number(cell.get("max_points"))


def _summary(result, verdicts: _Verdicts, manual: dict, scrub) -> dict:
    total = sum(_points(c)[0] for c in verdicts.cells.values())
    maximum = sum(_points(c)[1] for c in verdicts.cells.values())
    summary = {"total": f"{total:g}", "maximum": f"{maximum:g}", "hand": None, "late": None, "rows": [],
               "manual": [], "by_hand": [g for g, c in verdicts.cells.items() if _dict(c.get("by_hand"))]}
    hand = {k: _dict(v) for k, v in _dict(result.get("hand_graded")).items()}
    given = sum(_number(h.get("points")) for h in hand.values())
    most = sum(_number(h.get("max_points")) for h in hand.values())
    if hand:  # the totals with what a teaching assistant graded by hand (handgrading.apply)
        waiting = sum(1 for h in hand.values() if not isinstance(h.get("points"), (int, float)))
        summary["hand"] = {"given": f"{given:g}", "most": f"{most:g}", "waiting": waiting,
                           "total": f"{total + given:g}", "maximum": f"{maximum + most:g}"}
    penalty = _number(result.get("late_penalty"))
    if penalty > 0:  # nbgrader's late penalty (handgrading.apply): the total the LMS gets is after it
        summary["late"] = {"penalty": f"{penalty:g}", "total": f"{max(0.0, total + given - penalty):g}",
                           "maximum": f"{maximum + most:g}"}
    summary["marked_late"] = result.get("lms_late") is True and penalty <= 0  # the LMS's mark, no penalty here
    for grade_id, cell in verdicts.cells.items():
        points, most = _points(cell)
        status = cell.get("status") if isinstance(cell.get("status"), str) else "?"
        why = []
        message = cell.get("message") if isinstance(cell.get("message"), str) else ""
        if message.strip() and points < most:
            why.append(short_reason(scrub(message), 160))
        flags = verdicts.flags_for_test(grade_id)
        if flags:
            why.append(f"{len(flags)} note(s) from the grader about your code (see below)")
        speed = _speed_line(cell.get("speed"))
        if speed and status not in speed:
            why.append(speed)
        if _dict(cell.get("by_hand")):
            why.append("points given by a teaching assistant")
        summary["rows"].append({"anchor": _anchor(grade_id), "grade_id": grade_id, "ok": points >= most,
                                "points": f"{points:g} / {most:g}", "status": status, "why": "; ".join(why)})
    for grade_id in [g for g in _list(result.get("manual_cells")) if isinstance(g, str)]:
        entry = _dict(manual.get(grade_id))
        score, most = entry.get("score"), entry.get("max")
        graded = isinstance(score, (int, float))
        shown = f"{_number(score):g} / {_number(most):g}" if graded else \
            (f"? / {_number(most):g}" if isinstance(most, (int, float)) else "?")
        summary["manual"].append({"grade_id": grade_id, "shown": shown,
                                  "state": "graded by hand" if graded else "to be graded by hand"})
    return summary


def _anchor(grade_id) -> str:
    return "t-" + re.sub(r"[^A-Za-z0-9_-]", "_", str(grade_id))[:100]


def _flag(cell_id, text, test_id) -> dict:
    """A flag: ``about`` names the solution cell it is about when that is not the test it is shown at."""
    return {"about": None if cell_id == test_id else str(cell_id), "text": _flat(text, MAX_NOTE_CHARS)}


def _comment(entry) -> str:
    comment = _dict(entry).get("comment")
    return clean_text(comment, 4000) if isinstance(comment, str) and comment.strip() else ""


def _verdict(grade_id, verdicts: _Verdicts, scrub, manual: dict) -> dict:
    cell = verdicts.cells.get(grade_id, {})
    points, most = _points(cell)
    status = cell.get("status") if isinstance(cell.get("status"), str) else ""
    message = cell.get("message") if isinstance(cell.get("message"), str) else ""
    return {"anchor": _anchor(grade_id), "grade_id": grade_id, "ok": points >= most,
            "points": f"{points:g}", "most": f"{most:g}", "status": STATUS_WORDS.get(status, status),
            "message": clean_text(scrub(message), MAX_MESSAGE_CHARS) if message.strip() else "",
            "speed": _speed_line(cell.get("speed")),
            "flags": [_flag(c, f, grade_id) for c, f in verdicts.flags_for_test(grade_id)],
            "comment": _comment(manual.get(grade_id))}


def _grader_notes(verdicts: _Verdicts, release_problem: str, scrub) -> dict:
    cell_flags = []
    for cell_id, texts in verdicts.flags_by_cell.items():
        if cell_id in verdicts.cells:
            continue
        tests = verdicts.tests_using(cell_id)
        cost = f" (the tests that use it: {', '.join(tests)})" if tests else ""
        cell_flags += [{"cell": cell_id, "cost": cost, "text": _flat(text, MAX_NOTE_CHARS)} for text in texts]
    notes = verdicts.notes + ([release_problem] if release_problem else [])
    # a note may quote what a run met (an exception, a path): scrubbed as a failed test's message is
    return {"cell_flags": cell_flags,
            "general": [_flat(scrub(text), MAX_NOTE_CHARS) for text in verdicts.other_flags + notes]}


def _image(mime, data) -> dict:
    """A submitted image: ``{"mime", "data"}`` when it is valid base64 of a size the page shows, else a label."""
    data = _text(data).replace("\n", "")
    if len(data) > MAX_IMAGE_BYTES:
        return {"label": f"(an image of {len(data) // 1024} kB: too large to show)"}
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return {"label": "(an image that is not valid base64: not shown)"}
    return {"mime": mime, "data": data}


def _outputs(outputs) -> dict | None:
    """The outputs the student submitted: text, and PNG/JPEG images. HTML, JavaScript and other rich outputs are
    shown by their plain-text version (the page runs nothing a notebook carries)."""
    texts, images, budget = [], [], MAX_OUTPUT_CHARS
    for output in _list(outputs)[:1000]:
        if not isinstance(output, dict):
            continue
        kind = output.get("output_type")
        if kind == "stream":
            text = _text(output.get("text"))
        elif kind == "error":
            text = f"{_text(output.get('ename'))}: {_text(output.get('evalue'))}\n" + \
                "\n".join(t for t in _list(output.get("traceback")) if isinstance(t, str))
        elif kind in ("execute_result", "display_data"):
            data = _dict(output.get("data"))
            for mime in ("image/png", "image/jpeg"):
                if mime in data and len(images) < 20:
                    images.append(_image(mime, data[mime]))
                    break
            else:
                texts.append(_text(data.get("text/plain"))[: max(0, budget) + 1])
                budget -= len(texts[-1])
            continue
        else:
            continue
        texts.append(text[: max(0, budget) + 1])  # one past the budget: the cut below then says so
        budget -= len(texts[-1])
    text = clean_text("".join(t if t.endswith("\n") else t + "\n" for t in texts if t), MAX_OUTPUT_CHARS)
    text = text if text.strip() else ""
    return {"text": text, "images": images} if text or images else None


def _size(item) -> int:
    """About how many characters an item takes on the page (its texts and images), for the page's size budget."""
    if isinstance(item, str):
        return len(item)
    if isinstance(item, dict):
        return 80 + sum(_size(v) for v in item.values())
    if isinstance(item, list):
        return sum(_size(v) for v in item)
    return 8


def _cells(nb: dict, sources: LabSources, verdicts: _Verdicts, scrub, manual) -> tuple:
    """The notebook part of the page (cells, and labels where a cell is not shown), and the tests the student's
    notebook did not contain."""
    items, shown, size = [], set(), 0
    cells = nb["cells"]
    for index, cell in enumerate(cells):
        if size > MAX_PAGE_CHARS:
            items.append({"label": f"({len(cells) - index:,} more cells: past the size this page shows)"})
            break
        if not isinstance(cell, dict):
            items.append({"label": f"(cell {index + 1} is not a notebook cell: not shown)"})
            continue
        kind = cell.get("cell_type") if isinstance(cell.get("cell_type"), str) else "?"
        grade_id = _grade_id(cell)
        release = sources.release.get(grade_id) if grade_id else None
        provided = release is not None and not _meta(release).get("solution")
        if provided:
            source = _text(release.get("source"))
            kind = release.get("cell_type") if isinstance(release.get("cell_type"), str) else kind
            label = "from the lab's notebook"
        else:
            source = _text(cell.get("source"))
            label = f"your cell {grade_id}" if grade_id else "your cell"
        is_test = grade_id in verdicts.cells and grade_id not in shown
        text = clean_text(source, MAX_SOURCE_CHARS)
        item = {"test": is_test, "title": f"[{index + 1}] {kind}, {label}", "markdown": kind == "markdown",
                "source": text if text.strip() or kind == "markdown" else "",
                "outputs": _outputs(cell.get("outputs")) if kind == "code" else None,
                "flags": [], "verdict": None, "comment": ""}
        if grade_id and not is_test:
            item["flags"] = [_flag(grade_id, f, None) for f in verdicts.flags_by_cell.get(grade_id, [])]
        if is_test:
            item["verdict"] = _verdict(grade_id, verdicts, scrub, manual)
            shown.add(grade_id)
        elif grade_id in _dict(manual):
            item["comment"] = _comment(manual[grade_id])
        size += _size(item)
        items.append(item)
    return items, [g for g in verdicts.cells if g not in shown]


# ---------------------------------------------------------------------------------------------- the speed picture


def _measured(value) -> float | None:
    """A positive finite number, or None."""
    number = _number(value, None)
    return number if number is not None and math.isfinite(number) and number > 0 else None


def _record_of(records, test_id) -> dict:
    return next((_dict(r) for r in _list(records) if _dict(r).get("test") == test_id), {})


def _standing(grade_id, cell: dict, reference: dict) -> dict | None:
    """What the page says of a graded speed test's kernel: a picture of it beside the lab's unfused reference, the
    plain and tuned solutions and the floor, every number measured in this grading run; or, when its speed was not measured,
    why there is no picture. None for a cell that is not a speed test."""
    records = [_dict(r) for r in _list(cell.get("speed")) if isinstance(_dict(r).get("test"), str)]
    if not records:
        return None
    record = records[0]
    test_id = _flat(record["test"], 100)
    speedup, threshold = _measured(record.get("speedup")), _measured(record.get("threshold"))
    standing = {"grade_id": grade_id, "anchor": _anchor(grade_id), "test": test_id, "picture": None, "said": [],
                "why_not": ""}
    if speedup is None or threshold is None:
        status = record.get("status") if isinstance(record.get("status"), str) else ""
        standing["why_not"] = ("Your kernel's speed was not measured: the grading machine has no GPU, so there is no "
                               "picture of where it stands." if status == "not measured (no GPU)" else
                               f"Your kernel's speed was not measured ({_flat(status or 'no measurement', 300)}), "
                               "so there is no picture of where it stands.")
        return standing
    gpu = record.get("gpu") if isinstance(record.get("gpu"), str) else None
    kernels = {"the lab's unfused reference": 1.0}
    plain_record = _record_of(_dict(_dict(_dict(reference.get("cells")).get(grade_id))).get("speed"), test_id)
    same_gpu = plain_record.get("gpu") == gpu and plain_record.get("status") == "measured"
    plain = _measured(plain_record.get("speedup")) if same_gpu else None
    if plain is not None:
        kernels["the course's plain solution"] = plain
    else:
        standing["said"].append("The course's plain solution was not measured on this GPU in this grading run, so "
                                "it is not drawn.")
    tuned = _measured(plain_record.get("tuned_speedup")) if same_gpu else None
    if tuned is not None:
        kernels["the course's tuned solution"] = tuned
    elif plain is not None:
        standing["said"].append("The course's tuned solution was not measured in this grading run, so it is not "
                                "drawn.")
    kernels["your kernel"] = speedup
    floor = _floor(test_id, record, plain_record if same_gpu else {})
    if floor is None:
        standing["said"].append("The floor (the fewest bytes at this GPU's copy bandwidth) was not measured in this "
                                "grading run, so it is not drawn.")
    standing["said"].insert(0, _standing_words(speedup, threshold, plain, tuned, floor, gpu))
    standing["picture"] = _picture(kernels, threshold, floor)
    return standing


def _floor(test_id, record, plain_record) -> float | None:
    """The floor's speedup over the lab's unfused reference: the reference's time in the grader's reference run
    over the time of the op's minimum bytes at the copy bandwidth measured in that run, on the same GPU."""
    from ...labs import floors, registry
    copy, reference_s = _measured(plain_record.get("copy_bytes_per_s")), _measured(plain_record.get("reference_s"))
    shape = record.get("shape")
    if copy is None or reference_s is None or not isinstance(shape, list) or \
            not all(isinstance(s, int) and s > 0 for s in shape):
        return None
    try:
        dtype = registry.graded_tests()[test_id].dtype
    except KeyError:
        return None
    moved = floors.min_bytes(test_id, shape, dtype)
    return reference_s / (moved / copy) if moved else None


def _standing_words(speedup, threshold, plain, tuned, floor, gpu) -> str:
    words = [f"Your kernel ran {speedup:.2f}x faster than the lab's unfused reference"
             + (f" on the grading machine's {_flat(gpu, 80)}" if gpu else "")
             + f"; full marks from {threshold:.2f}x."]
    if plain is not None:
        words.append(f"The course's plain solution, measured in the same grading run, ran {plain:.2f}x.")
    if tuned is not None:
        words.append(f"The course's tuned solution (the lab's optional part; full marks do not need it) ran "
                     f"{tuned:.2f}x.")
    if floor is not None:
        words.append(f"No kernel can pass {floor:.2f}x here: the time of its fewest bytes at this GPU's copy "
                     "bandwidth (measured in the same run).")
    return " ".join(words)


def _picture(kernels: dict, threshold: float, floor) -> str | None:
    """The standing as a PNG, base64: drawn from the grader's numbers only (labels are the grader's own words)."""
    try:
        import io

        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        from ...plots import plot_standing
        figure = Figure(figsize=(7, 0.5 * len(kernels) + 1.8), dpi=90)
        FigureCanvasAgg(figure)
        plot_standing(kernels, threshold, floor, ax=figure.add_subplot(1, 1, 1))
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", bbox_inches="tight")
        return base64.b64encode(buffer.getvalue()).decode("ascii")
    except Exception:  # noqa: BLE001 - the words beside it still say the numbers
        return None


def build_page(result: dict, sources: LabSources, notebook: dict | None, notebook_problem: str = "",
               manual: dict | None = None, scrub=None, show_flags: bool = True, reference: dict | None = None) -> str:
    """The feedback page (HTML) of one submission; ``notebook`` is the student's submitted notebook or None.
    ``show_flags``: False leaves the grader's flags out (``write_one`` does until a TA decides). ``reference``: the
    grader's reference run of the lab (``reference.json``) in the same grading run, whose plain solution and floor
    the speed picture draws."""
    result = _dict(result)
    if not show_flags:
        result = {**result, "flags": []}
    manual, reference = _dict(manual), _dict(reference)
    scrub = scrub or MessageScrub(sources.hidden_lines)
    student, lab = _flat(result.get("student", "?"), 200), _flat(result.get("lab", "?"), 100)
    verdicts = _Verdicts.of(result, sources)
    speed = [s for s in (_standing(g, c, reference) for g, c in verdicts.cells.items()) if s is not None]
    cells, missing = None, list(verdicts.cells)
    if notebook is not None:
        try:
            cells, missing = _cells(notebook, sources, verdicts, scrub, manual)
        except Exception as exc:  # noqa: BLE001 - the verdicts above still reach the student
            notebook_problem = f"your notebook could not be shown ({type(exc).__name__})"
    missing = [{"source": clean_text(_text(sources.release[g].get("source")), MAX_SOURCE_CHARS)
                if g in sources.release else "", "verdict": _verdict(g, verdicts, scrub, manual)} for g in missing]
    return _render("feedback.html", student=student, lab=lab, style=_STYLE, how_graded=HOW_GRADED,
                   summary=_summary(result, verdicts, manual, scrub), speed=speed,
                   notes=_grader_notes(verdicts, sources.problem, scrub), cells=cells or [],
                   notebook_problem=notebook_problem, missing=missing)


def plain_page(student, lab, why: str) -> str:
    return _render("feedback-plain.html", student=_flat(student, 200), lab=_flat(lab, 100), why=_flat(why, 300))


# ---------------------------------------------------------------------------------------------- writing


def write_one(result: dict, out_dir: Path, sources: dict, manual: dict | None = None,
              show_flags: bool = False, references: dict | None = None) -> tuple:
    """Write ``out_dir/<student>/<lab>.html``; ``(path or None, problem text or "")``. Never raises. The flags
    are on the page only with ``show_flags`` (a TA decided). ``references``: lab → the grading run's reference
    run (``reference_runs``)."""
    result = _dict(result)
    student, lab = str(result.get("student", "")), str(result.get("lab", ""))
    problem, inputs = "", ""
    record = _drawn_record(out_dir, student, lab)
    try:
        lab_source, inputs = _page_inputs(result, sources, manual, show_flags, references)
        kept = _kept_page(_page_path(out_dir, student, lab), record, inputs)
        if kept is not None:
            return kept, ""
        notebook, notebook_problem = load_notebook(result.get("notebook", ""), result.get("notebook_sha"))
        page = build_page(result, lab_source, notebook, notebook_problem,
                          _dict(manual).get((student, lab), {}), show_flags=show_flags,
                          reference=_dict(references).get(lab))
        if notebook_problem:
            problem = notebook_problem
    except Exception as exc:  # noqa: BLE001 - one submission's page must not stop the class's
        problem = f"its feedback page could not be built ({type(exc).__name__}: {_flat(exc, 200)})"
        page = plain_page(student, lab, f"{type(exc).__name__}")
    try:
        target = _page_path(out_dir, student, lab)
        target.parent.mkdir(parents=True, exist_ok=True)
        drawn = page.encode("utf-8", "replace")
        record.unlink(missing_ok=True)  # no record while the page is being replaced
        target.write_bytes(drawn)
        if inputs and not problem:  # a page with a problem to report is drawn (and its problem said) every run
            _keep_record(record, inputs, drawn)
        return target, problem
    except (OSError, ValueError) as exc:
        return None, f"its feedback page could not be written ({type(exc).__name__}: {_flat(exc, 200)})"


# What each page was drawn from is kept beside the feedback folder (``<out>/feedback-drawn/``, never handed to
# students: a digest of the hidden tests' verdicts is not theirs to see), so that a later run of the term (next
# week's lab, one student's regrade) draws again only the pages whose inputs changed: a speed picture costs a
# tenth of a second or more, and every run writes every page of the course.
@functools.lru_cache(maxsize=None)
def _drawer_digest() -> bytes:
    """The code and templates that draw a page: a page drawn by other code is drawn again."""
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for path in [Path(__file__), here.parent.parent / "plots.py", *sorted((here / "templates").glob("feedback*"))]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.digest()


def _page_inputs(result: dict, sources: dict, manual, show_flags: bool, references) -> tuple:
    """``(the lab's sources, the digest of what the page is drawn from)`` for one result (a dict)."""
    student, lab = str(result.get("student", "")), str(result.get("lab", ""))
    lab_source = sources.get(lab) or LabSources(problem="the lab's release notebook is unknown")
    return lab_source, _inputs_digest(result, lab_source, _dict(manual).get((student, lab), {}), show_flags,
                                      _dict(references).get(lab))


def _already_drawn(shared, result: dict) -> Path | None:
    """The page ``write_one`` would keep for ``result`` (drawn before from the same inputs, unchanged since), or
    None: what is left to draw."""
    out_dir, sources, manual, show_flags, references = shared
    student, lab = str(result.get("student", "")), str(result.get("lab", ""))
    try:
        _, inputs = _page_inputs(result, sources, manual, (student, lab) in show_flags, references)
        return _kept_page(_page_path(out_dir, student, lab), _drawn_record(out_dir, student, lab), inputs)
    except Exception:  # noqa: BLE001 - write_one says what is wrong with it
        return None


def _inputs_digest(result: dict, lab_source: LabSources, manual, show_flags: bool, reference) -> str:
    """The digest of what a page is drawn from; "" where it cannot be read as plain data."""
    try:
        notebook = Path(str(result.get("notebook", "")))
        try:  # the notebook is read at drawing time: a changed file (size, time, inode) draws the page again
            info = notebook.stat()
            seen = [info.st_size, info.st_mtime_ns, info.st_ino]
        except OSError as exc:
            seen = [type(exc).__name__]
        inputs = [result, lab_source.release, lab_source.uses, sorted(lab_source.hidden_lines), lab_source.problem,
                  manual, bool(show_flags), reference, seen]
        text = json.dumps(inputs, sort_keys=True, default=lambda v: sorted(v) if isinstance(v, (set, frozenset))
                          else repr(v))
    except (TypeError, ValueError, RecursionError):
        return ""
    return hashlib.sha256(_drawer_digest() + text.encode("utf-8", "replace")).hexdigest()


def _page_path(out_dir: Path, student: str, lab: str) -> Path:
    return Path(out_dir) / _safe_part(student) / f"{_safe_part(lab)}.html"


def _drawn_record(out_dir: Path, student: str, lab: str) -> Path:
    return Path(out_dir).with_name(Path(out_dir).name + "-drawn") / _safe_part(student) / f"{_safe_part(lab)}.json"


def _read_plain(path: Path, limit: int) -> bytes | None:
    """A plain file's bytes (no link followed, at most ``limit``), or None."""
    try:
        with untrusted.Folder(path.parent) as folder:
            return folder.read_bytes(path.name, limit)
    except OSError:  # untrusted.Refused is one
        return None


def _kept_page(target: Path, record: Path, inputs: str) -> Path | None:
    """``target`` where it is the plain file the grader drew from the same inputs, unchanged since."""
    if not inputs:
        return None
    try:
        kept = json.loads(_read_plain(record, 4096) or b"null")
    except ValueError:
        return None
    page = _read_plain(target, MAX_PAGE_BYTES) if isinstance(kept, dict) and kept.get("inputs") == inputs else None
    return target if page is not None and hashlib.sha256(page).hexdigest() == kept.get("page") else None


def _keep_record(record: Path, inputs: str, page: bytes) -> None:
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"inputs": inputs, "page": hashlib.sha256(page).hexdigest()}))
    except OSError:
        pass  # without its record a page is only drawn again next time


def _safe_part(name: str) -> str:
    """A single path component: a student or lab name never leaves the feedback folder."""
    name = name.replace("/", "_").replace("\x00", "_")
    return "_" + name if name in ("", ".", "..") else name


FLAGS_SHOWN = "flags-shown.txt"


def shown_flags(course_folder: Path) -> set:
    """The (student, lab)s whose flags a TA decided to show them: ``student/lab`` lines of ``flags-shown.txt``
    in the course folder (``#`` starts a comment)."""
    try:
        lines = (Path(course_folder) / FLAGS_SHOWN).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return set()
    pairs = (line.split("#", 1)[0].strip().rpartition("/") for line in lines)
    return {(student.strip(), lab.strip()) for student, _, lab in pairs if student.strip() and lab.strip()}


def reference_runs(out: Path, labs) -> dict:
    """lab → the grading run's reference run of the lab's solution (``<out>/reference/<lab>/reference.json``,
    written by the grader before any student's code ran), where it can be read: its speed records hold the plain
    solution's speedup and the copy bandwidth measured on that GPU, which the speed picture draws."""
    found = {}
    for lab in labs:
        try:
            saved = json.loads((Path(out) / "reference" / _safe_part(str(lab)) / "reference.json").read_text())
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(saved, dict):
            found[lab] = saved
    return found


def write_all(results: list, out_dir: Path, sources: dict | None = None, gradebook_db: Path | None = None,
              show_flags=frozenset(), references: dict | None = None, drawers: Drawers | None = None) -> tuple:
    """Every submission's page. ``({lab: {student: path}}, [(student, lab, problem)])``; never raises.

    ``results``: ``SubmissionResult``s, or result.json dicts of any shape (read defensively, as JSON).
    ``show_flags``: the (student, lab)s whose pages show the grader's flags (``shown_flags``).
    ``references``: lab → the lab's reference run in this grading run; by default read beside ``out_dir``
    (``reference_runs`` of its parent, the run's output folder).

    Pages kept from an earlier run are found here; the rest, for a class, are drawn by several processes at once
    (``drawers``, started by the caller; where it started none, started here for the pages left), a few by this
    one."""
    results = [r.to_json() if isinstance(r, SubmissionResult) else r for r in _list(results)]
    results = [r for r in results if isinstance(r, dict)]
    if sources is None:
        sources = lab_sources(sorted({str(r.get("lab")) for r in results}))
    manual = written_answers(gradebook_db) if gradebook_db else {}
    if references is None:
        references = reference_runs(Path(out_dir).parent, sorted({str(r.get("lab")) for r in results}))
    shared = (out_dir, sources, manual, frozenset(show_flags), references)
    kept = [_already_drawn(shared, result) for result in results]
    todo = [result for result, page in zip(results, kept) if page is None]
    fresh = None
    if todo:  # the caller's processes where it sized some (they may have failed: then none), else fresh ones
        fresh = drawers.draw(todo, shared) if drawers is not None and drawers.processes >= 2 else \
            _drawn_side_by_side(todo, shared)
    if fresh is None:
        fresh = [_draw_with(shared, result) for result in todo]
    fresh = iter(fresh)
    drawn = [(page, "") if page is not None else next(fresh) for page in kept]
    pages, problems = {}, []
    for result, (path, problem) in zip(results, drawn):
        student, lab = str(result.get("student", "")), str(result.get("lab", ""))
        if path is not None:
            pages.setdefault(lab, {})[student] = path
        if problem:
            problems.append((student, lab, problem))
    return pages, problems


# a drawing process's start (Python, this module's imports, matplotlib) took 2.7 s on a CI-sized machine, about
# 15 pages' drawing: a process draws at least this many, so a small class (or a 2-core machine) draws in one
PAGES_PER_PROCESS = 20
# the host memory left per drawing process: Python and matplotlib, and a submitted notebook of up to
# ``MAX_NOTEBOOK_BYTES`` read as JSON
DRAWER_GIB = 1.0


def _ready() -> None:
    """A drawing process's start: what every page uses, loaded before the first page comes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    from matplotlib.figure import Figure  # noqa: F401

    from ...plots import plot_standing  # noqa: F401
    _environment().get_template("feedback.html")


def _started() -> None:
    """Nothing: an ask that makes the pool start a process."""


def _draw_chunk(shared, results: list) -> list:
    """Some pages, each as ``write_one`` answers; ``shared``: what every page of the class shares (out_dir,
    sources, manual, show_flags, references), sent with each chunk."""
    return [_draw_with(shared, result) for result in results]


def _draw_with(shared, result: dict) -> tuple:
    out_dir, sources, manual, show_flags, references = shared
    student, lab = str(result.get("student", "")), str(result.get("lab", ""))
    return write_one(result, out_dir, sources, manual, show_flags=(student, lab) in show_flags,
                     references=references)


def _drawing_processes(pages: int) -> int:
    """How many processes draw ``pages`` pages: the cores, the pages (``PAGES_PER_PROCESS`` each) and the host's
    available memory (``DRAWER_GIB`` each) allowing."""
    from ..gpus.schedule import available_cores, host_memory_gib
    processes = min(available_cores(), pages // PAGES_PER_PROCESS)
    memory = host_memory_gib()
    return min(processes, int(memory[1] // DRAWER_GIB)) if memory else processes


class Drawers:
    """Processes that draw a class's pages side by side (``_drawing_processes`` of them for about ``pages``
    pages), started when made: ``pipeline.write_outputs`` makes them before it records the class in the
    gradebook, so their start runs beside that, and ``write_all`` hands them the pages left to draw. Without
    enough pages for two, or where they fail, there are none (``draw`` answers None and the caller draws the
    pages itself; a failure is said on stderr: a page drawn twice is the same page). ``close`` ends them.

    Fresh processes (``spawn``): the grader's own has threads, which a fork would copy mid-step. A spawned process
    starts as ``python -c``, which puts its working folder (the grader's) first on ``sys.path`` while it imports
    ``multiprocessing``: ``PYTHONSAFEPATH`` (Python 3.11+), set while the processes start, leaves it off, as
    ``-P`` does for the clean recheck's workers; an older Python draws in one process."""

    def __init__(self, pages: int):
        import multiprocessing
        import sys
        from concurrent.futures import ProcessPoolExecutor
        self.pool, self.processes = None, _drawing_processes(pages)
        if self.processes < 2 or sys.version_info < (3, 11):
            return
        try:
            with config.environment({"PYTHONSAFEPATH": "1"}):
                self.pool = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"),
                                                initializer=_ready)
                # a spawning pool starts a process for each ask while none is idle: all of them here, unless one
                # is idle already (then ``draw`` starts the rest, asking under the same environment)
                for _ in range(self.processes):
                    self.pool.submit(_started)
        except (OSError, RuntimeError) as exc:
            self._failed(exc, pages)
        except BaseException:
            self.close()
            raise

    def draw(self, results: list, shared: tuple) -> list | None:
        """``write_one``'s answers for ``results``, in order; None where there are no processes to draw them."""
        from concurrent.futures.process import BrokenProcessPool
        if self.pool is None or not results:
            return None
        size = max(1, len(results) // (4 * self.processes))
        chunks = [results[k:k + size] for k in range(0, len(results), size)]
        try:
            with config.environment({"PYTHONSAFEPATH": "1"}):  # every chunk is asked for here (``Executor.map``)
                answers = self.pool.map(_draw_chunk, [shared] * len(chunks), chunks)
            return [answer for drawn in answers for answer in drawn]
        except (BrokenProcessPool, OSError, RuntimeError) as exc:
            self._failed(exc, len(results))
            return None

    def _failed(self, exc, pages: int) -> None:
        import sys
        print(f"feedback: the {self.processes} processes drawing {pages} pages failed "
              f"({type(exc).__name__}: {_flat(exc, 200)}); the grader draws them itself", file=sys.stderr)
        self.close()

    def close(self) -> None:
        if self.pool is not None:
            pool, self.pool = self.pool, None
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _drawn_side_by_side(results: list, shared: tuple) -> list | None:
    """``write_one``'s answers for ``results`` from processes started for them (``Drawers``); None where one
    process is enough or they failed. A page's picture is most of its time, a tenth of a second or more: a class
    of 120 took 26 s in one process on an H100 machine."""
    with Drawers(len(results)) as drawers:
        return drawers.draw(results, shared)
