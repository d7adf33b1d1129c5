"""The GPU self-check's command line: run the chosen stages in order, write ``selfcheck.json`` after each, print
the closing table (``bash .ci/gpu-selfcheck``, ``python -m fuselab.tools.gpu_selfcheck``)."""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from pathlib import Path

from ...course import REPO
from .stages import by_name, default_names


def chosen_stages(text: str, parser: argparse.ArgumentParser) -> list:
    """The stages ``--stages`` names, in its order; an unknown name stops the command before any stage runs."""
    known = by_name()
    names = text.split(",")
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(f"unknown stage(s): {', '.join(map(repr, unknown))}; the stages are: {', '.join(known)}")
    return [known[name] for name in names]


def stage_list() -> str:
    lines = []
    for stage in by_name().values():
        needs = ", ".join(stage.needs) or "nothing"
        lines.append(f"{stage.name:<10} needs {needs}{'' if stage.default else ' (not by default)'}\n"
                     f"{'':<10} {stage.checks}")
    return "\n".join(lines)


def summary_rows(results: dict) -> list:
    """``(label, status, text)`` rows of the closing table, one or more per stage that ran."""
    known = by_name()
    return [row for name, result in results.items() for row in known[name].table_rows(result)]


def main(argv=None):
    parser = argparse.ArgumentParser(prog=".ci/gpu-selfcheck", description="fuselab GPU self-check")
    parser.add_argument("--stages", default=",".join(default_names()),
                        help=f"comma-separated, from: {', '.join(by_name())}")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "selfcheck-out"))
    parser.add_argument("--list", action="store_true", help="list the stages, what each needs and checks")
    args = parser.parse_args(argv)
    if args.list:
        print(stage_list())
        return 0
    stages = chosen_stages(args.stages, parser)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for stage in stages:
        if stage.before is not None:
            stage.before(results, out)
        started = time.perf_counter()
        print(f"== stage {stage.name}", flush=True)
        try:
            results[stage.name] = stage.run(out)
        except Exception:  # noqa: BLE001 - a failed stage is reported, the others still run
            results[stage.name] = {"error": traceback.format_exc()}
            print(results[stage.name]["error"], flush=True)
        results[stage.name]["stage_seconds"] = time.perf_counter() - started
        (out / "selfcheck.json").write_text(json.dumps(results, indent=2, default=str))
    print("\nstage      status  result")
    for name, status, text in summary_rows(results):
        print(f"{name:<10} {status:<7} {text}")
    return 0 if all("error" not in r for r in results.values()) else 1
