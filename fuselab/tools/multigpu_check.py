"""The grader on several GPUs, judged against one GPU (the GPU self-check's ``multigpu`` stage).

The same class is graded twice with the same number of submissions sharing each GPU: on one GPU, then on every
visible GPU. What must hold:

- every submission is graded exactly once in both runs;
- correctness points are identical, and speed points within ±1 (two measurements of the same kernel);
- no two graded timings ever had one GPU at the same time (each clean recheck logs when it held its GPU; the
  instructor's reference runs, side by side on the first GPU, count too: with one worker per GPU they are the
  only timings that could collide);
- each worker's device is one physical GPU, and different devices are different GPUs (the UUID that every
  speed measurement records: ``CUDA_VISIBLE_DEVICES`` renumbers GPUs, so a mix-up would otherwise go unseen);
- the several-GPU run grades the submissions in at most ``WALL_RATIO`` of the one-GPU run's time. That is the
  submissions phase, the part the GPUs share out; the whole run's ratio is reported beside it, and also counts
  what any class pays once whatever the GPUs (the course set-up, the instructor's reference runs, feedback: about
  a minute on the H200), so it approaches the submissions' ratio as the class grows.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from ..grading.records.results import SubmissionResult

WALL_RATIO = 0.6       # the target for two GPUs
SPEED_TOLERANCE = 1.0  # points: two measurements of the same kernel on two (identical) GPUs


def _key(result: SubmissionResult) -> tuple:
    return result.student, result.lab


def _typed(results) -> list:
    return [SubmissionResult.of(r) for r in results]


def graded_once(results, label) -> list:
    """Problems: a submission graded more than once."""
    return [f"{label}: {s}/{lab} graded {n} times" for (s, lab), n in Counter(map(_key, _typed(results))).items() if n > 1]


def _is_speed_cell(cell) -> bool:
    return bool(cell.speed)


def same_grades(single, several) -> list:
    """Problems: a submission graded in one run only, a correctness point that differs, a speed point off by
    more than ``SPEED_TOLERANCE``."""
    one, many = {_key(r): r for r in _typed(single)}, {_key(r): r for r in _typed(several)}
    problems = [f"{s}/{lab} graded on one GPU only" for s, lab in sorted(set(one) - set(many))]
    problems += [f"{s}/{lab} graded on several GPUs only" for s, lab in sorted(set(many) - set(one))]
    for key in sorted(set(one) & set(many)):
        cells_one, cells_many = one[key].cells, many[key].cells
        for grade_id in sorted(set(cells_one) | set(cells_many)):
            a, b = cells_one.get(grade_id), cells_many.get(grade_id)
            if a is None or b is None:
                problems.append(f"{'/'.join(key)}: {grade_id} graded in one run only")
                continue
            speed = _is_speed_cell(a) or _is_speed_cell(b)
            allowed = SPEED_TOLERANCE if speed else 0.0
            if abs(a.points - b.points) > allowed + 1e-9:
                kind = "speed points differ by more than 1" if speed else "correctness points differ"
                problems.append(f"{'/'.join(key)}: {grade_id}: {kind}: {a.points:g} on one GPU, "
                                f"{b.points:g} on several")
    return problems


def timings(results, reference=None) -> list:
    """Every graded timing of the run: ``{device, student, lab, start, end}`` (epoch seconds), in time order.

    ``reference``: the instructor's reference runs (lab → result), graded side by side on the first GPU before
    the students, their timings taking turns through its lease (student "reference").
    """
    runs = [(r.device, r.student, r.lab, r.gpu_holds) for r in _typed(results)]
    runs += [(r.get("device"), "reference", lab, r.get("gpu_holds")) for lab, r in (reference or {}).items()]
    rows = [{"device": device, "student": student, "lab": lab, "start": start, "end": end}
            for device, student, lab, holds in runs for start, end in holds or []]
    return sorted(rows, key=lambda row: (row["start"], row["end"]))


def overlapping_timings(results, reference=None) -> list:
    """Problems: two timings that held the same GPU at the same time."""
    problems = []
    by_device = defaultdict(list)
    for row in timings(results, reference):
        by_device[row["device"]].append(row)
    for device, rows in by_device.items():
        for before, after in zip(rows, rows[1:]):
            if after["start"] < before["end"]:
                problems.append(f"GPU {device}: {before['student']}/{before['lab']}'s timing "
                                f"({before['start']:.3f}–{before['end']:.3f}) overlaps {after['student']}/"
                                f"{after['lab']}'s ({after['start']:.3f}–{after['end']:.3f})")
    return problems


def physical_gpus(results) -> dict:
    """Worker device → the GPU UUIDs its speed measurements ran on."""
    seen = defaultdict(set)
    for r in _typed(results):
        for cell in r.cells.values():
            for record in cell.speed or []:
                if record.get("gpu_uuid"):
                    seen[r.device].add(record["gpu_uuid"])
    return {device: sorted(uuids) for device, uuids in seen.items()}


def device_mix_ups(results) -> list:
    """Problems: a worker device whose timings ran on several GPUs, or two devices that are one GPU."""
    gpus = physical_gpus(results)
    problems = [f"device {d} measured on {len(u)} different GPUs: {', '.join(u)}" for d, u in gpus.items()
                if len(u) > 1]
    owners = defaultdict(list)
    for device, uuids in gpus.items():
        for uuid in uuids:
            owners[uuid].append(device)
    problems += [f"devices {', '.join(map(str, d))} are the same GPU {u}" for u, d in owners.items() if len(d) > 1]
    return problems


def verdict(single, several, expected: int | None = None) -> dict:
    """Judge two ``grading.run.pipeline.ClassResult`` of the same class (``expected`` submissions): one GPU, then
    several."""
    problems = (graded_once(single.results, "one GPU") + graded_once(several.results, "several GPUs")
                + same_grades(single.results, several.results)
                + overlapping_timings(several.results, several.reference)
                + overlapping_timings(single.results, single.reference) + device_mix_ups(several.results))
    for label, run in (("one GPU", single), ("several GPUs", several)):
        # a submission the grader failed on is in neither run's results: it would go unseen above
        problems += [f"{label}: not graded: {p.student or '?'}/{p.lab or '?'}: {p.message}" for p in run.problems]
        if expected is not None and len(run.results) != expected:
            problems.append(f"{label}: {len(run.results)} submissions graded, {expected} in the class")
    devices = sorted({str(w) for w in several.workers})
    if len(devices) < 2:
        problems.append(f"the several-GPU run used {len(devices)} GPU(s)")
    if not physical_gpus(several.results):
        problems.append("no speed measurement recorded its GPU: the class had no graded timing")
    walls = {}
    for name in ("submissions", "whole run"):
        one, many = (_seconds(r, name) for r in (single, several))
        walls[name] = {"one_gpu": one, "several": many, "ratio": many / one if one else None}
    ratio = walls["submissions"]["ratio"]
    met = ratio is not None and ratio <= WALL_RATIO
    speed_moves = [abs(a.points - b.points) for a, b in _speed_pairs(single.results, several.results)]
    return {"status": "ok" if not problems and met else "MISS", "problems": problems, "wall": walls,
            "wall_ratio_target": WALL_RATIO, "gpus": devices, "physical_gpus": physical_gpus(several.results),
            "largest_speed_point_change": max(speed_moves, default=0.0),
            "headline": (f"{len(several.results)} submissions on {len(devices)} GPUs vs 1: submissions "
                         f"{walls['submissions']['ratio'] or float('nan'):.2f}x the time (target {WALL_RATIO}), "
                         f"whole run {walls['whole run']['ratio'] or float('nan'):.2f}x; "
                         f"{len(problems)} problem(s)")}


def _seconds(class_result, name) -> float:
    phases = class_result.phase_seconds
    return sum(phases.values()) if name == "whole run" else phases.get(name, 0.0)


def _speed_pairs(single, several):
    many = {_key(r): r for r in _typed(several)}
    for r in _typed(single):
        other = many.get(_key(r))
        for grade_id, cell in r.cells.items() if other else ():
            if _is_speed_cell(cell) and grade_id in other.cells:
                yield cell, other.cells[grade_id]
