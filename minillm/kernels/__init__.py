"""Triton kernels, each beside the plain-PyTorch spec it must match.

    vector_add.py       the first kernel: blocks, masks, program ids
    fused_add_rmsnorm.py  the residual add fused into RMSNorm (one read of each row, one write)
    softmax.py          row softmax, numerically stable; online over blocks for long rows
    matmul.py           tiled matmul with a K loop
    int4_format.py      the engine's packed int4 format, read by int4_matmul (plain PyTorch, no triton)
    int4_matmul.py      int4 dequantize fused into the matmul
    store_kv.py         write a step's K/V into the paged pool through the slot mapping
    paged_decode.py     decode attention through block tables, GQA-aware, split over long contexts
    prefill_attention.py  causal FlashAttention over a flattened batch, through block tables
    guard.py            buffers with guard regions: catch out-of-bounds reads and writes in tests

One CPU module sits beside them, without triton: paged_decode_cpu.py is paged_decode's job in C++ (the
engine's decode attention on a CPU), built once per machine by minillm/cpp.

Without a GPU they run on the CPU in Triton's interpreter (`runtime.py` sets TRITON_INTERPRET=1
before any kernel is defined, whenever triton itself was imported): slow, but the same kernels,
so their results can be checked anywhere.
Import a kernel module only when it is needed: importing one imports triton (int4_format and
guard do not).
"""
