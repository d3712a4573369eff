"""`python -m minillm chat`, run as a user would, its turns piped in on standard input."""
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.subprocess

SYSTEM = "You are a helpful assistant who writes short Python functions."  # over one block: turn 2 can hit it
STATS = re.compile(r"\[TTFT (\d+) ms \| decode ([\d.]+) tokens/s \| prefix cache served (\d+) of (\d+) prompt tokens "
                   r"\| (\d+) tokens, (stop|length)\]")


def chat(stdin: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minillm", "chat", "--model", "tiny", "--max-tokens", "8",
                           "--temperature", "0", *args], input=stdin, capture_output=True, text=True, timeout=300)


def test_two_turns_stream_with_stats_and_the_second_reuses_the_first_from_the_prefix_cache():
    res = chat("def fib(n):\nclass Stack:\n", "--system", SYSTEM)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("minillm chat with tiny on cpu: a small code model with no chat template")
    turns = [tuple(map(float, m.groups()[:5])) for m in STATS.finditer(res.stdout)]
    assert len(turns) == 2, res.stdout
    (_, _, hit1, prompt1, out1), (_, _, hit2, prompt2, out2) = turns
    assert hit1 == 0 and out1 == out2 == 8
    assert prompt2 > prompt1 + out1, "turn 2's prompt holds the whole conversation"
    assert hit2 >= 16, "at least the first turn's full block came from the prefix cache"


def test_reset_starts_a_new_conversation_and_exit_ends():
    res = chat("def fib(n):\nclass Stack:\n/reset\nimport os\n/exit\nnever read\n", "--system", SYSTEM)
    assert res.returncode == 0, res.stderr
    prompts = [int(m.group(4)) for m in STATS.finditer(res.stdout)]
    assert len(prompts) == 3 and "(a new conversation)" in res.stdout
    assert prompts[2] < prompts[1], "after /reset the prompt is the system message and the new turn only"


def test_a_bad_option_is_reported_without_a_traceback():
    res = chat("", "--max-tokens", "0")
    assert res.returncode == 2
    assert "max_tokens must be an integer >= 1" in res.stderr and "Traceback" not in res.stderr
