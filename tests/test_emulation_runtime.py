"""The CPU emulation's runtime is compiled once and linked into every library (``emulate/runtime_object``).

Each build pays only for the student's own kernels; the runtime's object is compiled once per compiler, flags and
runtime source into the cache that builds, or taken from the instructor's shared builds the grader recorded (its
bytes checked as they are copied). Every library still keeps its own copy of the runtime and its own state.
"""

import ctypes
import subprocess
from pathlib import Path

import pytest
import torch

import fuselab
from fuselab import native_check
from fuselab.kernelbuild import shared as shared_builds
from fuselab.kernelbuild.emulate import runtime_object

PROTO = ["void scale(const float* x, float* out, int n, cudaStream_t stream)"]


def kernel(factor: str) -> str:
    return ("__global__ void scale_kernel(const float* x, float* out, int n) {\n"
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
            f"    if (i < n) out[i] = x[i] * {factor};\n}}\n"
            "void scale(const float* x, float* out, int n, cudaStream_t stream) {\n"
            "    scale_kernel<<<(n + 63) / 64, 64, 0, stream>>>(x, out, n);\n}\n")


@pytest.fixture
def compiles(monkeypatch):
    """How many times the runtime's object was compiled in this process."""
    calls = []
    original = runtime_object._compile

    def counted(cflags, target, timeout):
        calls.append(target)
        return original(cflags, target, timeout)
    monkeypatch.setattr(runtime_object, "_compile", counted)
    return calls


def runs(module, factor: float) -> bool:
    x = torch.arange(200, dtype=torch.float32)
    out = torch.empty_like(x)
    module.scale(x, out, 200)
    return torch.equal(out, x * factor)


def runtimes(cache) -> list:
    return sorted(p.name for p in (cache / "builds").glob(f"{runtime_object.PREFIX}*") if p.is_dir())


def linked_copy(module):
    return Path(module.library_path).parent / runtime_object.LINKED


def test_the_runtime_is_compiled_once_per_cache_and_flags_and_every_build_links_it(tmp_path, monkeypatch, compiles):
    monkeypatch.setenv("FUSELAB_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FUSELAB_SHARED_BUILDS", raising=False)
    first = fuselab.build(kernel("2.0f"), PROTO, backend="emulate")
    second = fuselab.build(kernel("3.0f"), PROTO, backend="emulate")
    assert runs(first, 2.0) and runs(second, 3.0)
    assert len(compiles) == 1 and len(runtimes(tmp_path)) == 1, (compiles, runtimes(tmp_path))
    (name,) = runtimes(tmp_path)
    cached = (tmp_path / "builds" / name / f"{name}.o").read_bytes()
    assert linked_copy(first).read_bytes() == cached == linked_copy(second).read_bytes()
    # other flags that reach the runtime's headers: another object, compiled once too
    other = fuselab.build(kernel("4.0f"), PROTO, backend="emulate", extra_cflags=["-DFUSELAB_EMU_UCONTEXT"])
    assert runs(other, 4.0) and len(compiles) == 2 and len(runtimes(tmp_path)) == 2
    # the kernel's own object holds none of the runtime: its launch calls the runtime out of line
    own = subprocess.run(["nm", "-C", "--defined-only", str(Path(first.library_path).parent / "main.o")], capture_output=True,
                         text=True, check=True).stdout
    assert "Worker" not in own and "launch_kernel" not in own and "cudaGetErrorString" not in own, own


def test_each_library_keeps_its_own_copy_of_the_runtime_and_its_state(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSELAB_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FUSELAB_SHARED_BUILDS", raising=False)
    one = fuselab.build(kernel("2.0f"), PROTO, backend="emulate")
    two = fuselab.build(kernel("5.0f"), PROTO, backend="emulate")
    lib_one, lib_two = ctypes.CDLL(one.library_path), ctypes.CDLL(two.library_path)
    lib_one.fuselab_emu_set_thread_order(1, 11)
    lib_two.fuselab_emu_set_thread_order(2, 22)
    assert (lib_one.fuselab_emu_get_thread_order(), lib_two.fuselab_emu_get_thread_order()) == (1, 2)
    lib_one.fuselab_emu_get_thread_seed.restype = lib_two.fuselab_emu_get_thread_seed.restype = ctypes.c_ulonglong
    assert (lib_one.fuselab_emu_get_thread_seed(), lib_two.fuselab_emu_get_thread_seed()) == (11, 22)
    launches = [lib.fuselab_emu_stat(0) for lib in (lib_one, lib_two)]
    assert runs(one, 2.0)
    assert [lib.fuselab_emu_stat(0) for lib in (lib_one, lib_two)] == [launches[0] + 1, launches[1]]
    # of the runtime's own functions, only the controls fuselab calls are exported (the C++ library's templates
    # instantiated for it are, as in any library: -Wl,-Bsymbolic binds each library's calls to its own copy)
    exported = subprocess.run(["nm", "-D", "--defined-only", one.library_path], capture_output=True, text=True,
                              check=True).stdout
    names = [line.split()[-1] for line in exported.splitlines() if line.split()]
    assert "fuselab_emu_set_thread_order" in names and "scale" in names
    assert not [n for n in names if n.startswith(("_ZN11fuselab_emu", "_ZNK11fuselab_emu", "_Z10cuda", "_Z16cuda"))], names
    assert not [n for n in names if n in ("threadIdx", "blockIdx", "blockDim", "gridDim")], names


def test_what_an_emulated_library_calls_includes_the_runtimes_imports_and_is_allowed(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSELAB_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FUSELAB_SHARED_BUILDS", raising=False)
    module = fuselab.build(kernel("2.0f"), PROTO, backend="emulate")
    calls = native_check.imported_symbols(module.library_path)
    assert "mmap" in calls and "sigaction" in calls, calls  # the runtime's, read from its copy beside main.o
    assert not [c for c in calls if c.startswith("_ZN11fuselab_emu")], calls  # defined by the linked runtime
    assert all(native_check.symbol_allowed(name, "emulate") for name in calls), calls


def test_a_sandboxed_build_links_only_the_recorded_shared_runtime_or_its_own(tmp_path, monkeypatch, compiles):
    """The grader's reference run (trusted) compiles the runtime into the shared builds, and records its digest; a
    submission's build links that object without compiling its own. A shared runtime changed after the record, or
    one the record does not hold, is never linked: the submission compiles one into its own cache."""
    shared = tmp_path / "shared-builds"
    monkeypatch.delenv("FUSELAB_SHARED_BUILDS", raising=False)
    monkeypatch.setenv("FUSELAB_CACHE_DIR", str(shared))
    fuselab.build(kernel("2.0f"), PROTO, backend="emulate")
    digests, changed = shared_builds.record(shared)
    (name,) = runtimes(shared)
    recorded = shared / "builds" / name / f"{name}.o"
    assert not changed and digests[name] == shared_builds.file_digest(recorded)
    assert shared_builds.library_of(shared / "builds", name) == recorded
    assert len(compiles) == 1

    monkeypatch.setenv("FUSELAB_SHARED_BUILDS", str(shared / "builds"))
    submission = tmp_path / "submission-cache"
    monkeypatch.setenv("FUSELAB_CACHE_DIR", str(submission))
    module = fuselab.build(kernel("3.0f"), PROTO, backend="emulate")
    assert runs(module, 3.0) and len(compiles) == 1 and runtimes(submission) == []
    assert linked_copy(module).read_bytes() == recorded.read_bytes()

    # changed after the grader recorded it (what a planted link used to do): never linked, not even by a new build
    recorded.chmod(0o644)
    genuine = recorded.read_bytes()
    recorded.write_bytes(genuine.replace(b"__trap() was called", b"__trap() WAS called"))
    assert shared_builds.status(name) == "changed"
    module = fuselab.build(kernel("4.0f"), PROTO, backend="emulate")
    assert runs(module, 4.0) and len(compiles) == 2 and runtimes(submission) == [name]
    assert linked_copy(module).read_bytes() == (submission / "builds" / name / f"{name}.o").read_bytes()
    assert b"__trap() WAS called" not in linked_copy(module).read_bytes()


def test_an_unrecorded_shared_runtime_is_never_linked(tmp_path, monkeypatch, compiles):
    shared = tmp_path / "shared-builds"
    name = runtime_object.name_for([*runtime_object_flags()])
    planted = shared / "builds" / name
    planted.mkdir(parents=True)
    (planted / f"{name}.o").write_bytes(b"not the grader's")
    (planted / shared_builds.COMPLETE).write_text("")
    (shared / shared_builds.MANIFEST).write_text("{}")
    monkeypatch.setenv("FUSELAB_SHARED_BUILDS", str(shared / "builds"))
    monkeypatch.setenv("FUSELAB_CACHE_DIR", str(tmp_path / "own"))
    module = fuselab.build(kernel("6.0f"), PROTO, backend="emulate")
    assert runs(module, 6.0) and len(compiles) == 1
    assert linked_copy(module).read_bytes() != b"not the grader's"


def runtime_object_flags():
    from fuselab.kernelbuild.emulate.flags import CXXFLAGS
    return [*CXXFLAGS, "-fdiagnostics-color=never"]
