"""JupyterLab's nbgrader extensions work with the course configuration: a real headless Chromium opens the
formgrader and sees the labs. Skipped where Chromium is absent, except in CI, where that fails (``.ci/run``
installs Debian's ``chromium``).

Only localhost traffic: JupyterLab listens on 127.0.0.1 with a token, Chromium runs without background
networking.
"""

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
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


@pytest.fixture
def jupyter_lab(tmp_path):
    """JupyterLab on a free localhost port, with the course's nbgrader config and a scratch gradebook."""
    workdir = tmp_path / "server"
    workdir.mkdir()
    (workdir / "nbgrader_config.py").write_text(
        f"c = get_config()\nload_subconfig({str(course.GRADER / 'nbgrader_config.py')!r})\n"
        f"c.CourseDirectory.db_url = 'sqlite:///{tmp_path / 'gradebook.db'}'\n"
        f"c.Exchange.root = {str(tmp_path / 'exchange')!r}\n")
    (tmp_path / "exchange").mkdir()
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_CONFIG_DIR=str(tmp_path / "jcfg"),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    server = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", "--allow-root", "--no-browser",
                               "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}",
                               f"--ServerApp.root_dir={course.REPO}"],
                              cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
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


def _dom(url, tmp_path):
    result = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                             "--disable-background-networking", "--no-first-run",
                             f"--user-data-dir={tmp_path / 'chrome'}",
                             "--virtual-time-budget=15000", "--dump-dom", url],
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
