"""Readable time and rate units."""

_TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns"))


def time_unit(seconds: float) -> tuple:
    """(scale, name) such that ``seconds / scale`` reads between 1 and 1000."""
    for scale, name in _TIME_UNITS:
        if abs(seconds) >= scale:
            return scale, name
    return _TIME_UNITS[-1]


def format_time(seconds: float, digits: int = 3) -> str:
    if seconds != seconds:  # NaN
        return "nan"
    scale, name = time_unit(seconds)
    return f"{seconds / scale:.{digits}g} {name}"


def format_rate(value: float, unit: str) -> str:
    """``format_rate(4.3e12, "B/s")`` -> ``'4.3 TB/s'``."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"
