// Paged decode attention for the CPU, called through ctypes from paged_decode_cpu.py: the Triton kernel's interface
// (paged_decode.py) over the work in minillm/cpp/paged_attention.h, which layers/cpu_ops.cpp also runs inside a
// whole decoder layer. Built by minillm/cpp (g++ -O3 -march=native -fopenmp).
#include <cstdint>

#include "paged_attention.h"  // minillm/cpp: paged::store, paged::decode

extern "C" {

// q: [tokens, heads, d] rows q_row_stride floats apart (heads d apart); k_slots, v_slots: [slots, kv_heads, d]
// contiguous; tables: int32 [batch, table_width]; context_lens, rows: int32 [batch] (rows: each sequence's
// row of q and out); out: [tokens, heads, d] contiguous, rows `rows` written.
void paged_decode_f32(const float* q, int64_t q_row_stride, const float* k_slots, const float* v_slots,
                      const int32_t* tables, int64_t table_width, const int32_t* context_lens, const int32_t* rows,
                      float* out, int64_t batch, int64_t heads, int64_t kv_heads, int64_t d, int64_t block_size,
                      float scale, int threads) {
    paged::decode(q, q_row_stride, k_slots, v_slots, tables, table_width, context_lens, rows, out, batch, heads,
                  kv_heads, d, block_size, scale, threads);
}

// k, v: the step's new K/V, [tokens, kv_heads, d], each head's d contiguous and the heads d apart, rows
// k_row_stride and v_row_stride floats apart (splits of the q/k/v products); slot_mapping: int64 [tokens], a
// negative slot skipped. Stores them, then attends as paged_decode_f32: a layer's attention over the pool in one call.
void paged_store_decode_f32(const float* k, int64_t k_row_stride, const float* v, int64_t v_row_stride,
                            const int64_t* slot_mapping,
                            int64_t tokens, const float* q, int64_t q_row_stride, float* k_slots, float* v_slots,
                            const int32_t* tables, int64_t table_width, const int32_t* context_lens,
                            const int32_t* rows, float* out, int64_t batch, int64_t heads, int64_t kv_heads,
                            int64_t d, int64_t block_size, float scale, int threads) {
    paged::store(k, k_row_stride, v, v_row_stride, slot_mapping, tokens, k_slots, v_slots, kv_heads, d);
    paged::decode(q, q_row_stride, k_slots, v_slots, tables, table_width, context_lens, rows, out, batch, heads,
                  kv_heads, d, block_size, scale, threads);
}

}  // extern "C"
