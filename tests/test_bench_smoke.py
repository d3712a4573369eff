"""Benchmarks are commands, not timed tests; these only prove the cheap ones still run and agree
with what they measure (no timing is asserted)."""
from minillm.bench import memory


def test_memory_benchmark_measures_paged_waste_below_contiguous(capsys):
    figures = memory.run(quick=True)
    paged, contiguous = figures["paged, block 16"], figures["contiguous, max_model_len"]
    assert paged["waste"] < 0.04 < contiguous["waste"]
    assert paged["concurrency"] > contiguous["concurrency"]
    assert "KV waste" in capsys.readouterr().out
