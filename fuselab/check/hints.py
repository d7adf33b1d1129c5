"""A short hint when the wrong elements form a pattern a student can act on.

Each rule looks at where the bad elements are and how they are wrong, and returns a sentence or "".
The first rule that fires wins, so the rules run from the most specific to the most general.
All tensors are float64 (``got`` and ``expected``), ``bad``/``not_written`` are bool masks of the same shape,
and ``allowed`` is the per-element tolerance.
"""

from dataclasses import dataclass, field
from typing import Callable

import torch

from .formatting import format_index, format_value, plural
from .tolerance import tolerance_for


@dataclass
class Evidence:
    got: torch.Tensor
    expected: torch.Tensor
    bad: torch.Tensor
    not_written: torch.Tensor
    allowed: torch.Tensor
    name: str
    dtype: torch.dtype
    inputs: dict = field(default_factory=dict)  # the inputs by name, for hints that relate the error to them
    wrote_outside: int = 0  # elements written out of bounds, in the guard bands around the output
    # the reference's value of this output from changed inputs, ``recompute({name: tensor})`` (float64), for hints
    # that test what a bug would have computed; None where there is no reference to rerun (``compare`` alone)
    recompute: Callable | None = None

    def close(self, got, expected, allowed) -> bool:
        return bool(((got - expected).abs() <= allowed).all())


def hint_for(evidence: Evidence) -> str:
    if not bool(evidence.bad.any()):
        return ""
    for rule in _RULES:
        hint = rule(evidence)
        if hint:
            return hint
    return ""


def _nothing_written(ev: Evidence) -> str:
    if not bool(ev.not_written.all()):
        return ""
    if ev.wrote_outside:
        return (f"nothing was written inside `{ev.name}`, but {plural(ev.wrote_outside, 'element')} around it "
                f"{'was' if ev.wrote_outside == 1 else 'were'}: every thread's index lands outside `{ev.name}`. An "
                f"index that is too large for every thread does that: a size (N, C, K, ...) where an index "
                f"belongs (an index runs from 0 to its size - 1: the batch or plane index from `blockIdx.z`, a "
                f"channel from `blockIdx.y`), or an offset added twice.")
    return (
        f"nothing was written to `{ev.name}`. Did the kernel launch (a grid of 0 blocks, a launch error)? "
        f"Does it write through the output pointer? In Python, `{ev.name} = ...` only rebinds the name: "
        f"write into the tensor with `{ev.name}.copy_(...)` or `{ev.name}[...] = ...`."
    )


def _what(ev: Evidence) -> str:
    """"never written" when every bad element still holds the poison, else "wrong"."""
    return "never written" if bool((ev.not_written | ~ev.bad).all()) else "wrong"


# Block sizes students use: a power of two from one warp to the 1024-thread limit.
_BLOCK_SIZES = {32, 64, 128, 256, 512, 1024}


def _only_the_first_along_a_dimension(ev: Evidence) -> str:
    """Index 0 along a dimension before the last two (the batch, the channels), or the first plane of them, right,
    every other index wrong: every thread works on the first item, as when that index is a constant or a size
    instead of coming from the grid (``blockIdx.z``), or the grid has one block along the axis that walks it. Where
    the other items are written, but wrong, the threads reach them: each item's offset (a stride) is wrong."""
    shape = tuple(ev.bad.shape)
    # (description, how to bring that dimension or those dimensions to the front, flattened)
    views = [(f"index 0 along dimension {d}", d, lambda t, d=d: t.movedim(d, 0)) for d in range(len(shape) - 2)]
    views += [(f"the first plane: index 0 along each of dimensions 0 to {lead - 1}", lead, None)
              for lead in range(2, len(shape) - 1)]
    for what, where, front in views:
        if front is None:  # the first `where` dimensions, flattened
            items = 1
            for size in shape[:where]:
                items *= size
            first = format_index(ev.name, (0,) * where)
            front = lambda t: t  # noqa: E731 - already in front
        else:
            items = shape[where]
            first = f"{ev.name}[" + ", ".join("0" if d == where else ":" for d in range(where + 1)) + "]"
        rest = ev.bad.numel() // items if items else 0
        if items < 2 or rest < _FEW:
            continue
        bad, got, expected, allowed = (front(t).reshape(items, rest) for t in (ev.bad, ev.got, ev.expected, ev.allowed))
        if bool(bad[0].any()) or not bool(bad[1:].all()):
            continue
        one = items == 2
        others = f"the other {items - 1} {'index' if one else 'indices'} along it" if "plane" not in what else \
            f"the other {items - 1} of the {items} planes"
        if bool(front(ev.not_written).reshape(items, rest)[1:].all()):
            how = "is never written" if one else "are never written"
        elif ev.close(got[1:], expected[0].expand(items - 1, rest), allowed[1:]):
            how = f"{'holds' if one else 'each hold'} what `{first}` should hold"
        else:
            # elements past the first item are written (so the threads reach them), but only the first item is
            # right: where each item's data is found goes wrong, and the first item's offset is 0 whatever its stride
            unwritten = bool(front(ev.not_written).reshape(items, rest)[1:].any())
            state = "wrong (some never written)" if unwritten else "written, but wrong"
            # along the channels (dimension 1 of an N, C, ... output), each channel has its own weights and bias:
            # a channel index that is 0 for every thread (`p / C` for `p % C`) computes every channel with channel
            # 0's, its offsets all right, and shows the same pattern
            channels = (" Or every channel is computed with channel 0's weights and bias: check the channel index "
                        "they are read with (`p % C` for a plane p = n * C + c, not `p / C`)."
                        if where == 1 and "plane" not in what and len(shape) >= 3 else "")
            return (f"only `{first}` ({what}) is right; {others} {'is' if one else 'are'} {state}: the threads "
                    f"reach the other items, and only the first, whose offset is 0 whatever the stride, is right. "
                    f"The offset of each item is computed wrongly: check the stride its index is multiplied by (the "
                    f"number of elements one item holds: the product of the sizes after it, such as C * H * W for "
                    f"an (N, C, H, W) tensor, not H * W) and the offset added to each pointer, inputs and output "
                    f"alike.{channels}")
        return (f"only `{first}` ({what}) is right; {others} {how}: every thread works on the first one. Its index "
                f"is 0 or the same for every thread (a size such as N, C or K where an index belongs), or the grid "
                f"has a single block along the axis that walks it (as when the grid's axes are swapped). Take that "
                f"index from the grid (`blockIdx.z` for a grid whose z dimension has one block per item, as "
                f"`dim3 grid(x, y, N)` gives), and launch that many blocks along it.")
    return ""


# Rerunning the reference once per channel costs channels × elements: beyond this, no hint is worth the wait.
_CHANNEL_RERUN_BUDGET = 5e7


def _channel_index_wrong(ev: Evidence) -> str:
    """Every wrong element of an (N, C, ...) output is what the reference gives at that position with the per-channel
    inputs (weights, bias, BN's scale and shift: a tensor whose first dimension is C) of *another* channel: the
    kernel reads them with a wrong channel index (``p / C`` for ``p % C`` with a plane p = n * C + c, the flat index
    where the plane's belongs). Tested, not guessed: the reference reruns with each channel's values in every
    channel, and a wrong value must equal one of those, in values the ReLU did not cut to 0."""
    got, bad = ev.got, ev.bad
    if ev.recompute is None or got.dim() < 3 or got.shape[1] < 2 or got.shape[0] < 1:
        return ""
    channels = got.shape[1]
    per_channel = {name: t for name, t in ev.inputs.items()
                   if isinstance(t, torch.Tensor) and t.is_floating_point() and 1 <= t.dim() <= got.dim()
                   and t.shape[0] == channels and tuple(t.shape) != tuple(got.shape)
                   and (t.dim() < got.dim() or t.shape[0] != got.shape[0])}
    wrong = bad & ~ev.not_written & torch.isfinite(got)
    if not per_channel or int(wrong.sum()) < _FEW or channels * got.numel() > _CHANNEL_RERUN_BUDGET:
        return ""
    own = torch.arange(channels, device=got.device).reshape((1, channels) + (1,) * (got.dim() - 2)).expand_as(got)
    tolerance = tolerance_for(ev.dtype)
    explained = torch.zeros_like(wrong)
    source = torch.full(got.shape, -1, dtype=torch.long, device=got.device)  # the other channel that fits best
    fit = torch.full(got.shape, float("inf"), dtype=torch.float64, device=got.device)  # its error / allowed
    whole = []  # channels whose values give got at every element (an all-zero output under a ReLU)
    planes = (got.shape[0], channels, -1)
    for s in range(channels):
        changed = {name: t[s:s + 1].expand(t.shape).contiguous() for name, t in per_channel.items()}
        try:
            value = ev.recompute(changed).to(got.device, torch.float64)
        except Exception:  # noqa: BLE001 - a reference that cannot take these inputs: no hint, never an error
            return ""
        if tuple(value.shape) != tuple(got.shape):
            return ""
        # each (n, c) plane's own scale: one channel's large values (a tiny variance) loosen no other plane's
        scale = torch.nan_to_num(value, nan=0.0, posinf=0.0, neginf=0.0).abs().reshape(planes).amax(dim=2)
        scale = scale.reshape(planes[:2] + (1,) * (got.dim() - 2)).expand_as(got)
        absolute = (tolerance.atol_scale * scale).clamp_min(tolerance.atol_floor)
        allowed = torch.maximum(ev.allowed, 4 * (absolute + tolerance.rtol * value.abs()))
        ratio = ((got - value).abs() / allowed.clamp_min(1e-300)).nan_to_num(nan=float("inf"))
        close = ratio <= 1
        if bool(close.all()):
            whole.append(s)
        other = close & (own != s)
        explained |= other
        better = other & (got != 0) & (ratio < fit)
        source, fit = torch.where(better, s, source), torch.where(better, ratio, fit)
    if not bool(explained[wrong].all()):
        return ""
    told = wrong & (source >= 0)  # wrong values the ReLU did not cut to 0: the evidence
    names = ", ".join(f"`{name}`" for name in per_channel)
    fix = ("The per-channel values (weights, bias, a BN's scale and shift) were applied from the wrong channel: "
           "check the channel index they are read with. For a plane index p = n * C + c (one (n, c) plane of "
           "H * W elements), the channel is `p % C`; `p / C` is the batch index n. From a flat index i, the "
           "channel is `(i / (H * W)) % C`, not `i % C`.")
    if int(told.sum()) < _FEW:
        zero = _all_zero(ev) if bool((got == 0).all()) and whole else ""
        if zero:
            # a ReLU cut every value: the whole output is the only evidence, and it fits two causes; the rerun
            # shows that one of them computes exactly this, so it comes first, and the usual guess follows
            said = f"every element of `{ev.name}` is 0"
            for joint in (", and ", ": "):
                zero = zero[len(said + joint):] if zero.startswith(said + joint) else zero
            return (f"{said}, and so is what channel {whole[0]}'s per-channel values ({names}) give at every "
                    f"position of this case. Is every channel computed with channel {whole[0]}'s values? {fix} "
                    f"Otherwise: {zero}")
        return ""
    index = torch.nonzero(told)
    s = source[told]
    n, c = index[:, 0], index[:, 1]
    first = tuple(int(v) for v in index[0])
    example = (f"`{format_index(ev.name, first)}` (n = {first[0]}, channel {first[1]}) holds what channel "
               f"{int(s[0])}'s values give there")
    if got.shape[0] > 1 and bool((s == n).all()):
        pattern = ("every wrong element holds what channel n's values give, n its batch index: the channel index "
                   "is the batch index (`p / C` where `p % C` belongs?)")
    elif bool((s == s[0]).all()):
        batch = (" (with N = 1 the batch index n is 0 too: `p / C`, where `p % C` belongs, gives it)"
                 if got.shape[0] == 1 and int(s[0]) == 0 else "")
        pattern = (f"every wrong element holds what channel {int(s[0])}'s values give: the channel index is the "
                   f"same for every thread{batch}")
    else:
        planes = n * channels + c
        varies = any(len(set(s[planes == p].tolist())) > 1 for p in planes.unique().tolist()[:64])
        pattern = ("within one (n, c) plane the channel changes from element to element: the channel index comes "
                   "from the element's position (`i % C` of a flat index?), not from its plane" if varies else
                   "each (n, c) plane holds another channel's values")
    return (f"every wrong element of `{ev.name}` is what the reference gives at that position with another "
            f"channel's per-channel values ({names}): {example}; {pattern}. {fix}")


def _tail_start(bad: torch.Tensor, dim: int):
    """The index from which every element along ``dim`` is bad and before which none is, or None."""
    size = bad.shape[dim]
    others = [d for d in range(bad.dim()) if d != dim]
    any_bad = bad.any(dim=others) if others else bad
    all_bad = bad.all(dim=others) if others else bad
    start = int(any_bad.to(torch.uint8).argmax())
    if start == 0 or not bool(all_bad[start:].all()) or start >= size:
        return None
    return start


def _two_indices_swapped(ev: Evidence) -> str:
    """A dimension never written from the size of another dimension on, while elements past the output were
    written: the two indices (or the grid axes or sizes they come from) are swapped, so one stops at the other's
    size and the other runs past its own."""
    bad, shape = ev.bad, tuple(ev.bad.shape)
    if not ev.wrote_outside or not bool(ev.not_written[bad].all()):
        return ""
    for dim, size in enumerate(shape):
        start = _tail_start(bad, dim) if size >= 2 else None
        other = next((d for d, s in enumerate(shape) if d != dim and s == start), None) if start else None
        if other is None:
            continue
        return (f"everything from index {start} on along dimension {dim} (size {size}) is never written, {start} "
                f"is the size of dimension {other}, and elements past `{ev.name}` were written: the index along "
                f"dimension {dim} stops where dimension {other}'s should, and dimension {other}'s runs past its "
                f"end. Are the two indices swapped (each taken from the grid axis, such as `blockIdx.y` or "
                f"`blockIdx.z`, or the size that belongs to the other)?")
    return ""


def _one_block_in_every_plane(ev: Evidence) -> str:
    """Within every plane (the trailing dimensions an index is flattened over, as ``pq`` runs over an (n, k) plane's
    P * Q pixels), exactly the first k elements written, k one block of threads, and the rest of every plane never
    written, in two planes or more: every block along the axis that walks the plane writes the same first k
    elements, as when the index is ``threadIdx.x`` alone. The whole tensor's flat index stops nowhere, and a stop
    at a row of one plane reads as a short grid along that dimension."""
    bad, shape = ev.bad, tuple(ev.bad.shape)
    if not bool(ev.not_written[bad].all()):
        return ""
    for lead in range(1, len(shape) - 1):  # dimensions lead.. are one plane, flattened: two or more of them
        planes = 1
        for size in shape[:lead]:
            planes *= size
        plane = bad.numel() // planes if planes else 0
        if planes < 2 or plane < 2:
            continue
        rows = bad.reshape(planes, plane)
        k = int(rows[0].to(torch.uint8).argmax())
        if k not in _BLOCK_SIZES or k >= plane or bool(rows[:, :k].any()) or not bool(rows[:, k:].all()):
            continue
        dims = f"dimensions {lead} to {len(shape) - 1}"
        return (f"in each of the {planes} planes of `{ev.name}` ({dims}, flattened: {plane} elements each), the "
                f"first {k} elements are right and everything from element {k} on is never written, the same in "
                f"every plane. {k} is one block of {k} threads: the index does not use blockIdx (everything from "
                f"one block's worth on, in every plane, is unwritten). `pq = threadIdx.x` (or a loop that starts "
                f"at threadIdx.x and stops at blockDim.x) makes every block along the plane write the same first "
                f"{k} elements: use `pq = blockIdx.x * blockDim.x + threadIdx.x`, with (P * Q + block - 1) / block "
                f"blocks. (If {k} is a whole number of your blocks instead, the grid has too few blocks along the "
                f"plane: round their number up.)")
    return ""


def _grid_axis_from_another_size(ev: Evidence) -> str:
    """Rows (or columns) from some index on never written, where that index is the other dimension's size rounded
    up to a block of two or more blocks: the grid's extent along this axis came from the other dimension, as when
    the grid's x and y are swapped. Where the data show no other size, the tail rules below say where it stops."""
    bad = ev.bad
    if bad.dim() < 2 or min(bad.shape[-2:]) < 1 or not bool(ev.not_written[bad].all()):
        return ""
    rows, cols = bad.dim() - 2, bad.dim() - 1
    for dim, other in ((rows, cols), (cols, rows)):
        start = _tail_start(bad, dim)
        if start is None:
            continue
        size, other_size = bad.shape[dim], bad.shape[other]
        rounded_down = _rounds_down_to(size, start)
        from_other = next((block for block in (8, 16, 32, 64, 128, 256, 512, 1024)
                           if start % block == 0 and start == -(-other_size // block) * block), None)
        if from_other is None:
            continue  # no other size in the data: a grid that rounds down, or a constant, says the tail rule
        what = "rows" if dim == rows else "columns"
        said = (f"`{ev.name}`'s {what} from index {start} on along dimension {dim} (size {size}) are never "
                f"written, and every one before is right")
        round_up = f"the number of blocks along it rounds down ({size} / block: round it up, (n + block - 1) / block)"
        if other_size <= from_other:
            # any size up to one block rounds up to it: one block along the axis, whatever size it came from
            if not rounded_down:
                continue  # a grid of one block (a constant?): no evidence of the other size
            # weak evidence, so the common cause comes first
            return (f"{said}: either {round_up}, or it was computed from the other dimension ({start} is its size, "
                    f"{other_size}, rounded up to a multiple of {from_other}). Are the grid's x and y swapped (x "
                    f"walks the columns, the last dimension; y the rows)?")
        why = (f"{start} is the other dimension's size ({other_size}, dimension {other}) rounded up to a "
               f"multiple of {from_other}: the grid's extent along this axis was computed from that size")
        also = f" (Or {round_up}.)" if rounded_down else ""
        return (f"{said}. {why}. Are the grid's x and y swapped? x walks the columns (the last dimension: "
                f"`blockIdx.x * blockDim.x + threadIdx.x`, with enough blocks for the columns), y the rows.{also}")
    return ""


def _rounds_down_to(size: int, start: int) -> bool:
    """Whether ``start`` is ``size`` rounded down to a multiple of some block (a block that divides ``start``): for
    a block b, size // b * b == start needs start <= size < start + b <= 2 * start, and b = start gives it then."""
    return start <= size < 2 * start


def _correct_only_below(ev: Evidence) -> str:
    """Right up to flat index k, wrong from k on: k is often one block's worth of threads (``i = threadIdx.x``)."""
    flat = ev.bad.flatten()
    k = int(flat.to(torch.uint8).argmax())
    if k == 0 or not bool(flat[k:].all()):
        return ""
    first = format_index(ev.name, torch.unravel_index(torch.tensor(k), ev.bad.shape))
    where = f"{first} on (flat index {k} and up)" if ev.bad.dim() > 1 else f"{first} on"
    said = (f"only the first {plural(k, 'element')} of `{ev.name}` in memory order {'is' if k == 1 else 'are'} "
            f"right; everything from {where} is {_what(ev)}")
    if not bool((ev.not_written & ev.bad).any()):
        # every wrong element was written: the grid reached it, and what it read or computed is wrong
        return (f"{said}, though written: the grid reaches them, so look at what each one reads. An index along "
                f"the wrong axis (a per-column value such as a bias read as bias[row] instead of bias[col], a "
                f"per-channel value read with the wrong channel) or a wrong stride gives exactly this.")
    if k not in _BLOCK_SIZES and not _rounds_down_to(flat.numel(), k):
        return ""  # neither one block nor a count of blocks rounded down: the tail rule says where it stops
    one_block = (f"{k} is one block of {k} threads: does the index use blockIdx? "
                 "`i = threadIdx.x` makes every block write the same first elements; "
                 "use `i = blockIdx.x * blockDim.x + threadIdx.x`")
    short_grid = ("the grid covers too few elements or a loop stops early (`<` vs `<=`, n rounded down): "
                  "round the number of blocks up, (n + block - 1) / block")
    if k in _BLOCK_SIZES:
        return f"{said}. {one_block}. (If {k} is a whole number of your blocks instead, {short_grid}.)"
    return f"{said}: {short_grid}. (If {k} is your block size, the index is missing blockIdx.)"


def _wrong_far_edge_read(ev: Evidence) -> str:
    """Every wrong element written, some NaN, and the wrong ones the far end of a row or column dimension (one of the
    last two): a bound at that edge (`ih > H`) reads past the input, into the NaN around it. The tail rule names
    the edge's bound, which the NaN hint (that runs before the other patterns) would only guess at."""
    if bool((ev.not_written & ev.bad).any()) or not bool((torch.isnan(ev.got) & ev.bad).any()):
        return ""
    return _tail_along_a_dimension(ev, dims=range(max(ev.bad.dim() - 2, 0), ev.bad.dim()))


def _tail_along_a_dimension(ev: Evidence, dims=None) -> str:
    bad = ev.bad
    for dim in (range(bad.dim()) if dims is None else dims):
        size = bad.shape[dim]
        if size < 2:
            continue
        start = _tail_start(bad, dim)
        if start is None or bad.numel() // size * (size - start) < 2:
            continue
        where = f"index {start} on along dimension {dim} (size {size})" if bad.dim() > 1 else f"`{ev.name}[{start}]` on"
        if not bool((ev.not_written & bad).any()):
            # written, but wrong: the grid reached them; what goes wrong is at the far edge itself
            return (
                f"everything from {where} is wrong, though written: the far edge of dimension {dim} gets wrong "
                f"values. Check the bounds conditions there (`ih >= H` written as `ih > H`, `<=` for `<`) and the "
                f"padding: an input index past the last row or column must count as 0, not be read."
            )
        if not _rounds_down_to(size, start):
            # a grid that rounds down stops less than one block short: this one stops further back
            return (f"everything from {where} is {_what(ev)}: your grid or loop stops at {start}, which is not "
                    f"{size} rounded down to a block size (a count of blocks that rounds down stops less than one "
                    f"block short). The number of blocks (or the loop's bound) along dimension {dim} does not come "
                    f"from its size, {size}: is it a constant, or a size that belongs to another dimension?")
        return (
            f"everything from {where} is {_what(ev)}: your grid or loop stops at {start}. "
            f"If {size} is not a multiple of your block size, round the number of blocks up: (n + block - 1) / block."
        )
    return ""


def _last_element_only(ev: Evidence) -> str:
    """Only the last element of a 1-D output wrong, though written (one element: no pattern for the rules after
    it): most often an input read one past its end (``a[i + 1]``, a neighbour), into the NaN the tests put around
    it, which a ReLU turns into 0 (so the ReLU rule would blame the ReLU)."""
    bad = ev.bad
    if bad.dim() != 1 or bad.numel() < 2 or int(bad.sum()) != 1 or not bool(bad[-1]) or bool(ev.not_written[-1]):
        return ""
    return (f"only the last element, `{ev.name}[{bad.numel() - 1}]`, is wrong, though written: does the kernel "
            "read one past the end of an input there (`a[i + 1]`, a neighbour)? The tests put NaN just past every "
            "input, and a NaN read comes out as anything after a ReLU (`fmaxf(NaN, 0.0f)` is 0).")


def _some_not_written(ev: Evidence) -> str:
    count = int(ev.not_written.sum())
    if count == 0:
        return ""
    return (
        f"{plural(count, 'element')} of `{ev.name}` still {'holds' if count == 1 else 'hold'} the poison fuselab put there: never written. "
        "Does every element get a thread (enough blocks, in every dimension) and does every thread write its element? "
        f"(A kernel that reads `{ev.name}` before writing it, like `out[i] += ...`, also leaves the poison.)"
    )


def _nan(ev: Evidence) -> str:
    """NaN the candidate wrote (not the poison of an element never written). It runs before the rules that read a
    pattern from where the wrong values are: inputs sit between NaN bands, so a NaN in the output is evidence of a
    read past an input (or of shared memory nobody wrote), and a wrong stride or a far edge read so shows it."""
    if not bool((torch.isnan(ev.got) & ev.bad & ~ev.not_written).any()):
        return ""
    return (
        "NaN (not-a-number) values: a 0/0, a sqrt or log of a negative number, or a read of memory nobody wrote "
        "(shared memory read before `__syncthreads()`), or an input read out of bounds (the tests put NaN just "
        "before and after every input, so a read past its end shows even where it is multiplied by 0)."
    )


def _inf(ev: Evidence) -> str:
    if not bool((torch.isinf(ev.got) & ev.bad).any()):
        return ""
    limit = f" ({ev.dtype} overflows above {format_value(float(torch.finfo(ev.dtype).max))})" if ev.dtype.is_floating_point else ""
    return f"infinite values: an overflow{limit} or a division by zero."


_FEW = 4  # fewer nonzero elements than this say nothing about a pattern: one output of 0 is also a ReLU's


def _all_zero(ev: Evidence) -> str:
    if not bool((ev.got == 0).all()) or int((ev.expected != 0).sum()) < _FEW:
        return ""
    if bool((ev.expected >= 0).all()) and 8 * int((ev.expected == 0).sum()) >= ev.expected.numel():
        # a ReLU's output (none negative, many exactly 0): fmaxf(NaN, 0) is 0, so a NaN read before the ReLU (an
        # input read past its end, into the NaN around it) leaves 0 as a negative value does
        return (f"every element of `{ev.name}` is 0, and the expected values are a ReLU's (none negative, many "
                f"exactly 0): a ReLU makes 0 of a negative value and of a NaN alike (`fmaxf(NaN, 0.0f)` is 0). "
                f"Was every value before the ReLU NaN? An input read out of bounds gives NaN (the tests put NaN "
                f"just before and after every input), and so does shared memory nobody wrote. Or is nothing "
                f"computed or stored?")
    return (
        f"every element of `{ev.name}` is 0: the kernel stores zeros. Is the result computed and stored? "
        "(In C, 1/2 == 0: integer division.)"
    )


def _per_index_value_on_the_wrong_axis(ev: Evidence) -> str:
    """A 1-D input with one value per column (or row) of the output, read with the other index (``bias[row]`` for
    ``bias[col]``, ``bias[i / N]`` for ``bias[i % N]``): where neither value was cut to 0 (by a ReLU), each element is
    off by exactly v[other index] - v[own index], and the diagonal, where the two indices are equal, is right. With
    a ReLU no error depends on one dimension and no element is off by a constant, so no other rule speaks."""
    got, expected = ev.got, ev.expected
    if got.dim() < 2 or min(got.shape[-2:]) < 2:
        return ""
    rows, cols = got.shape[-2], got.shape[-1]
    for name, values in ev.inputs.items():
        if not (isinstance(values, torch.Tensor) and values.dim() == 1 and values.is_floating_point()):
            continue
        v = values.detach().to("cpu", torch.float64).to(got.device)
        for own, other, wrong, right in ((-1, -2, "row", "col"), (-2, -1, "col", "row")):
            if v.numel() != got.shape[own]:
                continue
            reach = min(got.shape[other], v.numel())  # other indices past the input's end read its NaN band
            g, e, a, bad = (t.narrow(other, 0, reach) for t in (got, expected, ev.allowed, ev.bad))
            if own == -1:
                delta = v[:reach].unsqueeze(1) - v.unsqueeze(0)  # (row, col): v[row] - v[col]
            else:
                delta = v[:reach].unsqueeze(0) - v.unsqueeze(1)  # (row, col): v[col] - v[row]
            kept = (g != 0) & (e != 0) & torch.isfinite(g) & torch.isfinite(e)  # not cut to 0 by a ReLU
            if int(kept.sum()) < 2 * _FEW or int((kept & bad).sum()) < _FEW or not bool((delta != 0).any()):
                continue
            shifted = (e + delta.expand_as(e))[kept]
            if not ev.close(g[kept], shifted, a[kept]):
                continue
            per = "column" if own == -1 else "row"
            return (f"where neither value is cut to 0 (by the ReLU), each wrong element is off by exactly "
                    f"`{name}[{wrong}] - {name}[{right}]`, and the elements with {wrong} == {right} are right: "
                    f"`{name}` holds one value per {per} and is read with the {wrong} index: {name}[{wrong}] "
                    f"instead of {name}[{right}] (for a flat index i over a {rows} × {cols} output: "
                    f"{'i / N where i % N' if own == -1 else 'i % N where i / N'} belongs).")
    return ""


def _transposed(ev: Evidence) -> str:
    if ev.got.dim() < 2 or ev.got.shape[-1] < 2 or ev.got.shape[-2] < 2:
        return ""
    rows, cols = ev.got.shape[-2], ev.got.shape[-1]
    swapped = ev.got.reshape(*ev.got.shape[:-2], cols, rows).transpose(-1, -2)
    if not ev.close(swapped, ev.expected, ev.allowed):
        return ""
    return (
        "the right values are in the wrong places: it looks transposed. In row-major storage, "
        f"element (row, col) of a {rows}×{cols} matrix lives at row * {cols} + col."
    )


def _shifted_by_one(ev: Evidence) -> str:
    got, expected, allowed = ev.got, ev.expected, ev.allowed
    for dim in range(got.dim()):
        size = got.shape[dim]
        if size < 3:
            continue
        for offset, direction in ((1, "up"), (-1, "down")):
            g = got.narrow(dim, max(offset, 0), size - 1)
            e = expected.narrow(dim, max(-offset, 0), size - 1)
            a = allowed.narrow(dim, max(-offset, 0), size - 1)
            if ev.close(g, e, a):
                return (
                    f"the values look shifted by one along dimension {dim} (index {direction} by one): "
                    "an off-by-one in the index computation (a padding offset, a 1-based index)?"
                )
    return ""


def _relu(ev: Evidence) -> str:
    got, expected, bad = ev.got, ev.expected, ev.bad
    if bool(((expected == 0) & (got < 0) | ~bad).all()):
        return "negative values where 0 is expected: is the ReLU applied (and after the bias / BN, not before)?"
    if bool(((got == 0) & (expected < 0) | ~bad).all()):
        return "0 where negative values are expected: a ReLU where none belongs (or ReLU instead of LeakyReLU)?"
    return ""


def _border_only(ev: Evidence) -> str:
    bad = ev.bad
    # at least 5 wide (and high): in a 3×3 output 8 of the 9 elements are border, so any bug looks like one there
    if bad.dim() == 0 or min(bad.shape[-2:]) < 5:
        return ""
    border = torch.zeros_like(bad)
    border.narrow(-1, 0, 1).fill_(True)
    border.narrow(-1, bad.shape[-1] - 1, 1).fill_(True)
    if bad.dim() >= 2:
        border.narrow(-2, 0, 1).fill_(True)
        border.narrow(-2, bad.shape[-2] - 1, 1).fill_(True)
    # and only where that is telling: k bad elements scattered at random land all on the border with a chance of
    # about (border share)^k. Two bad elements of 7 (a typo'd input under a ReLU) sit on the border by chance 8 %
    # of the time, and the hint then sent a student to the padding while the larger cases were wrong everywhere
    if float(border.float().mean()) ** int(bad.sum()) > 0.01:
        return ""
    if not bool((bad & ~border).any()):
        what = "first/last row or column" if bad.dim() >= 2 else "first/last element"
        return f"only elements on the border ({what}) are wrong: check the padding and the bounds conditions at the edges."
    return ""


def _constant_error(ev: Evidence) -> str:
    bad = ev.bad
    got, expected, allowed = ev.got[bad], ev.expected[bad], ev.allowed[bad]
    if got.numel() < 4 or not bool(torch.isfinite(got).all()):
        return ""  # with fewer wrong values, any "pattern" is a coincidence
    offset = float((got - expected).median())
    if ev.close(got, expected + offset, allowed):
        return f"every wrong value is off by {format_value(offset)}: a bias or shift added twice, or missing?"
    if not bool((expected != 0).all()):
        return ""
    ratio = float((got / expected).median())
    if ratio != 0 and ev.close(got, expected * ratio, allowed * max(1.0, abs(ratio))):
        if bool((expected < 0).all()):
            return f"only negative values are wrong, all by a factor {format_value(ratio)}: check the LeakyReLU slope."
        return f"every wrong value is {format_value(ratio)} × the expected one: a scale factor missing or applied twice?"
    return ""


def _depends_on_one_dimension(ev: Evidence) -> str:
    got, expected = ev.got, ev.expected
    if sum(size >= 2 for size in got.shape) < 2 or not bool(torch.isfinite(got).all()):
        return ""  # with one non-trivial dimension, any error "depends only on" it
    error = got - expected
    for dim in range(got.dim()):
        if got.shape[dim] < 2:
            continue
        others = [d for d in range(got.dim()) if d != dim]
        per_index = error.mean(dim=others, keepdim=True)
        if ev.close(error, per_index.expand_as(error), ev.allowed):
            return (
                f"the error depends only on the index along dimension {dim}: a per-index term along that dimension "
                "(a bias, a BN scale or shift) is wrong, or broadcast along the wrong dimension."
            )
    return ""


# An error that follows an input: at least this many indices along the dimension (fewer make any ranking look
# strong), at least this many of them holding 90% of the error (one wrong index is the smallest or largest of some
# input by chance most of the time), and a rank correlation at least this strong between the input and the error.
_FOLLOWS_LENGTH, _FOLLOWS_WORST, _FOLLOWS_CORRELATION = 8, 3, 0.8


def _error_follows_an_input(ev: Evidence) -> str:
    """The error concentrated at the indices (along one dimension) where a per-index input is smallest (or
    largest), and growing with it: something that matters only for small values of it, such as eps added outside a
    square root (1/(sqrt(var) + eps) is close to 1/sqrt(var + eps) only where var is large). The error must rank
    with the input both as it is and relative to each index's own scale: a uniform error divided by a scale that
    follows the input (a BN output's, which grows as var shrinks) would follow it too."""
    got, expected = ev.got, ev.expected
    if got.dim() < 2 or not bool(torch.isfinite(got).all()) or not bool(torch.isfinite(expected).all()):
        return ""
    found = []  # (strength, hint)
    for name, values in ev.inputs.items():
        if not (isinstance(values, torch.Tensor) and values.dim() == 1 and values.is_floating_point()):
            continue
        length = values.numel()
        if length < _FOLLOWS_LENGTH or not bool(torch.isfinite(values).all()):
            continue
        values = values.detach().to("cpu", torch.float64)
        for dim in range(got.dim()):
            if got.shape[dim] != length:
                continue
            others = [d for d in range(got.dim()) if d != dim]
            absolute = (got - expected).abs().amax(dim=others).cpu()
            scale = expected.abs().amax(dim=others).cpu().clamp_min(1e-30)
            error = absolute / scale  # relative to each index's own scale
            total = float(error.sum())
            if total == 0:
                continue
            correlation = _rank_correlation(error, values)
            if abs(correlation) < _FOLLOWS_CORRELATION or \
                    _rank_correlation(absolute, values) * correlation < _FOLLOWS_CORRELATION * abs(correlation):
                continue  # not strong, or not so without the division by each index's scale
            order = torch.argsort(error, descending=True)
            share = torch.cumsum(error[order], 0) / total
            worst = order[: int((share < 0.9).sum()) + 1]
            rest = order[len(worst):]
            if len(worst) < _FOLLOWS_WORST or len(worst) > length // 2:
                continue
            if correlation < 0 and float(values[worst].max()) < float(values[rest].min()):
                side, bound = "smallest", f"{name} <= {format_value(float(values[worst].max()))}"
            elif correlation > 0 and float(values[worst].min()) > float(values[rest].max()):
                side, bound = "largest", f"{name} >= {format_value(float(values[worst].min()))}"
            else:
                continue
            cause = ("A constant added in the wrong place does that (for a variance: eps outside the square root, "
                     "1/(sqrtf(var) + eps) where rsqrtf(var + eps) belongs), or a division by it."
                     if side == "smallest" else f"Look at what the code computes from `{name}` where it is large.")
            where = f"{len(worst)} indices along dimension {dim} (of {length})"
            found.append((abs(correlation), (
                f"the error grows where `{name}` is {side}: 90% of it is at the {where} where {bound}, up to "
                f"{format_value(float(error[worst].max()))} relative to their values, and at most "
                f"{format_value(float(error[rest].max()))} elsewhere: something goes wrong only where `{name}` "
                f"is {'small' if side == 'smallest' else 'large'}. {cause}")))
    return max(found, key=lambda item: item[0])[1] if found else ""


def _rank_correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation of two 1-D tensors (ties ranked in order), 0 where either is constant."""
    ranks = torch.stack([t.argsort().argsort().double() for t in (a, b)])
    ranks -= ranks.mean(dim=1, keepdim=True)
    norm = float(ranks.norm(dim=1).prod())
    return float((ranks[0] * ranks[1]).sum()) / norm if norm else 0.0


def _half_precision_rounding(ev: Evidence) -> str:
    """A half-precision output a little off here and there: arithmetic done in half precision (an fp16 accumulator,
    the bias added in fp16, an intermediate rounded twice) instead of float with one rounding at the end."""
    if ev.dtype not in (torch.float16, torch.bfloat16):
        return ""
    bad = ev.bad
    error = (ev.got[bad] - ev.expected[bad]).abs()
    if not bool(torch.isfinite(error).all()) or not bool((error <= 8 * ev.allowed[bad]).all()):
        return ""
    kind = "fp16" if ev.dtype == torch.float16 else "bf16"
    convert = "__half2float / __float2half" if ev.dtype == torch.float16 else "__bfloat162float / __float2bfloat16"
    return (f"the wrong values are close to right (within a few times the tolerance) in a {kind} output: "
            f"rounding error. Is some arithmetic done in {kind} (a {kind} accumulator, the bias added in {kind}, a "
            f"value rounded to {kind} twice)? Convert to float on load, accumulate in a `float`, and round once, "
            f"at the store ({convert}).")


_RULES = (
    _nothing_written,
    _wrong_far_edge_read,
    _nan,
    _channel_index_wrong,
    _only_the_first_along_a_dimension,
    _two_indices_swapped,
    _one_block_in_every_plane,
    _grid_axis_from_another_size,
    _last_element_only,
    _correct_only_below,
    _tail_along_a_dimension,
    _some_not_written,
    _inf,
    _all_zero,
    _per_index_value_on_the_wrong_axis,
    _transposed,
    _border_only,
    _shifted_by_one,
    _relu,
    _constant_error,
    _depends_on_one_dimension,
    _error_follows_an_input,
    _half_precision_rounding,
)
