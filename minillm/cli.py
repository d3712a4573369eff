"""The command line:
`python -m minillm generate | chat | quantize | serve | route | batch | tune | bench | train [heads | distill]`."""
import argparse
import ipaddress
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # handed over whole: argparse would take `bench --list` as options of its own
        from minillm.bench.__main__ import main as bench_main
        return bench_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m minillm", description="minillm: a teaching inference engine")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="stream a completion and print TTFT and decode speed")
    gen.add_argument("--model", default=None, help="bundled model name or Hugging Face model directory (default: tiny)")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--ignore-eos", action="store_true", help="keep going past the end-of-text token")
    gen.add_argument("--device", default="auto")
    gen.add_argument("--dtype", default="auto")

    chat = sub.add_parser("chat", help="chat with a model in the terminal: streamed answers, TTFT, tokens/s and "
                                       "prefix-cache reuse after each")
    chat.add_argument("--model", default=None,
                      help="model name, folder or .gguf file (default: smollm2-135m-instruct if installed, else tiny)")
    chat.add_argument("--max-tokens", type=int, default=256, help="per answer (fewer when the context runs out)")
    chat.add_argument("--temperature", type=float, default=0.2)
    chat.add_argument("--top-p", type=float, default=0.9)
    chat.add_argument("--system", default=None, help="a system message opening the conversation")
    chat.add_argument("--device", default="auto")
    chat.add_argument("--dtype", default="auto")

    quant = sub.add_parser("quantize", help="write a quantized copy of a model (safetensors, loads with LLM(DIR))")
    quant.add_argument("model", help="bundled model name or Hugging Face model directory")
    quant.add_argument("--scheme", required=True, choices=["int8", "int4", "fp8"])
    quant.add_argument("--group-size", type=int, default=64, help="int4: inputs sharing a scale (32, 64, 128)")
    quant.add_argument("--layers", type=int, nargs="+", default=None, help="decoder layers (default: all)")
    quant.add_argument("--projections", nargs="+", default=None,
                       help="q_proj k_proj v_proj o_proj gate_proj up_proj down_proj lm_head (default: all but "
                            "lm_head)")
    quant.add_argument("--out", type=Path, required=True, help="the folder to write")

    serve = sub.add_parser("serve", help="the OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)")
    serve.add_argument("--model", default=None, help="bundled model name or model directory (default: tiny)")
    serve.add_argument("--served-model-name", default=None, help="the name clients ask for (default: --model)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every request")
    serve.add_argument("--allow-remote", action="store_true",
                       help="allow a non-loopback --host (needs --api-key too)")
    serve.add_argument("--max-waiting", type=int, default=None,
                       help="refuse requests (429 + Retry-After) while this many wait (default: never)")
    serve.add_argument("--max-body-bytes", type=int, default=None,
                       help="refuse (413) request bodies larger than this (default: 2 MiB, serve/body_limit.py)")
    # issue 50: the request limits of serve/limits.py (docs/serving.md lists them)
    serve.add_argument("--max-stop-strings", type=int, default=None,
                       help="refuse (400) requests with more stop strings than this (default: 16)")
    serve.add_argument("--max-stop-chars", type=int, default=None,
                       help="refuse (400) requests whose stop strings total more characters (default: 4096)")
    serve.add_argument("--grace-period", type=float, default=10.0,
                       help="seconds in-flight requests get to finish after SIGINT/SIGTERM")
    # What one request or connection may cost (issue 50; docs/serving.md's table of limits)
    serve.add_argument("--grammar-compile-timeout", type=float, default=10.0,
                       help="seconds a request waits for its grammar's compile, else 400 (default: 10)")
    serve.add_argument("--grammar-cache-bytes", type=int, default=256 * 2**20,
                       help="bytes of compiled grammars kept for reuse, least recently used evicted (default: 256 MiB)")
    serve.add_argument("--max-header-bytes", type=int, default=64 * 1024,
                       help="refuse (400, then close) request headers larger than this (default: 64 KiB)")
    serve.add_argument("--header-timeout", type=float, default=10.0,
                       help="close a connection whose request headers are not complete in this many seconds (10)")
    serve.add_argument("--read-timeout", type=float, default=30.0,
                       help="408 and close when a request body sends nothing for this many seconds (default: 30)")
    serve.add_argument("--max-connections", type=int, default=1024,
                       help="connections and requests at once; past it, 503 (default: 1024)")
    serve.add_argument("--scheduler", default="continuous", choices=["continuous", "static", "sequential"])
    serve.add_argument("--max-num-seqs", type=int, default=64, help="sequences running at once")
    serve.add_argument("--max-model-len", type=int, default=None)
    serve.add_argument("--max-num-batched-tokens", type=int, default=None, help="tokens a step computes at most")
    serve.add_argument("--block-size", type=int, default=None, help="token slots per KV block")
    serve.add_argument("--num-kv-blocks", type=int, default=None, help="the KV pool's size in blocks")
    serve.add_argument("--no-prefix-caching", action="store_true", help="compute every prompt in full")
    serve.add_argument("--no-chunked-prefill", action="store_true", help="a prompt runs in one step or waits")
    serve.add_argument("--quantization", default=None, choices=["int8", "int4", "fp8"], help="weight-only scheme")
    serve.add_argument("--device", default="auto")
    serve.add_argument("--dtype", default="auto")

    route = sub.add_parser("route", help="a cache-aware router in front of N replica servers (launched, or --upstream)")
    route.add_argument("--replicas", type=int, default=2, help="replica servers to launch (python -m minillm serve)")
    route.add_argument("--upstream", nargs="+", default=None, metavar="URL",
                       help="route to servers already running at these base URLs instead of launching replicas")
    route.add_argument("--policy", default="prefix_aware", choices=["prefix_aware", "least_loaded", "round_robin"])
    route.add_argument("--port", type=int, default=8000, help="the router's port (on 127.0.0.1)")
    route.add_argument("--model", default=None, help="the replicas' model: its tokenizer feeds the prefix index "
                                                     "(default: tiny)")

    batch = sub.add_parser("batch", help="run a JSONL file of requests offline (OpenAI batch format)")
    batch.add_argument("input", type=Path)
    batch.add_argument("output", type=Path)
    batch.add_argument("--model", default=None, help="bundled model name or model directory (default: tiny)")

    from minillm.tune.command import add_arguments as tune_arguments
    tune_arguments(sub.add_parser("tune", help="find the engine's best configuration for a workload, an objective "
                                               "and a budget: the simulator ranks, real runs decide"))

    sub.add_parser("bench", help="run a benchmark (same as python -m minillm.bench; --list names them)")

    train = sub.add_parser("train", help="train the bundled models from the Python standard library")
    train.add_argument("--models", nargs="+", default=["pico", "tiny"], choices=["pico", "tiny"])
    train.add_argument("--out", type=Path, default=None, help="output folder (default: the package's assets)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--precision", choices=["bf16", "fp32"], default="bf16",
                       help="bf16: autocast compute with float32 weights (the bundled models were trained so)")
    spec = train.add_subparsers(dest="what", metavar="{heads,distill,speculator}",
                                description="without one of these, train trains the bundled models")
    heads = spec.add_parser("heads", help="multi-token-prediction heads for a frozen target (speculative decoding)")
    heads.add_argument("--model", default="tiny", help="the target: bundled name or model directory")
    heads.add_argument("--heads", type=int, default=8, help="tokens ahead the heads predict (speculative k up to it)")
    heads.add_argument("--steps", type=int, default=300)
    heads.add_argument("--seed", type=int, default=0)
    heads.add_argument("--continuations", type=int, default=512,
                       help="corpus prompts the target continues greedily to train on (0: the corpus itself)")
    heads.add_argument("--out", type=Path, default=None, help="default: spec_heads.safetensors in the model's folder")
    distill = spec.add_parser("distill", help="distill a draft model toward its target (speculative decoding)")
    distill.add_argument("--draft", default="pico", help="the draft to start from: bundled name or model directory")
    distill.add_argument("--target", default="tiny", help="the target it learns from")
    distill.add_argument("--steps", type=int, default=600)
    distill.add_argument("--seed", type=int, default=0)
    distill.add_argument("--out", type=Path, default=None, help="default: the assets' <draft>-distilled folder")

    mlp = spec.add_parser("speculator", help="an MLP speculator for a frozen instruct model, on its own chat answers")
    mlp.add_argument("--model", default="smollm2-135m-instruct", help="the target: an instruct model's name or folder")
    mlp.add_argument("--questions", type=int, default=256, help="chat questions the target answers to train on")
    mlp.add_argument("--steps", type=int, default=300)
    mlp.add_argument("--seed", type=int, default=0)
    mlp.add_argument("--out", type=Path, default=None, help="default: spec_mlp.safetensors in the model's folder")

    args = parser.parse_args(argv)
    if args.command == "generate":
        return _generate(args)
    if args.command == "chat":
        return _chat(args)
    if args.command == "quantize":
        return _quantize(args)
    if args.command == "serve":
        return _serve(args)
    if args.command == "route":
        return _route(args)
    if args.command == "tune":
        from minillm.tune.command import run as tune_run
        return tune_run(args)
    if args.command == "batch":
        from minillm.serve.batch import run_batch
        done = run_batch(args.input, args.output, model=args.model)
        print(f"{args.output}: {done['succeeded']} succeeded, {done['failed']} failed, {done['skipped']} already "
              f"answered (skipped); {done['output_tokens']:,} output tokens in {done['seconds']:.1f} s "
              f"({done['output_throughput']:.1f} tokens/s)")
        return 0
    if args.what == "heads":
        from minillm.training.train_heads import train_heads
        train_heads(args.model, args.heads, args.steps, seed=args.seed, out=args.out,
                    continuations=args.continuations)
    elif args.what == "speculator":
        from minillm.training.train_speculator import train_speculator
        train_speculator(args.model, args.steps, seed=args.seed, out=args.out, questions=args.questions)
    elif args.what == "distill":
        from minillm.training.train_draft import train_distill
        train_distill(args.draft, args.target, args.steps, seed=args.seed, out=args.out)
    else:
        from minillm.models.registry import BUNDLED_DIR
        from minillm.training.bundled import train_all
        train_all(args.out or BUNDLED_DIR, args.models, seed=args.seed, bf16=args.precision == "bf16")
    return 0


def _quantize(args) -> int:
    from minillm import LLM
    from minillm.quant import QuantConfig, linear_weight_bytes, save_quantized
    try:
        extra = {} if args.projections is None else {"projections": tuple(args.projections)}
        config = QuantConfig(args.scheme, group_size=args.group_size, layers=args.layers, **extra)
        llm = LLM(args.model, quantization=config, device="cpu", dtype="float32")
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = save_quantized(llm.model, llm.engine.model_dir, args.out)
    b = linear_weight_bytes(llm.model)
    print(f"{config.label()}: {b['quantized']:,} bytes for the quantized matrices "
          f"({b['quantized'] / b['quantized_fp32']:.3f}x float32), {b['total']:,} bytes in all -> {out}")
    return 0


def _generate(args) -> int:
    from minillm import LLM, SamplingParams
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                                top_p=args.top_p, seed=args.seed, ignore_eos=args.ignore_eos)
        llm = LLM(args.model, device=args.device, dtype=args.dtype)
        start = time.perf_counter()
        print(args.prompt, end="", flush=True)
        output = None
        for chunk in llm.stream(args.prompt, params):
            print(chunk.text, end="", flush=True)
            output = chunk.output or output
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    m = output.metrics
    decode = f"{1 / m['tpot']:.1f} tokens/s" if m["tpot"] else "n/a (one token)"
    print(f"\n\n[{llm.config.model} on {llm.engine.device}, {llm.engine.dtype}] "
          f"TTFT {m['ttft'] * 1000:.1f} ms | decode {decode} | {m['output_tokens']} tokens in "
          f"{time.perf_counter() - start:.2f} s | finish: {output.finish_reason}")
    return 0


def _chat(args) -> int:
    from minillm import LLM, SamplingParams
    from minillm.models.registry import preferred_model
    from minillm.terminal_chat import chat
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p)
        llm = LLM(args.model or preferred_model(), device=args.device, dtype=args.dtype)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return chat(llm, params, args.system)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and `localhost`; any other name could resolve to a public address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def request_limits(args):
    """issue 50: the server's RequestLimits from its flags (the defaults where a flag is not given); a flag
    out of range raises ValueError."""
    from minillm.serve.limits import RequestLimits
    given = {name: getattr(args, name) for name in ("max_stop_strings", "max_stop_chars")
             if getattr(args, name) is not None}
    return RequestLimits(**given)


def _serve(args) -> int:
    if not is_loopback(args.host) and not (args.allow_remote and args.api_key):
        flags = (("--allow-remote", args.allow_remote), ("--api-key KEY", args.api_key))
        missing = " and ".join(flag for flag, given in flags if not given)
        print(f"error: refusing to bind {args.host!r}, which is not a loopback address: anyone who can reach "
              f"this machine could use the server. Pass {missing} to serve other machines, or bind 127.0.0.1.",
              file=sys.stderr)
        return 2
    from minillm.serve.connection_limits import ConnectionLimits
    from minillm.serve.server import run_server
    from minillm.structured.grammar import GrammarLimits
    engine = dict(scheduler=args.scheduler, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                  device=args.device, dtype=args.dtype)
    tuned = {"max_num_batched_tokens": args.max_num_batched_tokens, "block_size": args.block_size,
             "num_kv_blocks": args.num_kv_blocks, "enable_prefix_caching": False if args.no_prefix_caching else None,
             "enable_chunked_prefill": False if args.no_chunked_prefill else None}
    engine.update({k: v for k, v in tuned.items() if v is not None})
    if args.quantization:
        from minillm.quant import QuantConfig
        engine["quantization"] = QuantConfig(args.quantization)
    try:
        connections = ConnectionLimits(args.max_header_bytes, args.header_timeout, args.read_timeout,
                                       args.max_connections)
        grammar_limits = GrammarLimits(args.grammar_compile_timeout, args.grammar_cache_bytes)
        return run_server(args.model, args.host, args.port, grace_period=args.grace_period, engine_options=engine,
                          connection_limits=connections, grammar_limits=grammar_limits,
                          api_key=args.api_key, max_waiting=args.max_waiting,
                          limits=request_limits(args),  # issue 50
                          **({"max_body_bytes": args.max_body_bytes} if args.max_body_bytes else {}),
                          **({"model_name": args.served_model_name} if args.served_model_name else {}))
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _route(args) -> int:
    """Route until SIGINT/SIGTERM, then stop the router and the replicas it launched."""
    import signal
    import threading

    from minillm.router.fleet import Fleet, route_in_thread
    try:
        if args.upstream:
            fleet, router = None, route_in_thread(args.upstream, port=args.port, policy=args.policy,
                                                  model=args.model or "tiny")
        else:
            fleet = Fleet.start(args.replicas, args.model, args.policy, port=args.port)
            router = fleet.router
    except (ValueError, FileNotFoundError, RuntimeError, TimeoutError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    urls = ", ".join(r.url for r in router.app.state.router.state.replicas)
    print(f"routing {router.base_url} -> {urls} ({args.policy}); Ctrl-C stops", flush=True)
    done.wait()
    (fleet or router).stop()
    return 0
