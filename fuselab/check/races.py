"""Is a failing case's result a race? Run it again with each block's threads in another order and compare.

Under the CPU emulation the threads of a block run one after another between barriers, in an order the module
sets (``set_thread_order``). A correct kernel computes the same result in any order; a kernel whose threads
share memory without a ``__syncthreads()`` between a write and another thread's read computes a different one.
So a result that changes with the order is a race, shown by the data and not guessed from the source. Only
kernels the emulation ran in this process can be rerun so (``fuselab.launch_record``).
"""

import torch

from .formatting import format_index, format_value, plural
from .poison import GuardedOutput, first_change, guarded_input
from .tolerance import tolerance_for


def order_dependence(candidate, originals: dict, inputs: tuple, specs: list, first: list, names: list,
                     modules: list) -> str:
    """A sentence when rerunning ``candidate`` with the threads in another order changes an output beyond its
    tolerance, else "". ``first``: the outputs of the first run; ``originals``: the inputs as they were before it."""
    emulated = [m for m in modules if getattr(m, "emulated", False)]
    if not emulated or not first:
        return ""
    saved = [(module, module.thread_order) for module in emulated]
    other = "forward" if saved[0][1][0] == "reverse" else "reverse"
    fresh = tuple(guarded_input(originals[i].clone()) if i in originals else item for i, item in enumerate(inputs))
    outputs = [GuardedOutput(shape, dtype, first[0].device) for shape, dtype in specs]
    try:
        for module, _ in saved:
            module.set_thread_order(other)
        with torch.no_grad():
            candidate(*fresh, *(o.view for o in outputs))
    except Exception:  # noqa: BLE001 - the first run's failure is what the report is about
        return ""
    finally:
        for module, (order, seed) in saved:
            module.set_thread_order(order, seed)
    for before, after, name in zip(first, (o.view for o in outputs), names):
        change = first_change(_changed(before, after), before, after)
        if change is None:
            continue
        count, index, was, now = change
        return (f"the result depends on the order the threads of a block run in: run again with them in {other} "
                f"order (the module's `set_thread_order(\"{other}\")`), `{name}` changes at "
                f"{count} of {plural(before.numel(), 'element')} (first {format_index(name, index)}: "
                f"{format_value(was)}, then {format_value(now)}). A correct kernel gives one result in any order: "
                f"this is a race between the threads of a block. One thread reads shared memory that another "
                f"writes, with no `__syncthreads()` between the write and the read: a tile read before every "
                f"thread has loaded its part, or overwritten by the next iteration's loads while others still "
                f"read it (a tiled loop needs a barrier after the loads and another after the loop body).")
    return ""


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
