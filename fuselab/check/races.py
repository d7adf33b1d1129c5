"""Is a failing case's result a race? Run it again with each block's threads in another order and compare.

Under the CPU emulation the threads of a block run one after another between barriers, in an order the module
sets (``set_thread_order``). A correct kernel computes the same result in any order; a kernel whose threads
share memory without a ``__syncthreads()`` between a write and another thread's read computes a different one.
So a result that changes with the order is a race, shown by the data and not guessed from the source. Only
kernels the emulation ran in this process can be rerun so (``fuselab.launch_record``).

The order of the threads is not the only thing that changes from one run to the next. Blocks run at the same time
on the CPU's cores (OpenMP), so a race between blocks (several blocks writing one element, a ``+=`` where an
``atomicAdd`` belongs) changes the result from run to run, and so does a candidate that keeps something from one
call to the next (a workspace from ``torch.empty`` that its first run filled). So the reruns run each launch's
blocks one after another, on one OS thread, and the thread order is blamed only when a rerun in the same order
gives the first result again and a rerun in the other order does not (and a last one in the same order still
does). A rerun in the same order that differs from the first run says that the result is not reproducible.
"""

import torch

from .formatting import format_index, format_value, plural
from .poison import GuardedOutput, first_change, guarded_input
from .tolerance import tolerance_for


def order_dependence(candidate, originals: dict, inputs: tuple, specs: list, first: list, names: list,
                     modules: list, wrote_outside: bool = False) -> str:
    """A sentence when the reruns of ``candidate`` show that its result depends on the order of a block's threads,
    or that it is not the same from run to run, else "". ``first``: the outputs of the first run; ``originals``:
    the inputs as they were before it; ``wrote_outside``: the first run wrote past an output's ends."""
    emulated = [m for m in modules if getattr(m, "emulated", False)]
    if not emulated or not first:
        return ""
    saved = [(module, module.thread_order, _os_threads(module)) for module in emulated]
    order, seed = saved[0][1]
    other = "forward" if order == "reverse" else "reverse"

    def rerun(how):
        fresh = tuple(guarded_input(originals[i].clone()) if i in originals else item
                      for i, item in enumerate(inputs))
        outputs = [GuardedOutput(shape, dtype, first[0].device) for shape, dtype in specs]
        for module, (module_order, module_seed), _ in saved:
            # a random order's shuffle also depends on the launches since the order was set: set it anew
            module.set_thread_order(*((module_order, module_seed) if how == "same" else (other,)))
        with torch.no_grad():
            candidate(*fresh, *(o.view for o in outputs))
        return [o.view for o in outputs]

    try:
        for module, _, threads in saved:
            if threads is not None:
                module.set_os_threads(1)  # the blocks one after another: a race between blocks cannot show
        if order == "random":
            # the first run's shuffle cannot be repeated (it depended on the launches before it): the reruns are
            # compared with a rerun of their own
            first = rerun("same")
        control = rerun("same")
        differs = _first_difference(first, control, names)
        if differs:
            return _not_reproducible(*differs, pinned=all(t is not None for _, _, t in saved),
                                     wrote_outside=wrote_outside)
        reordered = rerun("other")
        differs = _first_difference(first, reordered, names)
        if not differs or _first_difference(first, rerun("same"), names):
            return ""
    except Exception:  # noqa: BLE001 - the first run's failure is what the report is about
        return ""
    finally:
        for module, (module_order, module_seed), threads in saved:
            module.set_thread_order(module_order, module_seed)
            if threads is not None:
                module.set_os_threads(threads)
    name, count, numel, index, was, now = differs
    serial = ", the blocks running one after another both times" if all(t is not None for _, _, t in saved) else ""
    return (f"the result depends on the order the threads of a block run in: run again in the same order, the "
            f"result is the same, but with the threads in {other} order (the module's "
            f"`set_thread_order(\"{other}\")`), `{name}` changes at {count} of {plural(numel, 'element')} (first "
            f"{format_index(name, index)}: {format_value(was)}, then {format_value(now)}){serial}. A correct kernel "
            f"gives one result in any order: this is a race between the threads of a block. One thread reads "
            f"shared memory that another writes, with no `__syncthreads()` between the write and the read: a tile "
            f"read before every thread has loaded its part, or overwritten by the next iteration's loads while "
            f"others still read it (a tiled loop needs a barrier after the loads and another after the loop body).")


def _os_threads(module):
    """How many OS threads ``module`` runs blocks on (0: OpenMP's default), or None where it cannot say (a library
    built before it could, a module of another kind): its reruns then keep their blocks in parallel."""
    try:
        return module.os_threads
    except (AttributeError, RuntimeError):
        return None


def _first_difference(before: list, after: list, names: list):
    """``(name, how many changed, of how many, the first one's index, its value before, after)`` for the first
    output that changed beyond its tolerance, or None."""
    for old, new, name in zip(before, after, names):
        change = first_change(_changed(old, new), old, new)
        if change is not None:
            count, index, was, now = change
            return name, count, old.numel(), index, was, now
    return None


def _not_reproducible(name, count, numel, index, was, now, pinned: bool, wrote_outside: bool = False) -> str:
    how = " (the blocks one after another)" if pinned else ""
    # a kernel without its bounds check (Lab 1's depthwise without `if (ow >= W || oh >= H) return;`) lets the
    # threads past the edge of a row or plane write the next one, which another block owns: that race is the
    # missing check, and the same run wrote past the output's end
    spill = (" Here the same run also wrote past the end of an output: threads past the edge of a row or plane "
             "(no bounds check on their index) write into the next one, which another block computes, and whichever "
             "block writes last wins. Check each index against its own size before the store."
             if wrote_outside else "")
    return (f"the result is not the same from run to run: run again on the same inputs, with the threads of each "
            f"block in the same order{how}, `{name}` changes at {count} of {plural(numel, 'element')} (first "
            f"{format_index(name, index)}: {format_value(was)}, then {format_value(now)}). Either blocks race with "
            f"each other (they run at the same time, on a GPU as on the CPU's cores here): several blocks write "
            f"the same element, or add to it with `+=` where `atomicAdd` belongs. Or the code keeps something "
            f"from one call to the next: a buffer (from `torch.empty`, or made once and kept) read before this "
            f"call writes it, an accumulator that is never reset to 0, a `static` or `__device__` variable.{spill}")


def _changed(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """Elements that differ by more than the output dtype's tolerance (NaN against NaN is no change)."""
    if not (before.is_floating_point() and after.is_floating_point()):
        return before != after
    a, b = before.double(), after.double()
    both_nan = torch.isnan(a) & torch.isnan(b)
    finite = a[torch.isfinite(a)]
    tolerance = tolerance_for(before.dtype)
    allowed = tolerance.absolute_for(float(finite.abs().max()) if finite.numel() else 0.0) + tolerance.rtol * a.abs()
    return ~both_nan & ~((a - b).abs() <= allowed)
