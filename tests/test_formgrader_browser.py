"""JupyterLab's nbgrader extensions work with the course configuration: a real headless Chromium opens the
formgrader and sees the labs. Skipped where Chromium is absent, except in CI, where that fails (``.ci/run``
installs Debian's ``chromium``).

Only localhost traffic: JupyterLab listens on 127.0.0.1 with a token, Chromium runs without background
networking.
"""

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fuselab import course

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
# skipped where Chromium is missing, except in CI (.ci/run installs it), where its absence fails
pytestmark = pytest.mark.skipif(CHROMIUM is None and os.environ.get("FUSELAB_CI") != "1",
                                reason="no Chromium on this machine (apt-get install chromium)")


def test_chromium_is_installed():
    assert CHROMIUM is not None, "no Chromium on this machine: apt-get install chromium (.ci/run installs it)"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _lab_server(tmp_path, args, cwd, env=None):
    """``jupyter lab ARGS`` on a free localhost port, run from ``cwd``, with a scratch user config; yields (url, token)."""
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_CONFIG_DIR=str(tmp_path / "jcfg"),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""), **(env or {}))
    server = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", *args, "--allow-root", "--no-browser",
                               "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}"],
                              cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=1)
                break
            except OSError:
                if server.poll() is not None:
                    pytest.fail(f"jupyter lab exited: {server.stdout.read().decode()[-2000:]}")
                time.sleep(0.5)
        yield base, token
    finally:
        os.killpg(server.pid, 9)
        server.wait()


@pytest.fixture
def jupyter_lab(tmp_path):
    """The instructor's JupyterLab: the course's nbgrader config and a scratch gradebook."""
    workdir = tmp_path / "server"
    workdir.mkdir()
    (workdir / "nbgrader_config.py").write_text(
        f"c = get_config()\nload_subconfig({str(course.GRADER / 'nbgrader_config.py')!r})\n"
        f"c.CourseDirectory.db_url = 'sqlite:///{tmp_path / 'gradebook.db'}'\n"
        f"c.Exchange.root = {str(tmp_path / 'exchange')!r}\n")
    (tmp_path / "exchange").mkdir()
    with _lab_server(tmp_path, [f"--ServerApp.root_dir={course.REPO}"], cwd=workdir) as server:
        yield server


@pytest.fixture
def student_lab(tmp_path):
    """The students' JupyterLab, started as the README says: from the repository root,
    ``JUPYTER_CONFIG_PATH=student jupyter lab labs/``."""
    with _lab_server(tmp_path, ["labs/"], cwd=course.REPO, env={"JUPYTER_CONFIG_PATH": "student"}) as server:
        yield server


def _dom(url, tmp_path, budget_ms=15000):
    result = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                             "--disable-background-networking", "--no-first-run",
                             f"--user-data-dir={tmp_path / 'chrome'}",
                             f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
                            capture_output=True, text=True, timeout=120)
    return result.stdout


def test_formgrader_lists_the_labs_in_chromium(jupyter_lab, tmp_path):
    base, token = jupyter_lab
    dom = _dom(f"{base}/formgrader?token={token}", tmp_path)
    assert "formgrader" in dom.lower() or "manage assignments" in dom.lower(), dom[:2000]
    missing = [lab for lab in course.lab_names() if lab not in dom]
    assert missing == [], f"formgrader does not list {missing}: {dom[:3000]}"


def test_assignment_list_extension_is_served(jupyter_lab):
    base, token = jupyter_lab
    with urllib.request.urlopen(f"{base}/lab/api/extensions?token={token}", timeout=10) as response:
        text = response.read().decode()
    assert "nbgrader" in text


def test_students_see_validate_and_no_instructor_tools(student_lab, tmp_path):
    base, token = student_lab
    with urllib.request.urlopen(f"{base}/lab?token={token}", timeout=10) as response:
        page = response.read().decode()
    config = json.loads(re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                                  page, re.S).group(1))
    hidden = {"@jupyter/nbgrader:create-assignment", "@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:menu",
              "@jupyter/nbgrader:course-list", "@jupyterlab/apputils-extension:announcements"}
    assert hidden <= set(config["disabledExtensions"]), config["disabledExtensions"]
    # nbgrader's Validate button gives way to the course's (labextension/), which says what it could not measure
    assert "@jupyter/nbgrader:validate-assignment" in config["disabledExtensions"]
    assert "@fuselab/validate" in {ext["name"] for ext in config["federated_extensions"]}
    with pytest.raises(urllib.error.HTTPError, match="404"):  # the formgrader's server side is off too
        urllib.request.urlopen(f"{base}/formgrader?token={token}", timeout=10)

    dom = _dom(f"{base}/lab/tree/lab0/lab0.ipynb?token={token}", tmp_path, budget_ms=30000)
    assert "validate-button" in dom, f"no Validate button in the student's notebook: {dom[-3000:]}"
    for shown in (">Nbgrader<", "Create Assignment", "official Jupyter news"):  # menu, sidebar, news pop-up
        assert shown not in dom, f"the student's JupyterLab shows {shown!r}"
