"""The repository explains itself: its text points only at files it holds (CPU, under a second).

- No tracked text file names a design note that is not in the repository, or a path outside it (a checkout's
  own absolute location, a folder beside it): a reader who clones the repository must find whatever it cites.
- Every citation of a section of ``docs/design.md`` ("docs/design.md §4.1") names a section that exists there.
- Comments and docs speak of the project's own machines and commands (``bash .ci/gpu-selfcheck``, "the H200 GPU
  machine"), not of the tools someone once used to reach a machine.
"""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESIGN_DOC = ROOT / "docs" / "design.md"
TEXT_SUFFIXES = {".py", ".md", ".ipynb", ".json", ".yml", ".yaml", ".toml", ".cfg"}

# Built from pieces, so that this file does not match its own patterns.
OUTSIDE = {
    "a design note that is not in the repository": re.compile(r"\b" + "DESIGN" + r"(?:\.md\b|\s*§)"),
    "an absolute path of a checkout": re.compile(r"(?:^|(?<=[\s\"'`(=:,\[]))" + "/wo" + r"rk/"),
    "a folder beside the repository": re.compile(r"\.\./" + "sha" + r"red\b"),
}
TOOL_WORDS = re.compile("|".join(["device" + " tool", "helper" + " session", "lease" + " budget",
                                  "KIN" + r"DS\.md", r"\." + "library/"]), re.IGNORECASE)
CITATION = re.compile(r"design\.md\s*§\s*(\d+(?:\.\d+)*)")
HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s", re.MULTILINE)


def tracked_text_files() -> list:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    paths = [Path(p) for p in listed.split("\0") if p]
    chosen = [p for p in paths if p.suffix in TEXT_SUFFIXES or p.parts[0] == ".ci"]
    return [p for p in chosen if (ROOT / p).is_file()]


def text_of(path: Path) -> str:
    text = (ROOT / path).read_text(encoding="utf-8", errors="replace")
    return text.replace("\\u00a7", "§")  # JSON may escape the section sign


def hits(pattern) -> list:
    found = []
    for path in tracked_text_files():
        for number, line in enumerate(text_of(path).splitlines(), 1):
            for match in pattern.finditer(line):
                found.append(f"{path}:{number}: ...{line[max(0, match.start() - 40):match.end() + 40]}...")
    return found


def test_the_files_are_found():
    files = {str(p) for p in tracked_text_files()}
    assert {"README.md", "docs/design.md", "fuselab/speed/policy.json", ".ci/gpu-selfcheck"} <= files


@pytest.mark.parametrize("what", sorted(OUTSIDE))
def test_no_text_points_outside_the_repository(what):
    found = hits(OUTSIDE[what])
    assert not found, f"{what} is named in:\n" + "\n".join(found[:20])


def test_no_text_speaks_of_the_tools_used_to_reach_a_machine():
    found = hits(TOOL_WORDS)
    assert not found, ("say what the project's own machine or command does instead:\n" + "\n".join(found[:20]))


def design_sections() -> set:
    return set(HEADING.findall(DESIGN_DOC.read_text(encoding="utf-8")))


def test_design_sections_are_numbered():
    sections = design_sections()
    assert {"1", "2", "3", "4"} <= sections, sorted(sections)


def test_every_design_citation_names_a_section_that_exists():
    sections = design_sections()
    cited, missing = 0, []
    for path in tracked_text_files():
        for number, line in enumerate(text_of(path).splitlines(), 1):
            for match in CITATION.finditer(line):
                cited += 1
                if match.group(1) not in sections:
                    missing.append(f"{path}:{number}: §{match.group(1)}")
    assert cited, "no citation of docs/design.md found: is the pattern still right?"
    assert not missing, (f"sections cited but not in docs/design.md (it has {sorted(sections)}):\n"
                         + "\n".join(missing))


def test_the_patterns_catch_what_they_are_for():
    samples = {
        "a design note that is not in the repository": ["see " + "DESIGN" + ".md §3", "(" + "DESIGN" + " §4)"],
        "an absolute path of a checkout": ['File "' + "/wo" + 'rk/main/fuselab/x.py"', "cd " + "/wo" + "rk/wt"],
        "a folder beside the repository": ["read " + ".." + "/shared/notes"],
    }
    for what, lines in samples.items():
        assert all(OUTSIDE[what].search(line) for line in lines), what
    # paths inside a run's own folder are not outside the repository
    assert not OUTSIDE["an absolute path of a checkout"].search("<out>" + "/wo" + "rk/<student>/result.json")
    assert not OUTSIDE["an absolute path of a checkout"].search('out.glob("slurm/shard-*' + "/wo" + 'rk/*")')
    assert CITATION.search("(docs/design.md §4.1).").group(1) == "4.1"
