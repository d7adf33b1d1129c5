"""``fuselab doctor``: is this machine ready for the course, and if not, what exactly to do.

Each check gives a status (ok / note / problem) and, for a problem, the fix. The exit code is non-zero only
when something *needed* is missing; a machine without a GPU is fine (kernels run under the CPU emulation).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from . import config, toolchain

TORCH_RANGE = ((2, 11), (2, 14))


@dataclass
class Finding:
    topic: str
    status: str  # "ok", "note" or "problem"
    detail: str
    fix: str = ""

    def line(self) -> str:
        mark = {"ok": "ok     ", "note": "note   ", "problem": "PROBLEM"}[self.status]
        text = f"  [{mark}] {self.topic:<14} {self.detail}"
        if self.fix:
            text += f"\n             fix: {self.fix}"
        return text


def run_checks() -> list:
    findings = [_python(), *_torch_and_gpu(), _bytecode(), _ninja(), _cxx(), *_course_tools(), *_cache_dirs()]
    return [f for f in findings if f is not None]


def main(extra_checks=()) -> int:
    """``extra_checks``: more checks (each returns a Finding) from the floors above, e.g. the grader's sandbox."""
    findings = run_checks() + [check() for check in extra_checks]
    print("fuselab doctor")
    for finding in findings:
        print(finding.line())
    problems = [f for f in findings if f.status == "problem"]
    if problems:
        print(f"\n{len(problems)} problem(s) to fix: each says what it stops and how to fix it.")
        return 1
    print("\nReady.")
    return 0


def _python():
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info < (3, 10):
        return Finding("python", "problem", version, "use Python 3.10 or newer")
    return Finding("python", "ok", f"{version} ({sys.executable})")


def _torch_and_gpu():
    try:
        import torch
    except ImportError:
        return [Finding("torch", "problem", "not installed", "bash .ci/setup  (or: pip install 'torch>=2.11,<2.15')")]
    major_minor = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    cuda = torch.version.cuda
    findings = []
    if TORCH_RANGE[0] <= major_minor <= TORCH_RANGE[1]:
        findings.append(Finding("torch", "ok", f"{torch.__version__} (CUDA {cuda or 'none: CPU build'})"))
    else:
        findings.append(Finding("torch", "problem", f"{torch.__version__}: the course is tested with 2.11 to 2.14",
                                "pip install 'torch>=2.11,<2.15'"))
    home = toolchain.find_cuda_home()
    nvcc = toolchain.nvcc_version(home)
    gpu = torch.cuda.is_available()
    if nvcc is None:
        status = "problem" if gpu else "note"
        findings.append(Finding("nvcc", status, "not found" + ("" if gpu else ": only the CPU emulation can build"),
                                "install the CUDA toolkit matching torch's CUDA, or set CUDA_HOME" if gpu else ""))
    elif cuda and nvcc[0] != int(cuda.split(".")[0]):
        # load_inline does not compare these; a major mismatch builds code the runtime may not load.
        findings.append(Finding("nvcc", "problem", f"{nvcc[0]}.{nvcc[1]} at {home}, but torch was built with CUDA "
                                f"{cuda}", f"install CUDA {cuda.split('.')[0]}.x's nvcc, or a torch built for "
                                f"CUDA {nvcc[0]}"))
    else:
        note = f" (torch: CUDA {cuda})" if cuda else ""
        findings.append(Finding("nvcc", "ok", f"{nvcc[0]}.{nvcc[1]} at {home}{note}"))
    if gpu:
        props = torch.cuda.get_device_properties(0)
        findings.append(Finding("gpu", "ok", f"{props.name}, compute capability {props.major}.{props.minor}, "
                                f"{props.multi_processor_count} SMs, {props.L2_cache_size / 2**20:.0f} MB L2"))
    else:
        findings.append(Finding("gpu", "note", "no GPU: kernels run under CPU emulation, speedups cannot be measured"))
    return findings


def _bytecode(package: str = "torch"):
    """Whether ``package`` was installed with its bytecode compiled (pip's default). The grader's processes write
    none (a sandbox's files are read-only), so without it every one of them compiles the package's Python again:
    on the H100 machine, whose torch ships without it, ``import torch`` took 6.7 core-s so (docs/RESULTS.md),
    three processes per graded submission-lab."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None  # not installed (its own check says so), or not from source files
    folder = os.path.dirname(spec.origin)
    if os.path.exists(importlib.util.cache_from_source(spec.origin)):
        return Finding(f"{package} bytecode", "ok", "compiled")
    return Finding(f"{package} bytecode", "note", f"{folder} has no compiled bytecode: every grading process "
                   "compiles it again at its start", f"{sys.executable} -m compileall -q -j 0 {folder}")


def _ninja():
    path = shutil.which("ninja")
    if path is None:
        try:
            import ninja  # the pip package puts its binary next to the module
            path = os.path.join(ninja.BIN_DIR, "ninja")
        except (ImportError, AttributeError):
            return Finding("ninja", "problem", "not found", "pip install ninja")
    return Finding("ninja", "ok", path)


def _cxx():
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        return Finding("c++ compiler", "problem", "none found", "install g++ (Debian/Ubuntu: apt-get install g++)")
    try:
        first = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
        return Finding("c++ compiler", "ok", first.splitlines()[0] if first else compiler)
    except (OSError, subprocess.SubprocessError) as exc:
        return Finding("c++ compiler", "problem", f"{compiler} does not run: {exc}", "reinstall g++")


def _course_tools():
    findings = []
    for package, why in (("jupyterlab", "students open the labs in JupyterLab"),
                         ("nbgrader", "teaching assistants autograde with nbgrader")):
        try:
            findings.append(Finding(package, "ok", importlib.metadata.version(package)))
        except importlib.metadata.PackageNotFoundError:
            findings.append(Finding(package, "note", f"not installed ({why})", "pip install -e '.[course]'"))
    return findings


def _cache_dirs():
    findings = []
    dirs = {"fuselab cache": config.cache_root()}
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        dirs["torch ext dir"] = os.environ["TORCH_EXTENSIONS_DIR"]
    for label, path in dirs.items():
        try:
            os.makedirs(path, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path):
                pass
            findings.append(Finding(label, "ok", f"{path} (writable)"))
        except OSError as exc:
            findings.append(Finding(label, "problem", f"{path} is not writable: {exc.strerror}",
                                    "set FUSELAB_CACHE_DIR (or TORCH_EXTENSIONS_DIR) to a writable folder"))
    return findings
