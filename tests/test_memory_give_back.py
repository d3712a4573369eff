"""minillm.testing.give_memory_back, which keeps the suite's workers small: it collects and trims when asked
unconditionally, and with `grown` only once the process has grown by that much since it last did."""
import torch

from minillm.testing import give_memory_back, resident_bytes


def test_give_back_with_grown_waits_for_the_process_to_grow_that_much():
    assert give_memory_back()                         # unconditional: it runs
    assert not give_memory_back(grown=256 << 20)      # nothing grew since: a collection would find nothing new
    before = resident_bytes()
    grown = torch.ones(320 << 18)                     # 320 MiB of float32, every page written
    assert resident_bytes() - before >= 300 << 20
    assert give_memory_back(grown=256 << 20)
    del grown
    assert not give_memory_back(above=1 << 50)        # `above` still bounds it: no process is a petabyte
