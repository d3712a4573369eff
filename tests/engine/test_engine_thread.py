"""The engine thread at interpreter exit: an AsyncLLM left with requests running, or dropped without a
shutdown, ends the process cleanly (exit code 0, nothing on stderr), its engine thread stopped first."""
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import asyncio, gc, sys, threading
    from minillm import AsyncLLM, SamplingParams

    async def use_once(llm):  # eight long requests: the engine thread is inside a step when the script ends
        params = SamplingParams(max_tokens=480, ignore_eos=True)
        streams = [await llm.start("def add(a, b):", params, f"r{i}") for i in range(8)]
        return await anext(streams[0])

    llm = AsyncLLM("tiny")
    asyncio.run(use_once(llm))
    if sys.argv[1] == "drop":
        thread = next(t for t in threading.enumerate() if t.name == "minillm-engine")
        del llm
        gc.collect()
        if sys.argv[2] == "wait":
            thread.join(30)
            assert not thread.is_alive(), "the engine thread outlived its AsyncLLM"
    print("done")
""")


@pytest.mark.subprocess
@pytest.mark.parametrize("how", [("keep",), ("drop", "now"), ("drop", "wait")])
def test_an_async_llm_never_shut_down_leaves_a_clean_exit(how):
    """keep: still referenced at exit; drop: garbage-collected, the process ending at once or once its
    engine thread has stopped. A daemon thread still in a step when the interpreter finalizes is ended
    inside torch's C++ as it takes the GIL back: "terminate called without an active exception", abort."""
    run = subprocess.run([sys.executable, "-c", SCRIPT, *how], capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stdout, run.stderr) == (0, "done\n", ""), run.stderr[-2000:]
