"""``check``: run a candidate over shapes × seeds and judge every output against a float64 reference."""

import inspect

import torch

from .. import launch_record
from ..native_check import NativeCodeRefused
from .outputs import compare
from .errors import CheckFailed
from .formatting import format_index, format_value, plural
from .poison import GuardedOutput, bits_differ, first_change, guarded_input
from .races import order_dependence
from .reference import run_reference
from .report import CaseResult, CheckResult


def check(
    candidate,
    reference,
    make_inputs,
    shapes,
    seeds=(0, 1, 2),
    *,
    atol: float | None = None,
    rtol: float | None = None,
    name: str | None = None,
    outputs: str = "write",
    out_dtype=None,
    raise_on_fail: bool = True,
    verbose: bool = True,
) -> CheckResult:
    """Check ``candidate`` against ``reference`` on every shape in ``shapes`` and every seed in ``seeds``.

    candidate    ``candidate(*inputs, *outs)`` writes its results into the output tensors it is given
                 (``outputs="write"``, the default), or ``candidate(*inputs)`` returns them (``outputs="return"``).
    reference    ``reference(*inputs)`` returns a tensor or a tuple of tensors. It is called on float64 copies of the
                 inputs, with float64 as torch's default dtype and TF32 off.
    make_inputs  ``make_inputs(shape, seed)`` returns a tuple of inputs (tensors on the device to test, in the dtype to
                 test; other values such as ``eps`` pass through). torch's global RNG is seeded with ``seed`` around the
                 call (and restored after), so ``torch.randn`` inside it is reproducible.
    shapes       a list of anything ``make_inputs`` understands: tuples, dicts. A case built to catch one bug can say
                 so: a ``hint`` attribute (a string, e.g. a class attribute of a named tuple) is added to the report
                 of that case when its values are wrong.

    Outputs take their shapes from the reference's results and their dtype from the first floating input (integer
    results keep theirs); ``out_dtype`` (one dtype, or one per output) overrides it. With ``outputs="write"`` each
    output is poisoned (so unwritten elements show) and surrounded by poisoned guard bands (so out-of-bounds writes
    show); returned outputs get neither. Inputs must come back bitwise unchanged.

    Returns a ``CheckResult``. If a case fails and ``raise_on_fail`` (the default), raises ``CheckFailed`` (an
    ``AssertionError``) whose message is the report. With ``verbose`` (the default) one line goes to stdout as the
    check finishes: ✓/✗, the name, the cases passed and the worst error, so that every check of a test cell shows;
    the details come only with a failure. Nothing ever goes to stderr (nbgrader scores a cell that writes there 0).
    An exception raised by the candidate fails its case (and is chained to ``CheckFailed``); on a GPU the remaining
    cases are skipped, since a CUDA fault is sticky. A ``NameError`` stops the check at once: a name the candidate
    needs is missing (a build cell above failed or did not run), and every other case would say the same.
    Exceptions from ``make_inputs`` or ``reference`` propagate unchanged: they are the lab author's bugs.
    """
    if outputs not in ("write", "return"):
        raise ValueError(f'outputs must be "write" (the candidate writes into outputs it is given) or "return", not {outputs!r}')
    shapes, seeds = list(shapes), list(seeds)
    if not shapes or not seeds:
        raise ValueError("check needs at least one shape and one seed")
    if name is None:
        name = getattr(candidate, "__name__", "candidate")
        name = "candidate" if name == "<lambda>" else name

    result = CheckResult(name)
    for shape in shapes:
        for seed in seeds:
            # one rerun in another thread order per check: the first case with wrong values says if it is a race
            probe = not any(case.reran for case in result.cases)
            case, device = _run_case(candidate, reference, make_inputs, shape, seed, atol, rtol, name, outputs,
                                     out_dtype, probe)
            result.cases.append(case)
            if isinstance(case.exception, NameError):
                result.could_not_run = _missing_name_note(case.exception)
                break
            if case.error and device.type != "cpu":
                # An illegal address on a GPU is sticky: every later call in this process would fail the same way.
                result.notes.append(f"stopped after {case.label}: the candidate raised an error on {device.type}")
                break
        else:
            continue
        break

    _drop_untrue_hints(result)
    if verbose:
        print(result.headline())
        result.announced = True
    if raise_on_fail and not result.passed:
        first_exception = next((case.exception for case in result.cases if case.exception is not None), None)
        raise CheckFailed(result.report(), result) from first_exception
    return result


def _drop_untrue_hints(result: CheckResult) -> None:
    """Drop the "nothing was written to `out`" hint (did the kernel launch? every index lands outside?) from the
    cases where no element of `out` was written, when another failing case wrote some: it is true of the failures
    only if none did. A bound one short (`i < n - 1`) leaves a 1-element output unwritten, and the hint sent the
    student looking at the launch; the larger cases' own hints say where the writes stop."""
    failing = [c for case in result.failures for c in case.comparisons if not c.problem and c.numel]
    written = {c.name for c in failing if c.n_not_written < c.numel}
    for comparison in failing:
        if comparison.name in written and comparison.n_not_written == comparison.numel:
            comparison.hint = ""


def _missing_name_note(exc: NameError) -> str:
    name = getattr(exc, "name", None)
    what = f"`{name}`" if name else "that name"
    from ..cell_hints import explain_missing
    known = explain_missing(name)
    if known:
        return f"{exc}. {known}"
    return (f"{exc}. {what} is made by a cell above this one, which failed or has not run yet (a build cell "
            f"whose error scrolled by?). Run the cells above in order (Run > Run All Above Selected Cell), fix "
            f"the first error there, then run this cell again.")


def _run_case(candidate, reference, make_inputs, shape, seed, atol, rtol, name, outputs, out_dtype, probe=False):
    inputs = _make_inputs(make_inputs, shape, seed)
    device = _device_of(inputs)
    expected = run_reference(reference, inputs, device)
    specs = _output_specs(expected, inputs, out_dtype)
    input_names, output_names = _argument_names(candidate, len(inputs), len(expected), outputs)
    case = CaseResult(name=name, shape=shape, seed=seed, hint=_case_hint(shape))

    inputs = tuple(guarded_input(item) for item in inputs)  # NaN around each input: reads past it show
    originals = {i: item.clone() for i, item in enumerate(inputs) if isinstance(item, torch.Tensor)}
    guarded = [GuardedOutput(out_shape, dtype, device) for out_shape, dtype in specs] if outputs == "write" else []
    try:
        with torch.no_grad(), launch_record.recording() as launched:
            returned = candidate(*inputs, *(g.view for g in guarded))
        _synchronize(device)
    except NativeCodeRefused:
        raise  # the grader would not load the library: one message for the test, not one per case
    except Exception as exc:  # the student's bug, reported as this case's failure (and chained by check)
        case.error = f"{type(exc).__name__}: {exc}".rstrip(": ")
        case.exception = exc
        return case, device

    case.problems += _changed_inputs(originals, inputs, input_names)
    outside = [0] * len(expected)  # elements written out of bounds, per output
    if outputs == "write":
        got = [g.view for g in guarded]
        for position, (output, out_name) in enumerate(zip(guarded, output_names)):
            damage = output.damage()
            if damage.any:
                case.problems.append(damage.describe(out_name, output.shape))
                outside[position] = damage.before_count + damage.after_count
    else:
        got, problems = _returned_outputs(returned, specs, device)
        case.problems += problems
    named_inputs = {n: item for n, item in zip(input_names, inputs) if isinstance(item, torch.Tensor)}
    for position, (got_tensor, expected_tensor, out_name, wrote_outside) in enumerate(
            zip(got, expected, output_names, outside)):
        if got_tensor is not None:
            case.comparisons.append(compare(got_tensor, expected_tensor, atol, rtol, name=out_name,
                                            inputs=named_inputs, wrote_outside=wrote_outside,
                                            recompute=_recompute(reference, inputs, input_names, position, device)))
    if not case.passed:
        case.emulation_notes += launched.barrier_notes
        if probe and outputs == "write" and any(not c.passed and not c.problem for c in case.comparisons):
            case.reran = bool(launched.modules)
            race = order_dependence(candidate, originals, inputs, specs, got, output_names, launched.modules,
                                    wrote_outside=any(outside))
            if race:
                case.emulation_notes.append(race)
    return case, device


def _recompute(reference, inputs, input_names, position, device):
    """The reference's output ``position`` with some inputs replaced by name: what a hint tests a bug against."""
    def recompute(changed: dict) -> torch.Tensor:
        replaced = tuple(changed.get(name, item) for name, item in zip(input_names, inputs))
        return run_reference(reference, replaced, device)[position]
    return recompute


def _case_hint(shape) -> str:
    """What a case built for one bug says when it fails (its ``hint`` attribute), or ""."""
    hint = getattr(shape, "hint", "")
    return hint if isinstance(hint, str) else ""


def _make_inputs(make_inputs, shape, seed) -> tuple:
    cuda_devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda_devices):
        torch.manual_seed(seed)
        made = make_inputs(shape, seed)
    return tuple(made) if isinstance(made, (tuple, list)) else (made,)


def _device_of(inputs) -> torch.device:
    for item in inputs:
        if isinstance(item, torch.Tensor):
            return item.device
    return torch.device("cpu")


def _output_specs(expected, inputs, out_dtype) -> list:
    """(shape, dtype) of each output: the reference's shape; floats in the inputs' dtype unless out_dtype says."""
    if out_dtype is None or isinstance(out_dtype, torch.dtype):
        dtypes = [out_dtype] * len(expected)
    else:
        dtypes = list(out_dtype)
        if len(dtypes) != len(expected):
            raise ValueError(f"out_dtype names {len(dtypes)} dtypes but the reference returns {len(expected)} outputs")
    input_dtype = next(
        (item.dtype for item in inputs if isinstance(item, torch.Tensor) and item.is_floating_point()), torch.float32
    )
    specs = []
    for output, dtype in zip(expected, dtypes):
        if dtype is None:
            dtype = input_dtype if output.is_floating_point() else output.dtype
        specs.append((tuple(output.shape), dtype))
    return specs


def _argument_names(candidate, n_inputs, n_outputs, outputs):
    """The candidate's own parameter names when it has them, so reports say `y` where the student wrote `y`."""
    input_names = [f"input {i}" for i in range(n_inputs)]
    output_names = ["out"] if n_outputs == 1 else [f"out{i}" for i in range(n_outputs)]
    try:
        parameters = list(inspect.signature(candidate).parameters.values())
    except (TypeError, ValueError):
        return input_names, output_names
    if any(p.kind == p.VAR_POSITIONAL for p in parameters):
        return input_names, output_names  # `def f(*args)`: its names say nothing about the arguments
    positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= n_inputs:
        input_names = positional[:n_inputs]
    if outputs == "write" and len(positional) >= n_inputs + n_outputs:
        output_names = positional[n_inputs : n_inputs + n_outputs]
    return input_names, output_names


def _changed_inputs(originals: dict, inputs: tuple, names: list) -> list:
    problems = []
    for position, before in originals.items():
        after, name = inputs[position], names[position]
        named = not name.startswith("input ")
        label = f"input `{name}`" if named else name
        if tuple(after.shape) != tuple(before.shape) or after.dtype != before.dtype:
            problems.append(f"{label} was changed in place: now {after.dtype} of shape {tuple(after.shape)}")
            continue
        change = first_change(bits_differ(before, after), before, after)
        if change is None:
            continue
        count, index, was, now = change
        where = format_index(name, index) if named else f"index {index}"
        problems.append(
            f"{label} was modified: {count} of {plural(after.numel(), 'element')} changed "
            f"(first {where}: was {format_value(was)}, now {format_value(now)}). "
            "A kernel must leave its inputs alone (an in-place ReLU on an input that is still needed?)."
        )
    return problems


def _returned_outputs(returned, specs, device):
    """Match what an ``outputs="return"`` candidate returned with the expected outputs; list what is off."""
    values = list(returned) if isinstance(returned, (tuple, list)) else [returned]
    if len(values) != len(specs):
        return [None] * len(specs), [f"returned {plural(len(values), 'value')}, expected {len(specs)}"]
    got, problems = [], []
    for position, (value, (shape, dtype)) in enumerate(zip(values, specs)):
        what = "the result" if len(specs) == 1 else f"result {position}"
        if not isinstance(value, torch.Tensor):
            problems.append(f"{what} is a {type(value).__name__}, expected a tensor")
            got.append(None)
            continue
        if value.dtype != dtype:
            problems.append(f"{what} is {value.dtype}, expected {dtype}")
        if value.device != device:
            problems.append(f"{what} is on {value.device}, expected {device}")
        got.append(value.detach())
    return got, problems


def _synchronize(device: torch.device) -> None:
    """Wait for the candidate's kernels, so that an asynchronous error belongs to this case."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type != "cpu" and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize(device)
