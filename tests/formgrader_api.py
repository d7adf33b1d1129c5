"""Hand grading through formgrader's own web API, as a teaching assistant's browser does it: ``fuselab formgrader
RUN`` started from the venv's own bin with a PATH that does not hold it, then formgrader's REST calls (the ones
its pages make) to find a submission's grade and comment and to set them. For tests/test_hand_grading.py and the
term's end-to-end test (tests/test_grading_term.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from fuselab import course
from fuselab.grading.outputs import formgrader


def _put(base, token, path, body):
    request = urllib.request.Request(f"{base}/formgrader/api/{path}?token={token}", method="PUT",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _get(base, token, path):
    joined = "&" if "?" in path else "?"
    with urllib.request.urlopen(f"{base}/formgrader/api/{path}{joined}token={token}", timeout=30) as response:
        return json.loads(response.read())


@dataclass
class Formgrader:
    base: str
    token: str
    log: Path

    def get(self, path):
        return _get(self.base, self.token, path)

    def put(self, path, body):
        return _put(self.base, self.token, path, body)

    def post(self, path):
        """A button of formgrader's pages that runs an nbgrader step (release, collect, feedback): its answer."""
        request = urllib.request.Request(f"{self.base}/formgrader/api/{path}?token={self.token}", method="POST",
                                         data=b"{}", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())

    def submission(self, lab: str, notebook: str, student: str) -> dict:
        return next(s for s in self.get(f"submitted_notebooks/{lab}/{notebook}") if s["student"] == student)

    def grade(self, lab: str, notebook: str, student: str, grade_id: str, score: float, comment: str = "") -> None:
        """What a TA does on a submission's page: a score for one cell, and a comment on it where given."""
        submission = self.submission(lab, notebook, student)
        grade = next(g for g in self.get(f"grades?submission_id={submission['id']}") if g["name"] == grade_id)
        self.put(f"grade/{grade['id']}", {**grade, "manual_score": score})
        if comment:
            self.comment(lab, notebook, student, grade_id, comment)

    def comment_boxes(self, lab: str, notebook: str, student: str) -> list:
        """The cells of a submission that formgrader gives a comment box (nbgrader's comments), by grade id."""
        submission = self.submission(lab, notebook, student)
        return [c["name"] for c in self.get(f"comments?submission_id={submission['id']}")]

    def comment(self, lab: str, notebook: str, student: str, grade_id: str, comment: str) -> None:
        """A comment alone, in a cell's comment box (a solution cell has one and no score)."""
        submission = self.submission(lab, notebook, student)
        remark = next(c for c in self.get(f"comments?submission_id={submission['id']}") if c["name"] == grade_id)
        self.put(f"comment/{remark['id']}", {**remark, "manual_comment": comment})


@contextlib.contextmanager
def serving(run: Path, scratch: Path, **env_more):
    """``fuselab formgrader RUN`` on a free port, once its API answers; stopped (its process group) on leaving.
    ``scratch``: a folder for Jupyter's runtime and config folders and the server's log; ``env_more``: more of
    the server's environment."""
    port = formgrader.free_port()
    env = dict(os.environ, PATH="/usr/bin:/bin", JUPYTER_RUNTIME_DIR=str(scratch / "rt"),
               JUPYTER_CONFIG_DIR=str(scratch / "jcfg"), PYTHONPATH=str(course.REPO), **env_more)
    log = scratch / "server.log"
    with log.open("w") as sink:
        server = subprocess.Popen([str(Path(sys.executable).parent / "fuselab"), "formgrader", str(run),
                                   "--port", str(port)], env=env, stdout=sink, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        started = time.monotonic()
        while "token=" not in log.read_text():
            assert server.poll() is None, log.read_text()
            assert time.monotonic() - started < 60, log.read_text()
            time.sleep(0.2)
        opened = next(line for line in log.read_text().splitlines() if "/formgrader?token=" in line)
        base, token = opened.split("open:")[1].strip().split("/formgrader?token=")
        for _ in range(240):
            try:
                _get(base, token, "assignments")
                break
            except OSError:
                assert server.poll() is None, log.read_text()
                time.sleep(0.5)
        yield Formgrader(base, token, log)
    finally:
        os.killpg(server.pid, 9)
        server.wait()
