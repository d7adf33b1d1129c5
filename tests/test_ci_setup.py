"""``.ci/setup`` installs bubblewrap for the grader's sandbox the way ``.ci/run`` does (root and apt-get), and
elsewhere prints the one command to run; tried with stand-ins for ``id`` and ``apt-get`` on a PATH without
``bwrap``."""

import subprocess

from .conftest import REPO

SCRIPT = REPO / ".ci" / "install-bubblewrap"


def _fake_bin(tmp_path, uid: int, apt=True, bwrap=False):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    tools = {"id": f"#!/bin/bash\necho {uid}\n"}
    if apt:
        tools["apt-get"] = f"#!/bin/bash\necho \"apt-get $*\" >> {log}\n"
    if bwrap:
        tools["bwrap"] = "#!/bin/bash\nexit 0\n"
    for name, text in tools.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir, log


def _run(bin_dir, tmp_path):
    return subprocess.run(["/bin/bash", str(SCRIPT)], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(bin_dir), "TMPDIR": str(tmp_path)})


def test_root_with_apt_installs_bubblewrap(tmp_path):
    bin_dir, log = _fake_bin(tmp_path, uid=0)
    result = _run(bin_dir, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "apt-get install -y -qq bubblewrap" in log.read_text()


def test_a_plain_user_is_told_the_one_command(tmp_path):
    bin_dir, log = _fake_bin(tmp_path, uid=1000)
    result = _run(bin_dir, tmp_path)
    assert result.returncode == 0
    assert "sudo apt-get install bubblewrap" in result.stderr
    assert not log.exists()  # nothing was tried as a plain user


def test_root_without_apt_is_told_the_one_command(tmp_path):
    bin_dir, _ = _fake_bin(tmp_path, uid=0, apt=False)
    assert "apt-get install bubblewrap" in _run(bin_dir, tmp_path).stderr


def test_an_installed_bubblewrap_is_left_alone(tmp_path):
    bin_dir, log = _fake_bin(tmp_path, uid=0, bwrap=True)
    result = _run(bin_dir, tmp_path)
    assert result.returncode == 0 and result.stderr == "" and not log.exists()


def test_setup_runs_the_step_before_anything_can_end_it():
    setup = (REPO / ".ci" / "setup").read_text()
    assert setup.index("bash .ci/install-bubblewrap") < setup.index("exit 0")
