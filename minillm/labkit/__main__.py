"""python -m minillm.labkit build [--lab NN] [--force]  |  fresh NN  |  progress [--target DIR]"""
import argparse
from pathlib import Path

from minillm.labkit.build import build, fresh
from minillm.labkit.progress import report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m minillm.labkit", description="Build the lab notebooks.")
    parser.add_argument("--root", type=Path, default=Path("."), help="the repository root (default: here)")
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build", help="regenerate solutions/*.ipynb and labs/*.ipynb from solutions/*.py")
    b.add_argument("--lab", help="only this lab, e.g. 01")
    b.add_argument("--force", action="store_true", help="replace learner notebooks you have edited (a copy is kept)")
    f = commands.add_parser("fresh", help="write a fresh learner copy of one lab to labs/fresh/")
    f.add_argument("lab", help="the lab number, e.g. 01")
    p = commands.add_parser("progress", help="every lab's exercises: passed, failing or not started, and the next")
    p.add_argument("--target", type=Path, default=None, help="the folder of your notebooks (default: labs/)")
    args = parser.parse_args(argv)
    if args.command == "build":
        print("\n".join(build(args.root, args.lab, args.force)))
    elif args.command == "fresh":
        print(fresh(args.root, args.lab))
    else:
        print(report(args.target or args.root / "labs"))


if __name__ == "__main__":
    main()
