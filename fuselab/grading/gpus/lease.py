"""The GPU to itself for each graded timing, while several submissions share that GPU for everything else.

Building, nbgrader's run and the correctness checks of a few submissions can share one GPU; a speedup
measurement cannot. So a graded timing asks for a *lease* on its GPU: the grader stops (``SIGSTOP``) every other
process tree it runs on that GPU, waits until the GPU has no kernel running (NVML's utilisation reads 0), lets
the timing run, and resumes the others (``SIGCONT``). One timing per GPU at a time; the stopped ones lose a few
seconds of wall time and nothing else. Where another timing is already waiting, the GPU passes straight to it and
the others stay stopped: their queued work drained before the first timing began, so the next idle wait is only
for the GPU's own clock to see the last timing end (resumed and stopped again, each would queue more work first).

The timing runs in the clean recheck's child (its checker), which asks on its channel to the grader and reads the
grant from a pipe the grader opened for it before it started (``recheck.channel``: ``Ask``, ``GiveBack``,
``Asker``): no file, so nothing a sandboxed child could plant in the grader's way, and a child's asks end
with its channel. ``fuselab.speed.lease`` is the child's side (``exclusive_gpu``, ``speed_test_slot``);
``recheck.run_clean`` hands each ask to the parent's side (``LeaseServer``) and polls it. The child is untrusted:
the grader holds a lease for it at most ``max_hold_s`` (then the child is killed and its test fails), and gives
the GPU back whatever happens in between.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

from ...speed.lease import GPU, SLOT
from ... import gpu_facts
from ...proctree import parents
from ..sandbox.isolate import children_of, gpu_processes, process_trees

# GPU memory one speed test may take at its peak, its checker and kernel worker together (input sets, outputs and
# float64 references at the timed shape, as PyTorch's caching allocator keeps them: about 15-18 GiB at Labs 0-2's
# shapes by their sizes), with room left for the other submissions' contexts and tests: a DeviceLease runs at
# most memory / SPEED_TEST_GIB speed tests at once (4 on an H200), at least one
SPEED_TEST_GIB = 32.0


def speed_test_slots(memory_gib) -> int:
    """How many speed tests may run at once on a GPU of ``memory_gib`` (None: unknown, one at a time)."""
    return max(1, int(memory_gib // SPEED_TEST_GIB)) if memory_gib else 1


def gpu_busy_percent(device) -> int | None:
    """NVML's utilisation of ``device`` (an index or a UUID): the share of its last sample period in which a kernel
    ran. None where NVML is missing."""
    return gpu_facts.busy_percent(device)


def wait_until_idle(device, timeout_s: float = 60.0, poll_s: float = 0.02) -> str:
    """Wait until no kernel runs on ``device``; returns "" or a note saying the GPU stayed busy."""
    deadline = time.monotonic() + timeout_s
    busy = gpu_busy_percent(device)
    if busy is None:
        time.sleep(0.2)  # no NVML: let kernels already queued by the stopped processes drain
        return ""
    while busy:
        if time.monotonic() > deadline:
            return (f"GPU {device} stayed busy ({busy}% utilisation) for {timeout_s:.0f} s with every other "
                    "submission stopped (another program's kernels?): this timing may be disturbed")
        time.sleep(poll_s)
        busy = gpu_busy_percent(device)
    return ""


def _signal_trees(roots, sig) -> dict:
    """Signal each of ``roots`` and its descendants: root → the pids signalled. One scan of /proc serves every
    tree (a hold stops every other submission at once: a scan per tree took most of a second with ten sharing).
    Stopping repeats until no new process appears (one may have been forked before its parent stopped);
    continuing goes from the leaves up."""
    roots = list(dict.fromkeys(roots))
    if not roots:
        return {}  # a hold with nobody else on the GPU: no scan of /proc
    if sig != signal.SIGSTOP:
        parent_of = parents()
        done = {}
        for root in roots:
            tree = [root] + children_of(root, parent_of)
            for target in reversed(tree):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(target, sig)
            done[root] = tree
        return done
    stopped: dict = {root: [] for root in roots}
    for _ in range(20):
        parent_of = parents()
        fresh_any = False
        for root in roots:
            fresh = [p for p in [root] + children_of(root, parent_of) if p not in stopped[root]]
            for target in fresh:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(target, sig)
            stopped[root] += fresh
            fresh_any = fresh_any or bool(fresh)
        if not fresh_any:
            break
    return stopped


class DeviceLease:
    """The processes the grader runs on one GPU, and one exclusive timing at a time among them."""

    def __init__(self, device, idle_timeout_s: float = 60.0, max_hold_s: float = 120.0,
                 own_busy_timeout_s: float | None = None, settle_s: float = 3.0, speed_slots: int = 1):
        self.device = device
        # speed tests at GPU size at once (``fuselab.speed.lease.speed_test_slot``): the GPU's memory, rationed
        self.speed_slots = threading.BoundedSemaphore(max(1, int(speed_slots)))
        # How long a timing waits for the GPU to go idle before it runs anyway (flagged): ``idle_timeout_s`` when
        # another program has a context on the GPU, ``own_busy_timeout_s`` (default the same) when only the
        # grader's own processes do, so a kernel that never ends is still running: it ends at its own test's
        # time limit, so the grader sets this past that limit.
        self.idle_timeout_s = idle_timeout_s
        self.own_busy_timeout_s = own_busy_timeout_s if own_busy_timeout_s is not None else idle_timeout_s
        self.settle_s = settle_s      # queued work of the stopped processes drains in well under this
        self._cooldown_until = 0.0    # after a try the GPU did not settle: nobody is stopped before this
        self.max_hold_s = max_hold_s  # a graded timing takes seconds; far longer is a hang or an abuse
        self._timing = threading.Lock()
        self._lock = threading.Lock()
        self._children: set = set()
        self._holder = None
        self._stopped: dict = {}      # child → (root pid, since) for the current timing
        self._stopped_s: dict = {}    # child → seconds it spent stopped, finished pauses
        self._waiting = 0             # timings waiting for ``_timing``: a release hands the GPU on to one of them

    def register(self, child) -> None:
        """A child process (``isolate.Child``) started on this GPU; stopped at once if a timing is running."""
        with self._lock:
            self._children.add(child)
            if self._holder is not None and child is not self._holder and child not in getattr(self._holder, "companions", ()):
                self._stop(child)

    def _stop(self, child) -> None:
        self._stop_all([child])

    def _stop_all(self, children) -> None:
        now = time.monotonic()
        # a child whose process ended and was reaped (``poll``) but is not yet unregistered (``wait``): its pid is
        # free for any process, a thread of the grader's own among them (stopping that would stop the grader);
        # one stopped already (for the timing before, handed on) keeps its pause as it is
        children = [child for child in children if child.process.returncode is None and child not in self._stopped]
        for child in children:
            self._stopped[child] = (child.process.pid, now)  # first: whatever happens, it is resumed
        _signal_trees([child.process.pid for child in children], signal.SIGSTOP)

    def _resume(self, children) -> None:
        """Resume those of ``children`` that are stopped, their pauses counted (from the leaves up)."""
        now = time.monotonic()
        stopped = [(child, self._stopped.pop(child)) for child in children if child in self._stopped]
        if not stopped:
            return
        for child, (pid, since) in stopped:
            self._stopped_s[child] = self._stopped_s.get(child, 0.0) + now - since
        with contextlib.suppress(OSError):
            _signal_trees([pid for child, (pid, _) in stopped if child.process.returncode is None], signal.SIGCONT)

    def unregister(self, child) -> None:
        with self._lock:
            self._children.discard(child)
            self._stopped_s.pop(child, None)
            self._stopped.pop(child, None)  # its pid may be reused: never signalled again

    def stopped_seconds(self, child) -> float:
        """Seconds ``child`` has spent stopped for others' timings, the current pause included."""
        with self._lock:
            current = self._stopped.get(child)
            return self._stopped_s.get(child, 0.0) + (time.monotonic() - current[1] if current else 0.0)

    def pids(self) -> set:
        """Every process of every registered child's tree."""
        with self._lock:
            roots = [c.process.pid for c in self._children]
        return set().union(*process_trees(roots).values())

    def acquire(self, holder) -> tuple | None:
        """Stop everyone else and wait for an idle GPU: ``(seconds waited, note)``, or None (and the lease not
        held) if ``holder`` died while waiting.

        SIGSTOP stops a process, not the kernel it launched: a kernel that never ends keeps running while its
        process is stopped, and the stopped process's own time limit (which leaves out pauses) would never
        come. So when the GPU does not settle within ``settle_s``, everyone is resumed for twice that long (a
        cool-down every timing on this GPU respects: the culprit runs on towards its limit and is killed) and
        the lease is tried again. It waits up to ``own_busy_timeout_s`` while another submission sharing this
        GPU has a context on it (the likely culprit), ``idle_timeout_s`` otherwise; then the timing runs
        anyway and the note flags it.

        The seconds waited leave out the time ``holder`` itself was stopped for others' timings
        (``stopped_seconds`` counts that): together they are not held against its test's time limit.
        """
        entered, stopped_before = time.monotonic(), self.stopped_seconds(holder)
        give_up_why = None

        def waited():
            return time.monotonic() - entered - (self.stopped_seconds(holder) - stopped_before)
        own = {holder, *getattr(holder, "companions", ())}
        while True:
            with self._lock:
                self._waiting += 1
            try:
                self._timing.acquire()
            finally:
                with self._lock:
                    self._waiting -= 1
            try:
                time.sleep(max(0.0, self._cooldown_until - time.monotonic()))  # nobody is stopped meanwhile
                with self._lock:
                    self._holder = holder
                    # handed on from the timing before: its holder was stopped for it, everyone else still is
                    self._resume([child for child in self._stopped if child in own])
                    self._stop_all([child for child in self._children if child not in own])
                busy = wait_until_idle(self.device, self.settle_s)
                if not busy:
                    return waited(), ""
                if give_up_why:
                    return waited(), (f"GPU {self.device} stayed busy for {waited():.0f} s before this timing, "
                                      f"every other submission stopped at each try ({give_up_why}): this timing "
                                      "may be disturbed")
            except BaseException:
                self.release(hand_on=False)
                raise
            self.release(hand_on=False)  # everyone runs during the cool-down, the culprit towards its time limit
            self._cooldown_until = time.monotonic() + 2 * self.settle_s
            if not holder.alive():
                return None
            sharing, foreign = self._on_the_gpu(holder)
            limit = self.own_busy_timeout_s if sharing and not foreign else self.idle_timeout_s
            if waited() + 2 * self.settle_s > limit:
                give_up_why = (f"process(es) {foreign} of another program use it" if foreign else
                               "a kernel of another submission that does not end?" if sharing else
                               "no process of another submission is on it")

    def _on_the_gpu(self, holder) -> tuple:
        """``(pids of other submissions sharing this GPU, pids of other programs)`` with a context on it
        (NVML; both empty where it cannot tell, e.g. PIDs of another PID namespace)."""
        with self._lock:
            roots = {child: child.process.pid for child in self._children}
        trees = process_trees(roots.values())  # one scan of /proc for every tree
        own = {holder, *getattr(holder, "companions", ())}
        sharing_pids = set().union(*(trees[pid] for child, pid in roots.items() if child not in own))
        ours = set().union(*trees.values()) | {os.getpid()}
        on_gpu = gpu_processes(self.device)
        sharing = [p for p in on_gpu if p in sharing_pids]
        foreign = [p for p in on_gpu if p not in ours and os.path.exists(f"/proc/{p}")]
        return sharing, foreign

    def release(self, hand_on: bool = True) -> None:
        """End the timing: everyone resumes, unless (``hand_on``) another timing waits to take the GPU next, which
        then resumes its own and stops the one just ended."""
        try:
            with self._lock:
                self._holder = None
                if not (hand_on and self._waiting):
                    self._resume(list(self._stopped))
        finally:
            self._timing.release()


def grading_lease(device, cell_timeout: float) -> DeviceLease:
    """The lease of a GPU the grader shares among submissions. A timing waits out another submission's endless
    kernel: it ends at that test's time limit, which runs at two thirds of wall-clock speed while timings keep
    trying (see ``DeviceLease.acquire``). Speed tests run as many at once as the GPU's memory holds."""
    from .schedule import smallest_gpu_memory_gib
    return DeviceLease(device, own_busy_timeout_s=2 * cell_timeout + 60,
                       speed_slots=speed_test_slots(smallest_gpu_memory_gib([device])))


class LeaseServer:
    """The parent's side of one child's lease (polled by ``recheck.run_clean``): ``ask`` and ``given_back`` as the
    child's records arrive, ``answer(what, number)`` writes a grant to it (False where it could not)."""

    def __init__(self, lease: DeviceLease | None, child, answer):
        self.lease, self.child, self._answer_with = lease, child, answer
        self._asked = {GPU: None, SLOT: None}  # the number of the ask of each kind not served yet
        self._given_back: set = set()          # (what, number) the child said it is done with
        self.slot = None             # the speed test slot held (its ask's number)
        self._slot_asked = None      # (when, the child's paused seconds then) while it waits for a slot
        self.holding = None          # the ask being served
        self.waited_s = 0.0          # time spent waiting for the GPU to go idle before its timings, or for a slot
        self.slot_waited_s = 0.0     # the part of it spent waiting for a speed test slot
        self.holds: list = []        # [granted, given back] in epoch seconds, each time it had the GPU
        self.notes: list = []
        self.stop_reason = None      # set when the child must be stopped (held too long, broke the protocol)
        self._granted_at = self._granted_epoch = 0.0

    def ask(self, what: str, number: int) -> None:
        if what in self._asked:
            self._asked[what] = number

    def given_back(self, what: str, number: int) -> None:
        self._given_back.add((what, number))

    @property
    def held_s(self) -> float:
        """Seconds it had the GPU to itself (everyone else on it stopped)."""
        return sum(end - start for start, end in self.holds)

    def paused_s(self) -> float:
        """Seconds the child spent waiting for the GPU or a speed test slot, or stopped for others' timings: not
        its own time."""
        return self.waited_s + self._slot_wait() + self.child.paused()

    def poll(self) -> None:
        if self.lease is None:
            return
        self._poll_slot()
        if self.holding is None:
            number = self._asked[GPU]
            if number is not None and self.child.alive():
                self._asked[GPU] = None
                self._grant(number)
        elif (GPU, self.holding) in self._given_back or not self.child.alive():
            self.finish()
        elif time.monotonic() - self._granted_at > self.lease.max_hold_s:
            self.stop_reason = "held the GPU to itself far longer than a timing takes"
            self.notes.append(f"held the GPU to itself for more than {self.lease.max_hold_s:.0f} s in one timing: "
                              "stopped")
            self.finish()

    def _poll_slot(self) -> None:
        """A speed test's slot: taken when one is free (asked again at every poll, so the loop that polls goes on
        watching the child's time limits meanwhile), given back when the child is done with it or dies. Not served
        while the child holds the GPU to itself: its checker never asks then, and with everyone else stopped no
        slot could come back."""
        if self.slot is None:
            number = self._asked[SLOT]
            if number is None or not self.child.alive() or self.holding is not None:
                return
            if self._slot_asked is None:
                self._slot_asked = (time.monotonic(), self.child.paused())
            if not self.lease.speed_slots.acquire(blocking=False):
                return
            waited = self._slot_wait()
            self.waited_s += waited
            self.slot_waited_s += waited
            self._slot_asked, self._asked[SLOT] = None, None
            self.slot = number
            if not self._answer(SLOT, number, "a speed test slot"):
                self._give_back_slot()
        elif (SLOT, self.slot) in self._given_back or not self.child.alive():
            self._give_back_slot()

    def _slot_wait(self) -> float:
        """Seconds of the current wait for a slot, less the time the child was stopped meanwhile (counted as a
        pause already)."""
        if self._slot_asked is None:
            return 0.0
        asked, paused = self._slot_asked
        return max(0.0, time.monotonic() - asked - (self.child.paused() - paused))

    def _give_back_slot(self) -> None:
        if self.slot is not None:
            self._given_back.discard((SLOT, self.slot))
            self.slot = None
            self.lease.speed_slots.release()

    def _answer(self, what: str, number: int, said: str) -> bool:
        if self._answer_with(what, number):
            return True
        self.stop_reason = f"its request for {said} could not be answered (it reads no grants)"
        self.notes.append(f"a grant of {said} could not be given (the child reads none): given back")
        return False

    def _grant(self, number: int) -> None:
        acquired = self.lease.acquire(self.child)
        if acquired is None:
            return  # the child died waiting: nothing to grant, and the GPU was not taken
        waited, note = acquired
        self.waited_s += waited
        if note:
            self.notes.append(note)
        self.holding, self._granted_at, self._granted_epoch = number, time.monotonic(), time.time()
        if not self._answer(GPU, number, "the GPU"):
            self.finish()

    def close(self) -> None:
        """Give back everything the child held: the GPU and its speed test slot (idempotent)."""
        self.finish()
        self._give_back_slot()

    def finish(self) -> None:
        """Give the GPU back (idempotent)."""
        if self.holding is not None:
            self._given_back.discard((GPU, self.holding))
            self.holding = None
            self.holds.append([self._granted_epoch, time.time()])
            self.lease.release()
