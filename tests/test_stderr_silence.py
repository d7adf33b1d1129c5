"""No stderr, ever, in a notebook: nbgrader gives 0 points to a test cell that writes to stderr.

pytest's capsys cannot see what a subprocess or torch's logger writes through an ipykernel, so these tests run
real cells through nbclient, as nbgrader does, and look at the stream outputs.
"""

import uuid

from .conftest import requires_nvcc
from .notebook_runner import errors, run_cells, streams

# An nvcc warning on a build that succeeds ("variable declared but never referenced"), on a fresh kernel where
# importing torch's cpp_extension on a machine without a GPU also logs "No CUDA runtime is found".
WARNING_SOURCE = """
__global__ void k(float* out) { int unused = 3; out[0] = 1.0f; }
void launch(float* out, cudaStream_t stream) { k<<<1, 1, 0, stream>>>(out); }
"""


@requires_nvcc
def test_cuda_build_with_compiler_warning_writes_nothing_to_stderr():
    tag = uuid.uuid4().hex
    nb = run_cells([
        "import fuselab",
        f"mod = fuselab.build({WARNING_SOURCE!r} + '// {tag}', ['void launch(float* out, cudaStream_t stream)'], "
        "backend='cuda')\nprint(mod.cached)",
        "try:\n    fuselab.build('__global__ void k() { x; }', ['void launch(float* out, cudaStream_t stream)'], "
        "backend='cuda')\nexcept fuselab.BuildError as e:\n    print('caught')",
    ])
    assert errors(nb) == {}
    assert streams(nb, "stderr") == {}
    assert streams(nb, "stdout") == {1: "False\n", 2: "caught\n"}
