"""`python -m minillm tune`: the command line of tune() and edge(), with errors for people."""
import argparse
import re
import sys

SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}
TIME_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3}


def size(text: str) -> int:
    """'300MB', '1.5GiB', '4096' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: write bytes or a number with one of "
                                         f"{', '.join(u for u in SIZE_UNITS if u)} (300MB, 1.5GiB)")
    return round(float(m.group(1)) * SIZE_UNITS[m.group(2).lower()])


def seconds(text: str) -> float:
    """'50ms', '1.5s', '0.2' -> seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time: write seconds or a number with s or ms (50ms)")
    return float(m.group(1)) * TIME_UNITS[m.group(2)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m-instruct", help="bundled model name or model directory")
    p.add_argument("--workload", default="chat",
                   help="chat (Poisson arrivals), batch (an offline job, all at once) or a .jsonl trace: one request "
                        'a line, {"arrival": s, "prompt_tokens": n, "output_tokens": m}')
    p.add_argument("--objective", default="goodput", choices=["goodput", "throughput", "cost"])
    p.add_argument("--slo-ttft", type=seconds, default=None, help="SLO on each request's TTFT (1s, 500ms)")
    p.add_argument("--slo-tpot", type=seconds, default=None, help="SLO on each request's TPOT (50ms)")
    p.add_argument("--slo-e2e", type=seconds, default=None, help="SLO on each request's end-to-end latency")
    p.add_argument("--space", nargs="+", default=None, metavar="KNOB=V1,V2",
                   help="the knobs searched and their values (default: max_num_seqs=4,8,16 "
                        "max_num_batched_tokens=128,256,512 enable_prefix_caching=true,false quantization=none,int8)")
    p.add_argument("--requests", type=int, default=64, help="requests of the longest real run")
    p.add_argument("--rate", type=float, default=None, help="chat requests/s (default: --load x one at a time)")
    p.add_argument("--load", type=float, default=2.0, help="chat load: how many times one-at-a-time serving")
    p.add_argument("--top", type=int, default=4, help="configurations the model sends to real runs")
    p.add_argument("--memory-budget", type=size, default=None, help="peak memory: weights + KV + activations")
    p.add_argument("--tpot-budget", type=seconds, default=None,
                   help="with --memory-budget: the edge question (which scheme and context fit, at this TPOT)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--price-per-hour", type=float, default=None, help="$ an hour: cost per 1M tokens, interactive "
                                                                     "against batch")
    p.add_argument("--profile", nargs="+", default=[], metavar="SCHEME=PATH",
                   help="step profiles already measured (python -m minillm.bench profile --json PATH)")
    p.add_argument("--results", default="tune.json", help="the JSON file written as it goes; run again to resume")
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    import torch  # here, not above: `python -m minillm serve` builds this parser and needs neither torch nor sim

    from minillm.sim.step_profile import StepProfile
    from minillm.tune.edge import EdgeError, edge
    from minillm.tune.search import tune
    from minillm.tune.space import parse_space
    try:
        profiles = {scheme: StepProfile.load(path) for scheme, _, path in (p.partition("=") for p in args.profile)}
        if args.tpot_budget is not None:
            if args.memory_budget is None:
                raise ValueError("--tpot-budget asks the edge question with --memory-budget: give both")
            if args.threads:
                torch.set_num_threads(args.threads)
            edge(args.model, args.memory_budget, args.tpot_budget, results=args.results, profiles=profiles)
            return 0
        slo = {name: v for name, v in (("ttft", args.slo_ttft), ("tpot", args.slo_tpot), ("e2e", args.slo_e2e))
               if v is not None}
        tune(args.model, args.workload, args.objective, slo, parse_space(args.space) if args.space else None,
             args.requests, args.rate, args.load, args.memory_budget, args.threads, args.price_per_hour,
             args.results, args.top, args.seed, profiles=profiles)
    except EdgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
