"""The plotting modules, loaded by the clean recheck's processes only when a cell uses them.

Every lab's setup cell imports ``matplotlib.pyplot`` and ``fuselab.plots``, and the setup cell runs in each of a
submission's three processes (checker, solution worker, kernel worker); while grading, only the demos (left out)
and GPU-only figures draw. Loaded eagerly, they were about 0.5 s of CPU per process on the project's 2-core
machine, some 1.5 s of each submission-lab's CPU. ``defer`` puts lazy modules in their place: the import
statement binds them at once, and the first use of one of their names loads the real module, so a cell that
does draw still draws, as before. It changes no verdict: what a test computes does not depend on when a
plotting module was loaded.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

DEFERRED = ("matplotlib.pyplot", "fuselab.plots")


class _Deferred(types.ModuleType):
    """Stands in ``sys.modules`` for a module not loaded yet; the first name looked up on it loads the real
    module (which then replaces it everywhere it can: ``sys.modules``, its package) and copies its names here, for
    the cells that bound this one."""

    def __getattr__(self, attr):  # only for a name this module does not have yet
        if attr == "__path__":  # not a package: asked by the import system, which must not load it
            raise AttributeError(attr)
        real = _load(self)
        return getattr(real, attr)


def _load(stub: _Deferred):
    name = stub.__name__
    if sys.modules.get(name) is stub:
        del sys.modules[name]
    real = importlib.import_module(name)
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, real)
    stub.__dict__.update({k: v for k, v in real.__dict__.items() if k != "__class__"})
    return real


def _lazy(name: str) -> None:
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)  # imports the parent package (matplotlib: cheap; fuselab: loaded)
    if spec is None:
        return
    stub = _Deferred(name)
    stub.__spec__, stub.__loader__, stub.__file__ = spec, spec.loader, spec.origin
    sys.modules[name] = stub
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, stub)  # ``from fuselab import plots`` finds it on the package


def defer() -> None:
    """Make ``DEFERRED`` lazy in this process (before any cell runs); a module that cannot be found is left to
    fail at its import, as it would have."""
    for name in DEFERRED:
        try:
            _lazy(name)
        except (ImportError, ValueError):
            continue
