"""How indices, values and shapes are written in reports: the way a student would write them in Python."""

import math


def format_index(name: str, index) -> str:
    """``out[0, 3, 5, 7]``; a 0-d tensor is just ``out``."""
    index = tuple(int(i) for i in index)
    if not index:
        return name
    return f"{name}[{', '.join(str(i) for i in index)}]"


def format_value(value) -> str:
    if value is None:
        return "?"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.7g}"


def format_error(value) -> str:
    if value is None:
        return "-"
    if math.isnan(value) or math.isinf(value):
        return format_value(value)
    return f"{value:.3g}"


def format_shape(shape) -> str:
    """A shape as make_inputs received it: ``(1, 3, 5, 5)``, ``N=1, C=3`` for a dict, a named tuple with its field
    names (``ConvCase(N=1, C=3, ..., act='relu')``, which a student can paste to rerun the case), else its repr."""
    if is_named_case(shape):
        return f"{type(shape).__name__}({', '.join(f'{k}={v!r}' for k, v in zip(shape._fields, shape))})"
    if isinstance(shape, dict):
        return ", ".join(f"{k}={v}" for k, v in shape.items())
    if isinstance(shape, (tuple, list)):
        return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
    return repr(shape)


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def is_named_case(shape) -> bool:
    """A named tuple (``collections.namedtuple`` or ``typing.NamedTuple``): its fields name the case."""
    return isinstance(shape, tuple) and isinstance(getattr(shape, "_fields", None), tuple)
