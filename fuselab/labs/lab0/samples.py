"""Lab 0's sample submissions for the grader's sample class (see fuselab/course/sample_class.py).

grade ids: test_dram_bytes (1), test_unfused (3), test_fused (2), test_speedup (4); written answers are graded by
hand and not listed.
"""

from ..registry import Sample

_FUSED_BODY = "if (i < n) out[i] = fmaxf(a[i] + b[i], 0.0f) * e[i];"

SAMPLES = {
    "correct": Sample(why="the instructor's plain solution"),
    "different_but_correct": Sample(
        changes={"fused_source": lambda s: s.replace(
            _FUSED_BODY,
            "for (; i < n; i += (int64_t)gridDim.x * blockDim.x) {\n"
            "        float s = a[i] + b[i];\n"
            "        out[i] = s > 0.0f ? s * e[i] : 0.0f;\n"
            "    }").replace("<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>",
                            "<<<(unsigned)((n + 1023) / 1024 < 4096 ? (n + 1023) / 1024 : 4096), 1024, 0, stream>>>")},
        why="grid-stride loop, 1024-thread blocks, ternary ReLU: a different kernel, equally right"),
    "edge_bug": Sample(
        changes={"fused_source": lambda s: s.replace("if (i < n) out[i] = fmaxf", "if (i < n - 1) out[i] = fmaxf")},
        expect={"test_fused": "zero", "test_speedup": "zero"},
        why="off by one: the last element is never written (poison catches it)"),
    "compile_error": Sample(
        changes={"fused_source": lambda s: s.replace("fmaxf(a[i] + b[i], 0.0f) * e[i];",
                                                     "fmaxf(a[i] + b[i], 0.0f) * e[i]")},
        expect={"test_fused": "zero", "test_speedup": "zero"},
        why="a missing semicolon: the fused kernel does not compile; the unfused kernels still earn their points"),
    "fault": Sample(
        changes={"fused_source": lambda s: s.replace("if (i < n) out[i] = fmaxf",
                                                     "out[i + (int64_t)1 << 40] = 0.0f;\n    if (i < n) out[i] = fmaxf")},
        expect={"test_fused": "zero", "test_speedup": "zero"},
        why="an out-of-bounds write far past the output: a fault that must cost only the fused kernel's tests"),
    "endless": Sample(
        changes={"fused_source": lambda s: s.replace("if (i < n) out[i] = fmaxf",
                                                     "while (i >= 0) { i += 0; }\n    if (i < n) out[i] = fmaxf")},
        expect={"test_fused": "zero", "test_speedup": "zero"},
        why="a kernel that never ends: it must hit the test timeout, and grading must go on"),
    "cheat_cache": Sample(
        changes={"fused_source": lambda s: s.replace(
            "void add_relu_mul(const float* a, const float* b, const float* e, float* out, int64_t n, "
            "cudaStream_t stream) {\n",
            "void add_relu_mul(const float* a, const float* b, const float* e, float* out, int64_t n, "
            "cudaStream_t stream) {\n"
            "    static const float* seen[8]; static int count = 0;  // skip inputs already computed\n"
            "    for (int k = 0; k < count; ++k) if (seen[k] == a) return;\n"
            "    if (count < 8) seen[count++] = a;\n")},
        expect={"test_fused": "zero", "test_speedup": "zero"},
        why="a result cache keyed by the input pointer: fresh contents at a reused address expose it, already in "
            "the correctness test (allocators reuse addresses) and, on a GPU, in the speedup test's refresh"),
    "cheat_torch": Sample(
        changes={"fused_source": lambda s: s.replace("fmaxf(a[i] + b[i], 0.0f) * e[i]", "0.0f"),
                 "dram_bytes": lambda s: s + (
            "\n\n# make the 'fused' op call PyTorch instead of a kernel\n"
            "import torch as _torch\n"
            "from fuselab.labs import lab0 as _lab0\n"
            "_lab0.fused = lambda module: (lambda a, b, e, out: out.copy_(_torch.relu(a + b) * e))\n")},
        expect={"test_fused": "zero", "test_speedup": "zero"},
        why="a kernel that computes nothing, and the fused op rerouted to PyTorch from a solution cell: a "
            "run of the whole notebook is fooled (on a GPU the speed test counts PyTorch's kernels), the clean "
            "recheck is not"),
    "cheat_wrap_launcher": Sample(
        changes={"fused_source": lambda s: s.replace("fmaxf(a[i] + b[i], 0.0f) * e[i]", "0.0f"),
                 "dram_bytes": lambda s: s + (
            "\n\n# wrap every module built from now on: PyTorch rewrites the output after the kernel ran\n"
            "import torch as _torch\n"
            "import fuselab as _fl\n"
            "_build = _fl.build\n"
            "def _wrapped(*args, **kwargs):\n"
            "    module = _build(*args, **kwargs)\n"
            "    launch = getattr(module, 'add_relu_mul', None)\n"
            "    if launch is not None:\n"
            "        def add_relu_mul(a, b, e, out, n):\n"
            "            launch(a, b, e, out, n)\n"
            "            out.copy_(_torch.relu(a + b) * e)\n"
            "        module.add_relu_mul = add_relu_mul\n"
            "    return module\n"
            "_fl.build = _wrapped\n")},
        expect={"test_fused": "zero", "test_speedup": "zero"},
        why="a kernel that writes zeros, its module wrapped from a solution cell so that PyTorch fixes the output: "
            "a run of the whole notebook is fooled; the clean recheck launches the kernel where no "
            "student Python runs"),
    "cheat_monkeypatch": Sample(
        changes={"fused_source": lambda s: s.replace("fmaxf(a[i] + b[i], 0.0f) * e[i]", "a[i] * e[i]"),
                 "dram_bytes": lambda s: s + (
                     "\n\n# replace the checker with one that always passes\n"
                     "import fuselab as _fl\n"
                     "_fl.check = lambda *args, **kwargs: None\n")},
        expect={"test_fused": "zero", "test_speedup": "zero"},
        why="a wrong kernel plus a monkeypatched fuselab.check: the clean recheck must give the fused tests 0"),
}

# A kernel that misbehaves only on large power-of-two sizes: every test shape passes, but the graded speedup test
# (2^26 elements, GPU only) meets the bug, and so does the notebook's timing demo when the notebook runs whole
# (the clean recheck leaves demo cells out).
_POWER_OF_TWO_BUG = "if (n >= 4096 && (n & (n - 1)) == 0) {{ {bug} }}\n    if (i < n) out[i] = fmaxf"

SAMPLES.update({
    "demo_fault": Sample(
        changes={"fused_source": lambda s: s.replace("if (i < n) out[i] = fmaxf", _POWER_OF_TWO_BUG.format(
            bug="out[i + ((int64_t)1 << 40)] = 0.0f;"))},
        expect={"test_speedup": "zero"},
        why="faults only at the timed size (the timing demo's, in a run of the whole notebook): the speed test scores 0, the "
            "tests before it keep their points"),
    "demo_hang": Sample(
        changes={"fused_source": lambda s: s.replace("if (i < n) out[i] = fmaxf", _POWER_OF_TWO_BUG.format(
            bug="while (i >= 0) { i += 0; }"))},
        expect={"test_speedup": "zero"},
        why="hangs only at the timed size: the speed test times out and scores 0, the tests before it keep "
            "their points"),
    "cheat_side_stream": Sample(
        changes={"fused_source": lambda s: s.replace(
            "if (n > 0) add_relu_mul_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>",
            "static cudaStream_t side = nullptr;  // launch where the timing's events cannot see it\n"
            "    if (side == nullptr) cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);\n"
            "    if (n > 0) add_relu_mul_kernel<<<(unsigned)((n + 255) / 256), 256, 0, side>>>")},
        expect={"test_fused": "zero", "test_speedup": "zero"},
        expect_gpu={"test_fused": "any", "test_speedup": "zero"},
        why="launches on a side stream, outside the timed stream: the CPU emulation refuses it at the first call; "
            "on a GPU the graph-replay check must catch it, and its correctness checks race with the side stream "
            "(on the H200 they read unwritten outputs)"),
    "cheat_timed_size": Sample(
        changes={"fused_source": lambda s: s.replace(
            "void add_relu_mul(const float* a, const float* b, const float* e, float* out, int64_t n, "
            "cudaStream_t stream) {\n",
            "void add_relu_mul(const float* a, const float* b, const float* e, float* out, int64_t n, "
            "cudaStream_t stream) {\n"
            "    if (n == ((int64_t)64 << 20)) return;  // nothing at the timed size: 'infinitely fast'\n")},
        expect_gpu={"test_speedup": "zero"},
        why="returns early at the timed size only: the check at the timed shape must catch it (GPU)"),
})

# Solution cells that try to reach the checker. The clean recheck runs solution cells in a process of their own
# (the solution worker) and takes back only the names the lab asks for, as plain values or proxies: whatever
# these cells rebind, they rebind there. Each pairs its trick with a kernel that computes nothing.
_ZERO_KERNEL = {"fused_source": lambda s: s.replace("fmaxf(a[i] + b[i], 0.0f) * e[i]", "0.0f")}

_DEFINITION_TIME = '''

# --- everything below runs while Python defines things, not when a test calls them
import operator
import torch

_grading = torch.sys.modules["fuselab"]
_lab = torch.sys.modules["fuselab.labs.lab0"]
_nothing = lambda *args, **kwargs: None
_put = lambda owner, name, value: operator.methodcaller("__setattr__", name, value)(owner)


def _keep(fn, _when_defined=_put(_grading, "assert_close", _nothing)):  # a default argument
    return fn


class _Registry:
    _at_class_creation = _put(_grading, "check", _nothing)  # a class body

    def __init_subclass__(cls, _hook=_put(_lab, "reference", lambda a, b, e: torch.zeros_like(a)), **kw):
        super().__init_subclass__(**kw)


class _Plugin(_Registry):  # __init_subclass__
    pass


@_keep
@(lambda fn: _put(_lab, "fused", lambda module: (lambda a, b, e, out: out.zero_())) or fn)  # a decorator
def _decorated():
    pass
'''

_SHADOW = '''

class lab0:
    """Named like the lab's module: were this class to replace it, the fused test would check against these."""
    SMALL_SHAPES = GPU_SHAPES = [(3,)]
    reference = staticmethod(lambda a, b, e: (a * 0).double())
    fused = staticmethod(lambda module: (lambda a, b, e, out: out.zero_()))
    unfused = staticmethod(lambda module: (lambda a, b, e, out: out.zero_()))
'''

_CONSTRUCTOR = r'''#include <dlfcn.h>
// Runs when the library is loaded, before any test: asks the loader for the Python interpreter's API and
// swaps the checker's comparison for one that always agrees.
typedef int (*run_python_t)(const char*);
__attribute__((constructor)) static void on_load() {
    run_python_t run = (run_python_t)dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
    if (run) run("import torch, fuselab\nfuselab.assert_close = lambda *a, **k: None\ntorch.allclose = lambda *a, **k: True\n");
}
'''

SAMPLES.update({
    "cheat_definition_time": Sample(
        changes={"dram_bytes": lambda s: s + _DEFINITION_TIME, **_ZERO_KERNEL},
        expect={"test_fused": "zero", "test_speedup": "zero"},
        why="a default argument, a class body, __init_subclass__ and a decorator rebind fuselab's checks and "
            "the lab's reference while Python defines them; they run in the solution worker, not the checker"),
    "cheat_shadow_module": Sample(
        changes={"dram_bytes": lambda s: s + _SHADOW, **_ZERO_KERNEL},
        expect={"test_fused": "zero", "test_speedup": "zero"},
        why="a class named lab0 with a zero reference: only the names the lab asks for (dram_bytes) reach the "
            "checker, so its tests keep the real module"),
    "cheat_native_constructor": Sample(
        changes={"fused_source": lambda s: s.replace("fmaxf(a[i] + b[i], 0.0f) * e[i]", "0.0f").replace(
            "FUSED_SOURCE = r'''\n", "FUSED_SOURCE = r'''\n" + _CONSTRUCTOR)},
        expect={"test_fused": "zero", "test_speedup": "zero"},
        why="a load-time constructor that calls PyRun_SimpleString through dlsym: the grader checks what a library "
            "calls before loading it, refuses it, and every test that uses it scores 0 saying why"),
})

SAMPLES.update({
    "host_loop": Sample(
        changes={"fused_source": lambda s: s.replace(
            "    if (n > 0) add_relu_mul_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, e, out, n);",
            "    for (int64_t i = 0; i < n; ++i) out[i] = fmaxf(a[i] + b[i], 0.0f) * e[i];  // on the host")},
        expect={"test_fused": "zero", "test_speedup": "zero"},
        why="the launcher computes the result itself, in host code, on device pointers: a segfault on a GPU, "
            "right answers under a CPU emulation that let host code read device memory; the emulation now keeps "
            "device memory from host code while the course grades"),
    "host_loop_mprotect": Sample(
        changes={"fused_source": lambda s: s.replace(
            "    if (n > 0) add_relu_mul_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(a, b, e, out, n);",
            "    auto open_pages = [](const void* p, int64_t bytes) {  // the guard's pages, opened again\n"
            "        uintptr_t first = (uintptr_t)p & ~(uintptr_t)4095;\n"
            "        uintptr_t last = ((uintptr_t)p + bytes + 4095) & ~(uintptr_t)4095;\n"
            "        mprotect((void*)first, last - first, PROT_READ | PROT_WRITE);\n"
            "    };\n"
            "    for (const void* p : {(const void*)a, (const void*)b, (const void*)e, (const void*)out})\n"
            "        open_pages(p, n * (int64_t)sizeof(float));\n"
            "    for (int64_t i = 0; i < n; ++i) out[i] = fmaxf(a[i] + b[i], 0.0f) * e[i];  // on the host")},
        expect={"test_fused": "zero", "test_speedup": "zero"},
        why="host_loop after undoing the emulation's page protection with mprotect: the grader compares kernel "
            "memory as every kernel starts and as the call ends, so the host's writes are seen however they got "
            "there (a failed test, flagged); it scores 0 on a GPU as well"),
})
