"""What crosses between the clean recheck's checker and its solution worker, and how the checker reads it.

The checker never runs a student's Python: the worker does, and every value it sends back is rebuilt here from
*exact* types only, by a decoder that knows nothing the student defined:

- ``bool``/``int``/``float``/``complex``/``str``/``None``, tuples, lists and dicts of those, ``torch.dtype``,
  ``torch.Size``, ``slice``: plain values. An ``int`` subclass with a lying ``__eq__`` arrives as the plain
  ``int`` it holds, so ``==`` in a test compares numbers;
- numpy scalars and arrays of numeric or bool dtype, as the same numpy type (``np.int64`` from ``np.prod``);
- tensors (plain ``torch.Tensor``, detached) and ``nn.Parameter``;
- ``torch.nn`` modules of an allowlisted class (``torch.nn``'s own classes and the labs' own model classes in
  ``fuselab.labs``): rebuilt here from their class, plain attributes (the constructor's configuration: kernel
  size, stride, eps...), parameters, buffers, children and training flag. The class's code is the checker's own;
- ``torch.fx.GraphModule``: rebuilt from its node list, each call target resolved here from an allowlist (ATen
  ops under ``torch``, ``torch.nn.functional``, ``operator``'s arithmetic, tensor method names);
- a module of the student's own ``nn.Module`` subclass: the ``torch.fx`` graph of its forward, traced in the worker
  and rebuilt here like any graph module, so the checker runs (and counts) its operations itself;
- anything else (such a module that fx cannot trace, an object of a class the student wrote): a *handle*.
  The object stays in the worker; the checker holds a ``remote.RemoteModule`` whose forward is evaluated there
  and whose outputs come back as tensors, checked here (a check that needs to see what a module runs refuses it).

Exceptions cross as the nearest builtin exception type and its message (``ValueError: ...``).

Transport: each message is a length-prefixed blob. Worker → checker blobs are ``torch.save`` of a tree of tagged
lists, read with ``torch.load(weights_only=True)`` (no code runs while loading) and then checked node by node.
Checker → worker blobs are pickles: the worker trusts the checker, never the other way round.
"""

from __future__ import annotations

import builtins
import io
import keyword
import operator
import os
import re
import struct

import torch
from torch import nn

MAX_MESSAGE = 4 * 2**30
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PART = re.compile(r"^[A-Za-z0-9_]+$")  # a submodule's name: an identifier, or a position ("0") in a Sequential


class WireError(Exception):
    """What the worker sent is not something the checker rebuilds."""


# ------------------------------------------------------------------------------------------------ framing

def send(fd: int, blob: bytes) -> None:
    data = struct.pack("<Q", len(blob)) + blob
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def receive(fd: int) -> bytes:
    """One message; ``EOFError`` when the other end has closed."""
    size = struct.unpack("<Q", _read_exact(fd, 8))[0]
    if size > MAX_MESSAGE:
        raise WireError(f"a message of {size} bytes is larger than the limit")
    return _read_exact(fd, size)


def _read_exact(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 22))
        if not chunk:
            raise EOFError("the other process closed the pipe")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def dump_tree(tree) -> bytes:
    buffer = io.BytesIO()
    torch.save(tree, buffer)
    return buffer.getvalue()


def load_tree(blob: bytes):
    """Worker → checker: the tagged tree, loaded without running any code (``weights_only``)."""
    try:
        return torch.load(io.BytesIO(blob), weights_only=True, map_location=None)
    except Exception as exc:  # noqa: BLE001 - whatever it is, it is not a tree the checker reads
        raise WireError(f"the solution process sent something that is not plain data ({type(exc).__name__})") \
            from None


# ------------------------------------------------------------------------------------------- exceptions

# the exception types a test may expect from a student's function; anything else arrives as RuntimeError
EXCEPTIONS = {cls.__name__: cls for cls in (
    ValueError, TypeError, KeyError, IndexError, AssertionError, NotImplementedError, RuntimeError,
    ZeroDivisionError, ArithmeticError, OverflowError, AttributeError, NameError, LookupError,
    RecursionError, MemoryError, UnboundLocalError, ImportError, ModuleNotFoundError, StopIteration,
    FloatingPointError)}


def exception_record(exc: BaseException) -> list:
    """Worker side: the nearest builtin exception type of ``exc`` and its message."""
    name = "RuntimeError"
    for cls in type(exc).__mro__:
        if cls.__module__ == "builtins" and cls.__name__ in EXCEPTIONS:
            name = cls.__name__
            break
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a __str__ that raises still gives a record
        message = "(an exception whose message could not be read)"
    if name != type(exc).__name__:
        message = f"{type(exc).__name__}: {message}"
    return ["raise", name, message[:4000]]


def rebuild_exception(record) -> BaseException:
    _, name, message = record
    if type(name) is not str or type(message) is not str:
        return RuntimeError("the solution process raised an exception that could not be read")
    return EXCEPTIONS.get(name, RuntimeError)(message)


# ------------------------------------------------------------------------------- worker side: encoding

class Unsendable(Exception):
    """A value the encoder cannot turn into plain data (the worker keeps it as a handle)."""


_MODULE_INTERNALS = frozenset(nn.Module().__dict__)


def allowed_module_class(cls) -> bool:
    """``torch.nn``'s own classes and the labs' model classes: the checker rebuilds these from their parts."""
    module = getattr(cls, "__module__", "") or ""
    if cls is nn.Module:
        return True
    return (module.startswith("torch.nn.modules.") or module.startswith("fuselab.labs.")) \
        and isinstance(cls, type) and issubclass(cls, nn.Module)


def _tensor(value) -> torch.Tensor:
    plain = value.detach()
    if type(plain) is not torch.Tensor:
        plain = plain.as_subclass(torch.Tensor)
    return plain


def encode(value, handles=None, depth=0, arguments=None):
    """Worker side: ``value`` as a tree of tagged lists. ``handles(obj)`` keeps an object and returns its id;
    ``arguments`` maps ``id()`` of the call's tensor and module arguments to their positions: such a value comes
    back as a reference to the checker's own argument."""
    if depth > 64:
        raise Unsendable("nested too deeply")
    if arguments and id(value) in arguments:
        return ["H", -1 - arguments[id(value)], "argument"]
    kind = type(value)
    if value is None or kind in (bool, str):
        return ["v", value]
    if getattr(kind, "__module__", None) == "numpy":
        record = _encode_numpy(value)
        if record is not None:
            return record
    if isinstance(value, bool):
        return ["v", bool(value)]
    if isinstance(value, int):
        return ["v", int.__add__(value, 0)]  # the value it holds, whatever its class says
    if isinstance(value, float):
        return ["v", float.__add__(value, 0.0)]
    if isinstance(value, complex):
        return ["c", float(complex.__getattribute__(value, "real")), float(complex.__getattribute__(value, "imag"))]
    if isinstance(value, str):
        return ["v", str.__str__(value)]
    if isinstance(value, torch.dtype):
        return ["dtype", str(value).replace("torch.", "")]
    if isinstance(value, torch.device):
        return ["device", str(value)]
    if isinstance(value, torch.Size):
        return ["size", [int(v) for v in value]]
    if isinstance(value, slice):
        return ["slice", [encode(v, handles, depth + 1) for v in (value.start, value.stop, value.step)]]
    if isinstance(value, nn.Parameter):
        return ["P", _tensor(value), bool(value.requires_grad)]
    if isinstance(value, torch.Tensor):
        return ["T", _tensor(value)]
    if isinstance(value, tuple):
        return ["t", [encode(v, handles, depth + 1, arguments) for v in tuple.__iter__(value)]]
    if isinstance(value, list):
        return ["l", [encode(v, handles, depth + 1, arguments) for v in list.__iter__(value)]]
    if isinstance(value, dict):
        return ["d", [[encode(k, handles, depth + 1), encode(v, handles, depth + 1, arguments)]
                      for k, v in dict.items(value)]]
    if isinstance(value, nn.Module):
        try:
            return _encode_module(value, depth)
        except Unsendable:
            if handles is None:
                raise
            traced = _traced(value, depth)
            return traced if traced is not None else ["H", handles(value), type(value).__name__]
    if handles is not None and callable(value):
        return ["H", handles(value), type(value).__name__]
    raise Unsendable(f"a {type(value).__name__} cannot be sent as plain data")


# numpy values (what np.prod, np.sum or an array's element give) cross as the same numpy type: a test compares them
# with numpy's own ==, as in the notebook. Exact numpy types only; a subclass is read as the number it holds.
_NUMPY_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                 "float32", "float64", "complex64", "complex128")


def _encode_numpy(value):
    import numpy
    kind = type(value)
    if kind is numpy.ndarray:
        dtype = value.dtype
        if dtype.name not in _NUMPY_DTYPES or value.ndim > 64:
            return None
        data = numpy.ascontiguousarray(value, dtype=dtype.newbyteorder("="))
        return ["npa", dtype.name, [int(n) for n in value.shape], data.tobytes()]
    if isinstance(value, numpy.generic) and kind is numpy.dtype(kind).type and numpy.dtype(kind).name in _NUMPY_DTYPES:
        return ["np", numpy.dtype(kind).name, numpy.ndarray.tobytes(numpy.asarray(value, dtype=numpy.dtype(kind)
                                                                                   .newbyteorder("=")))]
    return None


def _decode_numpy(node):
    try:
        import numpy
    except ImportError:
        raise WireError("the solution process sent a numpy value and numpy is not installed here") from None
    _check(len(node) in (3, 4) and type(node[1]) is str and node[1] in _NUMPY_DTYPES and type(node[-1]) is bytes,
           "numpy value")
    dtype = numpy.dtype(node[1])
    if node[0] == "np":
        _check(len(node) == 3 and len(node[2]) == dtype.itemsize, "numpy scalar")
        return numpy.frombuffer(node[2], dtype=dtype)[0]
    _check(len(node) == 4 and type(node[2]) is list and all(type(n) is int and n >= 0 for n in node[2]),
           "numpy array shape")
    count = 1
    for n in node[2]:
        count *= n
    _check(len(node[3]) == count * dtype.itemsize, "numpy array size")
    return numpy.frombuffer(node[3], dtype=dtype).reshape(node[2]).copy()


def argument_state(value):
    """Worker side: what a tensor or module argument holds after a call (its contents; a module's parameters,
    buffers and training flags), for the checker to write back into its own argument; None for anything else."""
    if isinstance(value, torch.Tensor):
        return ["T", _tensor(value)]
    if isinstance(value, nn.Module):
        tensors = [[name, None if t is None else _tensor(t), isinstance(t, nn.Parameter)]
                   for name, t in _named_state(value)]
        return ["S", tensors, [[name, bool(m.training)] for name, m in value.named_modules(remove_duplicate=False)]]
    return None


def _named_state(module):
    for prefix, owner in module.named_modules(remove_duplicate=False):
        for kind in (owner._parameters, owner._buffers):
            for name, tensor in kind.items():
                yield (f"{prefix}.{name}" if prefix else name), tensor


def write_back(argument, state) -> None:
    """Checker side: make ``argument`` (the checker's own) hold what the worker's copy held after the call. Only
    tensors, checked like every value from the worker; a state that does not fit the argument is ignored."""
    if state is None:
        return
    tag = _tagged(state)
    with torch.no_grad():
        if tag == "T" and isinstance(argument, torch.Tensor) and len(state) == 2:
            new = _plain_tensor(state[1])
            if new.shape == argument.shape and new.dtype == argument.dtype and not torch.equal(new, argument.detach()):
                argument.detach().copy_(new)
        elif tag == "S" and isinstance(argument, nn.Module) and len(state) == 3 and type(state[1]) is list \
                and type(state[2]) is list:
            modules = dict(argument.named_modules(remove_duplicate=False))
            for item in state[1]:
                _check(type(item) is list and len(item) == 3 and type(item[0]) is str and type(item[2]) is bool,
                       "argument state")
                name, new, is_param = item
                owner_name, _, leaf = name.rpartition(".")
                owner = modules.get(owner_name)
                if owner is None or not _IDENT.match(leaf) or leaf.startswith("__"):
                    continue
                slot = owner._parameters if leaf in owner._parameters else owner._buffers \
                    if leaf in owner._buffers else None
                if slot is None:
                    continue
                old = slot[leaf]
                if new is None or old is None:
                    slot[leaf] = None if new is None else (nn.Parameter(_plain_tensor(new), requires_grad=False)
                                                           if is_param else _plain_tensor(new))
                elif new.shape == old.shape and new.dtype == old.dtype:
                    if not torch.equal(_plain_tensor(new), old.detach()):
                        old.detach().copy_(new)
                else:  # replaced by a tensor of another shape or dtype
                    slot[leaf] = nn.Parameter(_plain_tensor(new), requires_grad=old.requires_grad) \
                        if isinstance(old, nn.Parameter) else _plain_tensor(new)
            for item in state[2]:
                _check(type(item) is list and len(item) == 2 and type(item[0]) is str and type(item[1]) is bool,
                       "argument state")
                if item[0] in modules:
                    modules[item[0]].training = item[1]


def _encode_module(module, depth):
    from torch import fx
    if isinstance(module, fx.GraphModule):
        return ["G", _encode_graph(module.graph, depth), _encode_parts(module, depth, plain_root=True)]
    if not allowed_module_class(type(module)):
        raise Unsendable(f"{type(module).__name__} is not a torch.nn class")
    return _encode_parts(module, depth)


def _traced(module, depth):
    """Worker side: a module of the student's own class as the ``torch.fx`` graph of its forward (traced here), so the
    checker runs and inspects it itself; None when it does not trace or the checker would not rebuild the graph
    (it then stays here as a handle)."""
    from torch import fx
    try:
        graph_module = fx.symbolic_trace(module)
        graph_module.training = module.training  # its own flag only: the submodules are the student's objects
        record = _encode_module(graph_module, depth)
        decode(load_tree(dump_tree(record)))  # the checker's own decoder: what it refuses stays a handle
        return record
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001 - whatever the student's forward does while traced, it is not a graph
        return None


def _encode_parts(module, depth, plain_root=False):
    attrs = {}
    for key, value in object.__getattribute__(module, "__dict__").items():
        if key in _MODULE_INTERNALS or (plain_root and not isinstance(value, torch.Tensor)):
            continue  # a graph module's own attributes are its code; only its constants (tensors) matter
        attrs[key] = encode(value, None, depth + 1)
    params = {k: (None if v is None else encode(v, None, depth + 1)) for k, v in module._parameters.items()}
    buffers = {k: (None if v is None else encode(v, None, depth + 1)) for k, v in module._buffers.items()}
    children = {k: (None if v is None else _encode_module(v, depth + 1)) for k, v in module._modules.items()}
    cls = "torch.nn.Module" if plain_root else f"{type(module).__module__}.{type(module).__qualname__}"
    return ["M", cls, attrs, params, buffers, children, bool(module.training)]


def _encode_graph(graph, depth):
    from torch.fx.node import Node, _get_qualified_name

    def arg(value):
        if isinstance(value, Node):
            return ["n", value.name]
        if isinstance(value, (tuple, list)):
            return ["t" if isinstance(value, tuple) else "l", [arg(v) for v in value]]
        if isinstance(value, dict):
            return ["d", [[encode(k), arg(v)] for k, v in value.items()]]
        record = encode(value, None, depth + 1)
        if record[0] in ("np", "npa"):
            raise Unsendable("a numpy constant in a graph")
        return record

    nodes = []
    for node in graph.nodes:
        target = node.target
        if node.op == "call_function":
            target = _get_qualified_name(target)
        nodes.append([node.name, node.op, str(target), arg(tuple(node.args)), arg(dict(node.kwargs))])
    return nodes


# ------------------------------------------------------------------------------ checker side: decoding

def _check(condition, what):
    if not condition:
        raise WireError(f"the solution process sent a malformed value ({what})")


def _tagged(node):
    _check(type(node) is list and node and type(node[0]) is str, "untagged")
    return node[0]


def decode(node, handle=None, depth=0):
    """Checker side: rebuild one value from exact types only (see the module doc).

    ``handle(id, class_name)`` turns a handle record into the checker's proxy for it.
    """
    _check(depth <= 200, "nested too deeply")
    tag = _tagged(node)
    if tag == "v":
        _check(len(node) == 2 and type(node[1]) in (bool, int, float, str, type(None)), "plain value")
        return node[1]
    if tag == "c":
        _check(len(node) == 3 and all(type(v) is float for v in node[1:]), "complex")
        return complex(node[1], node[2])
    if tag == "dtype":
        dtype = getattr(torch, node[1], None) if type(node[1]) is str and _IDENT.match(node[1]) else None
        _check(isinstance(dtype, torch.dtype), "dtype")
        return dtype
    if tag == "device":
        _check(type(node[1]) is str, "device")
        return torch.device(node[1])
    if tag == "size":
        _check(type(node[1]) is list and all(type(v) is int for v in node[1]), "size")
        return torch.Size(node[1])
    if tag == "slice":
        _check(type(node[1]) is list and len(node[1]) == 3, "slice")
        return slice(*(decode(v, handle, depth + 1) for v in node[1]))
    if tag == "T":
        return _plain_tensor(node[1])
    if tag == "P":
        _check(len(node) == 3 and type(node[2]) is bool, "parameter")
        return nn.Parameter(_plain_tensor(node[1]), requires_grad=node[2])
    if tag in ("t", "l"):
        _check(type(node[1]) is list, "sequence")
        items = [decode(v, handle, depth + 1) for v in node[1]]
        return tuple(items) if tag == "t" else items
    if tag == "d":
        _check(type(node[1]) is list, "dict")
        out = {}
        for pair in node[1]:
            _check(type(pair) is list and len(pair) == 2, "dict item")
            key = decode(pair[0], handle, depth + 1)
            _check(type(key) in (bool, int, float, str, type(None), tuple), "dict key")
            out[key] = decode(pair[1], handle, depth + 1)
        return out
    if tag in ("np", "npa"):
        return _decode_numpy(node)
    if tag == "M":
        return _rebuild_module(node, depth)
    if tag == "G":
        return _rebuild_graph_module(node, depth)
    if tag == "H":
        _check(handle is not None and len(node) == 3 and type(node[1]) is int and type(node[2]) is str, "handle")
        return handle(node[1], node[2])
    raise WireError(f"the solution process sent a value of unknown kind {tag!r}")


def _plain_tensor(value):
    _check(type(value) is torch.Tensor, "tensor")
    return value


def _identifier(name, what):
    _check(type(name) is str and _IDENT.match(name) and not keyword.iskeyword(name)
           and not (name.startswith("__") and name.endswith("__")), what)
    return name


def _module_class(path):
    _check(type(path) is str and "." in path, "module class")
    import importlib
    module_name, _, qualname = path.rpartition(".")
    _check(module_name.startswith(("torch.nn.modules.", "fuselab.labs.")) or path == "torch.nn.Module",
           f"module class {path}")
    if path == "torch.nn.Module":
        return nn.Module
    try:
        cls = getattr(importlib.import_module(module_name), _identifier(qualname, "class name"))
    except (ImportError, AttributeError):
        raise WireError(f"the solution process sent a module of unknown class {path}") from None
    _check(isinstance(cls, type) and allowed_module_class(cls) and cls.__module__ == module_name, f"class {path}")
    return cls


def _data_attribute(cls, key, value):
    """``value`` as a module's own attribute: data (sizes, flags, eps, a tensor), never code. An instance attribute
    is looked up before the class's methods, so one named ``forward`` (or ``_conv_forward``, ``eval``), or one that
    is a module or a function, would make the rebuilt module run what the student sent instead of its class's code
    on its parameters (a conv whose ``forward`` is the unfolded conv and BN). Submodules travel as children, where
    they never shadow a method."""
    import inspect
    on_class = inspect.getattr_static(cls, key, None)
    _check(on_class is None or not (callable(on_class) or hasattr(type(on_class), "__get__")),
           f"attribute {key!r}, which would replace {cls.__name__}.{key}")
    _check(not isinstance(value, nn.Module) and not callable(value), f"attribute {key!r} (code, not data)")
    return value


def _rebuild_module(node, depth):
    _check(len(node) == 7, "module record")
    _, path, attrs, params, buffers, children, training = node
    cls = _module_class(path)
    _check(all(type(x) is dict for x in (attrs, params, buffers, children)) and type(training) is bool, "module")
    module = cls.__new__(cls)
    nn.Module.__init__(module)
    for key, value in attrs.items():
        _check(type(key) is str and _IDENT.match(key) and not key.startswith("__")
               and key not in _MODULE_INTERNALS, f"attribute {key!r}")
        module.__dict__[key] = _data_attribute(cls, key, decode(value, None, depth + 1))
    for key, value in params.items():
        _identifier(key, "parameter name")
        param = None if value is None else decode(value, None, depth + 1)
        if param is not None and not isinstance(param, nn.Parameter):
            param = nn.Parameter(param, requires_grad=False)
        module._parameters[key] = param
    for key, value in buffers.items():
        _identifier(key, "buffer name")
        buffer = None if value is None else decode(value, None, depth + 1)
        _check(buffer is None or type(buffer) is torch.Tensor, "buffer")
        module._buffers[key] = buffer
    for key, value in children.items():
        _check(type(key) is str and _PART.match(key) and not key.startswith("__"), "submodule name")
        child = None if value is None else decode(value, None, depth + 1)
        _check(child is None or isinstance(child, nn.Module), "submodule")
        module._modules[key] = child
    module.training = training
    return module


# --- fx graphs: call targets resolved here, from an allowlist

_OPERATORS = {name: getattr(operator, name) for name in (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs", "matmul", "getitem", "eq",
    "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "invert", "lshift", "rshift", "not_", "iadd", "isub",
    "imul", "itruediv", "ifloordiv", "imatmul")}
_TORCH_REFUSED = {"from_file", "from_numpy"}  # a file's contents, memory not owned by a tensor
_TENSOR_METHODS_REFUSED = {"apply_", "map_", "map2_", "register_hook", "register_post_accumulate_grad_hook",
                           "storage", "untyped_storage", "data_ptr", "tolist", "numpy", "share_memory_",
                           "pin_memory", "backward", "set_", "resize_", "module_load", "new_tensor"}


def resolve_function(name: str):
    """A ``call_function`` target by its qualified name, from the allowlist; ``WireError`` otherwise."""
    _check(type(name) is str, "call target")
    module_name, _, attr = name.rpartition(".")
    refused = WireError(f"the folded graph calls {name}, which is not an operation a graph may call "
                        "(allowed: torch's tensor operations, torch.nn.functional, operator's arithmetic)")
    if not attr or attr.startswith("_"):
        raise refused
    if module_name in ("operator", "_operator") and attr in _OPERATORS:
        return _OPERATORS[attr]
    if module_name == "torch" and attr in dir(torch._C._VariableFunctions) and attr not in _TORCH_REFUSED:
        return getattr(torch, attr)
    if module_name == "torch._C._nn" and hasattr(torch._C._nn, attr):
        return getattr(torch._C._nn, attr)
    if module_name == "torch.nn.functional":
        import torch.nn.functional as F
        fn = getattr(F, attr, None)
        if callable(fn) and (getattr(fn, "__module__", "") in ("torch.nn.functional", "torch._C._nn")
                             or attr in dir(torch._C._VariableFunctions)):
            return fn
    if module_name == "torch" and attr in ("flatten", "cat", "relu", "sigmoid", "tanh"):
        return getattr(torch, attr)
    if name == "builtins.getattr":
        return builtins.getattr
    raise refused


def _rebuild_graph_module(node, depth):
    from torch import fx
    _check(len(node) == 3 and type(node[1]) is list, "graph module")
    root = decode(node[2], None, depth + 1)
    graph = fx.Graph()
    made = {}

    def arg(value):
        tag = _tagged(value)
        if tag == "n":
            _check(type(value[1]) is str and value[1] in made, "node reference")
            return made[value[1]]
        if tag in ("t", "l"):
            _check(type(value[1]) is list, "argument list")
            items = [arg(v) for v in value[1]]
            return tuple(items) if tag == "t" else items
        if tag == "d":
            _check(type(value[1]) is list, "argument dict")
            out = {}
            for pair in value[1]:
                _check(type(pair) is list and len(pair) == 2, "argument dict item")
                key = decode(pair[0])
                _check(type(key) is str and _IDENT.match(key) and not keyword.iskeyword(key), "keyword")
                out[key] = arg(pair[1])
            return out
        _check(tag not in ("M", "G", "H", "T", "P", "np", "npa"), "graph argument")
        return decode(value, None, depth + 1)

    for record in node[1]:
        _check(type(record) is list and len(record) == 5, "graph node")
        name, op, target, args, kwargs = record
        _identifier(name, "node name")
        args, kwargs = arg(args), arg(kwargs)
        _check(type(args) is tuple and type(kwargs) is dict, "node arguments")
        if op == "placeholder":
            target = _identifier(target, "input name")
        elif op == "output":
            target = "output"
        elif op == "call_function":
            target = resolve_function(target)
            if target is builtins.getattr:
                _check(len(args) == 2 and type(args[1]) is str and not args[1].startswith("_"),
                       "getattr of a private attribute")
        elif op == "call_method":
            _identifier(target, "method name")
            _check(not target.startswith("_") and hasattr(torch.Tensor, target)
                   and target not in _TENSOR_METHODS_REFUSED, f"method {target}")
        elif op in ("call_module", "get_attr"):
            _check(type(target) is str and all(_PART.match(p) and not p.startswith("__")
                                              for p in target.split(".")), "submodule path")
            try:
                root.get_submodule(target) if op == "call_module" else _attribute(root, target)
            except AttributeError:
                raise WireError(f"the graph refers to {target}, which the module does not have") from None
        else:
            raise WireError(f"a graph node of unknown kind {op!r}")
        made[name] = graph.create_node(op, target, args, kwargs, name=name)
    try:
        graph.lint()
        module = fx.GraphModule(root, graph)
    except Exception as exc:  # noqa: BLE001 - a graph that does not hold together is the student's error
        raise WireError(f"the returned graph module could not be rebuilt: {type(exc).__name__}: {exc}") from None
    module.training = root.training
    return module


def _attribute(root, target):
    *path, last = target.split(".")
    owner = root.get_submodule(".".join(path)) if path else root
    if last in owner._parameters or last in owner._buffers or last in owner._modules \
            or isinstance(owner.__dict__.get(last), torch.Tensor):
        return getattr(owner, last)
    raise AttributeError(target)
