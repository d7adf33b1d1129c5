"""A single-node Slurm cluster on this machine, for the tests: munged, slurmctld and slurmd in the foreground.

Everything (the munge key and socket, the state, the logs, slurm.conf) lives in one temporary folder; the daemons
are this process's children, stopped by ``stop`` (the test's finalizer). No cgroups and no systemd: the node
tracks processes through /proc (``proctrack/linuxproc``) and binds no tasks (``task/none``), so it runs as root
in a container. Clients find it through ``SLURM_CONF``, which ``start`` sets in ``os.environ`` (jobs inherit it:
sbatch exports the environment).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")


def missing() -> list:
    """The Slurm and munge programs this machine lacks (``apt-get install slurm-wlm munge`` brings them)."""
    return [name for name in (*DAEMONS, "sbatch", "squeue", "scancel", "sinfo") if shutil.which(name) is None]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LocalCluster:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.folder / "slurm.conf"
        self.processes: dict = {}
        self._saved_env = os.environ.get("SLURM_CONF")

    def _write_config(self) -> None:
        d = self.folder
        (d / "state").mkdir()
        (d / "spool").mkdir()
        self.conf.write_text("\n".join([
            "ClusterName=fuselabtest", f"SlurmctldHost={self.node}(127.0.0.1)",
            "SlurmUser=root", "SlurmdUser=root",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={d / 'munge' / 'munge.socket'}",
            f"StateSaveLocation={d / 'state'}", f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}", f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}", f"SlurmdLogFile={d / 'slurmd.log'}",
            # no cgroups: processes tracked through /proc, tasks not bound to cores
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "SchedulerType=sched/backfill",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none", "MpiDefault=none", "ReturnToService=2", "KillWait=5",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN",
            f"PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP", ""]))

    def _start(self, name: str, command: list) -> None:
        log = open(self.folder / f"{name}.out", "wb")
        self.processes[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=dict(os.environ, SLURM_CONF=str(self.conf)))

    def start(self, timeout_s: float = 60) -> "LocalCluster":
        d = self.folder
        (d / "munge").mkdir(mode=0o700, parents=True)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._write_config()
        # --force: munged refuses a socket folder under the world-writable /tmp otherwise
        self._start("munged", ["munged", "--foreground", "--force", f"--socket={d / 'munge' / 'munge.socket'}",
                               f"--key-file={key}", f"--pid-file={d / 'munge' / 'munged.pid'}",
                               f"--seed-file={d / 'munge' / 'seed'}", f"--log-file={d / 'munged.log'}"])
        self._wait(lambda: (d / "munge" / "munge.socket").exists(), timeout_s, "munged's socket")
        os.environ["SLURM_CONF"] = str(self.conf)
        self._start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._start("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(lambda: self.sinfo() in ("idle", "mix", "alloc"), timeout_s, "the node to be idle")
        return self

    def sinfo(self) -> str:
        done = subprocess.run(["sinfo", "--noheader", "--format=%t"], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            dead = [n for n, p in self.processes.items() if p.poll() is not None]
            if dead:
                break
            time.sleep(0.5)
        raise RuntimeError(f"the test cluster did not come up (waiting for {what}):\n" + self.logs())

    def logs(self) -> str:
        parts = []
        for name in (*DAEMONS, "slurmctld.log", "slurmd.log"):
            path = self.folder / (name if name.endswith(".log") else f"{name}.out")
            if path.exists():
                parts.append(f"--- {path.name}\n" + path.read_text(errors="replace")[-3000:])
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel every job, then stop the daemons (slurmd, slurmctld, munged), each by its own process id."""
        if self.processes.get("slurmctld") and self.processes["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "--partition=test"], capture_output=True)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and subprocess.run(
                    ["squeue", "--noheader"], capture_output=True, text=True).stdout.strip():
                time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):
            process = self.processes.get(name)
            if process is None or process.poll() is not None:
                continue
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._saved_env is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = self._saved_env
