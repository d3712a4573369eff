// Paged decode attention for the CPU, the kernel's work (kernels/paged_decode_cpu.cpp calls it through ctypes,
// layers/cpu_ops.cpp inside a whole decoder layer): one query token per sequence, over its context where it lies in
// the paged pool (no gather, no padding to the batch's longest context). The CPU twin of the Triton kernel in
// kernels/paged_decode.py; its plain-PyTorch reference is paged_decode_spec there.
//
// For sequence b and kv head h, the `group` query heads that share h are served together, so each key
// and value row is read once for all of them (GQA):
//   pass 1: s[g, t] = scale * q[g] . k[t]  for every token t of the context, and each row's max;
//   pass 2: p = exp(s - max), out[g] = sum_t p[g, t] * v[t] / sum_t p[g, t].
// Token t of sequence b lies in slot table[b][t / block_size] * block_size + t % block_size; a block's
// tokens are contiguous, so both passes walk the table a block at a time.
// Within a block, the scores are computed four keys at a time (one load of q serves four keys) and the
// weighted values sixteen columns at a time with their sums held in registers; exp is computed eight at a
// time (exp8). Against the first version, which took one dot product and one row update at a time with the C
// library's exp, a layer of SmolLM2 (9 query heads on 3 kv heads of 64, 260 tokens of context) went from 44 to
// 19 us on one core of the 2-core AMD EPYC, and a batch of 16 from 730 to 367 us.
// Each block's keys are asked for while the block before is scored, and its values (for pass 2) while it is: a
// batch of 16 at 320 tokens of context reads 7.9 MB of K/V a layer, scattered a block at a time, and over 30 such
// layers (236 MB, as a SmolLM2 step) the kernel took 28.3 ms without and 22.8 with (one core of the 2-core Intel
// Xeon; 2 cores: 16.3 -> 13.9; with the K/V in the caches 16 ms either way).
// The (sequence, kv head) pairs are shared out among the OpenMP threads torch runs on.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "vec.h"  // f8, load8, store8, sum8, exp8

namespace paged {

using namespace vec;

// a . b over d floats: two vector accumulators (two independent chains of multiply-adds), then the rest.
inline float dot(const float* a, const float* b, int64_t d) {
    f8 s0 = {}, s1 = {};
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
        s0 += load8(a + i) * load8(b + i);
        s1 += load8(a + i + 8) * load8(b + i + 8);
    }
    for (; i + 8 <= d; i += 8) s0 += load8(a + i) * load8(b + i);
    float s = sum8(s0 + s1);
    for (; i < d; ++i) s += a[i] * b[i];
    return s;
}

// s[i] = scale * q . rows[i * stride : i * stride + d] for i < n, four rows at a time: each load of q serves
// four rows, and the four sums are four independent chains of multiply-adds.
inline void score_rows(const float* q, const float* rows, int64_t stride, int64_t n, float scale, float* s,
                       int64_t d) {
    int64_t i = 0;
    if (d % 8 == 0) {
        for (; i + 4 <= n; i += 4) {
            const float* r = rows + i * stride;
            f8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
            for (int64_t c = 0; c < d; c += 8) {
                const f8 qc = load8(q + c);
                a0 += qc * load8(r + c);
                a1 += qc * load8(r + stride + c);
                a2 += qc * load8(r + 2 * stride + c);
                a3 += qc * load8(r + 3 * stride + c);
            }
            s[i] = scale * sum8(a0);
            s[i + 1] = scale * sum8(a1);
            s[i + 2] = scale * sum8(a2);
            s[i + 3] = scale * sum8(a3);
        }
    }
    for (; i < n; ++i) s[i] = scale * dot(q, rows + i * stride, d);
}

// acc[:d] += sum over i < n of p[i] * rows[i * stride : i * stride + d], sixteen columns at a time: the
// running sums stay in registers across the rows, and acc is read and written once per call, not once a row.
inline void weigh_rows(const float* p, const float* rows, int64_t stride, int64_t n, float* acc, int64_t d) {
    int64_t c = 0;
    for (; c + 16 <= d; c += 16) {
        f8 a0 = load8(acc + c), a1 = load8(acc + c + 8);
        for (int64_t i = 0; i < n; ++i) {
            const float* r = rows + i * stride + c;
            a0 += p[i] * load8(r);
            a1 += p[i] * load8(r + 8);
        }
        store8(acc + c, a0);
        store8(acc + c + 8, a1);
    }
    for (; c + 8 <= d; c += 8) {
        f8 a = load8(acc + c);
        for (int64_t i = 0; i < n; ++i) a += p[i] * load8(rows + i * stride + c);
        store8(acc + c, a);
    }
    for (; c < d; ++c)
        for (int64_t i = 0; i < n; ++i) acc[c] += p[i] * rows[i * stride + c];
}

// Asks for rows[i * stride : i * stride + d], i < n, ahead of their use (Locality 3: into the L1 cache, 2: L2).
template <int Locality>
inline void prefetch_rows(const float* rows, int64_t stride, int64_t n, int64_t d) {
    for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < d; c += 16) __builtin_prefetch(rows + i * stride + c, 0, Locality);  // a cache line
}

// s[t] = e^(s[t] - m) for t < n -> their sum.
inline float exp_shifted(float* s, int64_t n, float m) {
    f8 total = {};
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        const f8 e = exp8(load8(s + t) - m);
        store8(s + t, e);
        total += e;
    }
    float sum = sum8(total);
    for (; t < n; ++t) sum += (s[t] = std::exp(s[t] - m));
    return sum;
}

// The step's new K/V (k, v: [tokens, kv_heads, d] rows k_row_stride and v_row_stride floats apart, each head's d
// contiguous and the heads d apart) written to their slots of the pools ([slots, kv_heads, d]); a negative slot is skipped.
inline void store(const float* k, int64_t k_row_stride, const float* v, int64_t v_row_stride,
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
inline void decode(const float* q, int64_t q_row_stride, const float* k_slots, const float* v_slots,
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
                prefetch_rows<2>(v_slots + (kb - k_slots), slot_stride, n, d);  // this block's values, for pass 2
                if (t0 + block_size < length)  // the next block's keys
                    prefetch_rows<3>(k_slots + (int64_t)table[t0 / block_size + 1] * block_size * slot_stride + h * d,
                                     slot_stride, std::min(block_size, length - t0 - block_size), d);
                for (int64_t g = 0; g < group; ++g)
                    score_rows(qb + g * d, kb, slot_stride, n, scale, scores.data() + g * length + t0, d);
            }
            for (int64_t g = 0; g < group; ++g) {  // softmax numerators, shifted by each row's max
                float* s = scores.data() + g * length;
                total[g] = exp_shifted(s, length, *std::max_element(s, s + length));
            }
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int64_t t0 = 0; t0 < length; t0 += block_size) {  // pass 2: the values, weighted, a block at a time
                const float* vb = v_slots + (int64_t)table[t0 / block_size] * block_size * slot_stride + h * d;
                const int64_t n = std::min(block_size, length - t0);
                for (int64_t g = 0; g < group; ++g)
                    weigh_rows(scores.data() + g * length + t0, vb, slot_stride, n, acc.data() + g * d, d);
            }
            for (int64_t g = 0; g < group; ++g)
                for (int64_t i = 0; i < d; ++i) ob[g * d + i] = acc[g * d + i] / total[g];
        }
    }
}

}  // namespace paged
