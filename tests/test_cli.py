"""The fuselab command: doctor reports and advises; the demo builds, checks and times end to end."""

import os
import subprocess
import sys


from fuselab import doctor

FUSELAB = [sys.executable, "-m", "fuselab.cli"]


def _run(*args, env=None):
    return subprocess.run([*FUSELAB, *args], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, **(env or {})))


def test_doctor_reports_every_topic_and_passes_without_a_gpu():
    result = _run("doctor")
    topics = ["python", "torch", "nvcc", "gpu", "ninja", "c++ compiler", "jupyterlab", "nbgrader", "fuselab cache"]
    for topic in topics:
        assert topic in result.stdout, topic
    import torch
    if not torch.cuda.is_available():
        assert "no GPU: kernels run under CPU emulation, speedups cannot be measured" in result.stdout
        assert result.returncode == 0, result.stdout
    assert result.stderr == ""


def test_doctor_names_the_fix_for_an_unwritable_cache(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.access(locked, os.W_OK):  # root ignores permissions: use a path under a regular file instead
        blocker = tmp_path / "file"
        blocker.write_text("")
        locked = blocker / "cache"
    result = _run("doctor", env={"FUSELAB_CACHE_DIR": str(locked)})
    assert result.returncode == 1
    assert "PROBLEM" in result.stdout and "FUSELAB_CACHE_DIR" in result.stdout


def test_doctor_flags_an_nvcc_whose_major_version_differs_from_torchs(monkeypatch):
    import torch
    from fuselab import toolchain
    monkeypatch.setattr(toolchain, "nvcc_version", lambda home: (11, 8))
    monkeypatch.setattr(toolchain, "find_cuda_home", lambda: "/opt/cuda-11.8")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    findings = {f.topic: f for f in doctor.run_checks()}
    assert findings["nvcc"].status == "problem" and "13" in findings["nvcc"].fix


def test_demo_builds_checks_and_times():
    result = _run("demo", "--backend", "emulate")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "check: add_relu_mul: all" in result.stdout
    assert "not measured (no GPU)" in result.stdout or "faster at n" in result.stdout
    assert result.stderr == ""


def test_doctor_reports_a_sandbox_that_cannot_start_and_how_to_fix_it(tmp_path):
    """A bubblewrap that fails to start a sandbox (as where user namespaces are forbidden): grading would be
    refused, so the doctor says so, with the fix, and fails."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "bwrap").write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    (fake / "bwrap").chmod(0o755)
    result = _run("doctor", env={"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"})
    assert result.returncode == 1, result.stdout
    line = next(line for line in result.stdout.splitlines() if "sandbox" in line)
    assert "PROBLEM" in line and "refuses to grade" in line and "cannot start" in line, result.stdout
    assert "user namespaces" in result.stdout.split(line)[1]


def test_doctor_says_to_install_a_missing_bubblewrap(monkeypatch):
    from fuselab.grading.sandbox import isolate, readiness
    monkeypatch.setattr(isolate, "bubblewrap", lambda: None)
    finding = readiness.sandbox_finding()
    assert finding.status == "problem" and "not installed" in finding.detail
    assert "apt-get install bubblewrap" in finding.fix


def test_doctor_checks_the_sandbox_and_passes_where_it_works():
    result = _run("doctor")
    line = next(line for line in result.stdout.splitlines() if "sandbox" in line)
    assert "[ok" in line, result.stdout  # CI installs bubblewrap (.ci/run); the sandbox must work there


def test_doctor_says_how_to_compile_a_package_installed_without_bytecode(tmp_path, monkeypatch):
    package = tmp_path / "site" / "uncompiled_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    finding = doctor._bytecode("uncompiled_pkg")
    assert finding.status == "note" and "compiles it again" in finding.detail
    command = finding.fix.split()
    assert command[1:3] == ["-m", "compileall"] and command[-1] == str(package)
    subprocess.run(command, check=True)  # the fix it names, as a TA would paste it
    assert doctor._bytecode("uncompiled_pkg").status == "ok"
    assert doctor._bytecode("no_such_package_here") is None
