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
// Within a block, the group's heads are scored together, a tile of keys at a time: each key vector loaded serves
// every head of the group and each query vector every key of the tile (sixteen floats a vector with AVX-512, eight
// elsewhere); the weighted values likewise, each value vector loaded once for the group's heads, the sums held in
// registers; exp is computed eight at a time (exp8). Against the first version, which took one dot product and one
// row update at a time with the C library's exp, a layer of SmolLM2 (9 query heads on 3 kv heads of 64, 260 tokens
// of context) went from 44 to 19 us on one core of the 2-core AMD EPYC, and a batch of 16 from 730 to 367 us; serving
// the group's heads together, not one after another, took 30 such layers of a batch of 16 at 320 tokens from 25.0 to
// 21.1 ms with the K/V in the caches, and 34.6 to 32.2 ms from memory (one core of the 2-core Intel Xeon).
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
#include <type_traits>
#include <vector>

#include "vec.h"  // f8, lanes, load8, load_lanes, store8, sum8, sum_lanes, exp8

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

// The query heads of a group scored together: keys a tile at a time, each key vector loaded once for all G heads
// and each query vector once for KEYS keys, G * KEYS sums in registers (on AVX2's 16 registers, half the keys).
constexpr int KEYS = LANES == 16 ? 4 : 2;

// s[g * ls + i] = scale * q[g] . rows[i * stride : i * stride + d] for the G query heads (q: d apart) and i < n.
template <int G>
inline void score_heads(const float* q, const float* rows, int64_t stride, int64_t n, float scale, float* s,
                        int64_t ls, int64_t d) {
    int64_t i = 0;
    if (d % 8 == 0) {
        const int64_t whole = d - d % LANES;  // the rest, eight floats (AVX-512 and d = 24, say), once at the end
        for (; i + KEYS <= n; i += KEYS) {
            const float* r = rows + i * stride;
            lanes acc[G][KEYS] = {};
            for (int64_t c = 0; c < whole; c += LANES) {
                lanes kv[KEYS];
#pragma GCC unroll 4
                for (int j = 0; j < KEYS; ++j) kv[j] = load_lanes(r + j * stride + c);
#pragma GCC unroll 4
                for (int g = 0; g < G; ++g) {
                    const lanes qv = load_lanes(q + g * d + c);
#pragma GCC unroll 4
                    for (int j = 0; j < KEYS; ++j) acc[g][j] += qv * kv[j];
                }
            }
            for (int g = 0; g < G; ++g)
                for (int j = 0; j < KEYS; ++j) {
                    float sum = sum_lanes(acc[g][j]);
                    if (whole < d) sum += sum8(load8(q + g * d + whole) * load8(r + j * stride + whole));
                    s[g * ls + i + j] = scale * sum;
                }
        }
    }
    for (; i < n; ++i)
        for (int g = 0; g < G; ++g) s[g * ls + i] = scale * dot(q + g * d, rows + i * stride, d);
}

// acc[g * d : (g + 1) * d] += sum over i < n of p[g * ls + i] * rows[i * stride : i * stride + d] for the G heads:
// each load of a value vector serves G heads, and the running sums stay in registers across the rows.
template <int G>
inline void weigh_heads(const float* p, int64_t ls, const float* rows, int64_t stride, int64_t n, float* acc,
                        int64_t d) {
    int64_t c = 0;
    for (; c + 2 * LANES <= d; c += 2 * LANES) {
        lanes a[G][2];
        for (int g = 0; g < G; ++g) {
            a[g][0] = load_lanes(acc + g * d + c);
            a[g][1] = load_lanes(acc + g * d + c + LANES);
        }
        for (int64_t i = 0; i < n; ++i) {
            const lanes v0 = load_lanes(rows + i * stride + c), v1 = load_lanes(rows + i * stride + c + LANES);
#pragma GCC unroll 4
            for (int g = 0; g < G; ++g) {
                const float pg = p[g * ls + i];
                a[g][0] += pg * v0;
                a[g][1] += pg * v1;
            }
        }
        for (int g = 0; g < G; ++g) {
            std::memcpy(acc + g * d + c, &a[g][0], sizeof(lanes));
            std::memcpy(acc + g * d + c + LANES, &a[g][1], sizeof(lanes));
        }
    }
    for (; c + 8 <= d; c += 8) {
        f8 a[G];
        for (int g = 0; g < G; ++g) a[g] = load8(acc + g * d + c);
        for (int64_t i = 0; i < n; ++i) {
            const f8 v = load8(rows + i * stride + c);
            for (int g = 0; g < G; ++g) a[g] += p[g * ls + i] * v;
        }
        for (int g = 0; g < G; ++g) store8(acc + g * d + c, a[g]);
    }
    for (; c < d; ++c)
        for (int g = 0; g < G; ++g)
            for (int64_t i = 0; i < n; ++i) acc[g * d + c] += p[g * ls + i] * rows[i * stride + c];
}

template <int G>
using heads = std::integral_constant<int, G>;

// f(heads<G>, g0) for each run of G <= 4 of a group's heads, g0 the first: 1, 2, 3 and 4 heads compile to loops of
// their own, and a larger group (MQA's every head on one kv head, say) goes four at a time.
template <typename F>
inline void by_heads(int64_t group, F f) {
    for (int64_t g0 = 0; g0 < group; g0 += 4) {
        switch (std::min<int64_t>(4, group - g0)) {
            case 1: f(heads<1>{}, g0); break;
            case 2: f(heads<2>{}, g0); break;
            case 3: f(heads<3>{}, g0); break;
            default: f(heads<4>{}, g0);
        }
    }
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
                by_heads(group, [&](auto g, int64_t g0) {  // the heads' scores: rows `length` floats apart
                    score_heads<g.value>(qb + g0 * d, kb, slot_stride, n, scale, scores.data() + g0 * length + t0,
                                         length, d);
                });
            }
            for (int64_t g = 0; g < group; ++g) {  // softmax numerators, shifted by each row's max
                float* s = scores.data() + g * length;
                total[g] = exp_shifted(s, length, *std::max_element(s, s + length));
            }
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int64_t t0 = 0; t0 < length; t0 += block_size) {  // pass 2: the values, weighted, a block at a time
                const float* vb = v_slots + (int64_t)table[t0 / block_size] * block_size * slot_stride + h * d;
                const int64_t n = std::min(block_size, length - t0);
                by_heads(group, [&](auto g, int64_t g0) {
                    weigh_heads<g.value>(scores.data() + g0 * length + t0, length, vb, slot_stride, n,
                                         acc.data() + g0 * d, d);
                });
            }
            for (int64_t g = 0; g < group; ++g)
                for (int64_t i = 0; i < d; ++i) ob[g * d + i] = acc[g * d + i] / total[g];
        }
    }
}

}  // namespace paged
