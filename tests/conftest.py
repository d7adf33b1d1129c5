"""Shared test setup: caches inside the clone, never in the home folder (CI must not lean on a warm cache)."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent  # the repository root
os.environ.setdefault("FUSELAB_CACHE_DIR", str(REPO / ".cache" / "fuselab"))
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))


def _has_cuda():
    import torch
    return torch.cuda.is_available()


def _has_nvcc():
    from fuselab import toolchain
    return toolchain.find_cuda_home() is not None


requires_nvcc = pytest.mark.skipif(not _has_nvcc(), reason="no CUDA compiler (nvcc) on this machine")
requires_gpu = pytest.mark.skipif(not _has_cuda(), reason="no CUDA device on this machine")


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
