"""The instructor's reference runs are kept in the course folder and reused only while nothing they depend on
changed, verified by content, never from a file a submission could have swapped in (``reference_cache``)."""

import hashlib
import json
import os
import shutil

import pytest

from fuselab import course
from fuselab.kernelbuild import shared as shared_builds
from fuselab.grading.run import pipeline
from fuselab.grading.recheck import clean as recheck
from fuselab.grading.records import reference_cache
from fuselab.grading.recheck.clean import CellVerdict, CleanResult

LAB = "lab0"


@pytest.fixture
def course_copy(tmp_path, monkeypatch):
    """The course's solutions and package, copied so that a test may edit what the references depend on."""
    solutions = tmp_path / "course" / "solutions"
    shutil.copytree(course.SOLUTIONS / LAB, solutions / LAB)
    package = tmp_path / "course" / "fuselab"
    package.mkdir()
    (package / "module.py").write_text("X = 1\n")
    monkeypatch.setattr(course, "SOLUTIONS", solutions)
    monkeypatch.setattr(course, "REPO", tmp_path / "course")
    return tmp_path / "course"


@pytest.fixture
def runs(monkeypatch):
    """The clean recheck of the reference faked: it counts its runs and makes one shared build, as the real one
    does (the instructor's kernels into the shared builds)."""
    calls = []

    def run_clean(instructor, student, workdir, env=None, **kwargs):
        calls.append(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        build = shared_root_of(env) / "builds" / "lab0_reference"
        build.mkdir(parents=True, exist_ok=True)
        shared_builds.library_of(build.parent, build.name).write_bytes(b"the instructor's library")
        (build / shared_builds.COMPLETE).write_text("")
        return CleanResult(cells={"test_ok": CellVerdict("test_ok", 2.0, 2.0, "passed")}, seconds=3.0)

    monkeypatch.setattr(recheck, "run_clean", run_clean)
    return calls


def shared_root_of(env):
    from pathlib import Path
    return Path(env["FUSELAB_CACHE_DIR"])


def _settings(tmp_path, **kw):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return pipeline.Settings(out=out, shared_builds=out / "shared-builds", progress=False, **kw)


def _references(settings, device=None):
    """One run's reference step as ``pipeline._grade`` does it: the shared builds checked, run or reuse, record the
    builds, keep."""
    pipeline.prepare_shared_builds(settings)
    reference = {LAB: pipeline.reference_run(LAB, settings, device)}
    settings.shared_digests, changed = shared_builds.record(settings.shared_builds)
    assert not changed
    pipeline.keep_references(reference, settings)
    return reference[LAB]


def test_a_forced_regrade_reuses_the_references_and_remeasuring_runs_them(tmp_path, course_copy, runs):
    first = _references(_settings(tmp_path))
    assert len(runs) == 1 and not first.get("reused")
    again = _references(_settings(tmp_path, force=True))  # --force regrades students, not the references
    assert len(runs) == 1 and again["reused"] and again["cells"] == first["cells"]
    assert not _references(_settings(tmp_path, remeasure_references=True)).get("reused")
    assert len(runs) == 2


@pytest.mark.parametrize("change", ["solution", "package", "torch", "machine"])
def test_a_change_of_what_they_depend_on_runs_them_again(tmp_path, course_copy, runs, monkeypatch, change):
    _references(_settings(tmp_path))
    if change == "solution":
        notebook = course_copy / "solutions" / LAB / f"{LAB}.ipynb"
        notebook.write_text(notebook.read_text() + "\n")
    elif change == "package":
        (course_copy / "fuselab" / "module.py").write_text("X = 2\n")
    elif change == "torch":
        monkeypatch.setattr(reference_cache, "_torch_version", lambda: "9.9.9")
    else:
        monkeypatch.setattr(reference_cache, "machine", lambda device: "another GPU")
    assert not _references(_settings(tmp_path)).get("reused")
    assert len(runs) == 2


def _entry(settings):
    return settings.out / "reference" / LAB / reference_cache.ENTRY


@pytest.mark.parametrize("tamper", ["verdict", "digest", "link", "hard link", "build", "manifest", "broken"])
def test_an_entry_or_build_not_as_the_grader_kept_it_is_not_reused(tmp_path, course_copy, runs, tamper):
    settings = _settings(tmp_path)
    _references(settings)
    entry = _entry(settings)
    data = json.loads(entry.read_text())
    if tamper == "verdict":  # a changed result whose digest was not recomputed
        data["cells"]["test_ok"]["points"] = 0.0
        entry.write_text(json.dumps(data))
    elif tamper == "digest":  # a forged digest over a changed body still does not hold the right key's builds
        data["cache"]["builds"] = {}
        entry.write_text(json.dumps(data))
    elif tamper == "link":
        elsewhere = tmp_path / "elsewhere.json"
        entry.rename(elsewhere)
        entry.symlink_to(elsewhere)
    elif tamper == "hard link":
        os.link(entry, tmp_path / "second-name.json")
    elif tamper == "build":  # the library the submissions would load is not the one the reference proved
        library = next((settings.shared_builds / "builds").glob("*/*.so"))
        library.write_bytes(b"not the instructor's library")
    elif tamper == "manifest":
        (settings.shared_builds / shared_builds.MANIFEST).write_text("{}")
    else:  # a failed correctness test, kept as the grader keeps it (its digest right): run again all the same
        data["broken"] = ["test_ok"]
        cache = data.pop("cache")
        reference_cache.store(entry.parent, data, cache["key"], cache["builds"], cache["sandbox"])
    key = reference_cache.key(LAB, None)
    assert reference_cache.load(entry.parent, key, settings.shared_builds, sandbox=True) is None


def test_an_entry_kept_by_a_run_without_the_sandbox_is_not_reused_by_a_sandboxed_one(tmp_path, course_copy, runs):
    _references(_settings(tmp_path, sandbox=False))
    assert _references(_settings(tmp_path, sandbox=False))["reused"]
    assert not _references(_settings(tmp_path, sandbox=True)).get("reused")
    assert _references(_settings(tmp_path, sandbox=False))["reused"]  # a sandboxed entry serves either


def test_an_entry_claiming_the_sandbox_forged_during_a_run_without_it_is_not_reused(tmp_path, course_copy, runs):
    """Under ``--no-sandbox`` a submission can rewrite a kept entry whole, digest and sandbox claim included: a
    sandboxed run after it believes no entry changed before that run's end (``unsandboxed``)."""
    from fuselab.grading.records import unsandboxed
    settings = _settings(tmp_path)
    _references(settings)  # kept by a sandboxed run
    entry = _entry(settings)
    unsandboxed.mark(settings.out)  # a --no-sandbox run starts; one of its submissions rewrites the entry
    data = json.loads(entry.read_text())
    data["cells"]["test_ok"]["message"] = "forged"
    cache = data.pop("cache")
    reference_cache.store(entry.parent, data, cache["key"], cache["builds"], sandbox=True)
    unsandboxed.mark(settings.out)  # the run ends
    again = _references(_settings(tmp_path))
    assert not again.get("reused") and len(runs) == 2
    assert _references(_settings(tmp_path))["reused"]  # the entry the sandboxed run kept after the mark


def _plant_build(settings, name="lab0_reference", library=b"a submission's library"):
    """What a --no-sandbox submission can write: a finished build and its manifest entry, matching digests."""
    build = settings.shared_builds / "builds" / name
    build.mkdir(parents=True, exist_ok=True)
    path = shared_builds.library_of(build.parent, name)
    path.unlink(missing_ok=True)
    path.write_bytes(library)
    (build / shared_builds.COMPLETE).write_text("")
    manifest = settings.shared_builds / shared_builds.MANIFEST
    recorded = json.loads(manifest.read_text()) if manifest.exists() else {}
    recorded[name] = hashlib.sha256(library).hexdigest()
    manifest.write_text(json.dumps(recorded))
    return path


@pytest.mark.parametrize("before", ["sandboxed run", "fresh folder"])
def test_builds_planted_during_a_run_without_the_sandbox_are_made_again(tmp_path, course_copy, runs, monkeypatch,
                                                                      before):
    """A --no-sandbox submission plants a library and its manifest entry in the shared builds (and a planted
    stamp): the next sandboxed run removes them before its reference run, runs that again and records only what
    it made itself."""
    from fuselab.grading.records import unsandboxed
    settings = _settings(tmp_path, sandbox=False)
    if before == "sandboxed run":
        settings = _settings(tmp_path)
        _references(settings)
    unsandboxed.mark(settings.out)  # a --no-sandbox run starts; one of its submissions writes the shared builds
    settings.shared_builds = settings.out / "shared-builds"
    planted = _plant_build(settings)
    (settings.shared_builds / unsandboxed.STAMP).write_text("forged")
    unsandboxed.mark(settings.out)  # the run ends
    loaded = []
    real = recheck.run_clean

    def reference_loads(instructor, student, workdir, env=None, **kwargs):
        # the reference run would take a finished build it finds as it is: note whether the planted one is there
        if planted.exists():
            loaded.append(planted.read_bytes())
        return real(instructor, student, workdir, env=env, **kwargs)

    monkeypatch.setattr(recheck, "run_clean", reference_loads)
    again = _settings(tmp_path)
    assert pipeline.prepare_shared_builds(again)
    reference = {LAB: pipeline.reference_run(LAB, again, None)}
    again.shared_digests, changed = shared_builds.record(again.shared_builds)
    assert not loaded and not reference[LAB].get("reused")
    assert not changed and planted.read_bytes() == b"the instructor's library"
    assert again.shared_digests == {"lab0_reference": hashlib.sha256(planted.read_bytes()).hexdigest()}
    pipeline.keep_references(reference, again)
    # believed from now on: the next sandboxed run keeps the builds and reuses the reference run
    later = _settings(tmp_path)
    assert not pipeline.prepare_shared_builds(later)
    assert _references(later)["reused"]


def test_an_untouched_folder_keeps_its_builds(tmp_path, course_copy, runs):
    """No --no-sandbox run ever graded here: nothing is removed or built again."""
    from fuselab.grading.records import unsandboxed
    settings = _settings(tmp_path)
    _references(settings)
    library = next((settings.shared_builds / "builds").glob("*/*.so"))
    inode = library.stat().st_ino
    again = _settings(tmp_path)
    assert not pipeline.prepare_shared_builds(again)
    assert _references(again)["reused"] and len(runs) == 1 and library.stat().st_ino == inode
    assert not (settings.out / unsandboxed.MARK).exists()


def test_a_link_in_place_of_the_shared_builds_is_removed_not_followed(tmp_path, course_copy, runs):
    from fuselab.grading.records import unsandboxed
    settings = _settings(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "builds").mkdir(parents=True)
    (elsewhere / "keep.txt").write_text("someone's")
    unsandboxed.mark(settings.out)
    (settings.out / "shared-builds").symlink_to(elsewhere, target_is_directory=True)
    (elsewhere / unsandboxed.STAMP).write_text("forged")
    unsandboxed.mark(settings.out)
    assert pipeline.prepare_shared_builds(settings)
    assert (elsewhere / "keep.txt").read_text() == "someone's"
    assert settings.shared_builds == settings.out / "shared-builds" and settings.shared_builds.is_dir()
    assert not settings.shared_builds.is_symlink()


def test_a_change_made_while_they_ran_is_not_taken_for_what_they_ran(tmp_path, course_copy, runs, monkeypatch):
    real = recheck.run_clean

    def edited_meanwhile(*args, **kwargs):
        (course_copy / "fuselab" / "module.py").write_text("X = 3\n")  # the course updated during the run
        return real(*args, **kwargs)

    monkeypatch.setattr(recheck, "run_clean", edited_meanwhile)
    _references(_settings(tmp_path))
    assert not _references(_settings(tmp_path)).get("reused")  # kept under what ran: the code before the edit
    assert _references(_settings(tmp_path))["reused"]
    assert len(runs) == 2


def test_the_self_check_tools_are_not_what_they_depend_on(tmp_path, course_copy, runs):
    (course_copy / "fuselab" / "tools").mkdir()
    (course_copy / "fuselab" / "tools" / "bench.py").write_text("A = 1\n")
    _references(_settings(tmp_path))
    (course_copy / "fuselab" / "tools" / "bench.py").write_text("A = 2\n")
    assert _references(_settings(tmp_path))["reused"]
    (course_copy / "fuselab" / "labs_tools.py").write_text("B = 1\n")  # anything else of the package counts
    assert not _references(_settings(tmp_path)).get("reused")


def test_slurm_shards_reuse_the_reference_runs_of_their_gpu_model(tmp_path, course_copy, runs, monkeypatch):
    """The first task on a model runs them and keeps them with their builds; the next tasks, and each shard's
    own pipeline (through its ``reference`` link), reuse them."""
    from fuselab.grading.run import slurm
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the CPU emulation, as a task without GPUs
    out = tmp_path / "out"
    references = slurm.slurm_dir(out) / "references" / "cpu"
    settings = pipeline.Settings(out=out / "shard-000", labs=[LAB], gpus="auto", progress=False,
                                 shared_builds=references / "shared-builds")
    slurm.reference_runs(out, [LAB], settings, "cpu")
    slurm.reference_runs(out, [LAB], settings, "cpu")  # a later task on the same model
    assert len(runs) == 1
    assert pipeline.reference_run(LAB, settings, None)["reused"] and len(runs) == 1  # the shard's pipeline
