"""Roofline context: how close a kernel came to what this GPU can do.

The ceilings are measured, not taken from a data sheet: a large device-to-device copy for memory bandwidth
(bytes read plus bytes written), and large matrix products for arithmetic (fp32 with TF32 off, and fp16).
They are measured once per GPU model and torch version and cached as JSON under ``fuselab.config.cache_dir()``.
"""

import contextlib
import dataclasses
import datetime
import json
import os
import tempfile
import warnings

import torch

from .. import config
from . import gpu
from .measure import measure
from .results import Measurement
from .units import format_rate

_COPY_BYTES = 1 << 30  # 1 GiB each way: far beyond any L2, long enough that launch cost vanishes
_MATMUL_SIZE = 8192


@dataclasses.dataclass(frozen=True)
class Ceilings:
    """Measured limits of one GPU: bytes/s of a device copy (read + write) and FLOP/s of matrix products."""

    device: str
    torch_version: str
    copy_bytes_per_s: float
    fp32_flops_per_s: float
    fp16_flops_per_s: float
    measured_at: str = ""

    def flops_per_s(self, dtype="fp32") -> float:
        """The matmul ceiling for ``dtype`` ("fp32"/"fp16" or a torch dtype; bf16 counts as fp16)."""
        key = str(dtype).replace("torch.", "")
        if key in ("fp32", "float32", "float"):
            return self.fp32_flops_per_s
        if key in ("fp16", "float16", "half", "bf16", "bfloat16"):
            return self.fp16_flops_per_s
        raise ValueError(f"no matmul ceiling for dtype {dtype!r}: use 'fp32' or 'fp16'")

    def __repr__(self):
        return (f"<Ceilings {self.device} (torch {self.torch_version}): copy {format_rate(self.copy_bytes_per_s, 'B/s')}, "
                f"fp32 matmul {format_rate(self.fp32_flops_per_s, 'FLOP/s')} (TF32 off), "
                f"fp16 matmul {format_rate(self.fp16_flops_per_s, 'FLOP/s')}>")


def cache_path():
    return config.cache_dir() / "ceilings.json"


def cache_key(device=None) -> str:
    return f"{gpu.device_name(device)} | torch {torch.__version__}"


def _read_cache() -> dict:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(entries: dict) -> None:
    # Write then rename, so that a concurrent reader never sees half a file.
    path = cache_path()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ceilings-", suffix=".json")
    with os.fdopen(fd, "w") as handle:
        json.dump(entries, handle, indent=2, sort_keys=True)
    os.replace(tmp, path)


@contextlib.contextmanager
def _tf32_off():
    """fp32 matmuls without TF32, restoring the previous setting afterwards."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # newer torch warns about the old flag; never let it reach stderr
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous


def measure_copy_bandwidth(device=None, nbytes=_COPY_BYTES, budget_s=2.0) -> float:
    """Bytes per second of ``dst.copy_(src)``, counting bytes read plus bytes written."""
    device = gpu.resolve_device(device)
    free, _ = torch.cuda.mem_get_info(device)
    nbytes = int(min(nbytes, free // 4)) // 16 * 16
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    m = measure(lambda: dst.copy_(src), mode="device", flush=False, target_rse=0.002, budget_s=budget_s,
                label="device copy", device=device, progress=False)
    return 2 * nbytes / m.median


def measure_matmul_rate(dtype, device=None, size=_MATMUL_SIZE, budget_s=2.0) -> float:
    """FLOP/s (2 n^3 per product) of an n x n x n ``torch.mm`` on random data; fp32 runs with TF32 off."""
    device = gpu.resolve_device(device)
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    c = torch.empty_like(a)
    with _tf32_off():
        m = measure(lambda: torch.mm(a, b, out=c), mode="device", flush=False, target_rse=0.005,
                    budget_s=budget_s, label=f"matmul {dtype}", device=device, progress=False)
    return 2 * size**3 / m.median


def ceilings(device=None, refresh=False) -> Ceilings:
    """This GPU's measured ceilings, from the cache or measured now (a few seconds) and cached."""
    if not gpu.cuda_ready():
        raise gpu.NoGPUError("roofline ceilings are measured on a GPU, and this machine has none")
    device = gpu.resolve_device(device)
    key = cache_key(device)
    entries = _read_cache()
    if not refresh and key in entries:
        try:
            return Ceilings(**entries[key])
        except TypeError:
            pass  # not the fields of Ceilings: measured again, as for an unreadable file
    result = Ceilings(
        device=gpu.device_name(device),
        torch_version=torch.__version__,
        copy_bytes_per_s=measure_copy_bandwidth(device),
        fp32_flops_per_s=measure_matmul_rate(torch.float32, device),
        fp16_flops_per_s=measure_matmul_rate(torch.float16, device),
        measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
    torch.cuda.empty_cache()
    entries = _read_cache()
    entries[key] = dataclasses.asdict(result)
    _write_cache(entries)
    return result


@dataclasses.dataclass(frozen=True)
class Achieved:
    """Rates a kernel reached, and their fraction of the device's ceilings (None where there is no ceiling)."""

    seconds: float
    bytes_per_s: float = None
    flops_per_s: float = None
    bandwidth_fraction: float = None
    compute_fraction: float = None
    ceilings: Ceilings = None
    note: str = ""

    def __repr__(self):
        parts = []
        if self.bytes_per_s is not None:
            part = format_rate(self.bytes_per_s, "B/s")
            if self.bandwidth_fraction is not None:
                part += f" = {self.bandwidth_fraction:.0%} of copy {format_rate(self.ceilings.copy_bytes_per_s, 'B/s')}"
            parts.append(part)
        if self.flops_per_s is not None:
            part = format_rate(self.flops_per_s, "FLOP/s")
            if self.compute_fraction is not None:
                part += f" = {self.compute_fraction:.0%} of the matmul ceiling"
            parts.append(part)
        text = "; ".join(parts) or "nothing counted"
        return f"<Achieved {text}{' (' + self.note + ')' if self.note else ''}>"


def achieved(measurement, bytes=None, flops=None, dtype="fp32", limits=None) -> Achieved:
    """GB/s and/or FLOP/s reached by ``measurement`` (a Measurement, or seconds), with fractions of the ceilings.

    bytes: bytes the kernel must move (read + written); flops: arithmetic operations it must do;
    dtype: which matmul ceiling ``flops`` is compared with; limits: a :class:`Ceilings` (default: this GPU's).
    A host-clock measurement gets rates but no fractions.
    """
    if bytes is None and flops is None:
        raise ValueError("achieved() needs bytes=... or flops=... (or both)")
    if isinstance(measurement, Measurement):
        seconds, on_gpu = measurement.median, measurement.on_gpu
    else:
        # Plain seconds with explicit limits: the caller vouches that they are a GPU time.
        seconds, on_gpu = float(measurement), limits is not None or gpu.cuda_ready()
    if not seconds > 0:
        raise ValueError(f"a time must be positive, got {seconds!r} s")
    note = ""
    if not on_gpu:
        limits, note = None, "host clock: no GPU ceiling to compare with"
    elif limits is None:
        limits = ceilings()
    bytes_per_s = None if bytes is None else bytes / seconds
    flops_per_s = None if flops is None else flops / seconds
    return Achieved(
        seconds=seconds,
        bytes_per_s=bytes_per_s,
        flops_per_s=flops_per_s,
        bandwidth_fraction=None if limits is None or bytes_per_s is None else bytes_per_s / limits.copy_bytes_per_s,
        compute_fraction=None if limits is None or flops_per_s is None else flops_per_s / limits.flops_per_s(dtype),
        ceilings=limits,
        note=note,
    )
