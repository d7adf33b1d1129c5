"""Find the CUDA toolchain the way load_inline needs it, and describe it for ``fuselab doctor``.

torch guesses ``CUDA_HOME`` from the first ``nvcc`` on the PATH, which is wrong when that ``nvcc`` is a wrapper
in ``/usr/local/bin`` (it then guesses ``/usr/local``). So fuselab resolves the real ``nvcc`` first. The CUDA
build of torch from pip carries its CUDA runtime in ``site-packages/nvidia/cu13``; a toolkit without
``libcudart.so`` in its own ``lib64`` links against that one.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

DEFAULT_ARCH = "9.0"  # the course's reference GPU (H200) when no GPU is present to ask


def find_cuda_home():
    """The CUDA toolkit root, or None. Honours ``CUDA_HOME``/``CUDA_PATH``."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var]
    candidates = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(os.path.realpath(nvcc)).parent.parent)
    candidates += [Path("/usr/local/cuda")]
    for home in candidates:
        if (home / "bin" / "nvcc").exists() and (home / "include" / "cuda_runtime.h").exists():
            return str(home)
    return None


def prepare_cuda_environment():
    """Point torch's cpp_extension at the real toolkit.

    cpp_extension reads ``CUDA_HOME`` once, when it is first imported (by an emulated build, say), so the
    variable is set here and, if the module was imported already, its copy is corrected too.
    """
    import sys
    home = find_cuda_home()
    if home and not os.environ.get("CUDA_HOME"):
        os.environ["CUDA_HOME"] = home
    extension = sys.modules.get("torch.utils.cpp_extension")
    if home and extension is not None and getattr(extension, "CUDA_HOME", None) != home:
        extension.CUDA_HOME = home
    return home


def pip_cuda_dirs():
    """``(include, lib)`` of the CUDA runtime that pip's torch carries, where present."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return None, None
    for root in spec.submodule_search_locations:
        for sub in ("cu13", "cuda_runtime"):
            base = Path(root) / sub
            if (base / "include" / "cuda_runtime.h").exists() or (base / "lib").is_dir():
                return (str(base / "include") if (base / "include").is_dir() else None,
                        str(base / "lib") if (base / "lib").is_dir() else None)
    return None, None


def cuda_link_flags(cuda_home):
    """Extra link flags so ``-lcudart`` resolves where the toolkit has no ``libcudart.so``."""
    if cuda_home and any((Path(cuda_home) / d / "libcudart.so").exists() for d in ("lib64", "lib")):
        return []
    _, lib = pip_cuda_dirs()
    if lib is None:
        return []
    flags = [f"-L{lib}"]
    # pip ships only the versioned soname; give the linker an unversioned name in a private folder.
    if not (Path(lib) / "libcudart.so").exists():
        versioned = sorted(Path(lib).glob("libcudart.so.*"))
        if versioned:
            from .config import cache_dir
            shim = cache_dir() / "cudart-link"
            shim.mkdir(exist_ok=True)
            link = shim / "libcudart.so"
            if not link.exists():
                link.symlink_to(versioned[0])
            flags = [f"-L{shim}"] + flags
    return flags


def cuda_arch():
    """``major.minor`` of the visible GPU, else ``TORCH_CUDA_ARCH_LIST``'s first entry, else the H200's."""
    import torch
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}.{minor}"
    listed = os.environ.get("TORCH_CUDA_ARCH_LIST", "").replace(";", " ").split()
    return listed[0].replace("+PTX", "") if listed else DEFAULT_ARCH


def gencode_flag(arch: str) -> str:
    digits = arch.replace(".", "")
    return f"-gencode=arch=compute_{digits},code=sm_{digits}"


@functools.lru_cache(maxsize=None)
def nvcc_version(cuda_home):
    """``(major, minor)`` of ``nvcc`` under ``cuda_home``, or None."""
    if not cuda_home:
        return None
    try:
        out = subprocess.run([str(Path(cuda_home) / "bin" / "nvcc"), "--version"], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None
