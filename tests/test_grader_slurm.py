"""``fuselab grade --slurm`` on a real single-node Slurm cluster (munged, slurmctld, slurmd on this machine, see
``slurm_cluster.py``), grading a small class through the CPU emulation.

One class of two students (two cheap Lab 0 samples) in two shards; the test kills shard 1's array task as soon as
it starts, lets the merge job resubmit that shard alone, and checks the merged gradebook, grades.csv, feedback and
report against a one-host run of the same class. The resubmitted task is killed too, with its merge job, and the
same command run again finishes that shard alone; once more, it has nothing to do.
"""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from fuselab.grading.records import nbgrader_run, term
from fuselab.grading.run import cli, samplecheck, slurm

from .conftest import REPO
from .slurm_cluster import LocalCluster, missing

pytestmark = [
    pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU grading path (a GPU cluster is tested by hand)"),
    pytest.mark.skipif(bool(missing()), reason=f"Slurm is not installed ({', '.join(missing())} missing; "
                                               ".ci/run installs slurm-wlm and munge)"),
]
CLASS = [("compile_error", "lab0"), ("edge_bug", "lab0")]
GRADING = ["--cell-timeout", "30", "--submission-timeout", "400"]
DUE = ["--due", "lab0=2026-09-14T23:59"]
# a Canvas roster: its one person handed nothing in, so both runs' grades.csv and LMS export name them as missing
ROSTER = ("Student,ID,SIS User ID,SIS Login ID,Section,Lab 0 (777)\n"
          "\"Absent, Ann\",4242,s42,aabsent,A,\n")
WAIT_S = 420  # the whole class, twice over on CI's two cores: a bound on a hang, not a timing


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    local = LocalCluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield local.start()
    finally:
        local.stop()


@pytest.fixture(scope="module")
def roster_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("roster") / "canvas.csv"
    path.write_text(ROSTER)
    return path


@pytest.fixture(scope="module")
def one_host(tmp_path_factory, instructor_references, roster_file):
    """The same class graded on one host (``fuselab grade``), in the background while the cluster grades it: the
    shards leave a core idle while one of them runs alone."""
    folder = tmp_path_factory.mktemp("one-host")
    examples = samplecheck.stage(folder / "class", CLASS)
    # the one-host run reuses the session's reference run; the cluster's first task makes its own, as it must
    instructor_references.into(folder / "run", ["lab0"])
    log = open(folder / "log.txt", "w")
    process = subprocess.Popen([sys.executable, "-m", "grader", str(examples), "--out", str(folder / "run"),
                                *GRADING, *DUE, "--roster", str(roster_file)], cwd=REPO, stdout=log,
                               stderr=subprocess.STDOUT)

    def finished():
        assert process.wait(timeout=WAIT_S) == 0, (folder / "log.txt").read_text()[-3000:]
        return folder / "run"
    yield {"examples": examples, "out": finished}
    if process.poll() is None:
        process.kill()
        process.wait()


def _wait(condition, what, cluster, out):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(1)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted((out / "slurm" / "logs").glob("*")))
    raise AssertionError(f"timed out waiting for {what}\n{slurm.status_text(out)}\n{logs}\n{cluster.logs()}")


def _merged_from(out):
    return (slurm.read_json(out / "slurm" / "merged.json") or {}).get("from")


def _gradebook(out):
    """Every submission's score in the run's gradebook."""
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{out / 'course' / 'gradebook.db'}") as gradebook:
        return sorted((sub.student_id, lab.name, round(sub.score, 6))
                      for lab in gradebook.assignments for sub in lab.submissions)


def _same_verdicts(merged, one_host):
    by = {(r["student"], r["lab"]): r for r in one_host}
    assert sorted(by) == sorted((r["student"], r["lab"]) for r in merged)
    for r in merged:
        want = by[(r["student"], r["lab"])]
        assert {k: (c["points"], c["status"]) for k, c in r["cells"].items()} == \
            {k: (c["points"], c["status"]) for k, c in want["cells"].items()}, (r["student"], r["lab"])
        assert r["flags"] == want["flags"]


def test_a_class_graded_on_slurm_equals_one_host_through_a_killed_task_and_reruns(cluster, one_host, tmp_path,
                                                                                   capsys, roster_file):
    """... with a due date and a roster, which only the merge uses: its outputs show them as one host's do."""
    out = tmp_path / "run"
    command = ["grade", str(one_host["examples"]), "--slurm", "--gpus-per-task", "0", "--shards", "2",
               "--out", str(out), *GRADING, *DUE, "--roster", str(roster_file)]
    assert cli.main(command) == 0
    plan = slurm.read_json(out / "slurm" / "plan.json")
    assert plan["shards"] == 2 and sorted(e["shard"] for e in plan["submissions"]) == [0, 1]
    first = slurm.jobs_of(out)[0]
    assert first["shards"] == [0, 1]

    # shard 1's task is killed as soon as it starts (a node lost, a preemption): its merge job, which waits for
    # every task to end (afterany), finds it unfinished and resubmits that shard alone, with a merge job after it
    _wait(lambda: slurm.attempts(out, 1) >= 1, "shard 1's task to start", cluster, out)
    subprocess.run(["scancel", f"{first['array']}_1"], check=True)
    assert "still queued or running" in (cli.main(command), capsys.readouterr().out)[1]  # a rerun now waits
    _wait(lambda: len(slurm.jobs_of(out)) == 2, "the merge job to resubmit shard 1", cluster, out)
    second = slurm.jobs_of(out)[1]
    assert second["shards"] == [1] and slurm.attempts(out, 0) == 1

    # that task is killed too, and its merge job cancelled (the TA's allocation ran out): the same command again
    # submits shard 1 alone, and the class is merged
    _wait(lambda: slurm.attempts(out, 1) >= 2, "shard 1's second task to start", cluster, out)
    subprocess.run(["scancel", second["array"], second["merge"]], check=True)
    _wait(lambda: not any(slurm.queued(out).values()), "the cancelled jobs to leave the queue", cluster, out)
    assert cli.main(command) == 0
    assert "submitted shard(s) 1 " in capsys.readouterr().out
    _wait(lambda: _merged_from(out), "the merge", cluster, out)
    assert [j["shards"] for j in slurm.jobs_of(out)] == [[0, 1], [1], [1]]
    assert (slurm.attempts(out, 0), slurm.attempts(out, 1)) == (1, 3)
    assert slurm.read_json(out / "slurm" / "references" / "cpu" / "reference" / "lab0" / "reference.json")["broken"] == []

    # the merged class is the one-host run's: verdicts, grades.csv, gradebook, feedback pages
    reference = one_host["out"]()
    merged = [json.loads(p.read_text()) for p in sorted(out.glob("slurm/shard-*/work/*/*/result.json"))]
    _same_verdicts(merged, [json.loads(p.read_text()) for p in sorted(reference.glob("work/*/*/result.json"))])
    assert (out / "grades.csv").read_text() == (reference / "grades.csv").read_text()
    assert _gradebook(out) == _gradebook(reference)
    assert len(_gradebook(out)) == len(CLASS)  # each submission merged once
    # the due date and the roster reached the merge: the gradebook's due date, the roster's absent student
    assert nbgrader_run.due_dates(out / "course" / "gradebook.db") == \
        nbgrader_run.due_dates(reference / "course" / "gradebook.db") != {}
    assert "absentann_4242" in (out / "grades.csv").read_text()
    # the results lie where one host keeps them, for later runs into this folder and the export
    assert {k: r.total for k, r in term.saved_results(out).items()} == \
        {k: r.total for k, r in term.saved_results(reference).items()} != {}
    exports = {}
    for name, folder in (("cluster", out), ("one host", reference)):
        assert cli.main(["export", str(folder), "--to", str(tmp_path / f"export-{name}")]) == 0
        exports[name] = {p.name: p.read_bytes() for p in (tmp_path / f"export-{name}").iterdir()}
    assert exports["cluster"] == exports["one host"] and "canvas-grades.csv" in exports["cluster"]
    assert b"4242" in exports["cluster"]["canvas-grades.csv"]  # the roster's person, in the LMS's file
    assert sorted(p.relative_to(out / "feedback") for p in (out / "feedback").rglob("*.html")) == \
        sorted(p.relative_to(reference / "feedback") for p in (reference / "feedback").rglob("*.html"))
    report = (out / "report.md").read_text()
    assert "- lab0: " in report and "all correctness tests pass" in report
    for name, lab in CLASS:
        assert f"| {name} |" in report

    # the same command once more: everything is graded and merged, nothing is submitted
    assert cli.main(command) == 0
    assert "graded and merged" in capsys.readouterr().out
    assert len(slurm.jobs_of(out)) == 3
    assert cli.main(["grade", "--status", str(out)]) == 0
    said = capsys.readouterr().out
    assert "done        shard(s) 0-1" in said and "merged:" in said, said
    # a merge job started again (by hand, or a duplicate) merges nothing twice
    stamp = (out / "grades.csv").stat().st_mtime_ns
    assert slurm.merge(out) == 0 and "already merged" in capsys.readouterr().out
    assert (out / "grades.csv").stat().st_mtime_ns == stamp

    # a rerun with a notebook changed since the first run is refused, and says which
    changed = samplecheck.stage(tmp_path / "changed", CLASS, examples=one_host["examples"])
    notebook = next((changed / "edge_bug" / "lab0").glob("*.ipynb"))
    nb = json.loads(notebook.read_text())
    nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": "one more line"})
    notebook.write_text(json.dumps(nb))
    with pytest.raises(SystemExit, match=r"1 changed \(edge_bug/lab0\).*--force"):
        cli.main([*command[:1], str(changed), *command[2:]])
    assert len(slurm.jobs_of(out)) == 3


def test_squeue_array_task_ids_are_read_in_every_form_it_prints():
    assert slurm._indices("7") == {7}
    assert slurm._indices("[0-3]") == {0, 1, 2, 3}
    assert slurm._indices("1,4-5,9") == {1, 4, 5, 9}
    assert slurm._indices("0-9%2") == set(range(10))  # a throttled pending array
    assert slurm._indices("N/A") == set()
    assert slurm._ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"


def test_shards_are_equal_runs_of_one_lab_where_the_sizes_allow():
    entries = [{"student": f"s{i // 4}", "lab": f"lab{i % 4}"} for i in range(40)]  # 10 students x 4 labs
    shards = slurm.split(entries, 4)
    for index in range(4):
        mine = [e for e, s in zip(entries, shards) if s == index]
        assert len(mine) == 10 and {e["lab"] for e in mine} == {f"lab{index}"}
    uneven = slurm.split(entries[:10], 3)
    assert sorted(uneven.count(i) for i in range(3)) == [3, 3, 4]
    assert set(slurm.split(entries[:2], 5)) == {0, 1}
    assert set(slurm.split(entries, None)) == {0}  # default: 40 per shard


def test_status_of_a_folder_without_a_plan_says_so(tmp_path, capsys):
    with pytest.raises(SystemExit, match="holds no Slurm grading run"):
        cli.main(["grade", "--status", str(tmp_path)])


@pytest.mark.parametrize("given, said", [
    (["--roster", "missing.csv"], "--roster"),
    (["--due", "lab9=2026-09-14T23:59"], "no such lab"),
    (["--due", "lab0=next friday"], "--due lab0=next friday"),
])
def test_a_roster_or_due_date_that_cannot_be_read_is_refused_before_anything_is_submitted(tmp_path, given, said):
    """The merge job would meet them on another node, long after: read here, as one host reads them."""
    (tmp_path / "class").mkdir()
    with pytest.raises(SystemExit, match=said):
        cli.main(["grade", str(tmp_path / "class"), "--slurm", "--out", str(tmp_path / "run"), *given])
    assert not (tmp_path / "run" / "slurm").exists()


def test_a_merge_keeps_a_later_one_host_regrade_of_a_student(tmp_path):
    """The merge keeps each shard's result where one host keeps it; a result written there after the shard's (a
    one-host regrade of that student since) stays, and the outputs show it; a shard graded again (--force)
    after that regrade wins once more."""
    from fuselab.grading.records.results import SubmissionResult
    out, saved = tmp_path / "run", tmp_path / "run" / "slurm" / "shard-000" / "work" / "ann" / "lab0" / "result.json"
    saved.parent.mkdir(parents=True)
    saved.write_text(json.dumps(SubmissionResult("ann", "lab0", total=3.0, max_total=10.0).to_json()))
    target = out / "work" / "ann" / "lab0" / "result.json"

    def merged():
        shard = SubmissionResult.from_json(json.loads(saved.read_text()))
        return slurm._kept_in_course(out, "ann", "lab0", saved, shard).total
    assert merged() == 3.0 and json.loads(target.read_text())["total"] == 3.0
    assert merged() == 3.0  # merged again (a new roster): the same
    target.write_text(json.dumps(SubmissionResult("ann", "lab0", total=9.0, max_total=10.0).to_json()))
    later = saved.stat().st_mtime + 60
    os.utime(target, (later, later))  # the one-host regrade, a minute after the shard
    assert merged() == 9.0 and json.loads(target.read_text())["total"] == 9.0
    saved.write_text(json.dumps(SubmissionResult("ann", "lab0", total=5.0, max_total=10.0).to_json()))
    os.utime(saved, (later + 60, later + 60))  # the class regraded on the cluster after that
    assert merged() == 5.0 and json.loads(target.read_text())["total"] == 5.0
