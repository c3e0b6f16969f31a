"""Command line: `python -m ptlab doctor | pitfalls | catalogue | data | notebooks | bench | gpu-check | train |
watch`."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _doctor(args: argparse.Namespace) -> int:
    print("ptlab doctor", flush=True)        # at once: importing torch takes seconds
    from .course.doctor import check_lines, iter_checks, note_line, verdict

    checks = []
    for check in iter_checks(say=lambda text: print(note_line(text), flush=True)):
        checks.append(check)
        print("\n".join(check_lines(check)), flush=True)
    last, code = verdict(checks)
    print(last)
    return code


PITFALLS_RUN_USAGE = "usage: python -m ptlab pitfalls run ID [--fixed]   (for example: ID = missing-zero-grad)"


def _pitfalls(args: argparse.Namespace) -> int:
    from .course.catalogue import catalogue_json, catalogue_text, lesson_text
    from .course.pitfall_record import BUG_ON, FIXED, run_text
    from .course.pitfalls import all_pitfalls, get_pitfall, nearest_ids

    if args.action == "list":
        if args.id:
            print(f"`pitfalls list` takes no id (got {args.id!r}); to run it: python -m ptlab pitfalls run {args.id}",
                  file=sys.stderr)
            return 2
        print(catalogue_json() if args.json else catalogue_text())
        return 0
    if not args.id:                                   # `run` without an id: what there is, and how to run one
        print(catalogue_text())
        print(f"\npitfalls run: name the pitfall to run (an id from the list above)\n{PITFALLS_RUN_USAGE}",
              file=sys.stderr)
        return 2
    try:
        record = get_pitfall(args.id)
    except KeyError:
        nearest = nearest_ids(args.id)
        guess = (f"did you mean: {', '.join(nearest)}?" if nearest
                 else f"`python -m ptlab pitfalls list` shows all {len(all_pitfalls())}")
        print(f"no pitfall with id {args.id!r}; {guess}\n{PITFALLS_RUN_USAGE}", file=sys.stderr)
        return 2
    label = FIXED if args.fixed else BUG_ON
    colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    print(lesson_text(record, colour=colour), end="\n\n")
    skipped = record.skipped_text()
    if skipped is not None:
        print(skipped)
        return 0
    print(f"Run ({label}{'' if args.fixed else '; add --fixed for the fixed code'}): {record.id}", flush=True)
    print(run_text({label: record.run(buggy=not args.fixed)}))
    return 0


def _catalogue(args: argparse.Namespace) -> int:
    from .course.catalogue import catalogue_markdown, readme_is_current, write_readme

    readme = Path(args.readme)
    if args.check:
        if readme_is_current(readme):
            print(f"{readme}: pitfall catalogue is current")
            return 0
        print(f"{readme}: pitfall catalogue is stale; run `python -m ptlab catalogue --write`", file=sys.stderr)
        return 1
    if args.write:
        print(f"{readme}: {'updated' if write_readme(readme) else 'already current'}")
        return 0
    print(catalogue_markdown())
    return 0


def _data(args: argparse.Namespace) -> int:
    from . import data, reference

    if args.rebuild:
        print(f"rebuilt {data.DATASET_FILE.name}: sha256 {data.rebuild_dataset()}")
    if args.rebuild_weights:
        print(f"rebuilt {reference.rebuild_weights().name}:\n{reference.describe_weights()}")
    if args.export:
        print(f"wrote {data.export_image_folder(Path(args.export), train=not args.test)}")
    if not (args.rebuild or args.rebuild_weights or args.export):
        try:
            print(f"{data.DATASET_FILE.name}: sha256 {data.verify_dataset()} ok")
            print(f"{reference.weights_file().name}: ok\n{reference.describe_weights()}")
        except (data.DatasetError, reference.WeightsError) as err:
            print(err, file=sys.stderr)
            return 1
    return 0


def _notebooks(args: argparse.Namespace) -> int:
    from .course.nbrun import execute_in_place

    return execute_in_place([Path(p) for p in args.paths])


def _bench(args: argparse.Namespace) -> int:
    from .course.bench import bench, busy_bench

    paths = [Path(p) for p in args.paths]
    return busy_bench(paths, markdown=args.markdown) if args.busy else bench(paths, markdown=args.markdown)


def _gpu_check(args: argparse.Namespace) -> int:
    from .course.gpu_env import cannot_start

    reason = cannot_start()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    from .course.gpu_check import default_lanes, default_test_ids, gpu_check

    tests = [] if args.no_tests else args.tests if args.tests is not None else default_test_ids()
    return gpu_check([Path(p) for p in args.notebooks], Path(args.out), args.lanes or default_lanes(),
                     args.cell_timeout_s, args.deadline_s, args.tests_s, tests, allow_cpu=args.allow_cpu,
                     keep_notebooks=args.keep_notebooks)


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree; every option shows its default in --help."""
    parser = argparse.ArgumentParser(prog="python -m ptlab", description=__doc__,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="readiness report for this machine").set_defaults(func=_doctor)
    p = sub.add_parser("pitfalls", help="the pitfall catalogue, or run one pitfall",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  python -m ptlab pitfalls list\n  python -m ptlab pitfalls run "
                              "missing-zero-grad\n  python -m ptlab pitfalls run missing-zero-grad --fixed")
    p.add_argument("action", nargs="?", choices=["list", "run"], default="list",
                   help="list: every pitfall, and whether `python -m ptlab watch` detects it; run: one pitfall's "
                        "code, why, how to catch it, then its run")
    p.add_argument("id", nargs="?", help="pitfall id for `run` (see `list`)")
    p.add_argument("--fixed", action="store_true", help="run the fixed code instead of the buggy one")
    p.add_argument("--json", action="store_true", help="print the catalogue as JSON")
    p.set_defaults(func=_pitfalls)
    p = sub.add_parser("catalogue", help="the README's pitfall table")
    p.add_argument("--readme", default="README.md")
    p.add_argument("--write", action="store_true", help="refresh the table in the README")
    p.add_argument("--check", action="store_true", help="exit 1 if the README's table is stale")
    p.set_defaults(func=_catalogue)
    p = sub.add_parser("data", help="verify, rebuild or export the embedded dataset and the shipped weights")
    p.add_argument("--rebuild", action="store_true", help="regenerate the file with the generator")
    p.add_argument("--rebuild-weights", action="store_true",
                   help="retrain the shipped reference and backbone weights (data/ptlab_weights_v1.pt)")
    p.add_argument("--export", metavar="DIR", help="write an ImageFolder tree of PNGs to DIR")
    p.add_argument("--test", action="store_true", help="export the test split instead of train")
    p.set_defaults(func=_data)
    p = sub.add_parser("notebooks", help="re-execute notebooks in place (refresh committed outputs)")
    p.add_argument("paths", nargs="*", default=["notebooks"])
    p.set_defaults(func=_notebooks)
    p = sub.add_parser("bench", help="run every notebook once; time, memory and checked-cell table")
    p.add_argument("paths", nargs="*", default=["notebooks"])
    p.add_argument("--markdown", action="store_true", help="also print the table as Markdown, for the README")
    p.add_argument("--busy", action="store_true",
                   help="run each notebook quiet, then beside one busy process; print the busy/quiet ratios")
    p.set_defaults(func=_bench)
    p = sub.add_parser("gpu-check", help="every notebook on the GPU with its claims asserted, the GPU tests, a report",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--allow-cpu", action="store_true",
                   help="without a GPU, rehearse the check on the CPU instead of refusing")
    p.add_argument("--notebooks", nargs="+", default=["notebooks"], help="notebooks, or folders of them")
    p.add_argument("--out", default=os.environ.get("OUT") or "gpu-report",
                   help="the report's folder ($OUT when set: a borrowed GPU machine returns only what is there)")
    p.add_argument("--lanes", type=int, default=0, help="notebooks run at once (0: min(4, CPUs // 4), at least 1)")
    p.add_argument("--cell-timeout-s", type=float, default=240.0, help="the most one cell may take")
    p.add_argument("--deadline-s", type=float, default=420.0,
                   help="the whole check ends by then: unfinished notebooks are reported, the tests cut")
    p.add_argument("--tests-s", type=float, default=150.0,
                   help="seconds of the deadline kept for the tests: the notebooks stop at deadline - this")
    p.add_argument("--tests", nargs="+", metavar="ID", default=None,
                   help="pytest ids to run (default: the tests marked cuda, and the resume, checkpoint and "
                        "collective tests)")
    p.add_argument("--no-tests", action="store_true", help="run the notebooks only")
    p.add_argument("--keep-notebooks", action="store_true", help="also write the executed notebooks to OUT/executed")
    p.set_defaults(func=_gpu_check)
    p = sub.add_parser("train", add_help=False, help="the reference training script (python -m ptlab train --help)")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda args: _train(args.args))
    p = sub.add_parser("watch", add_help=False, help="run your training script under the pitfall watch "
                                                      "(python -m ptlab watch --help)")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda args: _watch(args.args))
    return parser


def _train(argv: list[str]) -> int:
    from .train_script import main as train_main

    return train_main(argv)


def _watch(argv: list[str]) -> int:
    from .watch import main as watch_main

    return watch_main(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m ptlab` and the `ptlab` script."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:  # every option after `train` (--help included) is the training script's
        return _train(argv[1:])
    if argv[:1] == ["watch"]:  # the script's own options included
        return _watch(argv[1:])
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
