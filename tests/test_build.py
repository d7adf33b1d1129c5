"""fuselab.build: the real CUDA path (compiled and linked here without a GPU), caching, locks, errors, stubs.

Running kernels is the emulation's job (tests/test_emulation.py); these tests exercise the build machinery on
the CUDA backend because that is the path whose failure modes (nvcc output, long compiles) matter most.
"""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import torch

import fuselab
from fuselab import config

from .conftest import requires_nvcc

PROTO = "void scale(const float* x /*[n]*/, float* out /*[n]*/, float factor, int n, cudaStream_t stream)"


def scale_source(tag=""):
    # ``tag`` makes the text unique, so the test gets a build nobody cached before.
    return textwrap.dedent(f"""\
        // {tag}
        __global__ void scale_kernel(const float* x, float* out, float factor, int n) {{
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) out[i] = x[i] * factor;
        }}
        void scale(const float* x, float* out, float factor, int n, cudaStream_t stream) {{
            scale_kernel<<<(n + 255) / 256, 256, 0, stream>>>(x, out, factor, n);
        }}
        """)


pytestmark = requires_nvcc


def test_cuda_build_compiles_links_and_loads():
    mod = fuselab.build(scale_source("loads"), [PROTO], backend="cuda")
    assert mod.backend == "cuda" and mod.device.type == "cuda"
    assert Path(mod.library_path).exists()
    assert "x: input tensor of float32" in mod.scale.__doc__
    assert "scale(x, out, factor, n)" in repr(mod)


def test_identical_source_is_not_rebuilt_and_different_sources_never_share():
    first = fuselab.build(scale_source("cache-a"), [PROTO], backend="cuda")
    started = time.perf_counter()
    again = fuselab.build(scale_source("cache-a"), [PROTO], backend="cuda")
    assert again.cached and time.perf_counter() - started < 0.5
    assert again.library_path == first.library_path
    other = fuselab.build(scale_source("cache-b"), [PROTO], backend="cuda")
    assert other.library_path != first.library_path


def _build_in_subprocess(tag, extra_env=None, new_session=False):
    code = (f"import fuselab, sys, time; t=time.perf_counter(); "
            f"m = fuselab.build({scale_source(tag)!r}, [{PROTO!r}], backend='cuda'); "
            f"print('cached' if m.cached else 'built', round(time.perf_counter()-t, 3))")
    env = dict(os.environ, **(extra_env or {}))
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=new_session)


def test_fresh_process_reloads_from_cache():
    tag = f"reload-{uuid.uuid4().hex}"
    fuselab.build(scale_source(tag), [PROTO], backend="cuda")
    out, err = _build_in_subprocess(tag).communicate(timeout=120)
    assert out.split()[0] == "cached", (out, err)
    assert err == ""


def test_two_processes_building_the_same_source_at_once():
    tag = f"concurrent-{uuid.uuid4().hex}"
    procs = [_build_in_subprocess(tag) for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    kinds = sorted(out.split()[0] for out, _ in results)
    assert kinds == ["built", "cached"], results  # exactly one of them ran the compiler


def _wait_for_compiler(build_root: Path, timeout=60):
    """Wait until some process is compiling inside ``build_root``."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    cwd = os.readlink(entry / "cwd")
                except OSError:
                    continue
                if cwd.startswith(str(build_root)) and cwd != str(build_root):
                    return True
        time.sleep(0.02)
    return False


def test_a_cuda_build_is_the_student_text_against_the_cuda_runtime_alone():
    # one nvcc call: no torch library linked in, no ninja file, no half-written library left beside it
    mod = fuselab.build(scale_source(f"alone-{uuid.uuid4().hex}"), [PROTO], backend="cuda")
    dynamic = subprocess.run(["readelf", "-d", mod.library_path], capture_output=True, text=True, check=True).stdout
    needed = [line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert any(name.startswith("libcudart.so") for name in needed), needed
    assert not any("torch" in name or "c10" in name for name in needed), needed
    folder = Path(mod.library_path).parent
    assert not list(folder.glob("*.partial")) and not (folder / "build.ninja").exists()


def test_a_build_killed_midway_does_not_block_the_next():
    tag = f"killed-{uuid.uuid4().hex}"
    victim = _build_in_subprocess(tag, new_session=True)
    assert _wait_for_compiler(config.builds_dir()), "the build never started compiling"
    os.killpg(victim.pid, signal.SIGKILL)  # the whole process group: python, nvcc and what nvcc runs
    victim.wait()
    started = time.perf_counter()
    mod = fuselab.build(scale_source(tag), [PROTO], backend="cuda", timeout=120)
    assert not mod.cached
    assert time.perf_counter() - started < 60


def test_a_leftover_torch_lock_file_is_cleared():
    tag = f"leftover-{uuid.uuid4().hex}"
    job_dir_before = set(config.builds_dir().iterdir())
    with pytest.raises(fuselab.BuildTimeout):  # creates the build folder, then stops
        fuselab.build(scale_source(tag), [PROTO], backend="cuda", timeout=0.05)
    (new_dir,) = [d for d in set(config.builds_dir().iterdir()) - job_dir_before if d.is_dir()]
    (new_dir / "lock").write_text("left by a build that was killed")  # what torch's FileBaton leaves
    mod = fuselab.build(scale_source(tag), [PROTO], backend="cuda", timeout=120)
    assert Path(mod.library_path).parent == new_dir


def test_time_limit_stops_the_compiler():
    tag = f"timeout-{uuid.uuid4().hex}"
    with pytest.raises(fuselab.BuildTimeout, match="longer than"):
        fuselab.build(scale_source(tag), [PROTO], backend="cuda", timeout=0.3)
    time.sleep(0.5)
    assert not _wait_for_compiler(config.builds_dir(), timeout=0.5), "a compiler outlived its time limit"


def test_compiler_error_names_the_students_line_without_noise():
    source = scale_source("error").replace("x[i] * factor", "x[i] * factr")
    with pytest.raises(fuselab.BuildError) as info:
        fuselab.build(source, [PROTO], backend="cuda")
    message = str(info.value)
    assert "kernel.cu(4): error" in message and "factr" in message
    assert "\x1b[" not in message and "ninja" not in message and "FAILED" not in message
    assert "/builds/" not in message  # no build-folder paths, just the student's file
    assert "(1 error)" in message


def test_wrong_launcher_signature_is_reported_with_the_expected_one():
    source = scale_source("signature").replace("float factor, int n, cudaStream_t", "double factor, int n, cudaStream_t")
    with pytest.raises(fuselab.BuildError, match=r"exactly these signatures:\n\s+void scale\(const float\* x"):
        fuselab.build(source, [PROTO], backend="cuda")


LAMBDA_SOURCE = textwrap.dedent("""\
    template <typename Op>
    __global__ void map_kernel(const float* x, float* out, int n, Op op) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) out[i] = op(x[i]);
    }
    void scale(const float* x, float* out, float factor, int n, cudaStream_t stream) {
        auto times = [factor] __host__ __device__ (float v) { return v * factor; };  // as PyTorch's kernels write it
        if (n > 0) map_kernel<<<(n + 255) / 256, 256, 0, stream>>>(x, out, n, times);
    }
    """)


@pytest.mark.parametrize("backend", ["cuda", "emulate"])
def test_a_device_lambda_builds_on_every_backend(backend):
    mod = fuselab.build(LAMBDA_SOURCE, [PROTO], name="device_lambda", backend=backend)
    if backend == "emulate":
        x = torch.randn(1000)
        out = torch.empty_like(x)
        mod.scale(x, out, 2.5, x.numel())
        torch.testing.assert_close(out, x * 2.5)


def test_nvcc_is_asked_for_extended_lambdas_only_where_the_text_writes_one():
    """``--extended-lambda`` costs a third of a small build's CPU: given where a lambda is marked for the device."""
    from fuselab import prototypes
    from fuselab.kernelbuild import cuda
    protos = prototypes.parse_all([PROTO])
    plain = cuda.job(scale_source("plain"), protos, "plain.cu", [])
    with_lambda = cuda.job(LAMBDA_SOURCE, protos, "lambda.cu", [])
    assert cuda.EXTENDED_LAMBDA not in plain.cuda_cflags and cuda.EXTENDED_LAMBDA in with_lambda.cuda_cflags
    for text in ("[=] __device__ (int i) { }", "[&](int i) __device__ { }", "[=](float a) mutable __device__ {}",
                 "[]__host__ __device__(){}", "[=](const float* (p)) __host__ __device__ { }"):
        assert cuda.DEVICE_LAMBDA.search(text), text


def test_a_device_lambda_the_text_hides_behind_a_macro_still_builds():
    """A lambda whose ``__device__`` comes from a macro is not seen in the text: the build that fails without
    extended lambdas is compiled again with them, so the student's kernel builds and runs."""
    source = "#define ON_GPU __host__ __device__\n" + LAMBDA_SOURCE.replace("__host__ __device__", "ON_GPU")
    from fuselab import prototypes
    from fuselab.kernelbuild import cuda
    assert cuda.EXTENDED_LAMBDA not in cuda.job(source, prototypes.parse_all([PROTO]), "m.cu", []).cuda_cflags
    mod = fuselab.build(source, [PROTO], name="device_lambda_macro", backend="cuda")
    assert mod.backend == "cuda"


@pytest.mark.parametrize("backend", ["cuda", "emulate"])
def test_a_function_declared_and_never_written_is_named_not_blamed_on_the_launchers(backend):
    source = scale_source(f"undefined {backend}").replace("void scale(", "void helper(int);\nvoid scale(", 1)
    source = source.replace("    scale_kernel<<<", "    helper(n);\n    scale_kernel<<<")
    with pytest.raises(fuselab.BuildError) as info:
        fuselab.build(source, [PROTO], backend=backend)
    message = str(info.value)
    assert "uses `helper(int)`, which nothing defines" in message and "exactly these signatures" not in message


def test_the_thread_index_read_in_host_code_is_named_on_the_gpu_build():
    """nvcc compiles ``threadIdx.x`` in a launcher and the loader then misses its variable: said as the mistake it is
    (the emulation refuses the same text before compiling: tests/test_emulation.py)."""
    source = scale_source("thread index in host code").replace("    scale_kernel<<<(n + 255) / 256, 256,",
                                                                  "    scale_kernel<<<(n + 255) / 256, 256 + threadIdx.x,")
    with pytest.raises(fuselab.BuildError) as info:
        fuselab.build(source, [PROTO], backend="cuda")
    assert "reads `threadIdx`, which only device code has" in str(info.value)


@pytest.mark.parametrize("backend", ["cuda", "emulate"])
@pytest.mark.parametrize("header", ["c10/cuda/CUDAException.h", "torch/extension.h", "ATen/ATen.h"])
def test_pytorchs_headers_are_refused_alike_on_every_backend(backend, header):
    """The GPU build compiles with nvcc alone; the emulation's compiler would find torch's headers and fail only at
    the link (C10_CUDA_KERNEL_LAUNCH_CHECK's function): the same clear message on both, naming the line."""
    source = "// a launch checked the way PyTorch's own kernels check one\n" + f"#include <{header}>\n" + scale_source()
    with pytest.raises(fuselab.BuildError) as info:
        fuselab.build(source, [PROTO], backend=backend)
    message = str(info.value)
    assert f"kernel.cu:2: `#include <{header}>`" in message and "cudaGetLastError()" in message


@pytest.mark.parametrize("stub", ["    raise NotImplementedError()", "# YOUR CODE HERE\nraise NotImplementedError()"])
def test_blank_lab_stub_builds_to_a_clear_message(stub):
    source = f"__global__ void k() {{}}\n{stub}\n"
    with pytest.raises(fuselab.NotWrittenError, match="not written yet") as info:
        fuselab.build(source, [PROTO], backend="cuda")
    assert isinstance(info.value, NotImplementedError)
    assert "line 2" in str(info.value)


def test_glue_names_the_bad_argument():
    mod = fuselab.build(scale_source("glue"), [PROTO], backend="cuda")
    x = torch.randn(8)
    with pytest.raises(ValueError, match="'x' of scale is on cpu"):
        mod.scale(x, torch.empty(8), 2.0, 8)
    with pytest.raises(TypeError, match="'x' of scale must have dtype float32.*got float64"):
        mod.scale(x.double(), torch.empty(8), 2.0, 8)
    with pytest.raises(TypeError, match="missing argument"):
        mod.scale(x, torch.empty(8))
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        mod.scale([1.0], torch.empty(8), 2.0, 8)


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend must be"):
        fuselab.build(scale_source(), [PROTO], backend="tpu")


def test_escape_hatch_builds_a_torch_extension_from_cpp_sources():
    """Torch C++ written directly, like load_inline itself: slow (torch's headers), but cached and quiet."""
    source = "torch::Tensor add_one(torch::Tensor x) { return x + 1; }"
    # the broken source builds in a process of its own meanwhile: each compile of torch's headers keeps one core
    # busy for tens of seconds, and the two builds share nothing but the cache folder
    broken = subprocess.Popen([sys.executable, "-c", BROKEN_EXTENSION, source.replace("x + 1", "x + undefined_name")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ext = fuselab.build_extension("add_one", [source], functions=["add_one"], timeout=600)
        assert torch.equal(ext.add_one(torch.arange(3.0)), torch.tensor([1.0, 2.0, 3.0]))
        started = time.perf_counter()
        again = fuselab.build_extension("add_one", [source], functions=["add_one"])
        assert time.perf_counter() - started < 2.0 and again.add_one(torch.zeros(1)).item() == 1.0
        said, _ = broken.communicate(timeout=900)
    finally:
        if broken.poll() is None:
            broken.kill()
            broken.wait()
    assert broken.returncode == 0, said[-3000:]  # it raised fuselab.BuildError, nothing else
    assert re.search("add_one.cpp", said), said[-3000:]


# the escape hatch given a source that does not compile: a fuselab.BuildError naming the file (argv[1]: the source)
BROKEN_EXTENSION = """\
import sys
import fuselab
try:
    fuselab.build_extension("add_one", [sys.argv[1]], functions=["add_one"], timeout=600)
except fuselab.BuildError as error:
    print(error)
else:
    sys.exit("built: no fuselab.BuildError")
"""


@pytest.mark.parametrize("config,named", [("(n + 255) / 256, 256", "names no stream"),
                                          ("(n + 255) / 256, 256, 0", "names no stream"),
                                          ("(n + 255) / 256, 256, 0, 0", "names stream 0"),
                                          ("(n + 255) / 256, 256, 0, cudaStreamPerThread",
                                           "names stream cudaStreamPerThread")])
def test_a_cuda_launch_on_stream_zero_in_a_launcher_given_a_stream_is_refused(config, named):
    # the CUDA build cannot see at run time which stream a launch used (the emulation does): it reads the text
    source = scale_source("stream zero").replace("256, 256, 0, stream>>>", f"{config}>>>")
    with pytest.raises(fuselab.BuildError) as info:
        fuselab.build(source, [PROTO], backend="cuda")
    message = str(info.value)
    column = source.splitlines()[6].index("<<<") + 1
    assert f"kernel.cu:7:{column}: error: this launch {named}, but its function was given `stream`" in message
    assert "\n      | " + " " * (column - 1) + "^" in message
    assert "kernel<<<grid, block, shared_bytes, stream>>>" in message and "CUDA-graph capture" in message


def test_a_launch_on_the_given_stream_or_a_helper_without_one_builds():
    from fuselab.kernelbuild.emulate.streams import off_stream_launches
    assert off_stream_launches(scale_source()) == []
    helper = """
    __global__ void k(float* x) {}
    static void run(float* x, cudaStream_t s) { k<<<1, 32, 0, s>>>(x); }
    void init(float* x) { k<<<1, 32>>>(x); }              // no stream to use
    // k<<<1, 32>>>(x); in a comment
    void go(float* x, cudaStream_t stream) { run(x, stream); }
    """
    assert off_stream_launches(helper) == []
