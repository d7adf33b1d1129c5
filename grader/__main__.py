"""``python -m grader SUBMISSIONS [...]``: the same as ``fuselab grade`` (see fuselab/grading/cli.py)."""

import sys

from fuselab.grading.cli import main

sys.exit(main())
