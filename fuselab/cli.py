"""The ``fuselab`` command: ``doctor``, ``demo``, ``clean``, ``release``, ``grade``, ``export``, ``calibrate``,
``samples``, ``formgrader``."""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fuselab", description="GPU operator-fusion lab tools")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="check this machine for the course and say how to fix what is missing")
    demo = sub.add_parser("demo", help="build, check and time a fused elementwise kernel")
    demo.add_argument("--backend", choices=["auto", "cuda", "emulate"], default=None)
    demo.add_argument("--size", type=int, default=None, help="elements (default: 64M on a GPU, 1M emulated)")
    sub.add_parser("clean", help="delete every cached build")
    rel = sub.add_parser("release", help="regenerate labs/ from solutions/ with nbgrader")
    rel.add_argument("--check", action="store_true", help="only report whether labs/ is up to date")
    hand = sub.add_parser("formgrader", help="hand-grade a graded run in nbgrader's formgrader (prints its URL)")
    hand.add_argument("run", nargs="?", metavar="RUN_OR_COURSE",
                      help="a graded run's folder (fuselab grade's --out) or its course/ (default: the newest run "
                           "under grader/runs)")
    hand.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    hand.add_argument("--ip", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    from .grading.run.cli import add_parsers as add_grading_parsers, parse
    add_grading_parsers(sub)
    args = parse(parser, argv)
    if args.command in ("grade", "export", "calibrate", "samples"):
        from .grading.run.cli import run as run_grading
        return run_grading(args)

    if args.command == "formgrader":
        from .grading.outputs.formgrader import main as formgrader
        return formgrader(args.run, port=args.port, ip=args.ip)
    if args.command == "doctor":
        from .doctor import main as doctor
        from .grading.sandbox.readiness import sandbox_finding
        return doctor(extra_checks=[sandbox_finding])
    if args.command == "demo":
        from .tools.demo import main as demo_main
        return demo_main(backend=args.backend, size=args.size)
    if args.command == "release":
        from .course import main_release
        return main_release(check=args.check)
    if args.command == "clean":
        from .kernelbuild import clear_cache
        clear_cache()
        print("cached builds deleted")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
