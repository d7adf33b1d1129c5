"""The code passes ruff's checks, configured in pyproject.toml's ``[tool.ruff]`` (pyflakes and pycodestyle's
errors): an unused import or an undefined name fails CI, not a reader's review."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO


def _ruff() -> str:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        if os.environ.get("FUSELAB_CI") == "1":
            pytest.fail("ruff is not installed: .ci/setup installs it with the test dependencies")
        pytest.skip("ruff is not installed (pip install ruff)")
    return found


def test_the_package_tests_and_grader_pass_ruff():
    result = subprocess.run([_ruff(), "check", "--no-cache", "fuselab", "tests", "grader"], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_the_configuration_catches_an_unused_import_and_an_undefined_name(tmp_path):
    # the check above passing proves nothing if the configuration selected no rule
    probe = tmp_path / "probe.py"
    probe.write_text("import os\n\n\ndef f():\n    return undefined_name\n")
    result = subprocess.run([_ruff(), "check", "--no-cache", "--config", str(REPO / "pyproject.toml"), str(probe)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stdout
    assert "F401" in result.stdout and "F821" in result.stdout, result.stdout
