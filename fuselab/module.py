"""The tensor glue: a built library's launchers, called from Python with tensors.

The glue is generated from the launcher prototypes alone and lives in Python (ctypes), so nothing of it is
compiled per edit or per student: only the student's ``.cu`` is. Every call checks each argument against its
prototype (dtype, device, contiguity, rank and named dimensions, integer sizes named like a dimension and
declared output sizes) and raises a ``TypeError``/``ValueError`` that names the argument, fills the
``cudaStream_t`` with the current stream (a default-stream launch would escape CUDA-graph capture and the timing
stream; under the emulation a launch on any other stream raises), and turns an error the launch recorded into a
``fuselab.LaunchError``.
"""

from __future__ import annotations

import ctypes
import numbers
import re
import threading

import torch

from . import launch_record
from .errors import HostWroteKernelMemory, LaunchError, StaleModule
from .prototypes import SCALAR_TYPES, Prototype, evaluate, expression_names

THREAD_ORDERS = {"forward": 0, "reverse": 1, "random": 2}

# The stream an emulated launcher is given: no real stream, but a handle of its own (never dereferenced), so
# the emulation can tell a launch on it from one on stream 0 or on a stream the launcher made.
EMULATED_STREAM = 0x5EA0000


class Launcher:
    """One launcher of a built library, callable with tensors and numbers."""

    def __init__(self, module: "Module", proto: Prototype, c_function):
        self._module = module
        self.prototype = proto
        self._fn = c_function
        self._fn.restype = ctypes.c_int if proto.return_type != "void" else None
        self._fn.argtypes = [ctypes.c_void_p if (p.pointer or p.is_stream) else SCALAR_TYPES[p.base_type][0]
                             for p in proto.params]
        self.__name__ = proto.name
        self.__doc__ = "\n".join([f"{proto.signature()}: calls `{proto.declaration}`"] +
                                 ["  " + p.describe() for p in proto.call_params])

    def __repr__(self):
        return f"<launcher {self.prototype.signature()} ({self._module.backend})>"

    @property
    def emulated(self) -> bool:
        """True under the CPU emulation: fuselab.timing then never gives a speedup verdict."""
        return self._module.emulated

    def __call__(self, *args, **kwargs):
        stale = getattr(self._module, "stale", None)
        if stale:
            raise StaleModule(f"{self.__name__}: {stale}")
        values = self._bind(args, kwargs)
        c_args, dims, tensors = [], {}, []
        for param in self.prototype.params:
            if param.is_stream:
                c_args.append(self._module._stream_handle())
            elif param.is_tensor:
                tensors.append((len(c_args), values[param.name]))
                c_args.append(self._check_tensor(param, values[param.name], dims))
            else:
                c_args.append(self._check_number(param, values[param.name]))
        self._check_sizes(values, dims)
        watched = self._module.emulated and any(p.is_stream for p in self.prototype.params)
        names = {position: param.name for position, param in enumerate(self.prototype.params)}
        device = _DeviceCopies(self._module, tensors, c_args, names) if self._module.guarded else None
        if watched:
            self._module._begin_call()
        host_wrote = None
        try:
            if device is not None:
                device.guard()
            returned = self._fn(*c_args)
        finally:
            try:
                if device is not None:
                    host_wrote = device.finish()
            finally:
                elsewhere = self._module._end_call() if watched else None
        if self._module.emulated:
            launch_record.launched(self._module, self._module._take_barrier_note())
        if host_wrote:
            raise HostWroteKernelMemory(f"{self.prototype.name}: {host_wrote}")
        if elsewhere:
            raise LaunchError(_off_stream_message(self.prototype, elsewhere))
        try:
            self._module._raise_launch_error(self.prototype.name, returned)
        except LaunchError as exc:
            nothing = _no_work(self.prototype, values)
            if nothing and "InvalidConfiguration" in str(exc):
                why, guard = nothing
                raise LaunchError(f"{exc} ({why}: there is nothing to compute, and CUDA refuses a grid of "
                                  f"0 blocks. Launch nothing when there is no work: {guard}.)") from None
            if "InvalidConfiguration" in str(exc) and re.search(r"\bgrid \([^)]*\b0\b[^)]*\) has a zero", str(exc)):
                raise LaunchError(f"{exc} (a grid of 0 blocks although this call has work to do: the block count "
                                  f"rounds down, as `n / 256` does for n < 256. Round it up: `(n + 255) / 256` "
                                  f"blocks of 256 threads cover every element, and the kernel's `if (i < n)` "
                                  f"skips the rest.)") from None
            if "InvalidConfiguration" in str(exc) and "exceeds CUDA's limits (2147483647, 65535, 65535)" in str(exc):
                raise LaunchError(f"{exc} (a grid's y and z dimensions hold at most 65535 blocks each, its x "
                                  f"2147483647: put the large count in x, or launch at most 65535 in z and loop "
                                  f"over the rest in the kernel: `for (int p = blockIdx.z; p < planes; "
                                  f"p += gridDim.z)`.)") from None
            raise

    def _bind(self, args, kwargs):
        params = self.prototype.call_params
        if len(args) > len(params):
            raise TypeError(f"{self.prototype.signature()} takes {len(params)} arguments, got {len(args)}")
        values = {p.name: a for p, a in zip(params, args)}
        for key, value in kwargs.items():
            if key not in {p.name for p in params}:
                raise TypeError(f"{self.prototype.signature()} has no argument named {key!r}")
            if key in values:
                raise TypeError(f"{self.prototype.signature()} got argument {key!r} twice")
            values[key] = value
        missing = [p.name for p in params if p.name not in values]
        if missing:
            raise TypeError(f"{self.prototype.signature()} is missing argument(s): {', '.join(missing)}")
        return values

    def _check_tensor(self, param, tensor, dims):
        where = f"argument {param.name!r} of {self.prototype.name}"
        if not isinstance(tensor, torch.Tensor):
            null = (f"; for a null pointer (`{param.name} == nullptr` in the kernel) pass an empty tensor, "
                    f"torch.empty(0, device=...)") if tensor is None and not param.dims else ""
            raise TypeError(f"{where} must be a torch.Tensor ({param.describe()}), got {type(tensor).__name__}{null}")
        if param.dtype is not None and tensor.dtype != param.dtype:
            raise TypeError(f"{where} must have dtype {str(param.dtype).replace('torch.', '')} to match "
                            f"`{param.c_type}`, got {str(tensor.dtype).replace('torch.', '')}; "
                            f"convert it with .to({param.dtype})")
        if tensor.device.type != self._module.device.type:
            raise ValueError(f"{where} is on {tensor.device}, but this module was built with the "
                             f"{self._module.backend} backend and needs tensors on {self._module.device.type}")
        if not tensor.is_contiguous():
            raise ValueError(f"{where} is not contiguous (shape {tuple(tensor.shape)}, strides "
                             f"{tensor.stride()}); pass {param.name}.contiguous()")
        if param.dims:
            self._check_dims(where, param, tensor, dims)
        return tensor.data_ptr() or None

    @staticmethod
    def _check_dims(where, param, tensor, dims):
        if tensor.dim() != len(param.dims):
            raise ValueError(f"{where} must have {len(param.dims)} dimensions "
                             f"[{', '.join(map(str, param.dims))}], got shape {tuple(tensor.shape)}")
        for axis, (dim, size) in enumerate(zip(param.dims, tensor.shape)):
            if isinstance(dim, int):
                if size != dim:
                    raise ValueError(f"{where} must have size {dim} in dimension {axis}, got shape "
                                     f"{tuple(tensor.shape)}")
            elif dims.setdefault(dim, (size, param.name, tuple(tensor.shape)))[0] != size:
                seen, other, _ = dims[dim]
                raise ValueError(f"{where} has {dim}={size} (shape {tuple(tensor.shape)}), but argument "
                                 f"{other!r} has {dim}={seen}")

    def _check_sizes(self, values, dims):
        """Size arguments against the tensors: a wrong one would leave outputs unwritten or write past them."""
        name = self.prototype.name
        numbers = {p.name: int(values[p.name]) for p in self.prototype.call_params
                   if not p.is_tensor and SCALAR_TYPES[p.base_type][1] is int}
        for param, value in numbers.items():
            if param in dims and dims[param][0] != value:
                size, tensor, shape = dims[param]
                raise ValueError(f"argument {param!r} of {name} is {value}, but argument {tensor!r} has "
                                 f"{param}={size} (shape {shape}): pass {param}={size}, the tensor's own size "
                                 f"(a size that disagrees with the tensors makes the kernel skip elements or "
                                 f"read and write past the end)")
        known = {**{d: size for d, (size, _, _) in dims.items()}, **numbers}
        for param in self.prototype.params:
            for key, expression in param.rules:
                if key not in dims:
                    continue
                try:
                    wanted = evaluate(expression, known)
                except ZeroDivisionError as exc:
                    raise ValueError(f"{name}: the size of {param.name!r} cannot be worked out: {exc}") from None
                size, _, shape = dims[key]
                if wanted != size:
                    used = ", ".join(f"{n}={known[n]}" for n in sorted(expression_names(expression)))
                    rule = f"{key} = {expression}" if key != expression else expression
                    raise ValueError(f"argument {param.name!r} of {name} has shape {shape}, but its size "
                                     f"{rule} is {wanted} with {used}, not {size}: a tensor of that shape does "
                                     f"not fit these arguments")

    def _check_number(self, param, value):
        where = f"argument {param.name!r} of {self.prototype.name}"
        ctype, kind = SCALAR_TYPES[param.base_type]
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if kind is int and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            division = (" (a float: `/` is float division in Python even when it divides evenly; use `//`, or "
                        "int(...))") if isinstance(value, float) else ""
            raise TypeError(f"{where} must be an integer (C type `{param.base_type}`), got {value!r}{division}")
        if kind is float and not isinstance(value, numbers.Real):
            raise TypeError(f"{where} must be a number (C type `{param.base_type}`), got {value!r}")
        if kind is int:
            limit = 1 << (8 * ctypes.sizeof(ctype) - (0 if param.base_type.startswith(("u", "size")) else 1))
            low = 0 if param.base_type.startswith(("u", "size")) else -limit
            if not low <= int(value) < limit:
                raise ValueError(f"{where} = {value} does not fit in a C `{param.base_type}`")
            return int(value)
        return kind(value)


class _DeviceCopies:
    """Under the CPU emulation, one launcher call's tensors in device memory of their own: each storage copied into
    pages of its own, which the runtime keeps from the launcher's host code (``PROT_NONE``) and opens only while a
    kernel or a runtime copy runs. A launcher that computes on the host (a loop over ``out[i]``) faults, as on a
    GPU, where its pointers are device addresses; a kernel sees the same bytes at the same offsets. One that gets
    past the protection is still seen: ``kernel_memory.Watch`` finds kernel memory changed outside a kernel."""

    PAGE = 4096

    def __init__(self, module, tensors, c_args, names):
        import mmap
        self.module, self.buffers, self.watch = module, {}, None
        self.names: dict = {}  # storage → the arguments that view it, for a student's message
        for position, tensor in tensors:
            storage = tensor.untyped_storage()
            base = storage.data_ptr()
            if c_args[position] is None or base == 0:
                continue
            self.names.setdefault(base, []).append(f"`{names.get(position, position)}`")
            if base not in self.buffers:
                size = storage.nbytes()
                length = max(self.PAGE, (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE)
                pages = mmap.mmap(-1, length)
                device = torch.frombuffer(pages, dtype=torch.uint8, count=size)
                host = torch.empty(0, dtype=torch.uint8).set_(storage)
                device.copy_(host)
                self.buffers[base] = (pages, device, host, length)
            c_args[position] = self.buffers[base][1].data_ptr() + (tensor.data_ptr() - base)

    def guard(self):
        from .kernel_memory import Watch
        self.watch = Watch(self.module._lib, [(f"the memory of {' and '.join(self.names[base])}",
                                               device.data_ptr(), device.numel())
                                              for base, (_, device, _, _) in self.buffers.items()])
        n = len(self.buffers)
        bases = (ctypes.c_void_p * max(n, 1))(*[b[1].data_ptr() for b in self.buffers.values()])
        sizes = (ctypes.c_ulonglong * max(n, 1))(*[b[3] for b in self.buffers.values()])
        self.module._lib.fuselab_emu_guard(bases, sizes, ctypes.c_int(n), self.watch.starting, self.watch.ended)

    def finish(self):
        """Unguard; copy what the kernels wrote back into the caller's tensors. Returns what host code changed in
        kernel memory outside a kernel, in words (and then copies nothing back), or None."""
        self.module._lib.fuselab_emu_unguard()
        watch, self.watch = self.watch, None
        host_wrote = watch.finish() if watch is not None else None
        if host_wrote is None:
            for pages, device, host, _ in self.buffers.values():
                host.copy_(device)  # what the kernels wrote, back into the caller's tensors
        buffers, self.buffers = self.buffers, {}
        for base in list(buffers):
            pages = buffers.pop(base)[0]
            try:
                pages.close()
            except BufferError:  # a view still held somewhere: the mapping goes with it
                pass
        if watch is not None and watch.problem:  # the watch's own failure: never passed over in silence
            raise LaunchError(f"fuselab could not watch the kernel memory of this call ({watch.problem})")
        return host_wrote


class Module:
    """A built library: its launchers are attributes, called like the prototypes minus the stream."""

    def __init__(self, library_path, prototypes, backend, source, log="", build_seconds=0.0, cached=False,
                 name="kernel"):
        self.library_path = str(library_path)
        self.backend = backend  # "cuda" or "emulate"
        self.device = torch.device("cuda" if backend == "cuda" else "cpu")
        self.source = source
        self.log = log
        self.build_seconds = build_seconds
        self.cached = cached
        self.name = name
        self.stale = None  # why it is not to be called: a later build of its name failed (``kernelbuild.build``)
        self._lib = ctypes.CDLL(self.library_path)
        # what every launch calls in the library, typed once here, and the buffers its messages are read into
        # (one call at a time reads them: ``_buffers_lock``)
        self._error_fn = _c_function(self._lib, "fuselab_last_error", ctypes.c_int, ctypes.c_char_p, ctypes.c_int)
        self._error_buffer = ctypes.create_string_buffer(1024)
        self._message_buffer = ctypes.create_string_buffer(512)
        self._buffers_lock = threading.Lock()
        self._begin_call_fn = self._end_call_fn = self._take_note_fn = None
        self._can_guard = False
        if backend == "emulate":
            lib = self._lib
            self._begin_call_fn = _c_function(lib, "fuselab_emu_begin_call", None, ctypes.c_void_p)
            self._end_call_fn = _c_function(lib, "fuselab_emu_end_call", ctypes.c_int, ctypes.c_char_p, ctypes.c_int)
            # a library built before the emulation had these lacks them
            self._take_note_fn = _c_function(lib, "fuselab_emu_take_barrier_note", ctypes.c_int, ctypes.c_char_p,
                                             ctypes.c_int, optional=True)
            self._can_guard = hasattr(lib, "fuselab_emu_guard")
            self._get_order_fn = _c_function(lib, "fuselab_emu_get_thread_order", ctypes.c_int)
            self._get_seed_fn = _c_function(lib, "fuselab_emu_get_thread_seed", ctypes.c_ulonglong)
            self._set_order_fn = _c_function(lib, "fuselab_emu_set_thread_order", None, ctypes.c_int,
                                             ctypes.c_ulonglong)
            self._get_os_threads_fn = _c_function(lib, "fuselab_emu_get_num_threads", ctypes.c_int, optional=True)
            self._set_os_threads_fn = _c_function(lib, "fuselab_emu_set_num_threads", None, ctypes.c_int)
        self.launchers = {}
        for proto in prototypes:
            launcher = Launcher(self, proto, getattr(self._lib, proto.name))
            self.launchers[proto.name] = launcher
            setattr(self, proto.name, launcher)

    def __repr__(self):
        how = "loaded from cache" if self.cached else f"built in {self.build_seconds:.2f} s"
        names = ", ".join(l.prototype.signature() for l in self.launchers.values())
        return f"<fuselab module {self.name!r} [{self.backend}] {how}: {names}>"

    @property
    def emulated(self) -> bool:
        return self.backend == "emulate"

    @property
    def guarded(self) -> bool:
        """Emulation only: whether a launcher's own host code is kept from device memory (``_DeviceCopies``): on
        while the course grades (``FUSELAB_GRADING=1``), or with ``FUSELAB_EMU_GUARD=1``; ``=0`` turns it off."""
        import os
        if not self._can_guard:
            return False
        return os.environ.get("FUSELAB_EMU_GUARD", os.environ.get("FUSELAB_GRADING", "0")) == "1"

    def _stream_handle(self):
        if self.backend == "cuda":
            return torch.cuda.current_stream().cuda_stream or None
        return EMULATED_STREAM

    def _begin_call(self):
        self._begin_call_fn(ctypes.c_void_p(EMULATED_STREAM))

    def _read_message(self, function):
        """``function(buffer, size)``'s message, or None where it returns 0."""
        with self._buffers_lock:
            buffer = self._message_buffer
            return buffer.value.decode(errors="replace") if function(buffer, len(buffer)) else None

    def _end_call(self):
        """What the launcher put on another stream than its own during the call, or None."""
        return self._read_message(self._end_call_fn)

    def _raise_launch_error(self, launcher_name, returned):
        with self._buffers_lock:
            buffer = self._error_buffer
            code = self._error_fn(buffer, len(buffer))
            message = buffer.value.decode(errors="replace") if code != 0 else ""
        if code == 0 and returned not in (None, 0):
            code, message = returned, f"launcher returned error code {returned}"
        if code != 0:
            raise LaunchError(f"{launcher_name} failed to launch: {message}")

    def _take_barrier_note(self):
        """Emulation: the first barrier since the last call that not every thread of its block reached, in words
        (the emulation lets the others go on, as a current GPU does; CUDA leaves it undefined), or None."""
        if self._take_note_fn is None:
            return None
        return self._read_message(self._take_note_fn)

    @property
    def thread_order(self) -> tuple:
        """Emulation only: the order each block's threads run in, and its seed, as ``set_thread_order`` takes them."""
        if self.backend != "emulate":
            raise RuntimeError("thread order can only be chosen under the CPU emulation")
        order = self._get_order_fn()
        return next(name for name, code in THREAD_ORDERS.items() if code == order), int(self._get_seed_fn())

    def set_thread_order(self, order: str = "forward", seed: int = 0):
        """Emulation only: run the threads of each block forward, in reverse or in a seeded random order.

        A kernel whose result depends on the order has a race (a missing ``__syncthreads``, say).
        """
        if self.backend != "emulate":
            raise RuntimeError("thread order can only be chosen under the CPU emulation")
        if order not in THREAD_ORDERS:
            raise ValueError(f"thread order must be one of {sorted(THREAD_ORDERS)}, got {order!r}")
        self._set_order_fn(THREAD_ORDERS[order], seed)

    @property
    def os_threads(self):
        """Emulation only: how many OS threads run a launch's blocks (0: OpenMP's default, one per core), or None
        for a library built before the emulation could say."""
        if self.backend != "emulate":
            raise RuntimeError("OS threads exist only under the CPU emulation")
        return None if self._get_os_threads_fn is None else int(self._get_os_threads_fn())

    def set_os_threads(self, n: int = 0):
        """Emulation only: run each launch's blocks on ``n`` OS threads (0: OpenMP's default). With 1 the blocks
        run one after another, in order: a race between blocks then gives one result every time."""
        if self.backend != "emulate":
            raise RuntimeError("OS threads exist only under the CPU emulation")
        self._set_os_threads_fn(int(n))


def _c_function(lib, name, restype, *argtypes, optional=False):
    """``lib``'s function ``name``, typed; None where ``optional`` and the library lacks it."""
    function = getattr(lib, name, None) if optional else getattr(lib, name)
    if function is not None:
        function.restype, function.argtypes = restype, list(argtypes)
    return function


def _no_work(proto: Prototype, values: dict):
    """``(why, guard)`` when this call has nothing to compute (every output tensor is empty), else None.

    ``why`` names the sizes that are 0 ("n = 0", "M = 0"); ``guard`` is the launch condition that skips the call:
    every size of the output that is an argument, `if (M > 0 && N > 0) kernel<<<...>>>(...)`, from the output's
    shape declaration (without one, the integer arguments that are 0). Outputs that are not empty (a size argument
    of 0 that is a flag or a padding, an empty K with a bias still to write) leave work to do: None."""
    outputs = [p for p in proto.call_params if p.is_tensor and not p.const]
    tensors = [values[p.name] for p in outputs]
    if not outputs or not all(isinstance(t, torch.Tensor) and t.numel() == 0 for t in tensors):
        return None
    sizes = {p.name: int(values[p.name]) for p in proto.call_params
             if not p.is_tensor and SCALAR_TYPES[p.base_type][1] is int}
    named = list(dict.fromkeys(d for p in outputs for d in p.dims if isinstance(d, str) and d in sizes))
    if not named:
        named = [name for name, value in sizes.items() if value == 0][:1]
    zero = [name for name in named if sizes[name] == 0]
    if not zero:
        shapes = ", ".join(f"{p.name!r} is empty (shape {tuple(values[p.name].shape)})" for p in outputs)
        return shapes, "return before the launch when the output is empty"
    condition = " && ".join(f"{name} > 0" for name in named)
    return ", ".join(f"{name} = 0" for name in zero), f"`if ({condition}) kernel<<<...>>>(...)`"


def _off_stream_message(proto: Prototype, elsewhere: str) -> str:
    stream = next(p.name for p in proto.params if p.is_stream)
    return (f"{proto.name} put work on another stream than the one it was given: {elsewhere}. "
            f"Launch everything on the launcher's `{stream}` argument: kernel<<<grid, block, shared_bytes, "
            f"{stream}>>>(...), and pass `{stream}` to every ...Async call. On a GPU, work on another stream "
            f"escapes a CUDA-graph capture of the caller's stream (a replayed graph leaves the output unwritten) "
            f"and is not ordered with the caller's other work on `{stream}`: the next kernel may read the output "
            f"before it is written, and the timing's events do not see it. (The CPU emulation, where every launch "
            f"finishes at once and would hide this, reports it instead.)")
