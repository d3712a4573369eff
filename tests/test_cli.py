"""The command line, run as a user would."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.subprocess


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minillm", *args], capture_output=True, text=True, timeout=120)


def test_generate_streams_text_and_reports_speed(hf_llama):
    res = run_cli("generate", "--model", str(hf_llama[0]), "--prompt", "def f(x):", "--max-tokens", "12",
                  "--ignore-eos")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("def f(x):")
    assert "TTFT" in res.stdout and "tokens/s" in res.stdout and "12 tokens" in res.stdout


def test_generate_reports_bad_input_without_a_traceback(hf_llama):
    res = run_cli("generate", "--model", str(hf_llama[0]), "--prompt", "x", "--max-tokens", "0")
    assert res.returncode == 2
    assert "max_tokens must be an integer >= 1" in res.stderr and "Traceback" not in res.stderr
