"""A term's own full-points threshold without a GPU: ``fuselab calibrate --set-threshold TEST=SPEEDUP`` writes it
into the policy file the grader reads, for the H200's entry (which GPUs without one are graded with) or a named
GPU's; a bad test name or value is refused, naming what is known."""

import json
import shutil
import subprocess
import sys

import pytest

from fuselab import speed
from fuselab.speed.policy import POLICY_PATH, load_policy


def _calibrate(*args):
    return subprocess.run([sys.executable, "-m", "fuselab.cli", "calibrate", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture
def policy(tmp_path):
    path = tmp_path / "policy.json"
    shutil.copy(POLICY_PATH, path)
    return path


def test_a_threshold_set_by_hand_is_what_grading_uses(policy):
    measured = speed.policy_entry("lab0.add_relu_mul", "NVIDIA H200", load_policy(policy))[1]
    result = _calibrate("--set-threshold", "lab0.add_relu_mul=1.6", "--policy", str(policy))
    assert result.returncode == 0, result.stderr
    assert "full points from 1.6x on NVIDIA H200" in result.stdout
    changed = load_policy(policy)
    for gpu in ("NVIDIA H200", "Some Other GPU"):  # the H200's entry is every unlisted GPU's too
        _, entry, _ = speed.policy_entry("lab0.add_relu_mul", gpu, changed)
        assert entry["threshold"] == 1.6 and "set by hand" in entry["threshold_source"]
    assert entry["plain_speedup"] == measured["plain_speedup"]  # the measurement stays beside it
    other = speed.policy_entry("lab1.depthwise_relu", "NVIDIA H200", changed)[1]
    assert other == speed.policy_entry("lab1.depthwise_relu", "NVIDIA H200", load_policy(POLICY_PATH))[1]


def test_a_named_gpu_gets_its_own_entry(policy):
    assert _calibrate("--set-threshold", "lab0.add_relu_mul=1.4", "--gpu", "NVIDIA A100", "--policy",
                      str(policy)).returncode == 0
    changed = load_policy(policy)
    assert speed.policy_entry("lab0.add_relu_mul", "NVIDIA A100", changed)[1]["threshold"] == 1.4
    assert speed.policy_entry("lab0.add_relu_mul", "NVIDIA H200", changed)[1]["threshold"] != 1.4


@pytest.mark.parametrize("bad, said", [("lab0.no_such=1.5", "lab0.add_relu_mul"),
                                       ("lab0.add_relu_mul=fast", "TEST=SPEEDUP"),
                                       ("lab0.add_relu_mul=0.9", "above 1.0")])
def test_bad_input_is_refused_and_nothing_is_written(policy, bad, said):
    before = policy.read_text()
    result = _calibrate("--set-threshold", bad, "--policy", str(policy))
    assert result.returncode == 2 and said in result.stderr
    assert policy.read_text() == before and json.loads(before)
