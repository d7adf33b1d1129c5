"""The checker's channel to the grader: one pipe the grader opens before the checker starts, typed records on it.

The checker (``cellrunner``) says what it does as records, one JSON object a line: ``CellStart`` before a cell
runs, ``CellEnd`` after, ``Poisoned`` when its processes cannot run another cell, ``Done`` at the end. The grader
(``clean``) reads them as it polls the checker's time limits, and once more after the checker ended.

The checker also asks on it (``Ask``) and waits for the grader's answer on a second pipe the grader opened for it
(``Asker``: the checker's side): at each test's end, for the submission's memory to be checked (``MEMORY``,
``fuselab.grading.sandbox.isolate.MemoryBudget.check_now``), and, where the grader shares the GPU, for the GPU to
itself or a speed test slot (``fuselab.grading.gpus.lease.LeaseServer``), saying when it is done (``GiveBack``).

The checker may have loaded what a submission built, so what arrives is data from an untrusted side: read
without blocking, at most ``LIMIT`` bytes in all and ``LINE_LIMIT`` a record; a line that does not decode into
one of the records below, field by field, is dropped. Nothing read is ever followed, loaded or executed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import time
from dataclasses import asdict, dataclass, field, fields

LIMIT = 64 * 2**20       # a checker sends a few KiB per cell
LINE_LIMIT = 2**20       # a record: a cell's output is cut to a few KiB before it is sent
ANSWERS_FD_ENV = "FUSELAB_GRADER_ANSWERS_FD"  # the checker's read end of the grader's grant pipe
SHARED_GPU_ENV = "FUSELAB_GPU_SHARED"  # set where the grader shares the GPU: timings ask it for the GPU
MEMORY = "memory check"  # what a checker asks at each test's end (``MemoryBudget.check_now``)


@dataclass
class CellStart:
    index: int
    grade_id: str | None
    time: float = 0.0    # epoch seconds, the checker's clock
    kind = "start"


@dataclass
class CellEnd:
    index: int
    grade_id: str | None
    time: float = 0.0
    error: str | None = None     # the verdict's message of a cell that failed
    value: float | None = None   # the number the cell ended in
    shown: str | None = None     # what else it ended in, as text
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    speed: list = field(default_factory=list)   # the speed tests' records (dicts), ``fuselab.speed``'s
    flag: str | None = None
    refused: str | None = None   # the checker's own: a kernel library the test used was refused (``REFUSED``)
    kind = "end"


@dataclass
class Poisoned:
    index: int
    grade_id: str | None
    why: str
    time: float = 0.0
    kind = "poisoned"


@dataclass
class Done:
    time: float = 0.0
    kind = "done"


@dataclass
class Ask:
    what: str            # ``fuselab.speed.lease``'s GPU or SLOT
    number: int          # the checker's count of its asks: the grant names it
    time: float = 0.0
    kind = "ask"


@dataclass
class GiveBack:
    what: str
    number: int
    time: float = 0.0
    kind = "give back"


REFUSED = "refused"  # ``CellEnd.refused``: set by the checker from the error's type, never from any text

RECORDS = {cls.kind: cls for cls in (CellStart, CellEnd, Poisoned, Done, Ask, GiveBack)}
_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "list": (list,),
          "str | None": (str, type(None)), "float | None": (int, float, type(None))}


def encode(record) -> bytes:
    return (json.dumps({"kind": record.kind, **asdict(record)}, default=repr) + "\n").encode()


def decode(line: bytes):
    """The record ``line`` holds, or None: every field of its kind present (or defaulted) with its type."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return None
    cls = RECORDS.get(data.get("kind")) if isinstance(data, dict) else None
    if cls is None:
        return None
    values = {}
    for spec in fields(cls):
        if spec.name not in data:
            continue  # a missing field takes its default, or the record is refused below
        value = data[spec.name]
        if isinstance(value, bool) or not isinstance(value, _TYPES[spec.type]):
            return None
        values[spec.name] = float(value) if spec.type.startswith("float") and value is not None else value
    if "speed" in values:
        values["speed"] = [r for r in values["speed"] if isinstance(r, dict)]
    try:
        return cls(**values)
    except TypeError:  # a field without a default was missing
        return None


class Sender:
    """The checker's end: a record is written whole, at once (the grader may be waiting to see a cell start)."""

    def __init__(self, fd: int):
        self.fd = fd
        os.set_inheritable(fd, False)  # the checker's own children (compilers, say) never hold the grader's pipe

    def send(self, record) -> None:
        record.time = time.time()
        view = memoryview(encode(record))
        while view:
            view = view[os.write(self.fd, view):]


def grant_line(what: str, number: int) -> bytes:
    """The grader's answer to ``Ask(what, number)`` on the grant pipe."""
    return f"{what} {number}\n".encode()


class Asker:
    """The checker's side of the grader's answers (its memory check; its lease, ``fuselab.speed.lease.
    talk_to_grader``): ``Ask`` on the channel, wait for the grant on ``grant_fd`` (the grader's pipe,
    ``ANSWERS_FD_ENV``), ``GiveBack`` at the end of the ``with`` block."""

    def __init__(self, sender: Sender, grant_fd: int):
        self.sender = sender
        os.set_inheritable(grant_fd, False)  # the checker's own children never read its grants
        self.grants = open(grant_fd, "rb", buffering=0)
        self._numbers = itertools.count(1)

    @contextlib.contextmanager
    def __call__(self, what: str):
        number = next(self._numbers)
        self.sender.send(Ask(what, number))
        line = b""
        while not line.endswith(b"\n"):  # a wait the grader counts as a pause: it ends at the grant
            byte = self.grants.read(1)
            if not byte:
                raise RuntimeError(f"the grader closed the lease pipe while this test waited for the {what}")
            line += byte
        if line != grant_line(what, number):
            raise RuntimeError(f"the grader answered {line!r} when asked for the {what} ({number})")
        try:
            yield
        finally:
            self.sender.send(GiveBack(what, number))


class Receiver:
    """The grader's end of one checker's channel; ``open`` makes the pipe."""

    def __init__(self, fd: int):
        self.file = open(fd, "rb", buffering=0)  # closed with this object, should the caller fail before ``close``
        self._partial = b""
        self._read = 0
        self._ended = False       # every writer closed its end
        self._skipping = False    # inside a line longer than LINE_LIMIT: dropped to its end

    @classmethod
    def open(cls) -> tuple:
        """``(Receiver, the write end's descriptor)``: the write end is for the checker to inherit; the grader
        closes its copy once the checker started, so a checker's end reads as the end of the channel."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        return cls(read_fd), write_fd

    def wait(self, timeout: float) -> None:
        """Until something arrives (or the checker's end), at most ``timeout`` seconds."""
        if self.file.closed or self._ended:  # a pipe at its end is always "ready": a sleep, not a spin
            time.sleep(timeout)
        else:
            select.select([self.file], [], [], timeout)

    def poll(self) -> list:
        """The records that arrived since the last call."""
        new = []
        while not self.file.closed:
            chunk = self.file.read(1 << 16)
            if not chunk:  # None: nothing more for now; b"": every writer closed its end
                self._ended = self._ended or chunk is not None
                break
            self._read += len(chunk)
            if self._read > LIMIT:  # past the limit: read and dropped, so the writer never blocks on it
                continue
            new += self._lines(chunk)
        return new

    def _lines(self, chunk: bytes) -> list:
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        found = []
        for line in lines:
            if not self._skipping and len(line) <= LINE_LIMIT:
                record = decode(line)
                if record is not None:
                    found.append(record)
            self._skipping = False
        if len(self._partial) > LINE_LIMIT:
            self._partial, self._skipping = b"", True
        return found

    def close(self) -> None:
        self.file.close()
