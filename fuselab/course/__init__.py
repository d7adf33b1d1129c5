"""The course's folders and its nbgrader wiring: regenerate ``labs/`` from ``solutions/``, and tell whether it is
up to date.

``solutions/`` is the source of truth; ``labs/`` is what nbgrader's ``generate_assignment`` makes of it (solutions
replaced by stubs, hidden tests removed). Both live in the repository so students can clone and start.

The course's operations live in this package: ``sample_class`` writes the grader's sample class (``fuselab
samples``) from the labs' sample declarations.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..notebook import source

REPO = Path(__file__).resolve().parents[2]  # fuselab/course/__init__.py
GRADER = REPO / "grader"
SOLUTIONS = REPO / "solutions"
LABS = REPO / "labs"


def lab_names() -> list:
    """The course's labs, from the registry (``fuselab/labs/registry.py``); a test checks that it names every
    lab folder of ``solutions/``."""
    from ..labs.registry import lab_names as registered
    return registered()


# jsonschema (imported by nbformat, which nbgrader imports) builds rfc3987-syntax's Lark grammars at its import
# where that package is installed (jupyter-events asks for it): 1.1 s of the 2.0 s an nbgrader import took on the
# 2-core machine. It checks only the "iri" formats, which no notebook or nbgrader schema uses, so the course's
# nbgrader processes, and the grader's (``without_iri_grammar``), import nbformat without it.
_WITHOUT_IRI_GRAMMAR = "import sys\nsys.modules.setdefault('rfc3987_syntax', None)\n"
_NBGRADER_MAIN = "import runpy\nrunpy.run_module('nbgrader', run_name='__main__', alter_sys=True)\n"


def without_iri_grammar() -> None:
    """This process imports nbformat (and so jsonschema) without rfc3987-syntax's grammars (see above); a no-op
    where it was imported already. For the course's own command-line processes, before they import nbgrader."""
    sys.modules.setdefault("rfc3987_syntax", None)  # what _WITHOUT_IRI_GRAMMAR runs in nbgrader's processes


def nbgrader(*args, cwd=GRADER, check=True, env=None, script=None) -> subprocess.CompletedProcess:
    """Run ``nbgrader`` (or ``script``, Python that drives nbgrader's apps) with the course config (found in
    ``grader/``), the venv's tools on the PATH."""
    bin_dir = str(Path(sys.executable).parent)
    # this checkout's fuselab first: a course config names fuselab's classes (``fuselab formgrader`` writes one
    # into a run's course, which nbgrader's commands there read), and they must be this code's
    python_path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    full_env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "PYTHONPATH": python_path,
                **(env or {})}
    # nbgrader itself may be importable only through PYTHONPATH (the GPU machine's wheelhouse)
    command = [sys.executable, "-c", _WITHOUT_IRI_GRAMMAR + (script or _NBGRADER_MAIN), *args]
    result = subprocess.run(command, cwd=cwd, env=full_env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"nbgrader {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


# nbgrader's ``generate_assignment`` for several labs in one process: importing nbgrader takes ~2 s of the ~2.5 s
# a lab costs as its own ``nbgrader`` command (2-core machine), so the four labs took 7.5 s this way against ~11 s.
# Each lab gets a fresh app, configured as the command line would (the course config in ``cwd``, then ``args``);
# a lab nbgrader fails on ends the process with status 1, as the command does.
_GENERATE = """
import sys
from nbgrader.apps.generateassignmentapp import GenerateAssignmentApp
at = sys.argv.index("--")
for lab in sys.argv[1:at]:
    app = GenerateAssignmentApp()
    app.initialize([lab, "--force", *sys.argv[at + 1:]])
    app.start()
"""


def generate_assignments(labs, *args, cwd=GRADER) -> subprocess.CompletedProcess:
    """nbgrader's ``generate_assignment LAB --force ARGS`` for each of ``labs``, in one process (``nbgrader``'s
    environment and errors)."""
    return nbgrader(*labs, "--", *args, cwd=cwd, script=_GENERATE)


def release(labs=None, into: Path | None = None):
    """Regenerate the student versions of ``labs`` (default: all) into ``into`` (default: ``labs/``)."""
    extra = []
    if into is not None:
        extra = [f"--CourseDirectory.release_directory={into}"]
        gradebook = Path(tempfile.mkdtemp(prefix="fuselab-gradebook-")) / "gradebook.db"
        extra.append(f"--CourseDirectory.db_url=sqlite:///{gradebook}")
    generate_assignments(labs or lab_names(), *extra)


def _normalised(path: Path):
    nb = json.loads(path.read_text())
    return [(c["cell_type"], source(c), c.get("metadata", {}).get("nbgrader")) for c in nb["cells"]]


def stale_labs() -> list:
    """Student notebooks that differ from what ``solutions/`` generates now (missing ones included)."""
    with tempfile.TemporaryDirectory(prefix="fuselab-release-") as tmp:
        release(into=Path(tmp))
        stale = []
        for fresh in sorted(Path(tmp).rglob("*.ipynb")):
            relative = fresh.relative_to(tmp)
            committed = LABS / relative
            if not committed.exists() or _normalised(committed) != _normalised(fresh):
                stale.append(str(Path("labs") / relative))
        return stale


def main_release(check: bool) -> int:
    if check:
        stale = stale_labs()
        if stale:
            print("labs/ is out of date with solutions/: " + ", ".join(stale))
            print("regenerate with: fuselab release")
            return 1
        print("labs/ matches solutions/")
        return 0
    release()
    print("regenerated labs/ from solutions/: " + ", ".join(lab_names()))
    return 0

