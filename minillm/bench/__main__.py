"""python -m minillm.bench NAME [--quick] [--json PATH]"""
import argparse
import importlib
import sys

BENCHMARKS = {
    "decode": "single-stream decode: minillm vs transformers vs no KV cache (SmolLM2-135M shape)",
    "memory": "KV memory waste and concurrency: contiguous max-length allocation vs paged blocks",
    "throughput": "offline throughput: continuous vs static vs sequential batching vs transformers padded batches",
    "chunked": "inter-token latency of running decodes while long prompts arrive, with and without chunked prefill",
    "prefix": "requests sharing a long system prompt: prefill work and TTFT with and without prefix caching",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minillm.bench",
                                     description="benchmarks: " + "; ".join(f"{k}: {v}" for k, v in BENCHMARKS.items()))
    parser.add_argument("name", choices=sorted(BENCHMARKS))
    parser.add_argument("--quick", action="store_true", help="a smoke run of about a minute on 2 CPU cores")
    parser.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    parser.add_argument("--model", help="model for the benchmarks that run a trained one (prefix, throughput, "
                                        "chunked): a bundled name or a directory; default tiny")
    args = parser.parse_args(argv)
    module = importlib.import_module(f"minillm.bench.{args.name}")
    extra = {"model": args.model} if args.model else {}
    module.run(quick=args.quick, json_path=args.json, **extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
