"""fuselab: build student CUDA fast, check it strictly, time it honestly.

    import fuselab
    mod = fuselab.build(CUDA_SOURCE, ["void add(const float* a, const float* b, float* out, int n, cudaStream_t s)"])
    mod.add(a, b, out, a.numel())
"""

from .build import build, resolve_backend
from .errors import (BuildError, BuildTimeout, FuselabError, LaunchError, NotWrittenError,
                     UnsupportedConstruct)
from .module import Module
from .prototypes import PrototypeError

__version__ = "0.1.0"

__all__ = [
    "build", "resolve_backend", "Module",
    "FuselabError", "BuildError", "BuildTimeout", "NotWrittenError", "LaunchError", "UnsupportedConstruct",
    "PrototypeError",
]
