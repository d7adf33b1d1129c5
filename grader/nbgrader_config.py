"""nbgrader course configuration for fuselab.

`solutions/` is nbgrader's source directory (instructor notebooks) and `labs/` its release directory (what
students get), so both top-level folders keep their meaning. Everything nbgrader writes while grading stays
under `grader/` and is ignored by git.
"""

import os
from pathlib import Path

c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads this file

REPO = Path(__file__).resolve().parent.parent

c.CourseDirectory.root = str(REPO)
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "labs"
c.CourseDirectory.submitted_directory = "grader/submitted"
c.CourseDirectory.autograded_directory = "grader/autograded"
c.CourseDirectory.feedback_directory = "grader/feedback"
c.CourseDirectory.course_id = "fuselab"
c.CourseDirectory.db_url = "sqlite:///" + str(REPO / "grader" / "gradebook.db")
# Build folders, caches and checkpoints never travel with an assignment.
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", ".cache", "*.so", "*.o",
                            "build", "*.ninja", ".ninja_*"]

# A cold CUDA build takes a few seconds, a cold CPU-emulation build of a big kernel up to a minute, and a graded
# speedup test several seconds: nbgrader's default of 30 s per cell is too short.
c.Execute.timeout = int(os.environ.get("FUSELAB_CELL_TIMEOUT", "600"))
c.Execute.interrupt_on_timeout = True

# JupyterHub courses: the exchange is where students fetch and submit (override per deployment).
c.Exchange.root = os.environ.get("FUSELAB_EXCHANGE", str(REPO / "grader" / "exchange"))
c.Exchange.path_includes_course = True

c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
