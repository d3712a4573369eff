"""python -m minillm.bench NAME [--quick] [--json PATH] [--model M] [--threads N] | --list"""
import argparse
import sys

from minillm.bench.registry import BENCHMARKS


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"  {b.name:<11} {b.description}\n{'':<14}model: "
                        + (f"{b.default_model} (default) or --model M" if b.takes_model else "none, so no --model")
                        for b in BENCHMARKS.values())
    p = argparse.ArgumentParser(prog="python -m minillm.bench", formatter_class=argparse.RawDescriptionHelpFormatter,
                                description=f"benchmarks:\n{listing}")
    p.add_argument("name", nargs="?", choices=list(BENCHMARKS), metavar="NAME", help="the benchmark to run")
    p.add_argument("--list", action="store_true", help="print the benchmarks' names, one a line, and exit")
    p.add_argument("--quick", action="store_true", help="a smoke run of about a minute on 2 CPU cores")
    p.add_argument("--json", metavar="PATH", help="also write the figures and run conditions to PATH as JSON")
    p.add_argument("--model", help="a bundled model name (tiny, pico) or a Hugging Face model directory, for "
                                   "the benchmarks that run one; default: the benchmark's own")
    p.add_argument("--threads", type=positive_int, metavar="N", help="torch threads for the run (default: torch's)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.list:
        print("\n".join(BENCHMARKS))
        return 0
    if args.name is None:
        p.error(f"name a benchmark ({', '.join(BENCHMARKS)}) or pass --list")
    bench = BENCHMARKS[args.name]
    if args.model is not None:
        if not bench.takes_model:
            p.error(bench.model_refusal())
        from minillm.models.registry import resolve_model_path
        try:
            resolve_model_path(args.model)
        except FileNotFoundError as e:
            p.error(str(e))
    if args.threads is not None:  # before any benchmark code runs, so every measurement uses them
        import torch  # only here and in the benchmarks, so that --list answers at once
        torch.set_num_threads(args.threads)
    bench.module().run(quick=args.quick, json_path=args.json, model=args.model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
