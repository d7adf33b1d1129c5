"""``fuselab doctor``'s grading check: does the sandbox that ``fuselab grade`` needs work on this machine.

The doctor (``fuselab/doctor.py``) sits below the grader (docs/design.md §2.1), so the grader contributes this
check to it (``fuselab/cli.py`` passes it in) rather than the doctor reaching up into ``isolate``.
"""

from __future__ import annotations

from ...doctor import Finding
from . import isolate

INSTALL = "apt-get install bubblewrap  (as root; or run `bash .ci/setup` as root, which does it)"
# what stops bubblewrap most often once it is installed, and the usual way past it
NAMESPACES = ("let unprivileged users create user namespaces: `sysctl -w kernel.unprivileged_userns_clone=1` "
              "(Debian), `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (Ubuntu 23.10+); in a "
              "container, start it with `--security-opt seccomp=unconfined --security-opt apparmor=unconfined` "
              "or grade on the host")


def sandbox_finding() -> Finding:
    """ok where a sandboxed child starts without rights; else a problem saying why and the fix."""
    problem = isolate.sandbox_problem()
    if problem is None:
        return Finding("sandbox", "ok", f"bubblewrap ({isolate.bubblewrap()}) starts submissions without rights")
    detail = f"fuselab grade refuses to grade here: {problem}"
    if isolate.bubblewrap() is None:
        return Finding("sandbox", "problem", detail, INSTALL)
    if "keep rights" in problem:
        return Finding("sandbox", "problem", detail, "use a bubblewrap that is not setuid, or grade as a plain user")
    return Finding("sandbox", "problem", detail, NAMESPACES)
