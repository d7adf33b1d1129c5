"""Poisoned output buffers with guard bands, and bitwise comparison of tensors.

Before the candidate runs, every output element holds a *poison* value: for floats a NaN whose bit pattern
(payload) no arithmetic produces by itself, for integers a sentinel. An element still holding the poison
afterwards was never written (or was computed from the output's own old contents, as in ``out += x``
without zeroing first: NaN payloads propagate).

Each output lives inside a larger poisoned buffer: ``guard`` elements before it and after it. The candidate
gets a contiguous view of the middle. Any guard element that changed was written out of bounds. This catches
what realistically happens: a kernel without a bounds check, or a grid rounded up, writing a few hundred
elements past the end. A write beyond the guard band lands in someone else's memory and cannot be seen here.

bool, complex and other dtypes get no poison and no guard band (there is no spare bit pattern to use).
"""

from dataclasses import dataclass

import torch

# Unsigned bit patterns. Float patterns are quiet NaNs (top mantissa bit set) so that nothing "quiets" them.
POISON_BITS = {
    torch.float64: 0x7FF8_DEAD_BEEF_CAFE,
    torch.float32: 0x7FCA_DEAD,
    torch.float16: 0x7EAD,
    torch.bfloat16: 0x7FED,
    torch.int64: 0xDEAD_BEEF_DEAD_BEEF,
    torch.int32: 0xDEAD_BEEF,
    torch.int16: 0xDEAD,
    torch.int8: 0xAD,
    torch.uint8: 0xAD,
}

_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# Guard bands are a multiple of this many elements, so that the view handed out keeps the buffer's alignment
# (>= 256 bytes for any element size) and vectorized loads/stores (float4, half2) stay legal.
_GUARD_ALIGN = 256
_GUARD_MIN = 4096
_GUARD_MAX = 1 << 20


def can_poison(dtype: torch.dtype) -> bool:
    return dtype in POISON_BITS


def _poison_value(dtype: torch.dtype) -> int:
    """The poison pattern as the integer that ``bits_of`` a poisoned element compares equal to."""
    bits = POISON_BITS[dtype]
    if dtype == torch.uint8:
        return bits
    width = torch.finfo(dtype).bits if dtype.is_floating_point else torch.iinfo(dtype).bits
    return bits - (1 << width) if bits >= 1 << (width - 1) else bits


def bits_of(t: torch.Tensor) -> torch.Tensor:
    """``t`` reinterpreted as integers of the same size, so that NaNs compare by bit pattern."""
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    if t.dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        return t
    return t.view(_SAME_SIZE_INT[t.element_size()])


def fill_poison(t: torch.Tensor) -> torch.Tensor:
    bits_of(t).fill_(_poison_value(t.dtype))
    return t


def poison_mask(t: torch.Tensor) -> torch.Tensor:
    """True where ``t`` holds exactly the poison pattern of its dtype (all False for unpoisonable dtypes)."""
    if not can_poison(t.dtype):
        return torch.zeros(t.shape, dtype=torch.bool, device=t.device)
    return bits_of(t) == _poison_value(t.dtype)


def bits_differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise "not bitwise identical" for two tensors of one shape and dtype (NaN-safe, -0.0 != 0.0)."""
    if a.element_size() in _SAME_SIZE_INT and not a.is_complex():
        return bits_of(a) != bits_of(b)
    both_nan = torch.isnan(a) & torch.isnan(b)
    return (a != b) & ~both_nan


def first_change(changed: torch.Tensor, before: torch.Tensor, after: torch.Tensor):
    """What a report says of a change: ``(how many changed, the first one's index, its value before, after)``, or
    None where ``changed`` (an elementwise mask over both) holds nowhere."""
    count = int(changed.sum())
    if count == 0:
        return None
    flat = int(changed.reshape(-1).to(torch.uint8).argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), after.shape)) if after.dim() else ()
    return count, index, before.reshape(-1)[flat].item(), after.reshape(-1)[flat].item()


def guard_size(numel: int) -> int:
    """Guard elements on each side: at least 4096 (a few rounded-up grids), up to the output's own size."""
    size = min(max(numel, _GUARD_MIN), _GUARD_MAX)
    return -(-size // _GUARD_ALIGN) * _GUARD_ALIGN


@dataclass
class GuardDamage:
    """Out-of-bounds writes seen in the guard bands of one output."""

    before_count: int = 0  # changed elements in the band before the output
    before_farthest: int = 0  # how far before the start the farthest one is (1 = the element just before)
    after_count: int = 0
    after_farthest: int = 0  # 1 = the element just past the end

    @property
    def any(self) -> bool:
        return self.before_count > 0 or self.after_count > 0

    def describe(self, name: str, shape=None) -> str:
        """What was written outside ``name``, and the bounds check that fits an output of ``shape``: one index
        against one size for a flat output, every index against its own size for a 2-D or larger one (a 2-D
        kernel that checks only the column writes whole rows past the end)."""
        parts = []
        if self.after_count:
            part = f"wrote {self.after_count} element{'s' if self.after_count != 1 else ''} past the end of `{name}`"
            if self.after_farthest != self.after_count:
                part += f" (the farthest {self.after_farthest} elements past it)"
            parts.append(part)
        if self.before_count:
            part = f"wrote {self.before_count} element{'s' if self.before_count != 1 else ''} before the start of `{name}`"
            if self.before_farthest != self.before_count:
                part += f" (the farthest {self.before_farthest} elements before it)"
            parts.append(part)
        dims = [int(d) for d in shape] if shape is not None else []
        if self.after_count == 1 and self.after_farthest == 1 and not self.before_count:
            # exactly the element just past the end: the bound admits one index too many
            bound = "`col <= cols` where `col < cols`" if len(dims) >= 2 else "`i <= n` where `i < n`"
            return parts[0] + f": an out-of-bounds write one past the end, an off-by-one bound ({bound} is meant?)"
        return "; ".join(parts) + f": out-of-bounds writes ({_bounds_check(dims)})"


def _bounds_check(dims: list) -> str:
    """The bounds check a kernel writing an output of these dimensions needs, as a question."""
    if len(dims) < 2:
        return "a missing `if (i < n)` bounds check?"
    if len(dims) == 2:
        rows, cols = dims
        return (f"a bounds check missing on the row or the column? A {rows} × {cols} output needs both, "
                f"`if (row < {rows} && col < {cols})`: the grid is rounded up along each")
    sizes = " × ".join(str(d) for d in dims)
    return (f"a bounds check missing on one of the indices? A {sizes} output needs each index the kernel computes "
            f"checked against its own size (or one flat `i < n` over all {_count(dims)} elements)")


def _count(dims) -> str:
    total = 1
    for d in dims:
        total *= d
    return f"{total:,}"


def guarded_input(value):
    """A floating, contiguous input tensor copied into the middle of a buffer whose bands on both sides hold NaN:
    a kernel that reads past the end (or before the start) of an input then computes NaN, which the comparison
    catches, instead of whatever memory lay there (a value multiplied by a zero of the other input, say, which made
    such a read pass or fail by chance). Anything else is returned as it is."""
    if not (isinstance(value, torch.Tensor) and value.is_floating_point() and value.is_contiguous()
            and value.numel() > 0 and not value.requires_grad):
        return value
    numel = value.numel()
    guard = guard_size(numel)
    buffer = torch.full((numel + 2 * guard,), float("nan"), dtype=value.dtype, device=value.device)
    view = buffer[guard: guard + numel].view(value.shape)
    view.copy_(value)
    return view


class GuardedOutput:
    """One output tensor living inside a poisoned buffer with guard bands on both sides."""

    def __init__(self, shape, dtype: torch.dtype, device):
        self.shape = tuple(shape)
        self.dtype = dtype
        numel = 1
        for s in self.shape:
            numel *= int(s)
        self.numel = numel
        self.guarded = can_poison(dtype)
        self.guard = guard_size(numel) if self.guarded else 0
        self.buffer = torch.empty(numel + 2 * self.guard, dtype=dtype, device=device)
        if self.guarded:
            fill_poison(self.buffer)
        self.view = self.buffer[self.guard : self.guard + numel].view(self.shape)

    def damage(self) -> GuardDamage:
        if not self.guarded:
            return GuardDamage()
        before = ~poison_mask(self.buffer[: self.guard])
        after = ~poison_mask(self.buffer[self.guard + self.numel :])
        result = GuardDamage(before_count=int(before.sum()), after_count=int(after.sum()))
        if result.before_count:
            first_changed = int(before.to(torch.uint8).argmax())  # lowest address = farthest before the start
            result.before_farthest = self.guard - first_changed
        if result.after_count:
            last_changed = self.guard - 1 - int(after.flip(0).to(torch.uint8).argmax())
            result.after_farthest = last_changed + 1
        return result
