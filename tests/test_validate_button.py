"""The students' Validate button (labextension/, built into student/labextensions): its committed build is the one
of its sources, the server's reply carries the points a machine without a GPU did not measure, and in a real
headless Chromium the students' JupyterLab shows one Validate button whose dialog says so, and still shows a
failed cell with its error.

Only localhost traffic, as in test_formgrader_browser.py.
"""

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from .conftest import REPO
from .test_formgrader_browser import CHROMIUM, _free_port, _lab_server
from .test_validate import NOTEBOOK_CELLS, _cell

SOURCES = REPO / "labextension"
BUILT = REPO / "student" / "labextensions" / "@fuselab" / "validate"
RECORD = SOURCES / "BUILD.sha256"
NOTE = "4 points not measured here (no GPU): test_speedup"


def _notebook(path, cells):
    path.write_text(json.dumps({"cells": cells, "nbformat": 4, "nbformat_minor": 5,
                                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                            "language": "python"}}}))


def test_the_committed_build_is_the_build_of_its_sources():
    recorded = dict(reversed(line.split("  ", 1)) for line in RECORD.read_text().splitlines())
    skip = {"node_modules", "lib"}  # what labextension/build installs and compiles, never committed
    sources = {p for p in SOURCES.rglob("*") if p.is_file() and not skip & set(p.relative_to(SOURCES).parts)}
    present = {p.relative_to(REPO).as_posix() for p in sources | set(BUILT.rglob("*")) if p.is_file()} - \
        {RECORD.relative_to(REPO).as_posix()}
    assert present == set(recorded), "labextension/ or its build changed without labextension/build: run it"
    stale = [name for name, digest in recorded.items()
             if hashlib.sha256((REPO / name).read_bytes()).hexdigest() != digest]
    assert stale == [], f"changed since labextension/build ran: {stale}; run labextension/build and commit"
    load = json.loads((BUILT / "package.json").read_text())["jupyterlab"]["_build"]["load"]
    assert (BUILT / load).is_file(), load


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path of Validate")
def test_the_servers_reply_carries_the_points_not_measured(tmp_path):
    # the reply of nbgrader's handler itself (its validate_notebook, outside a server), in the students' setup
    _notebook(tmp_path / "lab.ipynb", NOTEBOOK_CELLS)
    script = ("import json, logging, sys, types\n"
              "from nbgrader.server_extensions.validate_assignment.handlers import ValidateAssignmentHandler as H\n"
              "handler = types.SimpleNamespace(root_dir=sys.argv[1], log=logging.getLogger())\n"
              "handler.load_config = lambda: H.load_config(handler)\n"
              "print(json.dumps(H.validate_notebook(handler, 'lab.ipynb')))")
    env = dict(os.environ, JUPYTER_CONFIG_PATH=str(REPO / "student"),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    reply = json.loads(result.stdout.splitlines()[-1])
    assert reply["success"] is True, reply
    # nbgrader's own client reads only these keys of the value: with none of them it still says Success
    assert not {"type_changed", "changed", "passed", "failed"} & set(reply["value"]), reply
    assert reply["value"]["fuselab_not_measured"].startswith(NOTE), reply


class _Page:
    """A page of a headless Chromium driven through its DevTools protocol (websocket-client, a dependency of
    jupyter_server)."""

    def __init__(self, tmp_path):
        import websocket
        port = _free_port()
        self.chrome = subprocess.Popen([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                                        "--disable-dev-shm-usage", "--disable-background-networking",
                                        "--no-first-run", f"--user-data-dir={tmp_path / 'chrome'}",
                                        "--window-size=1600,1000",  # a toolbar with room for every button
                                        f"--remote-debugging-port={port}", "--remote-allow-origins=*",
                                        "about:blank"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        for _ in range(120):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=1) as response:
                    pages = [t for t in json.loads(response.read()) if t["type"] == "page"]
                if pages:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            self.close()
            pytest.fail("Chromium's DevTools did not answer")
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=60)
        self.calls = 0

    def call(self, method, **params):
        self.calls += 1
        self.ws.send(json.dumps({"id": self.calls, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.calls:
                return reply.get("result", {})

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, (expression, result["exceptionDetails"])
        return result["result"].get("value")

    def wait_for(self, expression, what, budget_s=240):
        deadline = time.monotonic() + budget_s  # a bound on a failing wait, not a timing under test
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.5)
        pytest.fail(f"waited in vain for {what}; the page shows: {self.evaluate('document.body.innerText')[-3000:]}")

    def close(self):
        os.killpg(self.chrome.pid, 9)
        self.chrome.wait()


BUTTONS = "[...document.querySelectorAll('.jp-NotebookPanel-toolbar .validate-button')].filter(b => b.offsetParent)"
DIALOG = ("(() => { const d = document.querySelector('.jp-Dialog'); "
          "return d && d.innerText.includes('Validat') ? d.innerText : null; })()")  # results, or why none


def _validate_in_the_browser(page, base, token, name):
    page.call("Page.navigate", url=f"{base}/lab/tree/{name}?reset&token={token}")  # reset: only this notebook
    page.wait_for(f"{BUTTONS}.length > 0", "the notebook's Validate button")
    buttons = page.evaluate(f"{BUTTONS}.length")
    assert buttons == 1, f"{buttons} Validate buttons: nbgrader's must be disabled where the course's is installed"
    page.evaluate(f"{BUTTONS}[0].click()")  # the button is the toolbar item itself (a jp-button)
    return page.wait_for(DIALOG, "the Validation Results dialog")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path of Validate")
@pytest.mark.skipif(CHROMIUM is None and os.environ.get("FUSELAB_CI") != "1",
                    reason="no Chromium on this machine (apt-get install chromium)")
def test_students_validate_button_says_what_it_did_not_measure_and_shows_failures(tmp_path):
    work = tmp_path / "notebooks"
    work.mkdir()
    _notebook(work / "passes.ipynb", NOTEBOOK_CELLS)
    explanation = "the K loop drops the last partial tile: a K tail was not summed"
    _notebook(work / "fails.ipynb", [NOTEBOOK_CELLS[0], _cell(f"raise AssertionError({explanation!r})", "test_k", 2),
                                     NOTEBOOK_CELLS[3]])
    # the students' JupyterLab as the README starts it (from the repository root, JUPYTER_CONFIG_PATH=student)
    env = {"JUPYTER_CONFIG_PATH": "student",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with _lab_server(tmp_path, [str(work)], cwd=REPO, env=env) as (base, token):
        page = _Page(tmp_path)
        try:
            said = _validate_in_the_browser(page, base, token, "passes.ipynb")
            assert "Success! Your notebook passes all the tests." in said, said
            assert NOTE in said, said

            said = _validate_in_the_browser(page, base, token, "fails.ipynb")
            assert "The following cell failed:" in said and explanation in said, said
            assert "Success" not in said, said
        finally:
            page.close()
