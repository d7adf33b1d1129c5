"""The clean recheck's isolation boundary: student Python runs only in the solution worker, values come back by
type, honest idioms keep their points, speed needs correctness, and native code is checked before it loads.

Each attack here got full marks from the blocklist sanitizer that ran student cells inside the checker."""

import copy
import json
import operator
import os

import pytest
import torch
from torch import fx, nn

import fuselab
from fuselab import native_check
from fuselab.grading.sandbox import isolate
from fuselab.grading.recheck import clean as recheck, wire
from fuselab.grading.recheck.sanitize import sanitize_cell


def _cell(source, grade_id, graded=False, solution=False, points=0):
    meta = {"nbgrader": {"grade_id": grade_id, "grade": graded, "solution": solution, "locked": not solution,
                         "schema_version": 3, **({"points": points} if graded else {})}}
    return {"cell_type": "code", "metadata": meta, "source": source, "outputs": [], "execution_count": None}


def _notebook(cells):
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells}


SETUP = "import copy\nimport torch\nfrom torch import nn\nimport fuselab\n"

# the instructor's notebook: each solution cell defines what the lab asks for, each test checks it in the checker
INSTRUCTOR = [
    _cell(SETUP, "setup"),
    _cell("def zeros_like_sum(a, b):\n    return a + b", "sol_sum", solution=True),
    _cell("a, b = torch.randn(37, dtype=torch.float64), torch.randn(37, dtype=torch.float64)\n"
          "fuselab.assert_close(zeros_like_sum(a, b), a + b)", "test_sum", graded=True, points=2),
    _cell("def out_size(n, k, s, p):\n    return (n + 2 * p - k) // s + 1", "sol_size", solution=True),
    _cell("assert out_size(5, 3, 2, 1) == 3 and out_size(7, 3, 1, 0) == 5", "test_size", graded=True, points=1),
    _cell("def fold(conv, scale):\n    new = copy.deepcopy(conv)\n    with torch.no_grad():\n"
          "        new.weight.mul_(scale)\n    return new", "sol_fold", solution=True),
    _cell("conv = nn.Conv2d(3, 5, 3, padding=1)\nbefore = {k: v.clone() for k, v in conv.state_dict().items()}\n"
          "got = fold(conv, 2.0)\nassert type(got) is nn.Conv2d and got is not conv\n"
          "assert all(torch.equal(v, before[k]) for k, v in conv.state_dict().items())\n"
          "x = torch.randn(2, 3, 7, 9)\nfuselab.assert_close(got(x), 2 * torch.nn.functional.conv2d(x, conv.weight, "
          "None, padding=1) + conv.bias.view(-1, 1, 1))\n"
          "try:\n    fold('not a conv', 1.0)\nexcept (ValueError, AttributeError, TypeError):\n    pass\n"
          "else:\n    raise AssertionError('expected an error')", "test_fold", graded=True, points=3),
]


def _run(cells_by_id, tmp_path):
    nb = _notebook(INSTRUCTOR)
    student = json.loads(json.dumps(nb))
    for cell in student["cells"]:
        grade_id = cell["metadata"]["nbgrader"]["grade_id"]
        if grade_id in cells_by_id:
            cell["source"] = cells_by_id[grade_id]
    return recheck.run_clean(nb, student, tmp_path, cell_timeout=60, total_timeout=180,
                             limits=isolate.Limits(memory_bytes=3 * 2**30))


ATTACKS = {
    # a default argument rebinds fuselab.assert_close through operator.methodcaller and torch.sys: no forbidden
    # name, no attribute assignment in the source
    "sol_sum": "import operator\n"
               "def zeros_like_sum(a, b, _=operator.methodcaller('__setattr__', 'assert_close', "
               "lambda *args, **kw: None)(torch.sys.modules['fuselab'])):\n    return torch.zeros_like(a)\n",
    # a lying int: every == is true
    "sol_size": "class Whatever(int):\n    def __eq__(self, other):\n        return True\n"
                "def out_size(n, k, s, p):\n    return Whatever(0)\n",
    # a class named like the module the tests use
    "sol_fold": "class fuselab:\n    assert_close = staticmethod(lambda *args, **kw: None)\n"
                "def fold(conv, scale):\n    if not isinstance(conv, nn.Module):\n"
                "        raise ValueError('not a conv')\n    return copy.deepcopy(conv)\n",
}


def test_definition_time_rebinding_lying_values_and_shadowing_never_reach_the_checker(tmp_path):
    result = _run(ATTACKS, tmp_path)
    points = {k: v.points for k, v in result.cells.items()}
    assert points == {"test_sum": 0.0, "test_size": 0.0, "test_fold": 0.0}, result.cells
    assert result.cells["test_size"].message.startswith("AssertionError")  # a plain 0 compared honestly
    assert any("methodcaller" in flag for flag in result.flags)  # the attempt is flagged for a TA


HONEST = {
    "sol_sum": "import operator\nADD = operator.add  # a constant that is not a literal\n"
               "def zeros_like_sum(a, b):\n    return ADD(a, b)\n"
               "print('a top-level experiment', zeros_like_sum(torch.ones(2), torch.ones(2)))\n",
    "sol_size": "undefined_name_in_an_experiment\n"
                "def out_size(n, k, s, p):\n    return (n + 2 * p - getattr(k, 'real', k)) // s + 1\n",
    # the torch.nn.utils.fusion way: deepcopy, then assign a new Parameter; a refusal as a ValueError
    "sol_fold": "CONVS = (nn.Conv1d, nn.Conv2d)\n"
                "def fold(conv, scale):\n    if not isinstance(conv, CONVS):\n"
                "        raise ValueError('fold needs a conv')\n"
                "    fused = copy.deepcopy(conv)\n"
                "    fused.weight = nn.Parameter(conv.weight.detach() * scale)\n"
                "    fused.padding_mode = getattr(conv, 'padding_mode', 'zeros')\n    return fused\n",
}


def test_honest_idioms_keep_full_marks_and_are_not_flagged(tmp_path):
    result = _run(HONEST, tmp_path)
    assert {k: v.points for k, v in result.cells.items()} == {"test_sum": 2.0, "test_size": 1.0,
                                                             "test_fold": 3.0}, result.cells
    assert result.flags == []


def test_the_sanitizer_flags_without_dropping_and_spares_honest_idioms():
    for source in HONEST.values():
        assert sanitize_cell(source).flags == [] and sanitize_cell(source).source == source
    flags = " ".join(sanitize_cell(ATTACKS["sol_sum"]).flags)
    assert "methodcaller" in flags and "__setattr__" in flags


# honest code that lost its points: numpy's integers (np.prod, np.int64 arithmetic) could not cross the wire, and a
# function the lab asks for in one solution cell, written in an earlier one, never reached the checker
HONEST_UNUSUAL = {
    "sol_sum": "import numpy as np\n\n"
               "def zeros_like_sum(a, b):\n    return a + b\n\n\n"
               "def out_size(n, k, s, p):  # written here, with the sum\n"
               "    return np.int64(n + 2 * p - k) // np.int64(s) + 1\n",
    "sol_size": "# out_size is defined in the cell above\n",
}


def test_numpy_values_and_a_function_written_in_an_earlier_solution_cell_keep_their_points(tmp_path):
    result = _run(HONEST_UNUSUAL, tmp_path)
    assert {k: v.points for k, v in result.cells.items()} == {"test_sum": 2.0, "test_size": 1.0,
                                                             "test_fold": 3.0}, result.cells


def test_numpy_values_cross_as_the_same_numpy_type():
    import numpy as np
    rng = np.random.default_rng(int(torch.randint(0, 2**31, ())))
    scalars = [np.int64(rng.integers(-2**40, 2**40)), np.float32(rng.normal()), np.bool_(rng.random() < 0.5),
               np.uint8(rng.integers(0, 256)), np.complex128(complex(rng.normal(), rng.normal()))]
    arrays = [rng.normal(size=(3, 4)).astype(np.float32), rng.integers(0, 9, size=(5,)),
              rng.normal(size=4).astype(">f8")]  # big-endian: arrives in this machine's order, equal values
    got = _roundtrip((scalars, arrays))
    for sent, back in zip(scalars, got[0]):
        assert type(back) is type(sent) and back == sent
    for sent, back in zip(arrays, got[1]):
        assert type(back) is np.ndarray and back.dtype == sent.dtype.newbyteorder("=") and np.array_equal(back, sent)

    class Lying(np.float64):
        def __eq__(self, other):
            return True

    assert type(_roundtrip(Lying(1.5))) is float and _roundtrip(Lying(1.5)) != 2.0
    with pytest.raises(wire.WireError):  # a scalar whose bytes do not fit its dtype
        wire.decode(["np", "int64", b"\x00" * 3])
    with pytest.raises(wire.WireError):  # an array whose bytes do not fit its shape
        wire.decode(["npa", "float32", [2, 2], b"\x00" * 12])
    with pytest.raises(wire.WireError):
        wire.decode(["np", "object", b"\x00" * 8])


# a fold that changes its input in place: the lab's tests fail it in the notebook ("the original is modified",
# "return a new module"), and the clean recheck gave full marks, its arguments being the worker's copies
IN_PLACE = {
    "sol_fold": "def fold(conv, scale):\n    if not isinstance(conv, nn.Module):\n"
                "        raise ValueError('not a conv')\n"
                "    with torch.no_grad():\n        conv.weight.mul_(scale)\n    return copy.deepcopy(conv)\n",
}
RETURNS_ITS_ARGUMENT = {
    "sol_fold": "def fold(conv, scale):\n    if not isinstance(conv, nn.Module):\n"
                "        raise ValueError('not a conv')\n"
                "    fused = copy.deepcopy(conv)\n    with torch.no_grad():\n        fused.weight.mul_(scale)\n"
                "    conv.load_state_dict(fused.state_dict())\n    return conv\n",
}


@pytest.mark.parametrize("cells", [IN_PLACE, RETURNS_ITS_ARGUMENT], ids=["changes_its_input", "returns_its_input"])
def test_a_function_that_changes_its_arguments_is_seen_to_in_the_checker(tmp_path, cells):
    result = _run(cells, tmp_path)
    assert result.cells["test_fold"].points == 0 and result.cells["test_sum"].points == 2, result.cells


def test_arguments_are_written_back_and_a_returned_argument_is_the_checkers_own(worker):
    worker.run_cell("setup", SETUP, want_names=False)
    names, error = worker.run_cell("scale", "def scale_(x, module, factor):\n    x.mul_(factor)\n"
                                   "    module.weight.data.add_(1)\n    module.bias = None\n    module.eval()\n"
                                   "    return x, module, x.clone()\n", want_names=["scale_"])
    assert error is None
    x = torch.randn(int(torch.randint(1, 50, ())))
    linear = nn.Linear(3, 4)
    expected_x, expected_w = 3 * x, linear.weight.detach() + 1
    got_x, got_module, copy_of_x = names["scale_"](x, linear, 3.0)
    assert got_x is x and got_module is linear and copy_of_x is not x
    assert torch.equal(x, expected_x) and torch.equal(copy_of_x, expected_x)
    assert torch.equal(linear.weight, expected_w) and linear.bias is None and not linear.training


def test_a_change_made_before_an_exception_is_written_back_too(worker):
    """A function that changes its input and then raises: a test that expects the error (and checks the caller's
    objects) saw the checker's untouched arguments, the change being lost with the worker's copies."""
    worker.run_cell("setup", SETUP, want_names=False)
    names, error = worker.run_cell("refuse", "def scale_then_refuse(x, module, factor):\n    x.mul_(factor)\n"
                                   "    module.weight.data.add_(1)\n    module.eval()\n"
                                   "    raise ValueError('refused after the change')\n",
                                   want_names=["scale_then_refuse"])
    assert error is None
    x = torch.randn(int(torch.randint(1, 50, ())))
    linear = nn.Linear(3, 4)
    expected_x, expected_w = 3 * x, linear.weight.detach() + 1
    with pytest.raises(ValueError, match="refused after the change"):
        names["scale_then_refuse"](x, linear, 3.0)
    assert torch.equal(x, expected_x) and torch.equal(linear.weight, expected_w) and not linear.training


def test_a_copied_solution_cell_runs_as_in_the_notebook(tmp_path):
    """A solution cell copied in JupyterLab keeps its grade id. The clean recheck took the first copy (here the
    student's old attempt), while the notebook runs both and the later definition wins (nbgrader's autograde keeps
    the last copy as the graded cell)."""
    nb = _notebook(INSTRUCTOR)
    student = json.loads(json.dumps(nb))
    index = next(i for i, c in enumerate(student["cells"]) if c["metadata"]["nbgrader"]["grade_id"] == "sol_size")
    old_attempt = json.loads(json.dumps(student["cells"][index]))
    old_attempt["source"] = "def out_size(n, k, s, p):\n    return (n - k) / s  # first try\n\nBLOCK = 2\n"
    broken = json.loads(json.dumps(student["cells"][index]))
    broken["source"] = "def out_size(n, k, s p):\n"  # a copy that does not parse runs nothing
    student["cells"][index]["source"] = "def out_size(n, k, s, p):\n    return (n + BLOCK * p - k) // s + 1\n"
    student["cells"][index:index] = [old_attempt, broken]
    cells, flags = recheck.clean_plan(nb, student)
    assert any("sol_size" in flag and "3 cells" in flag for flag in flags)
    result = recheck.run_clean(nb, student, tmp_path, cell_timeout=60, total_timeout=180,
                               limits=isolate.Limits(memory_bytes=3 * 2**30))
    assert {k: v.points for k, v in result.cells.items()} == {"test_sum": 2.0, "test_size": 1.0,
                                                             "test_fold": 3.0}, result.cells



def test_a_solution_cell_that_lost_its_id_is_graded_from_the_students_cell_that_defines_its_names(tmp_path):
    """A solution cell deleted and typed again, or pasted into a new cell, has no nbgrader id (Jupyter keeps the
    metadata with the cell): nbgrader's own run of the notebook would find its names, so the clean recheck takes
    the student's last cell without an id that defines them all, and says so; where none does, the flag says what
    the student can do. A cell that defines only some of the names is not taken."""
    nb = _notebook(INSTRUCTOR)
    student = json.loads(json.dumps(nb))
    index = next(i for i, c in enumerate(student["cells"]) if c["metadata"]["nbgrader"]["grade_id"] == "sol_size")
    retyped = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
               "source": "def out_size(n, k, s, p):\n    return (n + 2 * p - k) // s + 1\n"}
    partial = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
               "source": "BLOCK = 2\n"}
    student["cells"][index:index + 1] = [partial, retyped]
    cells, flags = recheck.clean_plan(nb, student)
    [flag] = [f for f in flags if f.startswith("sol_size:")]
    assert "no cell of the submission has this solution cell's nbgrader id" in flag and "graded with" in flag
    assert next(c for c in cells if c["grade_id"] == "sol_size")["source"] == retyped["source"]
    result = recheck.run_clean(nb, student, tmp_path, cell_timeout=60, total_timeout=180,
                               limits=isolate.Limits(memory_bytes=3 * 2**30))
    assert result.cells["test_size"].points == 1.0, result.cells["test_size"]
    del student["cells"][index + 1]  # only the cell that defines some of the names is left
    cells, flags = recheck.clean_plan(nb, student)
    [flag] = [f for f in flags if f.startswith("sol_size:")]
    assert "copy the cell from the released notebook" in flag
    assert next(c for c in cells if c["grade_id"] == "sol_size")["source"] == ""

# --- the restricted decoder -------------------------------------------------------------------------------

def _roundtrip(value):
    return wire.decode(wire.load_tree(wire.dump_tree(wire.encode(value))))


def test_values_cross_as_their_exact_types():
    class Liar(int):
        def __eq__(self, other):
            return True

    class Odd(float):
        pass

    got = _roundtrip((Liar(3), [Odd(2.5), "s", None, True, 1 + 2j], {"k": torch.float16}, slice(1, None)))
    assert got == (3, [2.5, "s", None, True, 1 + 2j], {"k": torch.float16}, slice(1, None))
    assert type(got[0]) is int and type(got[1][0]) is float and got[0] != 4


def test_modules_and_graphs_are_rebuilt_from_allowlisted_parts():
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU()).eval()
    net[1].running_mean.uniform_()
    rebuilt = _roundtrip(net)
    assert type(rebuilt) is nn.Sequential and not rebuilt.training
    x = torch.randn(2, 3, 6, 5)
    assert torch.equal(rebuilt(x), net(x))
    traced = fx.symbolic_trace(net)
    graph = _roundtrip(traced)
    assert isinstance(graph, fx.GraphModule) and torch.equal(graph(x), net(x))


@pytest.mark.parametrize("how", ["forward", "_conv_forward", "eval", "a function", "nested"])
def test_a_module_attribute_that_is_code_or_replaces_a_method_is_refused(how):
    """An instance attribute is found before the class's methods: a conv whose own ``forward`` (or the
    ``_conv_forward`` its forward calls, or ``eval``) is the unfolded conv and BN computes the right outputs from
    zero weights. Module attributes cross as data only; the conv's ordinary attributes still do."""
    conv, bn = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4).eval()
    cheat = copy.deepcopy(conv)
    with torch.no_grad():
        cheat.weight.zero_()
    unfolded = nn.Sequential(copy.deepcopy(conv), copy.deepcopy(bn))
    target = cheat
    if how == "nested":  # inside a container, as a folded network would carry it
        target, cheat = cheat, nn.Sequential(cheat, nn.ReLU())
    name = {"a function": "padding_mode"}.get(how, "forward" if how == "nested" else how)
    value = (lambda *a: unfolded(a[0])) if how == "a function" else unfolded
    target.__dict__[name] = value
    if how == "a function":  # the worker does not send code at all
        with pytest.raises(wire.Unsendable):
            _roundtrip(cheat)
    else:  # the worker sends a module as a module; the checker refuses it as an attribute
        with pytest.raises(wire.WireError, match=f"attribute '{name}'"):
            _roundtrip(cheat)
    honest = _roundtrip(copy.deepcopy(conv))
    assert honest.padding_mode == "zeros" and honest.stride == (1, 1)
    x = torch.randn(1, 3, 5, 6)
    assert torch.equal(honest(x), conv(x))


def test_a_graph_that_calls_outside_the_allowlist_is_refused():
    traced = fx.symbolic_trace(nn.Sequential(nn.ReLU()))
    tree = wire.encode(traced)
    for node in tree[1]:
        if node[1] == "call_module":
            node[1], node[2] = "call_function", "torch.load"
    with pytest.raises(wire.WireError, match="torch.load"):
        wire.decode(wire.load_tree(wire.dump_tree(tree)))
    with pytest.raises(wire.WireError):
        wire.resolve_function("torch.from_file")
    tree = wire.encode(fx.symbolic_trace(nn.Sequential(nn.Flatten())))
    for node in tree[1]:  # a keyword that would be code in the rebuilt graph's source
        if node[1] == "call_module":
            node[1], node[2], node[4] = "call_function", "torch.flatten", ["d", [[["v", "x=1); import os; ("],
                                                                                  ["v", 1]]]]
    with pytest.raises(wire.WireError, match="keyword"):
        wire.decode(wire.load_tree(wire.dump_tree(tree)))
    forged = ["M", "builtins.object", {}, {}, {}, {}, False]
    with pytest.raises(wire.WireError):
        wire.decode(forged)


def test_pickles_from_the_worker_are_never_loaded():
    import pickle
    with pytest.raises(wire.WireError):
        wire.load_tree(pickle.dumps(operator.methodcaller("x")))


# --- speed needs correctness -----------------------------------------------------------------------------

def test_speed_counts_only_when_the_timed_kernels_correctness_tests_passed():
    def verdicts(fused_points):
        return {"test_fused": recheck.CellVerdict("test_fused", fused_points, 2.0,
                                                  "passed" if fused_points == 2 else "failed"),
                "test_speedup": recheck.CellVerdict("test_speedup", 3.5, 4.0, "partial",
                                                    speed=[{"test": "lab0.add_relu_mul", "points": 3.5}])}
    wrong = verdicts(0.0)
    recheck.speed_needs_correctness(wrong)
    assert wrong["test_speedup"].points == 0 and wrong["test_speedup"].requires_failed == ["test_fused"]
    assert "speed counts only for a kernel that passes its correctness tests: test_fused failed" in \
        wrong["test_speedup"].message
    right = verdicts(2.0)
    recheck.speed_needs_correctness(right)
    assert right["test_speedup"].points == 3.5 and right["test_speedup"].requires_failed == []
    policy = fuselab.speed.load_policy()
    assert all(entry.get("speed_requires") for entry in policy["tests"].values())


# --- native code ------------------------------------------------------------------------------------------

LAUNCHER = "void scale(const float* x, float* out, int64_t n, cudaStream_t stream)"
KERNEL = ("__global__ void scale_kernel(const float* x, float* out, int64_t n) {\n"
          "    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;\n    if (i < n) out[i] = 2.0f * x[i];\n}\n"
          "void scale(const float* x, float* out, int64_t n, cudaStream_t stream) {\n"
          "    scale_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, out, n);\n}\n")
# reaches the loader without its name in the text, and runs at load time without the word "constructor"
PASTED = ('#define PASTE2(a, b) a##b\n#define PASTE(a, b) PASTE2(a, b)\n'
          'extern "C" void* PASTE(dl, sym)(void*, const char*);\n'
          'static void* found = PASTE(dl, sym)((void*)0, "P" "yRun_SimpleString");\n')


def test_the_symbol_allowlist_keeps_what_kernels_need_and_nothing_else():
    for name in ("cudaLaunchKernel", "__cudaRegisterFunction", "sqrtf", "memcpy", "_Znwm", "__cxa_guard_acquire"):
        assert native_check.symbol_allowed(name, "cuda")
    for name in ("GOMP_parallel", "mmap", "getenv"):  # the emulation runtime's own, not a CUDA build's
        assert native_check.symbol_allowed(name, "emulate") and not native_check.symbol_allowed(name, "cuda")
    for name in ("dlsym", "dlopen", "PyRun_SimpleString", "syscall", "system", "open", "fopen", "socket",
                 "execve", "fork", "cudaIpcOpenMemHandle",
                 "_ZNSt14basic_ofstreamIcSt11char_traitsIcEE4openEPKcSt13_Ios_Openmode"):
        assert not native_check.symbol_allowed(name, "cuda") and not native_check.symbol_allowed(name, "emulate")


def test_a_library_that_calls_the_loader_or_runs_at_load_time_is_never_loaded(monkeypatch):
    monkeypatch.setenv(native_check.POLICY_ENV, "1")
    honest = fuselab.build(KERNEL, [LAUNCHER], name="scale_ok", backend="emulate")
    x = torch.randn(1000)
    out = torch.empty_like(x)
    honest.scale(x, out, x.numel())
    assert torch.equal(out, 2 * x)
    for source, why in [(PASTED + KERNEL, "dlsym"),
                        ("__attribute__((constructor)) static void boom() {}\n" + KERNEL, "runs when the library"),
                        ("__attribute__((__constructor__)) static void boom() {}\n" + KERNEL, "runs when the library"),
                        ("__attribute__ ((__destructor__(101))) static void boom() {}\n" + KERNEL, "runs when"),
                        ("struct S {}; S s __attribute__((__init_priority__(200)));\n" + KERNEL, "runs when"),
                        ('#include <cstdlib>\nstatic int ran = system("true");\n' + KERNEL, "system")]:
        mod = fuselab.build(source, [LAUNCHER], name="scale_bad", backend="emulate")
        assert isinstance(mod, native_check.RefusedModule)
        with pytest.raises(native_check.NativeCodeRefused, match=why):
            mod.scale(x, out, x.numel())


# --- what cannot be rebuilt stays in the worker -------------------------------------------------------------

OWN_MODULE = '''
class Folded(nn.Module):  # a module of the student's own class: the checker cannot rebuild it
    def __init__(self, conv, bn):
        super().__init__()
        self.conv, self.bn = conv, bn

    def forward(self, x):
        return self.bn(self.conv(x))


def fold_network(model):
    if model.training:
        raise ValueError("fold only in eval mode")
    return Folded(*copy.deepcopy(list(model.children()))), 0
'''


@pytest.fixture
def worker(tmp_path):
    """A solution worker on pipes, as the grader starts one (a top-level budget of 3 s per cell)."""
    import os
    import subprocess
    import sys

    from fuselab.grading.recheck.remote import SolutionProcess
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    env = dict(recheck.runner_env(os.environ, tmp_path, None), FUSELAB_SOLUTION_CELL_S="3")
    process = subprocess.Popen([sys.executable, "-m", "fuselab.grading.recheck.solution_worker", str(to_r), str(from_w)],
                               pass_fds=(to_r, from_w), cwd=tmp_path, stdout=subprocess.DEVNULL, env=env)
    os.close(to_r)
    os.close(from_w)
    yield SolutionProcess(to_w, from_r)
    os.close(to_w)
    process.wait(timeout=30)
    os.close(from_r)


WRONG_FOLDS = {  # a wrong fold_conv_bn, and what it does to its arguments so that the wrong answer looks right
    "γ and β left out, and taken from the BN": (
        "gamma, beta = torch.ones_like(var), torch.zeros_like(var)", "bn.weight = None\n    bn.bias = None"),
    "the conv's bias forgotten, and taken from the conv": ("b = torch.zeros_like(var)", "conv.bias = None"),
    "float32 weights for fp16 parameters, and the conv's made float32": (
        "dtype = torch.float32",
        "conv.weight = nn.Parameter(conv.weight.detach().float(), requires_grad=conv.weight.requires_grad)"),
}
FOLD_TEMPLATE = """
def fold_conv_bn(conv, bn):
    var = bn.running_var.float()
    gamma = bn.weight.float() if bn.weight is not None else torch.ones_like(var)
    beta = bn.bias.float() if bn.bias is not None else torch.zeros_like(var)
    b = conv.bias.float() if conv.bias is not None else torch.zeros_like(var)
    dtype = conv.weight.dtype
    WRONG
    scale = gamma / torch.sqrt(var + bn.eps)
    fused = copy.deepcopy(conv).to(dtype)
    with torch.no_grad():
        fused.weight.copy_(conv.weight.float() * scale.reshape(-1, *([1] * (conv.weight.dim() - 1))))
        fused.bias = nn.Parameter(((b - bn.running_mean.float()) * scale + beta).to(dtype))
    COVER
    return fused
"""


@pytest.mark.parametrize("mistake", sorted(WRONG_FOLDS))
def test_a_fold_that_changes_its_arguments_cannot_choose_its_own_answer(worker, mistake):
    """What a student's function does to its arguments comes back to the checker's own modules. A wrong fold that
    set the BN's γ and β to None, the conv's bias to None, or the conv's weight to float32, scored full marks: the
    check read its answer, its input and the dtype it asks for from those modules after the fold ran, and the check
    that they were left alone saw neither a slot set to None nor a dtype. The answer now comes from copies made
    before the fold runs, and every slot's kind, dtype, shape and values must come back as they were."""
    from fuselab.labs import lab2
    wrong, cover = WRONG_FOLDS[mistake]
    worker.run_cell("setup", SETUP, want_names=False)
    for code, says in ((FOLD_TEMPLATE.replace("WRONG", wrong).replace("COVER", "pass"), "fold|float"),
                       (FOLD_TEMPLATE.replace("WRONG", wrong).replace("COVER", cover),
                        "was modified|expected torch.float16")):
        names, error = worker.run_cell("fold", code, want_names=["fold_conv_bn"])
        assert error is None, error
        with pytest.raises(AssertionError, match=says):
            lab2.check_fold_module(names["fold_conv_bn"], lab2.FOLD_CASES)
    honest = FOLD_TEMPLATE.replace("WRONG", "pass").replace("COVER", "pass")
    names, error = worker.run_cell("fold", honest, want_names=["fold_conv_bn"])
    lab2.check_fold_module(names["fold_conv_bn"], lab2.FOLD_CASES)


def test_a_slow_experiment_costs_only_itself(worker):
    names, error = worker.run_cell("slow", "import time\nwhile True:\n    time.sleep(0.01)\nprint('skipped')\n"
                                   "SCALE = 2\ndef double(x):\n    return SCALE * x\n", want_names=["double"])
    assert error.startswith("TimeoutError") and set(names) == {"double"} and names["double"](21) == 42


def test_a_module_of_the_students_own_class_arrives_as_the_graph_of_its_forward(worker):
    """fx traces it in the worker; the checker rebuilds the graph and runs (and counts) its operations itself."""
    from fuselab.labs import lab2
    worker.run_cell("setup", SETUP, want_names=False)
    names, error = worker.run_cell("fold", OWN_MODULE, want_names=["fold_network"])
    assert error is None and set(names) == {"fold_network"}
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval()
    model[1].running_var.uniform_(0.5, 2.0)
    folded, count = names["fold_network"](model)
    assert isinstance(folded, fx.GraphModule) and count == 0 and type(count) is int
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(folded.eval()(x), model(x))  # computed here
    assert lab2._bn_calls(folded, x) == 1
    with pytest.raises(ValueError, match="eval mode"):
        names["fold_network"](model.train())


# a "folded" model whose class hides the original network from .modules() (the worker's own count of BatchNorm
# calls, hooks on .modules(), saw none) and whose forward fx cannot trace: it stays in the worker, and nothing the
# worker says about it counts
HIDDEN_BN = """
class Folded(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.hidden = [model]  # a list, not a submodule

    def forward(self, x):
        if float(x.sum()) > 1e30:  # data-dependent: fx cannot trace it
            return x
        return self.hidden[0](x)


def fold_network(model):
    return Folded(copy.deepcopy(model)).eval(), 2
"""


def test_a_module_the_grader_cannot_see_into_earns_nothing_from_what_it_says_about_itself(worker):
    from fuselab.grading.recheck.remote import RemoteModule
    from fuselab.labs import lab2
    worker.run_cell("setup", SETUP, want_names=False)
    names, error = worker.run_cell("fold", HIDDEN_BN, want_names=["fold_network"])
    assert error is None
    channels = int(torch.randint(2, 6, ()))
    model = nn.Sequential(nn.Conv2d(3, channels, 3), nn.BatchNorm2d(channels), nn.ReLU(),
                          nn.Conv2d(channels, channels, 1), nn.BatchNorm2d(channels)).eval()
    for bn in (model[1], model[4]):
        bn.running_var.uniform_(0.5, 2.0)
        bn.running_mean.normal_()
    folded, count = names["fold_network"](model)
    x = torch.randn(2, 3, 9, 7)
    assert isinstance(folded, RemoteModule) and torch.equal(folded(x), model(x))  # right outputs, BNs still run
    with pytest.raises(AssertionError, match="could not trace"):
        lab2._bn_calls(folded, x)
    with pytest.raises(AssertionError, match="could not trace"):
        lab2.check_fold_network(names["fold_network"], [(model, 2, tuple(x.shape))])


def _foldable_pairs(traced):
    modules = dict(traced.named_modules())
    for node in list(traced.graph.nodes):
        if node.op == "call_module" and isinstance(modules[node.target], nn.modules.batchnorm._BatchNorm):
            source = node.args[0]
            if source.op == "call_module" and isinstance(modules[source.target], nn.modules.conv._ConvNd) \
                    and len(source.users) == 1:
                yield source, node, modules[source.target], modules[node.target]


def _graph_pass(replace):
    """A fold_network that traces a copy of the model and hands each foldable pair to ``replace(traced, conv_node,
    bn_node, conv, bn, i)``, which returns the node standing for the pair's output; its result crosses the wire."""
    def fold_network(model):
        traced = fx.symbolic_trace(copy.deepcopy(model))
        pairs = list(_foldable_pairs(traced))
        for i, (conv_node, bn_node, conv, bn) in enumerate(pairs):
            with traced.graph.inserting_before(bn_node):
                new = replace(traced, conv_node, bn_node, conv, bn, i)
            bn_node.replace_all_uses_with(new)
            traced.graph.erase_node(bn_node)
        traced.recompile()
        return _roundtrip((traced.eval(), len(pairs)))
    return fold_network


def _scale_shift(bn):
    scale = torch.rsqrt(bn.running_var + bn.eps) * (bn.weight.detach() if bn.affine else 1.0)
    return scale, (bn.bias.detach() if bn.affine else 0.0) - bn.running_mean * scale


def _functional_bn(traced, conv_node, bn_node, conv, bn, i):
    graph, t = traced.graph, bn_node.target
    weight = graph.get_attr(f"{t}.weight") if bn.affine else None
    bias = graph.get_attr(f"{t}.bias") if bn.affine else None
    return graph.call_function(torch.nn.functional.batch_norm, (
        bn_node.args[0], graph.get_attr(f"{t}.running_mean"), graph.get_attr(f"{t}.running_var"), weight, bias,
        False, 0.0, bn.eps))


def _instance_norm(traced, conv_node, bn_node, conv, bn, i):
    norm = nn.InstanceNorm2d(bn.num_features, eps=bn.eps, affine=bn.affine, track_running_stats=True)
    norm.load_state_dict(bn.state_dict())
    traced.add_submodule(f"norm{i}", norm.eval())
    return traced.graph.call_module(f"norm{i}", (bn_node.args[0],))


def _pointwise_conv(traced, conv_node, bn_node, conv, bn, i):
    c = bn.num_features
    scale, shift = _scale_shift(bn)
    pointwise = nn.Conv2d(c, c, 1, groups=c)
    with torch.no_grad():
        pointwise.weight.copy_(scale.view(c, 1, 1, 1))
        pointwise.bias.copy_(shift)
    traced.add_submodule(f"pointwise{i}", pointwise.eval())
    return traced.graph.call_module(f"pointwise{i}", (bn_node.args[0],))


def _multiply_add(traced, conv_node, bn_node, conv, bn, i):
    scale, shift = _scale_shift(bn)
    traced.register_buffer(f"scale{i}", scale.view(1, -1, 1, 1).clone())
    traced.register_buffer(f"shift{i}", shift.view(1, -1, 1, 1).clone())
    graph = traced.graph
    return graph.call_function(torch.addcmul, (graph.get_attr(f"shift{i}"), bn_node.args[0],
                                               graph.get_attr(f"scale{i}")))


def _folded_conv(traced, conv_node, bn_node, conv, bn, i):
    """Honest, the way an fx pass is often written: a new node calls the folded conv; the old conv node is left in
    the graph, dead (nothing uses its output)."""
    traced.add_submodule(f"folded{i}", torch.nn.utils.fusion.fuse_conv_bn_eval(conv, bn))
    return traced.graph.call_module(f"folded{i}", conv_node.args)


def _identity(model):
    """Honest, the torch.ao.quantization.fuse_modules way: a copy of the model, each folded conv in its conv's place
    and nn.Identity in its BN's."""
    copied = copy.deepcopy(model)
    pairs = list(_foldable_pairs(fx.symbolic_trace(copied)))
    for conv_node, bn_node, conv, bn in pairs:
        for target, module in ((conv_node.target, torch.nn.utils.fusion.fuse_conv_bn_eval(conv, bn)),
                               (bn_node.target, nn.Identity())):
            parent, _, name = target.rpartition(".")
            setattr(copied.get_submodule(parent), name, module)
    return _roundtrip((copied.eval(), len(pairs)))


@pytest.mark.parametrize("replace", [_functional_bn, _instance_norm, _pointwise_conv, _multiply_add])
def test_a_folded_network_that_computes_its_batchnorms_another_way_fails(replace):
    """Each of these got full marks when BatchNorms were counted as calls of BatchNorm modules: the outputs are
    right, the count is right, and no BatchNorm module runs; but every BN still runs, as another operation."""
    from fuselab.labs import lab2
    seed = int(torch.randint(0, 1000, ()))
    with pytest.raises(AssertionError, match="BatchNorm"):
        lab2.check_fold_network(_graph_pass(replace), [lab2.random_network(seed)], seed=seed)


@pytest.mark.parametrize("fold_network", [_graph_pass(_folded_conv), _identity])
def test_honest_folded_networks_pass_whatever_their_shape(fold_network):
    from fuselab.labs import lab2
    seed = int(torch.randint(0, 1000, ()))
    lab2.check_fold_network(fold_network, [lab2.random_network(seed), lab2.tricky_network(seed)], seed=seed)


def _poison_with_nan(graph, x):
    return graph.call_method("fill_", (x, float("nan")))


def _poison_by_copy(graph, x):
    return graph.call_function(operator.imul, (x, 0.0))


@pytest.mark.parametrize("poison", [_poison_with_nan, _poison_by_copy])
def test_a_folded_graph_that_writes_into_its_input_cannot_change_what_it_is_compared_with(poison):
    """The checker runs a folded graph itself, on tensors of its own: a wrong fold (γ left out) whose graph first
    wrote into its input (NaN everywhere, or zeros; an activation dropped to pay for that node in the operation
    count) got full marks while the expected output was computed from that input afterwards. Every check computes
    what it expects before any code of the student's runs, and hands that code tensors it does not use again."""
    from fuselab.labs import lab2

    def fold_network(model):
        traced = fx.symbolic_trace(copy.deepcopy(model))
        pairs = list(_foldable_pairs(traced))
        for i, (conv_node, bn_node, conv, bn) in enumerate(pairs):
            without_gamma = copy.deepcopy(bn)
            with torch.no_grad():
                without_gamma.weight.fill_(1.0)
            with traced.graph.inserting_before(bn_node):
                new = _folded_conv(traced, conv_node, bn_node, conv, without_gamma, i)
            bn_node.replace_all_uses_with(new)
            traced.graph.erase_node(bn_node)
        graph = traced.graph
        x = next(node for node in graph.nodes if node.op == "placeholder")
        with graph.inserting_after(x):
            written = poison(graph, x)
        x.replace_all_uses_with(written, delete_user_cb=lambda user: user is not written)
        relu = next(node for node in graph.nodes
                    if node.op == "call_module" and isinstance(traced.get_submodule(node.target), nn.ReLU))
        relu.replace_all_uses_with(relu.args[0])
        graph.erase_node(relu)
        traced.recompile()
        return _roundtrip((traced.eval(), len(pairs)))

    with pytest.raises(AssertionError, match="folded model output"):
        lab2.check_fold_network(fold_network, lab2.visible_networks())


def test_a_kernel_that_writes_into_its_input_cannot_change_the_many_planes_answer():
    """What a kernel writes into the buffers it is given comes back to the checker with them: an op that zeroed
    its input and wrote act(bias) passed Lab 1's many-planes test, whose answer was computed from the input after
    the op ran. The answer is computed first, from copies."""
    from fuselab.labs import lab1

    def op(x, w, bias, act, slope, out):
        x.zero_()
        out.copy_(lab1.activate(bias.view(1, -1, 1, 1).expand_as(out), act, slope))

    with pytest.raises(AssertionError, match="depthwise_conv_act"):
        lab1.check_many_planes(op, lab1.make_depthwise_inputs)


def test_a_kernel_that_writes_into_its_input_fails_the_many_planes_test():
    """fuselab.check refuses a kernel that changed its inputs; the many-planes test, which does not go through it,
    did not: a kernel could write into its input only past 65535 planes. It now says so."""
    from fuselab.labs import lab1

    def op(x, w, bias, act, slope, out):
        out.copy_(lab1.depthwise_reference(x, w, bias, act, slope))
        x.add_(1.0)

    with pytest.raises(AssertionError, match="input `x` was modified"):
        lab1.check_many_planes(op, lab1.make_depthwise_inputs)


def test_a_folded_graph_draws_no_number_from_the_checkers_generator():
    """A folded graph runs in the checker and may call torch's random functions: they draw from a copy of the
    checker's generator, whose state stays its own."""
    from fuselab.labs import lab2
    networks = lab2.visible_networks()[:1]

    def fold_network(model):
        traced = fx.symbolic_trace(copy.deepcopy(model))
        graph = traced.graph
        output = next(node for node in graph.nodes if node.op == "output")
        with graph.inserting_before(output):
            noise = graph.call_function(torch.rand_like, (output.args[0],))
            noisy = graph.call_function(operator.add, (output.args[0], noise))
        output.args = (noisy,)
        traced.recompile()
        return _roundtrip((traced.eval(), networks[0][1]))  # the right count: the graph runs

    state = torch.get_rng_state()
    with pytest.raises(AssertionError, match="BatchNorm"):  # nothing folded
        lab2.check_fold_network(fold_network, networks)
    assert torch.equal(torch.get_rng_state(), state)


def test_in_the_sandbox_the_worker_never_sees_the_checkers_folder(tmp_path):
    if not isolate.sandbox_works():  # CI installs bubblewrap: there a sandbox that cannot start is a failure
        if os.environ.get("FUSELAB_CI") == "1":
            pytest.fail(f"the sandbox must work in CI: {isolate.sandbox_problem()}")
        pytest.skip("bubblewrap cannot start here (CI installs it)")
    nb = _notebook([
        _cell(SETUP, "setup"),
        _cell("def peek():\n    return ''", "sol_peek", solution=True),
        _cell("got = peek()\nassert 'HIDDEN_MARK' not in got, got[:200]\n### BEGIN HIDDEN TESTS\n"
              "assert 'HIDDEN_MARK'\n### END HIDDEN TESTS", "test_peek", graded=True, points=1)])
    student = json.loads(json.dumps(nb))
    student["cells"][1]["source"] = (
        "import glob, os\n"
        "def peek():\n    found = glob.glob(os.path.join(os.getcwd(), '..', '*'))\n"
        "    return ' '.join(open(p).read() for p in found if os.path.isfile(p))\n")
    result = recheck.run_clean(nb, student, tmp_path / "work", cell_timeout=30, total_timeout=120, sandbox=True,
                               hide=[tmp_path], limits=isolate.Limits(memory_bytes=3 * 2**30))
    assert result.cells["test_peek"].points == 1, result.cells["test_peek"]


def test_what_a_library_calls_is_read_from_the_students_objects_not_from_how_the_runtime_was_linked(tmp_path):
    """A toolchain that links the C++ runtime statically (seen on a GPU machine's default environment) gives the
    library imports of its own (unwinding, threads, the loader); the student's code still calls only what its
    object files reference."""
    import shutil
    import subprocess
    if shutil.which("g++") is None:
        pytest.fail("g++ is needed")
    (tmp_path / "k.cpp").write_text('#include <stdexcept>\nextern "C" float twice(float x) {\n'
                                    '    if (x != x) throw std::runtime_error("nan");\n    return 2 * x;\n}\n')
    subprocess.run(["g++", "-O2", "-fPIC", "-c", "k.cpp", "-o", "k.o"], cwd=tmp_path, check=True)
    subprocess.run(["g++", "-shared", "-static-libstdc++", "k.o", "-o", "k.so"], cwd=tmp_path, check=True)
    linked = subprocess.run(["nm", "-D", "--undefined-only", "k.so"], cwd=tmp_path, capture_output=True,
                            text=True, check=True).stdout
    assert "_Unwind_RaiseException" in linked  # the static C++ runtime's own import
    calls = native_check.imported_symbols(tmp_path / "k.so")
    assert "_Unwind_RaiseException" not in calls and "__cxa_throw" in calls
    assert all(native_check.symbol_allowed(name, "cuda") for name in calls), calls


# --- device memory is not host memory under the CPU emulation ---------------------------------------------------

ADD_PROTO = ["void add(const float* a /*[n]*/, const float* b /*[n]*/, float* out /*[n]*/, int64_t n, "
             "cudaStream_t stream)"]
HOST_LOOP = ("void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {\n"
             "    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];  // host code on device pointers\n}\n")
SCRATCH_KERNEL = (
    "__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {\n"
    "    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) out[i] = a[i] + b[i];\n}\n"
    "void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {\n"
    "    if (n <= 0) return;\n    float* scratch = nullptr;\n    cudaMalloc(&scratch, n * sizeof(float));\n"
    "    add_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, scratch, n);\n"
    "    cudaMemcpyAsync(out, scratch, n * sizeof(float), cudaMemcpyDeviceToDevice, stream);\n"
    "    cudaFree(scratch);\n}\n")
GUARDED_CALL = """
import sys, torch, fuselab
mod = fuselab.build(sys.argv[1], {proto!r}, name="guarded_" + str(abs(hash(sys.argv[1])) % 10**8),
                    backend="emulate")
n = int(sys.argv[2])
a, b = torch.randn(n), torch.randn(n)
out = torch.full((n,), float("nan"))
mod.add(a, b, out, n)
assert torch.equal(out, a + b), "wrong sum"
expected = a + b + b
mod.add(out, b, out, n)  # in place: the output is an input
assert torch.equal(out, expected), "wrong in-place sum"
print("SUM OK")
"""


def _guarded_run(source, tmp_path):
    import os
    import subprocess
    import sys
    env = dict(os.environ, FUSELAB_EMU_GUARD="1", FUSELAB_CACHE_DIR=str(tmp_path / "cache"))
    n = str(int(torch.randint(1, 5000, ())))
    return subprocess.run([sys.executable, "-c", GUARDED_CALL.format(proto=ADD_PROTO), source, n],
                          capture_output=True, text=True, env=env, timeout=600)


def test_a_launcher_that_computes_on_the_host_faults_under_the_emulation_as_on_a_gpu(tmp_path):
    """Its pointers are device addresses on a GPU, where the host loop segfaults; the emulation gave it full
    marks."""
    import signal
    done = _guarded_run(HOST_LOOP, tmp_path)
    assert done.returncode == -signal.SIGSEGV and "SUM OK" not in done.stdout, \
        (done.returncode, done.stdout, done.stderr[-2000:])


# honest: a __constant__ set with cudaMemcpyToSymbol, a __device__ counter kernels write, a workspace cudaMalloc'd
# once and kept across calls, cudaMemset
DEVICE_VARIABLES = (
    "__constant__ float c_scale[1];\n__device__ unsigned int d_calls;\n"
    "static float* workspace = nullptr;\nstatic int64_t workspace_n = 0;\n"
    "__global__ void add_kernel(const float* a, const float* b, float* tmp, int64_t n) {\n"
    "    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) tmp[i] = c_scale[0] * (a[i] + b[i]);\n    if (i == 0) d_calls += 1;\n}\n"
    "void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {\n"
    "    if (n <= 0) return;\n    const float one = 1.0f;\n"
    "    cudaMemcpyToSymbol(c_scale, &one, sizeof(float));\n"
    "    if (workspace_n < n) {\n        cudaFree(workspace);\n"
    "        cudaMalloc(&workspace, n * sizeof(float));\n        workspace_n = n;\n    }\n"
    "    cudaMemset(workspace, 0, n * sizeof(float));\n"
    "    add_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, workspace, n);\n"
    "    cudaMemcpyAsync(out, workspace, n * sizeof(float), cudaMemcpyDeviceToDevice, stream);\n}\n")


@pytest.mark.parametrize("source", [SCRATCH_KERNEL, DEVICE_VARIABLES], ids=["scratch", "device_variables"])
def test_kernels_runtime_copies_and_cudamalloc_still_work_under_the_guard(tmp_path, source):
    done = _guarded_run(source, tmp_path)
    assert done.returncode == 0 and "SUM OK" in done.stdout, (done.returncode, done.stdout, done.stderr[-2000:])


# launchers that compute the sum in host code and get it into kernel memory around the guard: the guard's pages
# opened again with mprotect; a __device__ array written by host code (on a GPU only cudaMemcpyToSymbol can), plain
# or through /proc/self/mem or process_vm_writev, which a kernel then copies out. The emulation gave each full marks.
HOST_SUM = ("static float ha[8192], hb[8192], hs[8192];\n"
            "static void host_sum(const float* a, const float* b, int64_t n) {\n"
            "    cudaMemcpy(ha, a, n * 4, cudaMemcpyDeviceToHost);\n"
            "    cudaMemcpy(hb, b, n * 4, cudaMemcpyDeviceToHost);\n"
            "    for (int64_t i = 0; i < n; ++i) hs[i] = ha[i] + hb[i];\n}\n")
COPY_OUT = ("__device__ float sums[8192];\n"
            "__global__ void copy_out(float* out, int64_t n) {\n"
            "    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) out[i] = sums[i];\n}\n")
LAUNCH_COPY_OUT = "    copy_out<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(out, n);\n}\n"
HOST_WRITES = {
    "mprotect": (
        "static void open_pages(const void* p, size_t bytes) {\n"
        "    uintptr_t s = (uintptr_t)p & ~(uintptr_t)4095, e = ((uintptr_t)p + bytes + 4095) & ~(uintptr_t)4095;\n"
        "    mprotect((void*)s, e - s, PROT_READ | PROT_WRITE);\n}\n"
        "void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {\n"
        "    open_pages(a, n * 4);\n    open_pages(b, n * 4);\n    open_pages(out, n * 4);\n"
        "    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];\n}\n"),
    "device_variable": (
        COPY_OUT + HOST_SUM + "void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {\n"
        "    host_sum(a, b, n);\n    for (int64_t i = 0; i < n; ++i) sums[i] = hs[i];\n" + LAUNCH_COPY_OUT),
    "proc_self_mem": (
        "#include <fcntl.h>\n" + COPY_OUT + HOST_SUM +
        "void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {\n"
        "    host_sum(a, b, n);\n    int fd = open(\"/proc/self/mem\", O_RDWR);\n"
        "    pwrite(fd, hs, n * 4, (off_t)(uintptr_t)sums);\n    close(fd);\n" + LAUNCH_COPY_OUT),
    "process_vm_writev": (
        "#include <sys/uio.h>\n" + COPY_OUT + HOST_SUM +
        "void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {\n"
        "    host_sum(a, b, n);\n    struct iovec mine = {hs, (size_t)n * 4}, theirs = {sums, (size_t)n * 4};\n"
        "    process_vm_writev(getpid(), &mine, 1, &theirs, 1, 0);\n" + LAUNCH_COPY_OUT),
}


@pytest.mark.parametrize("how", sorted(HOST_WRITES))
def test_host_code_that_writes_kernel_memory_fails_however_it_got_there(tmp_path, how):
    """Not by catching each way around the guard: kernel memory is compared, as every kernel or runtime copy starts
    and as the call ends, with what the last one left."""
    done = _guarded_run(HOST_WRITES[how], tmp_path)
    assert done.returncode != 0 and "SUM OK" not in done.stdout, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "HostWroteKernelMemory" in done.stderr and "host code wrote kernel memory outside a kernel" in done.stderr


def test_device_variables_become_kernel_memory_and_every_declaration_still_compiles(tmp_path, monkeypatch):
    """The translator puts namespace-scope __device__/__constant__ variables in the section the watch reads; not
    functions, __managed__ memory (the host may write it) or const objects (a read-only object among writable
    ones would not compile)."""
    import ctypes

    from fuselab.kernelbuild.emulate.translate import translate
    declarations = {
        "__device__ float results[64];": True, "__constant__ float weights[4] = {1, 2};": True,
        "static __device__ int counter = 0;": True, "__device__ __align__(16) float aligned[4];": True,
        "__device__ float sized[(4 + 4) / 2];": True, "__device__ const float* pointers[2];": True,
        "template <class T> __device__ T per_type = T(1);": True, "namespace k { __device__ float in_k[3]; }": True,
        "__device__ const float table[2] = {1, 2};": False, "__device__ float* const fixed = nullptr;": False,
        "__managed__ float unified[4];": False, "__device__ inline float twice(float x) { return 2 * x; }": False,
        "__device__ float declared(float);": False,
        "struct Pair { __device__ float first() const { return 1; } };": False,
    }
    translated = translate("\n".join(declarations)).splitlines()
    for (line, tagged), out in zip(declarations.items(), translated):
        assert ("FUSELAB_EMU_DEVICE_VARIABLE" in out) == tagged, (line, out)
    monkeypatch.setenv("FUSELAB_CACHE_DIR", str(tmp_path))
    mod = fuselab.build("\n".join(declarations) + "\n" + SCRATCH_KERNEL, ADD_PROTO, name="declarations",
                        backend="emulate")
    start = ctypes.c_void_p()
    assert mod._lib.fuselab_emu_device_variable_bytes(ctypes.byref(start)) > 0 and start.value
