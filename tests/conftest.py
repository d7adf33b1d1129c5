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


class InstructorReferences:
    """The instructor's reference runs and shared builds, made once a session per lab (the labs not yet made side
    by side, as ``pipeline.grade`` runs them) and copied into a test's ``--out`` before it grades: the pipeline
    finds them kept and reuses them (``records/reference_cache.py``), as a course's later runs do. Each test gets
    its own copy, so nothing it grades can reach another's. Only for tests whose subject is not the reference run
    or the shared builds themselves (those make their own: tests/test_grader_reference_cache.py and others)."""

    def __init__(self, root: Path):
        self.root = root
        self.made: set = set()

    def _make(self, labs) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from fuselab.grading.gpus import schedule
        from fuselab.grading.run import pipeline
        from fuselab.kernelbuild import shared as shared_builds
        todo = sorted(set(labs) - self.made)
        if not todo:
            return
        settings = pipeline.Settings(out=self.root, progress=False, feedback=False,
                                     shared_builds=self.root / "shared-builds")
        settings.cpu_threads = max(1, schedule.available_cores() // len(todo))
        pipeline.check_sandbox(settings)
        with ThreadPoolExecutor(max_workers=len(todo)) as pool:
            ran = dict(zip(todo, pool.map(lambda lab: pipeline.reference_run(lab, settings), todo)))
        settings.shared_digests, changed = shared_builds.record(settings.shared_builds)
        if not changed:  # kept as the pipeline keeps them; a broken reference is never reused, so a test sees it
            pipeline.keep_references(ran, settings)
        self.made |= set(todo)

    def into(self, out: Path, labs) -> Path:
        """``out`` holding the kept reference runs of ``labs`` and the shared builds they made."""
        import shutil
        self._make(labs)
        for lab in labs:
            shutil.copytree(self.root / "reference" / lab, out / "reference" / lab, symlinks=True)
        shutil.copytree(self.root / "shared-builds", out / "shared-builds", symlinks=True, dirs_exist_ok=True)
        return out


@pytest.fixture(scope="session")
def instructor_references(tmp_path_factory):
    return InstructorReferences(tmp_path_factory.mktemp("instructor-references"))
