"""Running a submission's work: limits, the process tree's keeper and kill, the sandbox (an allow-listed environment, a
user without rights, bubblewrap), and the only way into a folder a submission can write.

Processes started from here, by path (``python -I -S``): ``keeper.py`` (the parent of every process a submission
starts) and ``enter_sandbox.py`` (the first step into the sandbox).
"""
