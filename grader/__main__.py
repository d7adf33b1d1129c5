"""``python -m grader SUBMISSIONS [...]``: the same as ``fuselab grade`` (see fuselab/grading/run/cli.py)."""

import sys

from fuselab.grading.run.cli import main

sys.exit(main())
