"""The grader never opens, follows or loads what a submission can write, except through ``untrusted``.

A submission planted links named like its workers' logs (``output-N.txt``), pointing at the instructor's shared
build of a kernel and at host files, then crashed its kernel worker: on the restart the grader opened the links
for writing (as root, anywhere), the shared library changed, and every later checker loaded it. Here the same
attacks (planted from Python and from a C++ static initialiser) run through the sandboxed clean recheck, as root
and as a plain user the test creates; a control submission graded after them, in the same folders, keeps its
grade, and a shared build changed after the reference run is never loaded. Fails, never skips, where bubblewrap
does not work."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from fuselab.kernelbuild import shared as shared_builds
from fuselab.grading.sandbox import isolate, untrusted
from fuselab.grading.run import pipeline
from fuselab.grading.recheck import clean as recheck

from .conftest import REPO

LINK_NAMES = [f"output-{n}.txt" for n in range(0, 6)]


def _cell(source, grade_id, graded=False, solution=False, points=0):
    meta = {"nbgrader": {"grade_id": grade_id, "grade": graded, "solution": solution, "locked": not solution,
                         "schema_version": 3, **({"points": points} if graded else {})}}
    return {"cell_type": "code", "metadata": meta, "source": source, "outputs": [], "execution_count": None}


REFERENCE_KERNEL = r'''
__global__ void twice_kernel(const float* a, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * a[i];
}
void twice(const float* a, float* out, int n, cudaStream_t stream) {
    twice_kernel<<<(n + 127) / 128, 128, 0, stream>>>(a, out, n);
}
'''
PROTO = "void twice(const float* a, float* out, int n, cudaStream_t stream)"
STUDENT_PROTO = "void student(const float* a, float* out, int n, cudaStream_t stream)"

SETUP = ("import torch\nimport fuselab\n"
         f"REFERENCE = fuselab.build({REFERENCE_KERNEL!r}, [{PROTO!r}], name='reference', backend='emulate')\n")
# the instructor's solution: a Python function and a kernel source
SOLUTION = ("def double(x):\n    return 2 * x\n"
            "SOURCE = r'''\n__global__ void k(const float* a, float* out, int n) {\n"
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) out[i] = 2.0f * a[i];\n}\n"
            "void student(const float* a, float* out, int n, cudaStream_t stream) {\n"
            "    k<<<(n + 127) / 128, 128, 0, stream>>>(a, out, n);\n}\n'''\n")
# the tests check against the shared build of the reference kernel: a changed library changes every grade
TEST_KERNEL = ("x = torch.arange(8, dtype=torch.float32)\nexpected = torch.empty(8)\n"
               "REFERENCE.twice(x, expected, 8)\nassert torch.equal(expected, 2 * x), expected\n"
               f"mine = fuselab.build(SOURCE, [{STUDENT_PROTO!r}], name='student', backend='emulate')\n"
               "got = torch.empty(8)\nmine.student(x, got, 8)\nassert torch.equal(got, expected)\n")
TEST_PYTHON = ("x = torch.arange(8, dtype=torch.float32)\nexpected = torch.empty(8)\n"
               "REFERENCE.twice(x, expected, 8)\nassert torch.equal(double(x), expected)\n")
# three kernel tests: a kernel that crashes its worker restarts the run three times (output-1, -2 and -3 opened)
INSTRUCTOR = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
    _cell(SETUP, "setup"), _cell(SOLUTION, "solution", solution=True),
    _cell(TEST_KERNEL, "test_kernel", graded=True, points=3),
    _cell(TEST_KERNEL, "test_kernel_again", graded=True, points=1),
    _cell(TEST_KERNEL, "test_kernel_third", graded=True, points=1),
    _cell(TEST_PYTHON, "test_python", graded=True, points=2)]}
DESERVED = {"test_kernel": 3.0, "test_kernel_again": 1.0, "test_kernel_third": 1.0, "test_python": 2.0}

# a launcher that crashes the kernel worker (abort is allowed: any kernel may call it): the restart that follows
# is where the grader used to open the worker's log files
CRASHING_KERNEL = ("#include <cstdlib>\n"
                   "void student(const float* a, float* out, int n, cudaStream_t stream) { abort(); }\n")


def _python_attack(targets: list) -> str:
    """Links planted from Python in the solution worker's folder, then a kernel that crashes its worker."""
    return textwrap.dedent(f"""\
        import os
        for target, name in zip({targets!r} * 6, {LINK_NAMES[1:]!r}):
            try:
                os.symlink(target, name)
            except OSError:
                pass
        def double(x):
            return 2 * x
        SOURCE = {CRASHING_KERNEL!r}
        """)


# x86-64: long f(long nr, long a, long b, long c) { return syscall(nr, a, b, c); } (no system call's name, no
# asm in the source: the way the attack got past the symbol filter)
SYSCALL_CODE = "0x48,0x89,0xf8,0x48,0x89,0xf7,0x48,0x89,0xd6,0x48,0x89,0xca,0x0f,0x05,0xc3"


def _cpp_attack(targets: list) -> str:
    """Links planted by a static initialiser of the student's library, in the kernel worker's folder."""
    pairs = ", ".join(f'{{"{t}", "{n}"}}' for t, n in zip(targets * 6, LINK_NAMES[1:]))
    source = textwrap.dedent(f"""\
        #include <cstdlib>
        #include <cstring>
        extern "C" void* mmap(void*, unsigned long, int, int, int, long);
        static const unsigned char code[] = {{{SYSCALL_CODE}}};
        static const char* links[][2] = {{{pairs}}};
        static int planted = [] {{
            void* page = mmap(0, 4096, 7, 0x22, -1, 0);  // read, write and execute; private, anonymous
            if (page == (void*)-1) return 0;
            memcpy(page, code, sizeof code);
            long (*call)(long, long, long, long) = (long (*)(long, long, long, long))page;
            for (auto& link : links) call(88, (long)link[0], (long)link[1], 0);  // symlink(2)
            return 1;
        }}();
        void student(const float* a, float* out, int n, cudaStream_t stream) {{ abort(); }}
        """)
    return f"def double(x):\n    return 2 * x\nSOURCE = {source!r}\n"


def _student(solution_source: str) -> dict:
    nb = json.loads(json.dumps(INSTRUCTOR))
    nb["cells"][1]["source"] = solution_source
    return nb


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _snapshot(folder: Path) -> dict:
    return {str(p): (p.read_bytes(), p.stat().st_mode, p.stat().st_uid) for p in sorted(folder.rglob("*"))
            if p.is_file() or p.is_symlink()}


def reference_run(root: Path) -> dict:
    """The instructor's run, unsandboxed as the pipeline's: it fills ``root/shared-builds``. Returns its points."""
    env = dict(os.environ, FUSELAB_CACHE_DIR=str(root / "shared-builds"), MPLBACKEND="Agg")
    env.pop("FUSELAB_SHARED_BUILDS", None)
    reference = recheck.run_clean(INSTRUCTOR, INSTRUCTOR, root / "reference", cell_timeout=240, total_timeout=600,
                                  env=env, kernels_in_worker=False)
    return {k: v.points for k, v in reference.cells.items()}


@pytest.fixture(scope="module")
def made_by_the_reference_run(tmp_path_factory):
    """One reference run for the tests run as root here (none of them is about the reference run): each copies
    its shared builds (``copy_reference``), as a course's later runs find them kept."""
    root = tmp_path_factory.mktemp("reference-run")
    points = reference_run(root)
    return {"root": root, "points": points}


def copy_reference(made: dict, root: Path) -> dict:
    shutil.copytree(made["root"] / "shared-builds", root / "shared-builds", symlinks=True)
    return dict(made["points"])


def scenario(root: Path, attacks=("python", "cpp"), made: dict | None = None) -> dict:
    """The whole attack, as the grader meets it: a reference run fills the shared builds (digests recorded; a copy
    of ``made``'s where given), each attack is graded sandboxed in a submission folder, then the control twice
    (as in a regrade in the same ``--out``). Returns what the test asserts."""
    root = Path(root)
    shared, out = root / "shared-builds", root / "out"
    host = root / "host"
    host.mkdir(parents=True, exist_ok=True)
    existing = host / "existing.txt"
    existing.write_text("the host's own file\n")
    created = host / "created-by-grader.txt"
    reference = copy_reference(made, root) if made is not None else reference_run(root)
    digests, _ = shared_builds.record(shared)
    hidden = [out, root / "reference", *([made["root"]] if made is not None else [])]
    library = next((shared / "builds").glob("*/*.so"))
    before = {"library": _digest(library), "host": _snapshot(host)}
    targets = [str(library), str(existing), str(created)]
    sources = {"python": _python_attack(targets), "cpp": _cpp_attack(targets), "control": SOLUTION}
    graded = {}
    for name in [*attacks, "control", "control"]:
        workdir = out / "work" / name / "lab"
        env = dict(os.environ, FUSELAB_GRADING="1", FUSELAB_CACHE_DIR=str(workdir / "cache"), MPLBACKEND="Agg",
                   FUSELAB_SHARED_BUILDS=str(shared / "builds"))
        result = recheck.run_clean(INSTRUCTOR, _student(sources[name]), workdir / "clean", cell_timeout=240,
                                   total_timeout=900, env=env, sandbox=True, hide=hidden,
                                   limits=isolate.Limits(memory_bytes=4 * 2**30))
        planted = sorted(str(p.relative_to(workdir)) for p in (workdir / "clean").rglob("output-*")
                         if p.is_symlink())
        # the shared build was loaded where it is, never built again into this submission's caches
        rebuilt = sorted(str(p.relative_to(workdir)) for p in (workdir / "clean").rglob(library.parent.name))
        # a kernel it built linked the emulation runtime the reference run compiled and the grader recorded: none
        # compiled into its own caches
        runtimes = sorted(str(p.relative_to(workdir)) for p in (workdir / "clean").rglob("fuselab_emurt_*"))
        graded.setdefault(name, []).append({
            "points": {k: v.points for k, v in result.cells.items()},
            "messages": {k: v.message[:300] for k, v in result.cells.items()},
            "restarts": result.restarts, "flags": result.flags, "planted": planted, "rebuilt": rebuilt,
            "runtimes": runtimes})
    return {"reference": reference, "graded": graded,
            "library_unchanged": _digest(library) == before["library"],
            "host_unchanged": _snapshot(host) == before["host"], "created": created.exists()}


def _check(outcome: dict, attacks=("python", "cpp")) -> None:
    assert outcome["reference"] == DESERVED, outcome
    for name in attacks:
        attack = outcome["graded"][name][0]
        refused = any("refused" in flag for flag in attack["flags"])
        # the attack happened: its links are there, its kernel crashed the worker and the run restarted
        assert refused or attack["planted"], attack
        assert refused or attack["restarts"] >= 3, attack
        assert attack["points"]["test_kernel"] == 0, attack
        assert not attack["runtimes"], attack
    assert outcome["library_unchanged"], "the shared build was written through a planted link"
    assert outcome["host_unchanged"] and not outcome["created"], "a host file was written through a planted link"
    for control in outcome["graded"]["control"]:
        assert control["points"] == DESERVED, control
        assert not control["rebuilt"], control


def _sandbox_or_fail():
    problem = isolate.sandbox_problem()
    assert problem is None, f"the sandbox must work here (CI installs bubblewrap): {problem}"


def test_planted_log_links_never_reach_the_shared_builds_or_the_host(tmp_path, made_by_the_reference_run):
    _sandbox_or_fail()
    _check(scenario(tmp_path, made=made_by_the_reference_run))


PLAIN_USER = "fuselab-untrusted"


@contextlib.contextmanager
def _traversable(*paths):
    """Every folder above ``paths`` that others cannot pass through (an interpreter under ``/root``, say) gets
    o+x (pass through, not list) for the duration; put back after."""
    changed = []
    try:
        for path in paths:
            for folder in reversed(Path(os.path.realpath(path)).parents):
                mode = folder.stat().st_mode
                if not mode & stat.S_IXOTH:
                    folder.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
                    changed.append((folder, stat.S_IMODE(mode)))
        yield
    finally:
        for folder, mode in reversed(changed):
            folder.chmod(mode)


def test_as_a_plain_user_the_same_attacks_hold(tmp_path, made_by_the_reference_run):
    """The grader run by a user without rights (``runuser``), the sandbox in an unprivileged user namespace."""
    _sandbox_or_fail()
    if os.geteuid() != 0:
        # already a plain user: the same scenario, in this process
        _check(scenario(tmp_path, made=made_by_the_reference_run))
        return
    if subprocess.run(["id", PLAIN_USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PLAIN_USER],
                       check=True, capture_output=True)
    user = pwd.getpwnam(PLAIN_USER)
    root = Path(tempfile.mkdtemp(prefix="fuselab-plain-user-"))
    try:
        os.chmod(root, 0o755)
        # the reference run's shared builds, the plain user's as if its own grader had made them
        made = root / "made"
        shutil.copytree(made_by_the_reference_run["root"] / "shared-builds", made / "shared-builds", symlinks=True)
        for path in [made, *made.rglob("*")]:
            os.lchown(path, user.pw_uid, user.pw_gid)
        os.chown(root, user.pw_uid, user.pw_gid)
        script = ("import json, sys\nfrom pathlib import Path\nfrom tests.test_grader_untrusted_paths import scenario\n"
                  "made = {'root': Path(sys.argv[2]), 'points': json.loads(sys.argv[3])}\n"
                  "print('OUTCOME ' + json.dumps(scenario(sys.argv[1], made=made)))\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FUSELAB_", "TORCH_EXTENSIONS"))}
        env.update(HOME=str(root), PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1",
                   FUSELAB_CACHE_DIR=str(root / "cache"), TORCH_EXTENSIONS_DIR=str(root / "torch-extensions"))
        with _traversable(sys.executable, REPO / "fuselab"):
            done = subprocess.run(["runuser", "-u", PLAIN_USER, "--", sys.executable, "-c", script,
                                   str(root / "run"), str(made), json.dumps(made_by_the_reference_run["points"])],
                                  cwd=str(root), env=env, capture_output=True, text=True,
                                  timeout=1800)
        line = next((l for l in done.stdout.splitlines() if l.startswith("OUTCOME ")), None)
        assert line, f"the plain user's run failed (is the checkout readable by others?):\n{done.stderr[-4000:]}"
        _check(json.loads(line[len("OUTCOME "):]))
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ----------------------------------------------------------------------------- a changed shared build

def test_a_shared_build_changed_after_the_reference_run_is_never_loaded(tmp_path, made_by_the_reference_run):
    """The checker loads the instructor's kernels from the shared builds only with the bytes recorded when the
    reference run made them; a changed library is rebuilt in the submission's own cache and the TA is told."""
    _sandbox_or_fail()
    shared = tmp_path / "shared-builds"
    assert copy_reference(made_by_the_reference_run, tmp_path) == DESERVED  # this test changes its own copy
    digests, changed = shared_builds.record(shared)
    assert not changed and len(digests) >= 2  # the reference kernel and the instructor's own solution kernel
    library = next(p for p in (shared / "builds").glob("*/*.so") if _loads_reference(p))
    library.chmod(0o644)
    library.write_bytes(b"\x7fELF not the instructor's library")  # what a planted link used to do
    assert shared_builds.record(shared)[1] == [library.parent.name]  # a resumed run keeps the first digest
    assert shared_builds.changed(shared, digests) == [library.parent.name]
    settings = pipeline.Settings(out=tmp_path / "out", shared_builds=shared, shared_digests=digests)
    workdir = tmp_path / "out" / "work" / "control" / "lab"
    env = pipeline._base_env(settings, workdir / "clean", None)
    result = recheck.run_clean(INSTRUCTOR, _student(SOLUTION), workdir / "clean", cell_timeout=240,
                               total_timeout=900, env=env, sandbox=True, hide=[tmp_path / "out"],
                               limits=isolate.Limits(memory_bytes=4 * 2**30))
    # not loaded (it would fail to load: every test would score 0), rebuilt in the checker's own cache
    assert {k: v.points for k, v in result.cells.items()} == DESERVED, result
    assert (workdir / "clean" / "cache" / "builds" / library.parent.name).is_dir()
    assert library.read_bytes() == b"\x7fELF not the instructor's library"
    assert "not loaded" in shared_builds.note([library.parent.name])


PAYLOAD = r'''
#include <cstdio>
__attribute__((constructor)) static void planted() {
    FILE* trace = fopen("%s", "w");
    if (trace) { fputs("payload ran with the grader's rights\n", trace); fclose(trace); }
}
extern "C" void twice(const float* a, float* out, int n, void* stream) {
    for (int i = 0; i < n; ++i) out[i] = 3.0f * a[i];
}
'''


def test_a_build_planted_without_the_sandbox_is_not_loaded_by_the_next_reference_run(tmp_path,
                                                                                        made_by_the_reference_run):
    """A --no-sandbox submission runs with the grader's rights: it replaces the instructor's shared build of a
    kernel with a library of its own and records that library's digest in the manifest. The next sandboxed run
    removes the shared builds before its reference run (``pipeline.prepare_shared_builds``): the reference run
    builds them again and never loads the planted library, whose constructor would leave a trace."""
    from fuselab.grading.records import unsandboxed
    compiler = shutil.which("g++") or shutil.which("c++")
    assert compiler, "a C++ compiler is needed (the CPU emulation builds with one)"
    out = tmp_path / "out"
    out.mkdir()
    assert copy_reference(made_by_the_reference_run, out) == DESERVED
    shared = out / "shared-builds"
    assert not pipeline.prepare_shared_builds(pipeline.Settings(out=out, progress=False))  # a sandboxed run
    shared_builds.record(shared)
    unsandboxed.mark(out)  # a --no-sandbox run starts; one of its submissions does this:
    trace = tmp_path / "trace.txt"
    source = tmp_path / "payload.cpp"
    source.write_text(PAYLOAD % trace)
    library = next(p for p in (shared / "builds").glob("*/*.so") if _loads_reference(p))
    library.unlink()
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    manifest = shared / shared_builds.MANIFEST
    recorded = json.loads(manifest.read_text())
    recorded[library.parent.name] = _digest(library)
    manifest.write_text(json.dumps(recorded))
    unsandboxed.mark(out)  # the run ends
    settings = pipeline.Settings(out=out, progress=False)
    removed = pipeline.prepare_shared_builds(settings)
    assert reference_run(out) == DESERVED
    assert not trace.exists(), "the planted library was loaded by the reference run"
    assert removed
    digests, changed = shared_builds.record(shared)
    assert not changed and digests[library.parent.name] == _digest(library) and _loads_reference(library)


def _loads_reference(library: Path) -> bool:
    return b"twice_kernel" in library.read_bytes()


def test_without_recorded_digests_nothing_is_loaded_from_the_shared_builds(tmp_path, monkeypatch):
    builds = tmp_path / "builds" / "k1"
    builds.mkdir(parents=True)
    (builds / "k1.so").write_bytes(b"library")
    (builds / "fuselab-complete").write_text("")
    monkeypatch.setenv("FUSELAB_SHARED_BUILDS", str(tmp_path / "builds"))
    assert shared_builds.status("k1") == "changed" and shared_builds.status("k2") == "absent"  # no manifest
    manifest = tmp_path / shared_builds.MANIFEST
    manifest.symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps({"k1": hashlib.sha256(b"library").hexdigest()}))
    assert shared_builds.status("k1") == "changed"  # a manifest that is a link is never read
    manifest.unlink()
    manifest.write_text(json.dumps({"k1": hashlib.sha256(b"library").hexdigest()}))
    assert shared_builds.status("k1") == "ok"
    (builds / "k1.so").unlink()
    (builds / "k1.so").symlink_to(tmp_path / "elsewhere.so")
    (tmp_path / "elsewhere.so").write_bytes(b"library")
    assert shared_builds.status("k1") == "changed"  # a link is never followed, even to the right bytes


# ----------------------------------------------------------------------------- the helper itself

def test_the_helper_refuses_links_special_files_hard_links_and_size(tmp_path):
    box_path = tmp_path / "box"
    box_path.mkdir()
    secret = tmp_path / "host-secret"
    secret.write_text("root's")
    (box_path / "leaf-link").symlink_to(secret)
    (box_path / "folder-link").symlink_to(tmp_path)
    os.mkfifo(box_path / "fifo")
    os.link(secret, box_path / "hard")
    (box_path / "big").write_bytes(b"x" * 100)
    (box_path / "real").mkdir()
    (box_path / "real" / "fine.txt").write_text("data")
    with untrusted.Folder(box_path) as box:
        for name in ("leaf-link", "folder-link/host-secret", "fifo", "hard"):
            with pytest.raises(untrusted.Refused):
                box.read_bytes(name)  # a FIFO is refused at once, never waited on
        with pytest.raises(untrusted.Refused):
            box.read_bytes("big", limit=10)
        assert box.read_bytes("real/fine.txt") == b"data"
        assert box.read_bytes("missing") is None
        assert not box.is_file("leaf-link") and box.is_file("real/fine.txt")
        # writing replaces a link, never follows it; a link on the way is refused
        box.write_text("leaf-link", "grader's")
        assert secret.read_text() == "root's" and (box_path / "leaf-link").read_text() == "grader's"
        with pytest.raises(untrusted.Refused):
            box.read_bytes("folder-link/anything")
        assert not box.create("hard") and secret.read_text() == "root's"
        # a folder the grader hands to a sandbox: a link in its place is removed, not followed
        assert box.make_folder("folder-link") == box_path / "folder-link"
        assert (box_path / "folder-link").is_dir() and not (box_path / "folder-link").is_symlink()
        assert secret.exists()
        # removing a tree never follows a link inside it
        (box_path / "real" / "out").symlink_to(tmp_path)
        box.remove("real")
        assert not (box_path / "real").exists() and secret.read_text() == "root's"


def test_a_locked_folder_a_sandbox_left_is_still_removed(tmp_path):
    locked = tmp_path / "work" / "clean" / "kernel-process"
    locked.mkdir(parents=True)
    (locked / "file").write_text("x")
    (locked / "link").symlink_to(tmp_path)
    keep = tmp_path / "work" / "result.json"
    keep.write_text("{}")
    locked.chmod(0)
    run = pipeline.SubmissionRun(sub=None, device=None, settings=None, source=tmp_path, workdir=tmp_path / "work")
    pipeline.tidy(run)
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["result.json"], run.notes
    assert tmp_path.exists()


def test_the_grader_never_names_a_workers_log_in_its_folder():
    """The workers' output goes to their keeper's anonymous files: nothing named in a folder they write."""
    source = Path(recheck.__file__).read_text()
    assert "output-" not in source and "clean-events" not in source


# ----------------------------------------------------------------------------- other names the grader touches

PLAIN = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
    _cell("import torch\n", "setup"), _cell("def double(x):\n    return 2 * x\n", "solution", solution=True),
    _cell("assert double(21) == 42", "test_double", graded=True, points=1),
    _cell("assert double(2) == 4", "test_again", graded=True, points=1)]}

def test_links_fifos_and_hard_links_in_the_checkers_folder_are_never_followed(tmp_path):
    """What a checker that loaded a changed library could leave in its folder before a restart: its workers'
    folders and the plan as links, and names the grader once used (a transfer file, lease files) as links, a FIFO
    and a hard link to host files. The grader (root here: it hands the workers' folders to the sandbox's user)
    follows none of them."""
    _sandbox_or_fail()
    host = tmp_path / "host"
    (host / "folder").mkdir(parents=True)
    (host / "folder" / "kept.txt").write_text("host data")
    (host / "file.txt").write_text("host file")
    before = _snapshot(host), (host / "folder").stat().st_uid, (host / "folder").stat().st_mode
    clean = tmp_path / "work" / "student" / "lab" / "clean"
    clean.mkdir(parents=True)
    (clean / "solution-process").symlink_to(host / "folder", target_is_directory=True)
    (clean / "kernel-process").mkdir()
    (clean / "kernel-process" / "transfer.bin").symlink_to(host / "file.txt")
    (clean / "clean-plan.json").symlink_to(host / "file.txt")
    os.mkfifo(clean / "lease-released-0-1")
    os.link(host / "file.txt", clean / "lease-granted-0-1")
    result = recheck.run_clean(PLAIN, PLAIN, clean, cell_timeout=120,
                               total_timeout=300, sandbox=True, hide=[tmp_path / "work"],
                               limits=isolate.Limits(memory_bytes=3 * 2**30))
    assert {k: v.points for k, v in result.cells.items()} == {"test_double": 1.0, "test_again": 1.0}, result
    after = _snapshot(host), (host / "folder").stat().st_uid, (host / "folder").stat().st_mode
    assert after == before
    assert not (clean / "solution-process").is_symlink()


def test_a_fifo_planted_as_a_log_never_holds_the_grader_up(tmp_path):
    """FIFOs named like the workers' logs, then a kernel that crashes the kernel worker in a graded test: the
    restart opens no name in the workers' folders (a FIFO would hold the grader there for good), and the test
    after the crash keeps its points."""
    _sandbox_or_fail()
    fifos = ("import os\n"
             f"for name in {LINK_NAMES!r}:\n"
             "    os.mkfifo(name)\n"
             "def double(x):\n    return 2 * x\n"
             f"SOURCE = {CRASHING_KERNEL!r}\n")
    result = recheck.run_clean(INSTRUCTOR, _student(fifos), tmp_path / "work" / "clean", cell_timeout=240,
                               total_timeout=600, sandbox=True, hide=[tmp_path / "work"],
                               limits=isolate.Limits(memory_bytes=4 * 2**30))
    assert stat.S_ISFIFO(os.lstat(tmp_path / "work" / "clean" / "solution-process" / "output-1.txt").st_mode)
    assert result.restarts >= 1 and result.cells["test_kernel"].points == 0, result
    assert result.cells["test_python"].points == 2, result.cells["test_python"]


def test_the_shared_builds_show_a_sandbox_no_instructors_source(tmp_path):
    """The reference run builds the instructor's solution kernels into the shared builds, which every sandbox is
    shown read-only: their build folders held the source word for word (``main.cpp``, the ``.cu``), the build
    file and the compiler's log, so a student's solution cell could read the instructor's kernel and hand it in.
    Once recorded, a shared build holds its library alone, and still loads from there."""
    _sandbox_or_fail()
    shared = tmp_path / "shared-builds"
    marker = "fuselab-instructor-solution-text"
    source = REFERENCE_KERNEL.replace("{\n", "{ // " + marker + "\n", 1)
    build = (f"import fuselab\nm = fuselab.build({source!r}, [{PROTO!r}], name='fused', backend='emulate')\n"
             "print(m.backend)")
    made = subprocess.run([sys.executable, "-c", build], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, FUSELAB_CACHE_DIR=str(shared)))
    assert made.returncode == 0 and made.stdout.split() == ["emulate"], made.stderr[-2000:]
    assert any(marker in p.read_text(errors="replace") for p in shared.rglob("*") if p.is_file())  # the attack
    digests, changed = shared_builds.record(shared)
    assert digests and not changed
    env = dict(os.environ, FUSELAB_SHARED_BUILDS=str(shared / "builds"), PYTHONPATH=str(REPO))
    probe = textwrap.dedent(f"""\
        import os
        from fuselab.kernelbuild import shared
        top = os.environ["FUSELAB_SHARED_BUILDS"]
        found, names = [], sorted(os.listdir(top))
        for folder, _, files in os.walk(os.path.dirname(top)):
            for name in files:
                with open(os.path.join(folder, name), "rb") as handle:
                    if {marker.encode()!r} in handle.read():
                        found.append(name)
        print("found", found)
        print("loadable", [shared.status(n) for n in names if not n.endswith(".lock")])
        """)
    own = tmp_path / "own"
    command = isolate.sandboxed([sys.executable, "-c", probe], own=[own], hide=[tmp_path],
                                readonly=shared_builds.readonly(env))
    result = isolate.Child(command, limits=isolate.Limits(wall_s=60), env=env, cwd=str(own)).wait()
    assert result.ok, (result.stdout + result.stderr)[-2000:]
    assert "found []" in result.stdout, result.stdout
    assert "loadable ['ok', 'ok']" in result.stdout, result.stdout  # the kernel and the emulation's runtime


@pytest.mark.parametrize("boot", ["this python", "the bootstrap before 3.11"])
def test_a_package_planted_in_a_workers_folder_is_never_what_the_next_worker_imports(tmp_path, boot):
    """Each worker starts as ``python -m`` in its own folder, which its submission can write (native code of the
    kernel worker, say): a ``json/`` planted there must not be the ``json`` the next process of that folder runs."""
    planted = tmp_path / "json"
    planted.mkdir()
    for name in ("__init__.py", "tool.py"):
        (planted / name).write_text("open('PLANTED_RAN', 'w').write('yes')\n")
    command = recheck.python_module("json.tool", "--help")
    if boot != "this python":
        command = [sys.executable, "-c", recheck._SAFE_PATH_BOOT, "json.tool", "--help"]
    ran = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and "usage" in ran.stdout.lower(), ran.stderr
    assert not (tmp_path / "PLANTED_RAN").exists()
    plain = subprocess.run([sys.executable, "-m", "json.tool", "--help"], cwd=tmp_path, capture_output=True,
                           timeout=60)
    assert (tmp_path / "PLANTED_RAN").exists() and plain is not None  # the plain ``-m`` this replaces imports it


def test_both_workers_start_with_the_safe_path(tmp_path, monkeypatch):
    """The workers' commands are ``python_module``'s, not a bare ``-m`` in a folder their submission can write."""
    started = []

    class Recorded(Exception):
        pass

    def record(command, **_):
        started.append(list(command))
        raise Recorded

    monkeypatch.setattr(isolate, "Child", record)
    box = recheck.Folder(tmp_path)
    with pytest.raises(Recorded):
        recheck._start_worker("kernel", box, {}, isolate.Limits(), False, [], None)
    with pytest.raises(Recorded):
        recheck._start_worker("solution", box, {}, isolate.Limits(), False, [], None)
    safe = recheck.python_module("m")[:-1]
    assert all(command[:len(safe)] == safe for command in started), started


def _nest(root: Path, depth: int) -> None:
    fd = os.open(root, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)


def test_a_tree_nested_past_any_recursion_is_given_and_removed(tmp_path):
    """A submission nests thousands of folders in its own folder and crashes: the worker's restart gives the
    folder to the sandbox's user again, and the next run removes it; neither may fail (a grader failure would
    leave the student ungraded on every rerun) or follow the link beside it."""
    root = tmp_path / "kernel-process"
    root.mkdir()
    _nest(root, 3000)
    target = tmp_path / "host-file"
    target.write_text("the host's")
    (root / "link").symlink_to(target)
    uid = isolate.SANDBOX_UID if os.geteuid() == 0 else os.getuid()
    gid = isolate.SANDBOX_GID if os.geteuid() == 0 else os.getgid()
    isolate._give(root, uid, gid)
    assert os.stat(root / "d").st_uid == uid and os.lstat(root / "link").st_uid == uid
    assert os.stat(target).st_uid == os.geteuid()  # the link's target is never given
    untrusted.remove_tree(root)
    assert not root.exists() and target.read_text() == "the host's"


def test_the_workers_python_path_never_names_their_working_folder(tmp_path):
    """``PYTHONPATH=/wheels:`` (an unset variable exported with a colon) has an empty entry, Python's name for the
    working folder, which ``-P`` keeps: the workers' path holds absolute folders only."""
    env = recheck.runner_env({"PYTHONPATH": f"/wheels{os.pathsep}{os.pathsep}.{os.pathsep}rel{os.pathsep}",
                              "LD_LIBRARY_PATH": "/usr/local/cuda/lib64:"}, tmp_path, None)
    entries = env["PYTHONPATH"].split(os.pathsep)
    assert entries == [str(REPO), "/wheels"], entries
    # the same for the loader's path: the reference run's build-ahead process gets this environment as it is
    assert env["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64"


def test_the_deep_removal_opens_locked_folders_and_never_touches_a_links_target(tmp_path, monkeypatch):
    """Where Python's walk gives up (a RecursionError), coreutils removes the tree: folders a sandbox locked
    (``chmod 000``) are opened first, and neither step changes what a link inside names."""
    root = tmp_path / "kernel-process"
    (root / "locked" / "inner").mkdir(parents=True)
    target = tmp_path / "host-file"
    target.write_text("the host's")
    target.chmod(0o600)
    (root / "locked" / "inner" / "link").symlink_to(target)
    (root / "locked").chmod(0)

    def too_deep(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    too_deep.avoids_symlink_attacks = True
    monkeypatch.setattr(untrusted.shutil, "rmtree", too_deep)
    untrusted.remove_tree(root)
    assert not root.exists() and target.read_text() == "the host's"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_a_record_is_written_whole_and_never_through_a_link_at_its_temporary_name(tmp_path):
    """A result, roster or marker is written beside its path and renamed over it: a link planted where the
    temporary goes (the grader's own pid, a folder a submission once wrote into) is replaced, its target untouched;
    a link at the record's own path is replaced too; and a write that fails leaves the old record and no
    temporary."""
    from fuselab.grading.records.whole import write_whole
    target = tmp_path / "host-file"
    target.write_text("the host's")
    record = tmp_path / "result.json"
    (tmp_path / f"result.json.{os.getpid()}.tmp").symlink_to(target)
    write_whole(record, '{"score": 1}')
    assert record.read_text() == '{"score": 1}' and not record.is_symlink()
    assert target.read_text() == "the host's"
    record.unlink()
    record.symlink_to(target)
    write_whole(record, '{"score": 2}')
    assert record.read_text() == '{"score": 2}' and not record.is_symlink() and target.read_text() == "the host's"
    with pytest.raises(UnicodeEncodeError):
        write_whole(record, "\ud800")  # a lone surrogate: the write itself fails
    assert record.read_text() == '{"score": 2}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["host-file", "result.json"]
