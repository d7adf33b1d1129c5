"""``fuselab formgrader [RUN_OR_COURSE]``: nbgrader's formgrader on a graded run's own gradebook, for hand grading.

A graded run (``fuselab grade --out RUN``) keeps its nbgrader course in ``RUN/course``: ``gradebook.db``, the
labs' ``source/`` and ``release/``, each submission in ``autograded/`` (``nbgrader_run.record``). This starts
JupyterLab on that course alone: an ``nbgrader_config.py`` written into it (the course's own settings from
``grader/nbgrader_config.py``, the folders and gradebook of the run), the server run from it, the venv's
``bin`` first on ``PATH`` (nbgrader calls ``alembic`` by name), and none of nbgrader's student-side extensions
(assignment and course lists), which are what need an exchange folder. What a teaching assistant enters goes to
the run's gradebook; ``fuselab grade`` of the same ``--out`` then puts it in ``grades.csv``, the report and the
feedback pages (``handgrading``) without regrading. Every step of nbgrader's exchange is replaced by one that
refuses (``EXCHANGE_STEPS``): formgrader's release, collect and feedback-release buttons reach no student.
The server runs through ``formgrader_server``, which has formgrader count the run's submissions (nbgrader would
look for them in ``submitted/``, which a run leaves empty).
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path

from ...course import GRADER

CONFIG_NAME = "nbgrader_config.py"
# nbgrader's extensions for students: they list and fetch assignments through the exchange, which a run has none of
STUDENT_EXTENSIONS = ("nbgrader.server_extensions.assignment_list", "nbgrader.server_extensions.course_list",
                      "nbgrader.server_extensions.validate_assignment")
STUDENT_LAB_PLUGINS = ("@jupyter/nbgrader:assignment-list", "@jupyter/nbgrader:course-list",
                       "@jupyter/nbgrader:validate-assignment")


class NotACourse(ValueError):
    """The folder given is neither a graded run nor a course folder."""


def course_folder(target: str | os.PathLike | None) -> Path:
    """The nbgrader course of ``target``: a graded run (``RUN/course``) or a course folder itself (it holds
    ``gradebook.db``); without a target, the newest run under ``grader/runs``."""
    if target is None:
        runs = sorted((p for p in (GRADER / "runs").glob("*/course/gradebook.db")), key=lambda p: p.stat().st_mtime)
        if not runs:
            raise NotACourse(f"no graded run under {GRADER / 'runs'}: give the run's folder (fuselab grade's --out)")
        return runs[-1].parent.resolve()
    folder = Path(target).expanduser().resolve()
    for course in (folder / "course", folder):
        if (course / "gradebook.db").is_file():
            return course
    raise NotACourse(f"{folder} holds no gradebook (course/gradebook.db or gradebook.db): give the folder a "
                     "graded run wrote (fuselab grade's --out), or its course/ folder")


def write_config(course: Path) -> Path:
    """``course/nbgrader_config.py``: the course's settings, with this course's folders and gradebook."""
    config = course / CONFIG_NAME
    text = (
        "# written by `fuselab formgrader`: formgrader on this course's folders and gradebook\n"
        "c = get_config()  # noqa: F821\n"
        f"load_subconfig({str(GRADER / CONFIG_NAME)!r})  # noqa: F821 - the course's own settings\n"
        f"c.CourseDirectory.root = {str(course)!r}\n"
        "c.CourseDirectory.source_directory = 'source'\n"
        "c.CourseDirectory.release_directory = 'release'\n"
        "c.CourseDirectory.submitted_directory = 'submitted'\n"
        "c.CourseDirectory.autograded_directory = 'autograded'\n"
        "c.CourseDirectory.feedback_directory = 'feedback'\n"
        f"c.CourseDirectory.db_url = {'sqlite:///' + str(course / 'gradebook.db')!r}\n"
        "c.CourseDirectory.course_id = 'fuselab'\n"
        "# no exchange: formgrader's release, collect and feedback buttons do nothing (feedback goes back as\n"
        "# fuselab's pages, which hold no hidden test), and nothing is written outside this course\n"
        + "".join(f"c.ExchangeFactory.{trait} = 'fuselab.grading.outputs.formgrader.No{name}'\n"
                  for trait, name in EXCHANGE_STEPS.items()))
    config.unlink(missing_ok=True)  # written new, never through a link
    config.write_text(text)
    return config


LAB_CONFIG = ".formgrader-config"  # in the course: a Jupyter config path with the lab's page settings


def write_lab_config(course: Path) -> Path:
    """``course/.formgrader-config``: JupyterLab without the student-side panels (their server side is off)."""
    folder = course / LAB_CONFIG
    (folder / "labconfig").mkdir(parents=True, exist_ok=True)
    page = folder / "labconfig" / "page_config.json"
    page.unlink(missing_ok=True)
    page.write_text(json.dumps({"disabledExtensions": {name: True for name in STUDENT_LAB_PLUGINS}}, indent=2))
    return folder


# every step of nbgrader's exchange (``ExchangeFactory``'s plugins) → its default class, replaced by one that
# refuses: formgrader's "Release assignment", "Collect", "Release feedback" and the rest reach no student and
# write nothing; formgrader says the step failed
EXCHANGE_STEPS = {"list": "ExchangeList", "release_assignment": "ExchangeReleaseAssignment",
                  "release_feedback": "ExchangeReleaseFeedback", "collect": "ExchangeCollect",
                  "fetch_assignment": "ExchangeFetchAssignment", "fetch_feedback": "ExchangeFetchFeedback",
                  "submit": "ExchangeSubmit"}
NO_EXCHANGE = ("fuselab formgrader runs without an exchange: return each student's page from the run's "
               "feedback/ folder (fuselab grade writes them)")


def _no_exchange_class(name: str):
    from nbgrader.exchange import ExchangeError
    from nbgrader.exchange import default  # the default's settings (Exchange.root, ...) still apply

    def start(self):
        raise ExchangeError(NO_EXCHANGE)

    # an exchange that is not there, said quietly: nbgrader's formgrader asks for the list on every request,
    # and the default one logs "Unwritable directory" each time its folder is missing
    return type(f"No{name}", (getattr(default, name),), {"start": start, "__doc__": NO_EXCHANGE,
                                                        "__module__": __name__})


def __getattr__(name):  # nbgrader imports the classes by name; nbgrader itself is imported only then
    if name == "NoExchange":  # the name an earlier course config gave the list
        return _no_exchange_class("ExchangeList")
    if name.startswith("No") and name[2:] in EXCHANGE_STEPS.values():
        return _no_exchange_class(name[2:])
    raise AttributeError(name)


def free_port(ip: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def server_command(course: Path, port: int, token: str, ip: str = "127.0.0.1") -> tuple:
    """``(argv, env)`` of the JupyterLab that serves formgrader on ``course`` (run it with cwd=course)."""
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""),
               JUPYTER_CONFIG_PATH=os.pathsep.join(filter(None, [str(write_lab_config(course)),
                                                                 os.environ.get("JUPYTER_CONFIG_PATH")])))
    # JupyterLab with formgrader counting the run's submissions (formgrader_server.py)
    argv = [sys.executable, "-m", "fuselab.grading.outputs.formgrader_server", "--no-browser", f"--ip={ip}", f"--port={port}",
            "--ServerApp.port_retries=0", f"--ServerApp.root_dir={course}", f"--IdentityProvider.token={token}",
            *(f"--ServerApp.jpserver_extensions={name}=False" for name in STUDENT_EXTENSIONS)]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")
    return argv, env


def url(ip: str, port: int, token: str) -> str:
    return f"http://{ip}:{port}/formgrader?token={token}"


def main(target=None, port: int | None = None, ip: str = "127.0.0.1") -> int:
    try:
        course = course_folder(target)
    except NotACourse as problem:
        print(f"fuselab formgrader: {problem}", file=sys.stderr)
        return 2
    write_config(course)
    port = port or free_port(ip)
    token = secrets.token_hex(16)
    argv, env = server_command(course, port, token, ip)
    print(f"formgrader on {course}\n  open: {url(ip, port, token)}\n"
          f"  then, for each lab you graded by hand: fuselab grade <that lab's download, as graded> --labs <lab> "
          f"--out {course.parent} puts the hand grades in grades.csv, the report and the feedback pages (nothing "
          "is regraded)\n  stop: Ctrl-C", flush=True)
    # the server ends with this command however it ends: Ctrl-C, a closed terminal (SIGHUP), a script's SIGTERM,
    # even SIGKILL (the child's death signal); left behind, it would keep serving the gradebook on the port
    server = subprocess.Popen(argv, cwd=str(course), env=env, preexec_fn=_dies_with_parent)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: server.terminate())
    try:
        return server.wait()
    except KeyboardInterrupt:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        return 0


def _dies_with_parent() -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
