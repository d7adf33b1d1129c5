"""Graded speedup tests, as nbgrader test cells call them.

A graded speedup cell ends in a number of points (nbgrader reads a cell's last displayed number as its score;
anything else would count as full marks). The test:

1. looks the test up in the policy (``fuselab/speed/policy.json``): mode, shape, dtype and the full-points threshold
   for this GPU model, falling back to the H200's entry, and saying so;
2. without a GPU, or for an emulated module, returns 0 marked "not measured (no GPU)": never full marks. Under
   ``nbgrader validate`` (a student's own check, which scores nothing) it returns None instead and says that the
   course measures the speed when it grades: a 0 there would make Validate tell every student without a GPU
   that they "WILL NOT receive full credit";
3. checks that one call launches exactly the expected number of kernels, all of them the student's own (a library
   GEMM/conv or a PyTorch op inside the fused op is caught here): the kernels of a CUDA graph capture of the call
   (after one real call), or the profiler's list where the capture cannot vouch for them;
4. checks the result at the timed shape (poison, guard bands, unchanged inputs), and that all its work runs on
   the stream it is given (one call captured in a CUDA graph, its inputs given new contents, and replayed must
   write the output of those);
5. times the student's op against the lab's fixed unfused reference, interleaved, with rotating input sets
   (while the grader shares the GPU: with the GPU to itself for the timing alone, and steps 3-6 in one of the few
   speed test slots the GPU's memory allows at once);
6. refreshes every input set's contents in place and checks the outputs again, so a result cache keyed by
   pointer returns stale results and fails; then changes a few elements of the first input, at places drawn at
   random, and checks again, so a cache keyed by a few sampled values (the timed calls repeat unchanged inputs)
   fails too;
7. turns the speedup into points: 0 at 1.0x, linear to full points at the threshold.

The numbers also go to ``FUSELAB_GRADE_LOG`` (JSON lines) when set, for the grader's report.
"""

from __future__ import annotations

import itertools
import json
import os
import re

import torch

from .. import timing
from ..check import assert_close, check
from ..quiet import captured_output
from ..runmode import graded_by_the_course, instructors_run, validating
from ..timing.capture import capture
from .graph_kernels import captured_kernels
from .lease import asks_a_checker, exclusive_gpu, speed_test_slot
from .policy import REFERENCE_GPU, policy_entry
from .tuned import course_tuned

LAST_TIMED = None   # the last graded timing's rotating call of the student's op
LAST_RECORD = None  # the last speed test's record
# where a speed test's time goes, in the order it runs (the record's "phases": label → seconds, for the grader's
# throughput report; the kernel worker sends only these labels)
PHASES = ("input sets", "kernel list", "check at the timed shape", "stream check", "timing",
          "refreshed check")
_OWN_KERNEL = re.compile(r"__global__\s+[\w:<>,\s]*?\b(\w+)\s*\(")


def own_kernel_names(source: str) -> set:
    """The ``__global__`` function names defined in a CUDA source."""
    code = re.sub(r"//[^\n]*|/\*.*?\*/", " ", source, flags=re.S)
    code = re.sub(r"__launch_bounds__\s*\([^)]*\)", " ", code)
    return set(_OWN_KERNEL.findall(code))


def launched_kernels(fn, accept=None) -> list:
    """Names of the GPU kernels one call of ``fn`` launches: from a CUDA graph capture of the call
    (``graph_kernels``), or from the profiler (which runs it) where the call cannot be captured or the captured
    list fails ``accept`` (work on a stream of its own escapes a capture, not the profiler: the speed test's
    message then names what really ran)."""
    kernels = captured_kernels(fn)
    if kernels is None or (accept is not None and not accept(kernels)):
        kernels = profiled_kernels(fn)
    return kernels


def profiled_kernels(fn) -> list:
    """Names of the GPU kernels one call of ``fn`` launches (torch.profiler: its first use in a process starts
    CUPTI, seconds on a shared GPU)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    # torch 2.11's profiler warns on stderr ("Profiler clears events..."), and stderr costs a test cell its points.
    with captured_output(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
            and not e.name.startswith(("Memcpy", "Memset"))]


def warm_kernel_list() -> None:
    """Ready what lists a speed test's kernels in this process (the driver's graph calls; the profiler, whose
    first use starts CUPTI, only where a capture cannot list them): the grader's kernel worker does it before a
    speed test takes its slot."""
    launched_kernels(lambda: torch.ones(1, device="cuda").add_(1))


def speedup_test(test_id, *, candidate, reference_op, make_inputs, reference, module, max_points,
                 expected_kernels=1, input_sets=3, policy=None, budget_s=3.0, verbose=True) -> float | None:
    """Run a graded speedup test and return the points earned (a float between 0 and ``max_points``).

    None, only under ``nbgrader validate`` without a GPU: nbgrader reads a cell that displays no value as passed,
    and the speed is the course's to measure when it grades the notebook.

    candidate, reference_op: ``op(*inputs, out)`` callables, the student's fused op and the lab's fixed unfused
    reference. make_inputs(shape, seed) → inputs on the GPU; reference(*inputs) → the expected output (float64).
    module: the student's built module (its source names the kernels allowed to run).
    """
    say = print if verbose else (lambda *a, **k: None)
    host = getattr(module, "kernel_host", None)
    if host is not None and torch.cuda.is_available() and not module.emulated:
        # the grader's checker: the student's kernel lives in the kernel worker, which times it; the checker
        # bounds that by its own clock and computes the points (``grading.recheck.kernels.SpeedCheck``)
        gpu_name = torch.cuda.get_device_name()
        test, entry, note = policy_entry(test_id, gpu_name, policy)
        warm = host.warm_speed_test()  # outside the slot: what does not take GPU memory waits for none
        with speed_test_slot():
            record = host.measure_speedup(
                test_id, max_points, dict(reference_op=reference_op, make_inputs=make_inputs, reference=reference,
                                          shape=test["shape"], mode=test["mode"], threshold=entry["threshold"],
                                          gpu=gpu_name, policy_note=note), input_sets=input_sets)
        record.setdefault("phases", {})["kernel list start"] = warm
        say(_said(record))
        return _finish(record)
    gpu_name = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    record = {"test": test_id, "max_points": max_points, "points": 0.0, "speedup": None}
    if gpu_name is None or getattr(module, "emulated", False):
        if validating() and not graded_by_the_course():
            say(f"{test_id}: the speed is not measured on this machine (no GPU). It is measured when the course "
                f"grades your notebook on its GPU, for up to {max_points} points; Validate checks everything else.")
            say(would_grade(test_id, max_points, policy))
            return None  # nothing to log: no grader is listening, and nothing was measured
        record["status"] = "not measured (no GPU)"
        if graded_by_the_course():
            say(f"{test_id}: speedup not measured (no GPU): 0 of {max_points} points. "
                "Speed points are only given on a GPU.")
        else:  # a student's own run: the 0 here is not their grade
            say(f"{test_id}: speedup not measured (no GPU): 0 points on this machine. The course measures it "
                f"when it grades your notebook on its GPU, for up to {max_points} points.")
            say(would_grade(test_id, max_points, policy))
        return _finish(record)
    # which physical GPU measured it (CUDA_VISIBLE_DEVICES renumbers them): the multi-GPU self-check reads it
    record["gpu_uuid"] = str(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", ""))
    test, entry, note = policy_entry(test_id, gpu_name, policy)
    if note:
        say(note)
        record["policy_note"] = note  # the grader's report says which GPU's thresholds were used
    shape, threshold, mode = tuple(test["shape"]), float(entry["threshold"]), test["mode"]

    phases = record["phases"] = {}
    phase = _phase_clock(phases)

    def measure() -> dict:
        """Steps 3-6 on this process's GPU: ``record``, filled in."""
        phase("input sets")
        sets = [make_inputs(shape, seed=1000 + k) for k in range(input_sets)]
        expected_shape = reference(*[x.double() if torch.is_tensor(x) else x for x in sets[0]]).shape
        outs = {name: [torch.empty(expected_shape, device="cuda", dtype=sets[0][0].dtype) for _ in sets]
                for name in ("student", "reference")}

        # 3. exactly the expected kernels, all the student's own
        phase("kernel list")
        own = own_kernel_names(module.source)
        # one real call first: a launcher that sets itself up on first use (a workspace for this size) must not
        # meet its setup inside the capture
        candidate(*sets[0], outs["student"][0])
        torch.cuda.synchronize()
        kernels = launched_kernels(lambda: candidate(*sets[0], outs["student"][0]),
                                   accept=lambda ks: len(ks) == expected_kernels and not _foreign(ks, own))
        foreign = _foreign(kernels, own)
        if len(kernels) != expected_kernels or foreign:
            record["status"] = f"launched {len(kernels)} kernel(s) {kernels}, expected {expected_kernels} of its own"
            say(f"{test_id}: 0 of {max_points} points: one call launched {len(kernels)} kernel(s) "
                f"({', '.join(kernels) or 'none'}); a fused op must launch exactly {expected_kernels} kernel(s) "
                f"of its own ({', '.join(sorted(own)) or 'none found in the source'}).")
            return record

        # 4. right at the timed shape
        phase("check at the timed shape")
        check(candidate, reference, lambda s, seed: make_inputs(s, seed=seed), [shape], seeds=(7,), name=test_id,
              verbose=verbose)

        # 4b. all of its work on the stream it is given: a side-stream launch escapes both the timing's events and
        # a CUDA graph's capture, so a capture replayed on new inputs leaves the output unwritten or stale
        phase("stream check")
        escaped = _escapes_stream(candidate, sets[0], outs["student"][0], reference, make_inputs(shape, seed=3000))
        if escaped:
            record["status"] = escaped
            say(f"{test_id}: 0 of {max_points} points: {escaped}")
            return record

        # 5. interleaved timing over rotating input sets
        def rotating(op, name):
            counter = itertools.count()

            def call():
                k = next(counter) % len(sets)
                op(*sets[k], outs[name][k])
            return call

        # the grader's run of the instructor's own notebook: the course's tuned solution too, for the feedback
        # pages' picture; built and checked here, before the GPU is taken (a student's kernel worker never does)
        tuned = None
        if instructors_run() and not asks_a_checker():
            phase("tuned solution")
            outs["tuned"] = [torch.empty_like(out) for out in outs["student"]]
            tuned, record["tuned_status"] = course_tuned(test_id, sets[0], outs["tuned"][0], reference)

        global LAST_TIMED
        phase("timing")
        LAST_TIMED = rotating(candidate, "student")  # the grader's checker times a batch of it from outside
        with exclusive_gpu():  # while the grader shares this GPU among submissions, only the timing gets it alone
            result = timing.compare({"reference": rotating(reference_op, "reference"),
                                     "student": LAST_TIMED},
                                    baseline="reference", mode=mode, budget_s=budget_s)
            if not asks_a_checker():
                # a run of the course's own (the grader's reference run of the solution, not a student's kernel
                # worker): this GPU's copy bandwidth, now, the feedback page's yardstick for the floor
                from ..timing.roofline import measure_copy_bandwidth
                record["copy_bytes_per_s"] = measure_copy_bandwidth(budget_s=0.5)
            if tuned is not None:  # timed apart from the plain solution's comparison, which it leaves unchanged
                record.update(_time_tuned(rotating(reference_op, "reference"), rotating(tuned, "tuned"), mode,
                                          budget_s))
        speedup = result.graded_speedup("student")
        record.update(student_s=result["student"].median, reference_s=result["reference"].median)

        # 6. fresh contents at the same addresses: a cache keyed by pointer now returns stale results; then one
        # element changed where no sample of a few places looks: a cache keyed by sampled values does too
        phase("refreshed check")
        for k, inputs in enumerate(sets):
            _refill(inputs, make_inputs(shape, seed=2000 + k))
            candidate(*inputs, outs["student"][k])
            assert_close(outs["student"][k], reference(*[x.double() if torch.is_tensor(x) else x for x in inputs]))
        one_element_check(candidate, reference, sets[0], outs["student"][0])

        phase(None)
        points = timing.speedup_points(speedup, threshold, max_points)
        s = result.speedup("student")
        record.update(points=points, speedup=speedup, ci=[s.low, s.high], threshold=threshold, mode=mode,
                      gpu=gpu_name, shape=list(shape), status="measured")
        say(f"{test_id}: {speedup:.2f}x faster than the lab's unfused reference (95% CI {s.low:.2f}-{s.high:.2f}, "
            f"{mode} time at shape {list(shape)}); full points from {threshold:.2f}x → "
            f"{points:.2f} of {max_points} points")
        return record

    # a speed test's input sets, outputs and float64 references at the timed shape take GPU memory for all of it:
    # while the grader shares the GPU, only a few speed tests run at once (the timing itself has the GPU alone),
    # and their memory goes back when it ends
    with speed_test_slot():
        try:
            return _finish(measure())
        finally:
            phase(None)
            _let_go_of_timed_sets()


def _time_tuned(reference_call, tuned_call, mode, budget_s) -> dict:
    """The course's tuned solution against the lab's reference: the record's ``tuned_*`` fields; a failure is said
    there and never costs the plain solution's record."""
    try:
        result = timing.compare({"reference": reference_call, "tuned": tuned_call}, baseline="reference", mode=mode,
                                budget_s=budget_s)
        return {"tuned_speedup": result.graded_speedup("tuned"), "tuned_s": result["tuned"].median,
                "tuned_status": "measured"}
    except Exception as exc:  # noqa: BLE001 - the tuned solution is the picture's, never a verdict
        return {"tuned_status": f"not measured ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"}


def one_element_check(candidate, reference, inputs, out, places: int = 8) -> None:
    """Change a few elements of the first input of ``inputs`` (every lab's activation, which the student's op and
    the reference both read as it is) in place, each at a place drawn at random (not from any generator the
    process seeds), call ``candidate`` again and check its output. Any real computation gives the new output; a
    launcher that skips its work while the few values it samples (and the pointers) are the same as last time
    returns the last one, and fails here: a sample of a few places misses a few elements of millions. Only the
    first: other inputs may be read by one side alone (Lab 2's reference reads the batch norm's statistics, the
    student's op the weights folded from them). Raises AssertionError (the check's) where the output is wrong.
    The places change in one indexed add (``put_``, any layout: one launch): this runs while the checker holds the GPU
    alone for its outside clock, so it must cost next to nothing."""
    import secrets
    x = inputs[0] if inputs else None
    if not (torch.is_tensor(x) and x.is_floating_point() and x.numel() > 0):
        return
    where = torch.tensor([secrets.randbelow(x.numel()) for _ in range(places)], dtype=torch.long)
    # raised well past the inputs' spread: a change that a ReLU after it would keep at zero is rare, and each of
    # the few places has its own chance to show in the output
    x.put_(where.to(x.device), torch.full((places,), 8.0, dtype=x.dtype).to(x.device), accumulate=True)
    candidate(*inputs, out)
    assert_close(out, reference(*[t.double() if torch.is_tensor(t) else t for t in inputs]))


def _refill(inputs, fresh) -> None:
    """Give the tensors of ``inputs`` the contents of ``fresh`` in place (same addresses, new values)."""
    for old, new in zip(inputs, fresh):
        if torch.is_tensor(old):
            old.copy_(new)


def _foreign(kernels, own) -> list:
    """The kernels not named after one of the student's own ``__global__`` functions ``own``: the function's own
    name, not a name that holds it (a student's ``__global__ void gemm`` never launched would vouch for cuBLAS's
    ``sm90_xmma_gemm_..._bias_relu``, one fused kernel, were the test a substring)."""
    return [k for k in kernels if kernel_identifier(k) not in own]


def kernel_identifier(name: str) -> str:
    """The function name of a kernel as the driver or the profiler names it: ``fused`` of ``fused(float const*,
    float*, int)``, ``void ns::fused<128>(float*)``, ``(anonymous namespace)::fused(...)``, of ``fused`` (extern
    "C") and of a name the demangler could not read (``_Z5fusedPKfPfi``: its first length-prefixed part, or its
    nested name's last)."""
    text = name.replace("(anonymous namespace)::", "").strip()
    if text.startswith("_Z"):
        parts, rest = [], text[2 + (1 if text[2:3] == "N" else 0):]
        while (m := re.match(r"L?(\d+)", rest)) is not None:  # L: internal linkage (a static kernel)
            size = int(m.group(1))
            parts.append(rest[m.end():m.end() + size])
            rest = rest[m.end() + size:]
            if not (text[2:3] == "N" and re.match(r"L?\d", rest)):
                break
        return parts[-1] if parts else text
    head, depth, plain = text.split("(", 1)[0], 0, []
    for ch in head:  # template arguments out: ``fused<128>``
        depth += (ch == "<") - (ch == ">")
        if depth == 0 and ch not in "<>":
            plain.append(ch)
    words = "".join(plain).split()
    return words[-1].rsplit("::", 1)[-1] if words else ""


def _phase_clock(phases: dict):
    """``phase(label)`` ends the phase running (adding its seconds to ``phases``) and starts ``label`` (None: none);
    each phase waits for the GPU work it queued, so its seconds are its own."""
    import time
    running = [None, 0.0]

    def phase(label):
        now = time.perf_counter()
        if running[0] is not None:
            try:  # a failing phase's error (a poisoned context, say) is the one raised, not this one's
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.synchronize()
                    now = time.perf_counter()
            except Exception:  # noqa: BLE001
                pass
            phases[running[0]] = round(phases.get(running[0], 0.0) + now - running[1], 4)
        running[:] = [label, now]
    return phase


def _let_go_of_timed_sets():
    """The timed input sets outlive a speed test only through ``LAST_TIMED``, and only in the kernel worker, whose
    checker times a batch of it and then says so (``speed_end``); elsewhere they go now, memory and all."""
    global LAST_TIMED
    if not asks_a_checker():
        LAST_TIMED = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()


def _escapes_stream(candidate, inputs, out, reference, fresh):
    """Why ``candidate``'s work escapes the current stream, or None: one call is captured, ``inputs`` get the
    contents of ``fresh`` (in place), and the replay must compute the output of those. Work launched on a stream
    of its own runs at capture time, on the old contents, and is not in the graph (nor in its kernel list)."""
    graph = torch.cuda.CUDAGraph()
    exc = capture(graph, lambda: candidate(*inputs, out), quiet=True)
    if exc is not None:  # any failure to capture is the verdict
        return (f"the fused op could not be captured in a CUDA graph ({type(exc).__name__}: {str(exc)[:200]}); "
                "launch only on the stream you are given")
    torch.cuda.synchronize()
    _refill(inputs, fresh)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    expected = reference(*[x.double() if torch.is_tensor(x) else x for x in inputs])
    if not torch.allclose(out.double(), expected, rtol=1e-3, atol=1e-4):
        return ("the fused op's work is not all on the stream it is given (a side stream or the default stream): "
                "replaying a captured call on new inputs left its output unwritten or stale, and such work escapes "
                "the timing too")
    return None


def would_grade(test_id, max_points, policy=None) -> str:
    """What the test grades on the course's GPU, for a student who cannot run it: the timed setting, the threshold,
    how partial credit goes, and what the course's plain fused solution measured there."""
    test, entry, _ = policy_entry(test_id, REFERENCE_GPU, policy)
    shape = _timed_size(test["shape"])
    plain = entry.get("plain_speedup")
    return (f"What it grades, on the course's {REFERENCE_GPU}: your kernel against the lab's unfused reference at "
            f"{shape}, {test['dtype']}, {test['mode']} time; full {max_points} points from {entry['threshold']:.2f}x, "
            f"partial credit linear from 0 at 1.00x up to it"
            + (f"; the calibration that set this threshold ({entry.get('measured', 'undated')}) measured the "
               f"course's plain fused solution at {plain:.2f}x." if plain else "."))


def _timed_size(shape) -> str:
    """A timed setting's size for the student: a flat one by its element count, written so that it reads as one
    ("67,108,864 elements", not a bare 67108864), any other by its sizes ("shape 16384×4096×16")."""
    if len(shape) == 1:
        return f"{shape[0]:,} elements"
    return "shape " + "×".join(str(size) for size in shape)


def _said(record) -> str:
    """The checker's line for a speed record the solution worker measured."""
    test, points, top = record["test"], record["points"], record["max_points"]
    if record.get("status") == "not measured (no GPU)":
        return f"{test}: speedup not measured (no GPU): 0 of {top} points. Speed points are only given on a GPU."
    if record.get("status") != "measured" or "graded_speedup" not in record:
        return f"{test}: 0 of {top} points: {record.get('status', 'not measured')}"
    line = (f"{test}: {record['graded_speedup']:.2f}x faster than the lab's unfused reference "
            f"({record.get('mode', '')} time at shape {record.get('shape')}); full points from "
            f"{record['threshold']:.2f}x → {points:.2f} of {top} points")
    return line + (f" ({record['flag']})" if record.get("flag") else "")


def _finish(record):
    global LAST_RECORD
    LAST_RECORD = dict(record)  # the solution worker sends it to the grader's checker
    path = os.environ.get("FUSELAB_GRADE_LOG")
    if path:
        with open(path, "a") as log:
            log.write(json.dumps(record) + "\n")
    return float(record["points"])
