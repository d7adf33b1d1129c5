"""Every kernel the CPU emulation runs must also be real CUDA: compile and link each with nvcc here (no GPU).

The emulation is more permissive than nvcc in places (a header it includes for itself, a __device__ call from a
__host__ __device__ function), so a kernel that only ever ran emulated could fail on the GPU. This catches it.
"""

import pytest

import fuselab
from fuselab import native_check
from fuselab.labs import lab_modules
from fuselab.notebook_sources import string_assignments

from .conftest import REPO, requires_nvcc
from .test_emulation import BARRIERS, BASICS, KERNELS, LIMITS, SPACES_OK

pytestmark = requires_nvcc


@pytest.mark.parametrize("filename,launchers", [("basics.cu", BASICS), ("barriers.cu", BARRIERS)])
def test_emulation_test_kernels_compile_with_nvcc(filename, launchers):
    mod = fuselab.build((KERNELS / filename).read_text(), launchers, name=filename[:-3], backend="cuda")
    assert mod.backend == "cuda"


def test_calls_the_emulation_takes_across_execution_spaces_compile_with_nvcc():
    mod = fuselab.build(SPACES_OK, ["void launch(float* x, int n, cudaStream_t stream)"], name="spaces_ok",
                        backend="cuda")
    assert mod.backend == "cuda"
    valid = fuselab.build((KERNELS / "spaces_valid.cu").read_text(),
                          ["void spaces_valid_launch(float* a, int n, cudaStream_t stream)"], name="spaces_valid",
                          backend="cuda")
    assert valid.backend == "cuda"


def test_static_shared_memory_beyond_the_limit_is_refused_by_nvcc_too():
    # The emulation fails this kernel at launch; ptxas refuses it at build time.
    with pytest.raises(fuselab.BuildError, match="too much shared data"):
        fuselab.build((KERNELS / "limits.cu").read_text(), LIMITS, name="limits", backend="cuda")


LABS = lab_modules()
LAB_CASES = [(lab, name) for lab, module in LABS.items() for name in module.SOLUTION_SOURCES]


@pytest.mark.parametrize("lab,name", LAB_CASES)
def test_every_solution_kernel_compiles_and_links_for_the_gpu(lab, name):
    module = LABS[lab]
    launchers = module.SOLUTION_SOURCES[name]
    source = string_assignments(REPO / "solutions" / module.NOTEBOOK)[name]
    mod = fuselab.build(source, launchers, name=name.lower(), backend="cuda")
    assert set(mod.launchers) == {l.split("(")[0].split()[-1] for l in launchers}
    # the grader's check of native code passes the instructor's kernels, real CUDA build and emulated alike
    native_check.check_library(mod.library_path, source, "cuda", f"{name}.cu")
    emulated = fuselab.build(source, launchers, name=name.lower(), backend="emulate")
    native_check.check_library(emulated.library_path, source, "emulate", f"{name}.cu")


@pytest.mark.parametrize("lab", [lab for lab, m in LABS.items() if hasattr(m, "REFERENCE_SOURCES")])
def test_every_lab_reference_compiles_for_the_gpu(lab):
    for name, (source, launchers) in LABS[lab].REFERENCE_SOURCES.items():
        fuselab.build(source, launchers, name=name, backend="cuda")
