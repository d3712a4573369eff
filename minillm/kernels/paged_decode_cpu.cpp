// Paged decode attention for the CPU: one query token per sequence, over its context where it lies in
// the paged pool (no gather, no padding to the batch's longest context). The CPU twin of the Triton
// kernel in paged_decode.py, with its interface; its plain-PyTorch reference is paged_decode_spec there.
// Built by minillm/kernels/cpp.py (g++ -O3 -march=native -fopenmp) and called through ctypes from
// paged_decode_cpu.py.
//
// For sequence b and kv head h, the `group` query heads that share h are served together, so each key
// and value row is read once for all of them (GQA):
//   pass 1: s[g, t] = scale * q[g] . k[t]  for every token t of the context, and each row's max;
//   pass 2: p = exp(s - max), out[g] = sum_t p[g, t] * v[t] / sum_t p[g, t].
// Token t of sequence b lies in slot table[b][t / block_size] * block_size + t % block_size; a block's
// tokens are contiguous, so both passes walk the table a block at a time.
// The (sequence, kv head) pairs are shared out among the OpenMP threads torch runs on.
// paged_store_decode_f32 first writes the step's new K/V into their slots (store_kv.py's job), so that a
// layer's attention over the pool is one call.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

inline float dot(const float* a, const float* b, int64_t d) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < d; ++i) s += a[i] * b[i];
    return s;
}

inline void axpy(float a, const float* x, float* y, int64_t d) {
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) y[i] += a * x[i];
}

}  // namespace

extern "C" {

static void store(const float* k, int64_t k_row_stride, const float* v, int64_t v_row_stride,
                  const int64_t* slot_mapping, int64_t tokens, float* k_slots, float* v_slots, int64_t kv_heads,
                  int64_t d) {
    const int64_t width = kv_heads * d;
    for (int64_t t = 0; t < tokens; ++t) {
        const int64_t slot = slot_mapping[t];
        if (slot < 0) continue;  // a padded row: no slot
        for (int64_t h = 0; h < kv_heads; ++h)
            for (int64_t i = 0; i < d; ++i) {  // each head's d contiguous, the heads d apart
                k_slots[slot * width + h * d + i] = k[t * k_row_stride + h * d + i];
                v_slots[slot * width + h * d + i] = v[t * v_row_stride + h * d + i];
            }
    }
}

// q: [tokens, heads, d] rows q_row_stride floats apart (heads d apart); k_slots, v_slots: [slots, kv_heads, d]
// contiguous; tables: int32 [batch, table_width]; context_lens, rows: int32 [batch] (rows: each sequence's
// row of q and out); out: [tokens, heads, d] contiguous, rows `rows` written.
void paged_decode_f32(const float* q, int64_t q_row_stride, const float* k_slots, const float* v_slots,
                      const int32_t* tables, int64_t table_width, const int32_t* context_lens, const int32_t* rows,
                      float* out, int64_t batch, int64_t heads, int64_t kv_heads, int64_t d, int64_t block_size,
                      float scale, int threads) {
    const int64_t group = heads / kv_heads, slot_stride = kv_heads * d;
#pragma omp parallel num_threads(threads)
    {
        std::vector<float> scores, acc(group * d), total(group);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < batch * kv_heads; ++task) {
            const int64_t b = task / kv_heads, h = task % kv_heads, length = context_lens[b];
            const float* qb = q + rows[b] * q_row_stride + h * group * d;  // the group's query heads, d apart
            float* ob = out + rows[b] * heads * d + h * group * d;
            const int32_t* table = tables + b * table_width;
            if (length <= 0) {  // nothing to attend to: zeros, as a softmax over no keys would not define
                std::fill(ob, ob + group * d, 0.0f);
                continue;
            }
            scores.resize(group * length);
            for (int64_t t0 = 0; t0 < length; t0 += block_size) {  // pass 1: scores, a block at a time
                const float* kb = k_slots + (int64_t)table[t0 / block_size] * block_size * slot_stride + h * d;
                const int64_t n = std::min(block_size, length - t0);
                for (int64_t i = 0; i < n; ++i)
                    for (int64_t g = 0; g < group; ++g)
                        scores[g * length + t0 + i] = scale * dot(qb + g * d, kb + i * slot_stride, d);
            }
            for (int64_t g = 0; g < group; ++g) {  // softmax numerators, shifted by each row's max
                float* s = scores.data() + g * length;
                const float m = *std::max_element(s, s + length);
                float sum = 0.0f;
                for (int64_t t = 0; t < length; ++t) sum += (s[t] = std::exp(s[t] - m));
                total[g] = sum;
            }
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int64_t t0 = 0; t0 < length; t0 += block_size) {  // pass 2: the values, weighted
                const float* vb = v_slots + (int64_t)table[t0 / block_size] * block_size * slot_stride + h * d;
                const int64_t n = std::min(block_size, length - t0);
                for (int64_t i = 0; i < n; ++i)
                    for (int64_t g = 0; g < group; ++g)
                        axpy(scores[g * length + t0 + i], vb + i * slot_stride, acc.data() + g * d, d);
            }
            for (int64_t g = 0; g < group; ++g)
                for (int64_t i = 0; i < d; ++i) ob[g * d + i] = acc[g * d + i] / total[g];
        }
    }
}

// k, v: the step's new K/V, [tokens, kv_heads, d], each head's d contiguous and the heads d apart, rows
// k_row_stride and v_row_stride floats apart (splits of the q/k/v products); slot_mapping: int64 [tokens], a
// negative slot skipped. Stores them, then attends as paged_decode_f32.
void paged_store_decode_f32(const float* k, int64_t k_row_stride, const float* v, int64_t v_row_stride,
                            const int64_t* slot_mapping,
                            int64_t tokens, const float* q, int64_t q_row_stride, float* k_slots, float* v_slots,
                            const int32_t* tables, int64_t table_width, const int32_t* context_lens,
                            const int32_t* rows, float* out, int64_t batch, int64_t heads, int64_t kv_heads,
                            int64_t d, int64_t block_size, float scale, int threads) {
    store(k, k_row_stride, v, v_row_stride, slot_mapping, tokens, k_slots, v_slots, kv_heads, d);
    paged_decode_f32(q, q_row_stride, k_slots, v_slots, tables, table_width, context_lens, rows, out, batch, heads,
                     kv_heads, d, block_size, scale, threads);
}

}  // extern "C"
