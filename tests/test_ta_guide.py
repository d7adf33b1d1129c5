"""docs/ta-guide.md tells the truth: every number in "How long a class takes" is one docs/RESULTS.md states and
the saved raw data of that run gives, each command it shows exists with the options it uses, and README's
grading section points to it (CPU, about a second).
"""

import json
import re
import shlex

import pytest

from .conftest import REPO

GUIDE = REPO / "docs" / "ta-guide.md"
RESULTS = REPO / "docs" / "RESULTS.md"
RUN = REPO / "docs" / "results" / "throughput-h200-148b874.json"


def _throughput() -> dict:
    return json.loads(RUN.read_text())["throughput"]


def _cpu_target(t):
    return next(x["measured"] for x in t["targets"] if x["target"].startswith("CPU per submission-lab"))


# each number the section may state → how to read it from the saved run (rounded as written)
FROM_THE_RUN = {
    "10 submissions sharing": lambda t: t["jobs"],
    "a class of 120": lambda t: t["phases"]["submissions"]["count"],
    "332.5 s all-in": lambda t: t["phases"]["wall_seconds"],
    "2.48 s per submission-lab": lambda t: t["phases"]["submissions"]["seconds_each"],
    "20.9 core-s": _cpu_target,
    "17.8 s of that went before the first": lambda t: t["phases"]["fixed"]["seconds"],
    "23.1 s all-in": lambda t: t["one_student_regrade"]["phases"]["wall_seconds"],
    "one student's four labs": lambda t: t["one_student_regrade"]["phases"]["submissions"]["count"],
}
CPU_RUN = REPO / "docs" / "results" / "throughput-cpu2-2f55c78.json"
# the same for the run without a GPU (the throughput stage on the idle 2-core machine)
FROM_THE_CPU_RUN = {
    "4.94 s per submission-lab": lambda t: t["phases"]["submissions"]["seconds_each"],
    "23.4 s before the first": lambda t: t["phases"]["fixed"]["seconds"],
    "24.1 s all-in": lambda t: t["one_student_regrade"]["phases"]["wall_seconds"],
    "regrade of four labs": lambda t: t["one_student_regrade"]["phases"]["submissions"]["count"],
}
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.]*\d)")


def _section(title: str) -> str:
    text = GUIDE.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_every_number_of_the_timing_section_is_the_saved_runs():
    section = _section("How long a class takes")
    for commit in ("148b874", "2f55c78"):  # the commits are names, not numbers
        section = section.replace(commit, "")
    section = re.sub(r"docs/RESULTS\.md|H200|--\w[\w-]*|2-core", "", section)
    section = section.replace("speed tests score 0", "")  # the rule without a GPU, not a measurement
    stated = NUMBER.findall(section)
    readers = {**{p: (FROM_THE_RUN[p], _throughput()) for p in FROM_THE_RUN},
               **{p: (FROM_THE_CPU_RUN[p], json.loads(CPU_RUN.read_text())) for p in FROM_THE_CPU_RUN}}
    claimed = {phrase: re.search(r"\d+(?:\.\d+)?", phrase.replace("four", "4")).group() for phrase in readers}
    unexplained = [n for n in stated if n not in claimed.values()]
    assert unexplained == [], f"numbers in the guide's timing section with no saved source: {unexplained}"
    results = RESULTS.read_text()
    for phrase, number in claimed.items():
        assert phrase in " ".join(section.replace("**", "").split()), \
            f"the guide no longer says {phrase!r}: update the readers"
        read, run = readers[phrase]
        value = read(run)
        decimals = len(number.split(".")[1]) if "." in number else 0
        assert f"{value:.{decimals}f}" == number, (phrase, value)
        if "four" not in phrase:
            assert number in results, f"{phrase}: docs/RESULTS.md does not state {number}"
    for commit in ("148b874", "2f55c78"):
        assert commit in results and commit in _section("How long a class takes")


def _commands():
    for line in GUIDE.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith(".venv/bin/fuselab "):
            yield shlex.split(line)[1:]


@pytest.mark.parametrize("argv", list(_commands()), ids=lambda argv: " ".join(argv[:2]))
def test_each_command_shown_parses(argv):
    import argparse

    from fuselab import cli
    parsed = {}

    def keep(self, args=None, namespace=None):
        parsed["args"] = original(self, args, namespace)
        raise SystemExit(0)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = keep
    try:
        with pytest.raises(SystemExit) as ended:
            cli.main(argv)
    finally:
        argparse.ArgumentParser.parse_args = original
    assert ended.value.code == 0 and parsed["args"].command == argv[0]


def test_readme_points_to_the_guide_and_its_synopsis_lists_every_option():
    import argparse

    from fuselab.grading.run.cli import add_parsers
    readme = REPO / "README.md"
    text = readme.read_text()
    section = text[text.index("## Grading a class"):text.index("\n## ", text.index("## Grading a class") + 1)]
    assert "docs/ta-guide.md" in section
    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    grade = parser._subparsers._group_actions[0].choices["grade"]
    options = {o for action in grade._actions for o in action.option_strings if o.startswith("--")} - {"--help"}
    synopsis = section[section.index("```"):section.index("```", section.index("```") + 3)]
    missing = sorted(o for o in options if o not in synopsis)
    assert missing == [], f"README's grading synopsis leaves out {missing}"


def test_the_late_penalty_line_is_nbgraders_own_setting(tmp_path):
    """The guide's line that turns a late penalty on, put in a course config as a TA would, is read by nbgrader's
    own late-penalty plugin (``nbgrader_run.late_penalty_plugin``, which the grading run uses)."""
    section = _section("Late work")
    block = section[section.index("```python") + len("```python"):section.index("```", section.index("```python") + 3)]
    line = next(text for text in block.splitlines() if text.strip().startswith("c."))
    assert line.split("#")[0].strip() == 'c.LateSubmissionPlugin.penalty_method = "zero"'
    from fuselab.grading.records import nbgrader_run
    config = tmp_path / "nbgrader_config.py"
    config.write_text(nbgrader_run.NBGRADER_CONFIG.read_text() + "\n" + line + "\n")
    original = nbgrader_run.NBGRADER_CONFIG
    nbgrader_run.NBGRADER_CONFIG = config
    try:
        plugin = nbgrader_run.late_penalty_plugin().plugin_inst
    finally:
        nbgrader_run.NBGRADER_CONFIG = original
    assert plugin.penalty_method == "zero" and plugin.late_submission_penalty("ann", 7.0, 3600) == 7.0
    assert nbgrader_run.late_penalty_plugin().plugin_inst.penalty_method == "none"  # the course's default: none
