// A decoder layer's operators in C++ for the CPU, in float32: the product of a few rows by a weight (single-stream
// decode, speculative verification), and the small operators between the matrix products, fused: the residual add
// with the RMSNorm after it, rotary embeddings in place, SwiGLU's SiLU-and-multiply; and, for a decode step, the
// whole layer in one call made of them (decoder_layer_f32, at the end). Built by minillm/cpp (g++ -O3 -march=native
// -fopenmp) and called through ctypes from cpu_ops.py and models/cpu_decode.py; linear.py, rmsnorm.py, rotary.py and
// mlp.py keep the plain-PyTorch formulas, which are their reference in the tests.
//
// Why: a decode step streams every weight from memory once. The product reads each weight once for every row of x
// (up to 31 at a time with AVX-512), in an order the memory system can fetch ahead of the multiply-adds: at one row
// it streams the weights as fast as the core reaches into memory (with huge pages, models/huge_pages.py, SmolLM2's
// 540 MB at 32 GB/s on one core of the 2-core AMD EPYC, against 17-20 for torch's F.linear), and a batch of 16 or 24
// rows costs little more than one. And between two weight streams the cache holds none of the code or data of the
// operators in between: PyTorch's rms_norm is about ten operator calls, rotary four, SiLU-and-multiply three, each
// paying Python, the dispatcher and cold caches; here each is one call that reads its rows once. Rows (or the
// weight's panels) are shared out among the OpenMP threads torch runs on when there are many.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <vector>

#include "paged_attention.h"  // minillm/cpp: paged::store, paged::decode (decoder_layer_f32's attention)
#include "vec.h"  // minillm/cpp: f8, f16, lanes, i8, load8, load16, load_lanes, broadcast16, store8, sum8, exp8

namespace {

using namespace vec;

constexpr int64_t PARALLEL_ELEMENTS = 1 << 16;  // below this many floats, one thread: waking the others costs more

// y = h / sqrt(mean(h^2) + eps) * w over one row of n floats
void norm_row(const float* h, const float* w, float* y, int64_t n, float eps) {
    f8 s0 = {}, s1 = {};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const f8 a = load8(h + i), b = load8(h + i + 8);
        s0 += a * a;
        s1 += b * b;
    }
    float squares = sum8(s0 + s1);
    for (; i < n; ++i) squares += h[i] * h[i];
    const float r = 1.0f / std::sqrt(squares / static_cast<float>(n) + eps);
    i = 0;
    for (; i + 8 <= n; i += 8) store8(y + i, load8(h + i) * r * load8(w + i));
    for (; i < n; ++i) y[i] = h[i] * r * w[i];
}

// silu(x) = x * sigmoid(x), eight at a time, with exp8 of -|x| only (it takes x <= 0): for x >= 0,
// sigmoid(x) = 1 / (1 + e^-x); for x < 0, e^x / (1 + e^x).
inline f8 silu8(f8 x) {
    i8 bits;
    std::memcpy(&bits, &x, sizeof bits);
    const i8 abs_bits = bits & 0x7fffffff;
    f8 minus_abs;
    std::memcpy(&minus_abs, &abs_bits, sizeof minus_abs);
    const f8 e = exp8(-minus_abs);  // e^-|x|, in (0, 1]
    const f8 one = {1, 1, 1, 1, 1, 1, 1, 1};
    const i8 negative = x < 0.0f;   // all ones where x < 0
    i8 e_bits, one_bits;
    std::memcpy(&e_bits, &e, sizeof e_bits);
    std::memcpy(&one_bits, &one, sizeof one_bits);
    const i8 numerator_bits = (e_bits & negative) | (one_bits & ~negative);
    f8 numerator;
    std::memcpy(&numerator, &numerator_bits, sizeof numerator);
    return x * numerator / (one + e);
}

inline float silu(float x) { return x >= 0.0f ? x / (1.0f + std::exp(-x)) : x * std::exp(x) / (1.0f + std::exp(x)); }

inline int threads_for(int64_t elements, int nthreads) { return elements >= PARALLEL_ELEMENTS ? nthreads : 1; }

// The weight's layout for the product. With AVX-512, in panels of PANEL = 16 of its rows (one vector, one cache line),
// each panel stored column by column: panel p holds w[16p + c][j] at [p][j][c] (cpu_ops.py `pack` makes the copy, the
// last panel padded with zeros). Elsewhere (AVX2, plain x86-64) the weight as nn.Linear holds it, [n, k] row by row,
// and PANEL = 0. MINILLM_WEIGHT_PANELS=0 or 1 picks either one for any build (the tests build both).
#ifndef MINILLM_WEIGHT_PANELS
#if defined(__AVX512F__)
#define MINILLM_WEIGHT_PANELS 1
#else
#define MINILLM_WEIGHT_PANELS 0
#endif
#endif

#if MINILLM_WEIGHT_PANELS
// The product by panels: a tile is one panel by up to MAX_TILE_ROWS rows of x, one sum of sixteen outputs a row, held
// in registers over the whole of k. Each step of k loads one vector of the panel (its sixteen weights at column j)
// and multiplies it by each row's x[i][j], broadcast from memory inside the multiply-add: MAX_TILE_ROWS sums and one
// weight vector fill AVX-512's 32 registers, and every weight is read from memory once for up to 31 rows (the last
// version, row by row: once per tile of 6 rows, the later reads from the caches). The panel streams through in order
// and the next one is asked for into L2 a line at a time as this one is read, so the memory system fetches it while
// the multiply-adds run (at 16 rows 72 ms without, 43 with; a panel further ahead 45-51, into L1 44). A pass over SmolLM2's 120 layer matrices, one core of the 2-core Intel Xeon, interleaved,
// ms, panels against the row-by-row tiles: 1 row 26.7 against 26.2, 4 rows 28.3 / 29.7, 8: 31.8 / 31.7,
// 16: 37.0 / 45.8, 24: 50.4 / 76.7, 31: 48.7 / 79.7; two threads 16 rows 24.7 / 33.2, 24: 31.8 / 44.9.
// A tile of one to three rows keeps two or four sums a row over alternate steps of k, so that the multiply-adds do not
// wait on each other. x is read transposed (xt[j][i]: each step's rows side by side); each output adds its products in
// the order of k (with two or four sums: each over its steps, then added pairwise).
constexpr int64_t PANEL = 16;
#if defined(__AVX512F__)
constexpr int MAX_TILE_ROWS = 31;  // 31 sums and the weight vector: AVX-512's 32 registers
#else
constexpr int MAX_TILE_ROWS = 6;   // 12 registers of sums (a pair of eight-float registers each) of AVX2's 16
#endif

template <int MR>
VEC_INLINE void panel_tile(const float* panel, const float* xt, int64_t m, int64_t k, const float* ahead, f16* out) {
    constexpr int SPLIT = MR == 1 ? 4 : MR <= 3 ? 2 : 1;
    f16 acc[SPLIT][MR] = {};
    int64_t j = 0;
    for (; j + SPLIT <= k; j += SPLIT) {
#pragma GCC unroll 4
        for (int s = 0; s < SPLIT; ++s) {
            const f16 w = load16(panel + (j + s) * PANEL);
            if (ahead) __builtin_prefetch(ahead + (j + s) * PANEL, 0, 2);
#pragma GCC unroll 32
            for (int i = 0; i < MR; ++i) acc[s][i] += w * broadcast16(xt[(j + s) * m + i]);
        }
    }
    for (; j < k; ++j) {
        const f16 w = load16(panel + j * PANEL);
#pragma GCC unroll 32
        for (int i = 0; i < MR; ++i) acc[0][i] += w * broadcast16(xt[j * m + i]);
    }
    for (int i = 0; i < MR; ++i) {
        if constexpr (SPLIT == 4) out[i] = (acc[0][i] + acc[1][i]) + (acc[2][i] + acc[3][i]);
        else if constexpr (SPLIT == 2) out[i] = acc[0][i] + acc[1][i];
        else out[i] = acc[0][i];
    }
}

// panel_tile<mr> for the sizes known at run time: each size compiles to a loop of its own
template <int MR>
void panel_tile_of(int mr, const float* panel, const float* xt, int64_t m, int64_t k, const float* ahead, f16* out) {
    if constexpr (MR > 1)
        if (mr < MR) return panel_tile_of<MR - 1>(mr, panel, xt, m, k, ahead, out);
    panel_tile<MR>(panel, xt, m, k, ahead, out);
}
#else
constexpr int64_t PANEL = 0;

// Without AVX-512 the weight is read as it is: built for AVX2 on the Intel Xeon, panels (6 rows a tile, in 12 of its
// 16 registers) were level at 1-4 rows and 4-14% slower than the tiles below at 8-32.
// The product's tile: NW rows of w by NX rows of x, NW * NX sums of sixteen lanes (eight without AVX-512) held in
// registers over the whole of k. Each step loads NW + NX vectors for NW * NX multiply-adds, so from two rows of x on
// the multiply-adds, not the loads, set the pace; and one row of x streams NW weight rows at once. On AVX2's 16
// registers 3 x 4 (12 + 3 + 1); built with MINILLM_WEIGHT_PANELS=0 for AVX-512, 4 x 6 (24 + 4 + 1 of 32).
// Every sum adds its products in the order of k, sixteen lanes at a time, then the lanes as a tree, then the tail.
#if defined(__AVX512F__)
constexpr int TILE_W = 4, TILE_X = 6;
#else
constexpr int TILE_W = 3, TILE_X = 4;
#endif

// y[i * n + r] = x[i] . w[r] for the tile's rows (x: rows k apart, w: rows k apart). `ahead`: the next weight rows,
// asked for into the L2 cache one tile ahead (null for the last tile): without it the weight stream stalls while the
// multiply-adds run.
template <int NW, int NX>
VEC_INLINE void tile(const float* x, const float* w, const float* ahead, int64_t k, float* y, int64_t n) {
    lanes acc[NW][NX] = {};
    int64_t j = 0;
    for (; j + LANES <= k; j += LANES) {
        lanes wv[NW];
#pragma GCC unroll 8
        for (int r = 0; r < NW; ++r) {
            if (ahead) __builtin_prefetch(ahead + r * k + j, 0, 2);
            wv[r] = load_lanes(w + r * k + j);
        }
#pragma GCC unroll 8
        for (int i = 0; i < NX; ++i) {
            const lanes xv = load_lanes(x + i * k + j);
#pragma GCC unroll 8
            for (int r = 0; r < NW; ++r) acc[r][i] += wv[r] * xv;
        }
    }
    for (int r = 0; r < NW; ++r)
        for (int i = 0; i < NX; ++i) {
            float s = sum_lanes(acc[r][i]);
            for (int64_t t = j; t < k; ++t) s += w[r * k + t] * x[i * k + t];
            y[i * n + r] = s;
        }
}

// tile<nw, nx> for the sizes known at run time (a block's last rows): each size compiles to a loop of its own
template <int NW, int NX>
void tile_of(int nw, int nx, const float* x, const float* w, const float* ahead, int64_t k, float* y, int64_t n) {
    if constexpr (NX > 1)
        if (nx < NX) return tile_of<NW, NX - 1>(nw, nx, x, w, ahead, k, y, n);
    if constexpr (NW > 1)
        if (nw < NW) return tile_of<NW - 1, NX>(nw, nx, x, w, ahead, k, y, n);
    tile<NW, NX>(x, w, ahead, k, y, n);
}
#endif

}  // namespace

extern "C" {

// The weight layout linear_f32 reads: rows in panels of this many (0: [n, k] row by row). cpu_ops.py asks.
int64_t weight_panel_f32() { return PANEL; }

// y = x w^T + bias for a few rows of x (decode: one a sequence; speculative verification: k + 1 a sequence): x [m, k]
// contiguous, w the weight [n, k] in the layout above (weight_panel_f32), bias [n] or null, y [m, n]. w is read from
// memory once for up to MAX_TILE_ROWS rows of x (panels) or TILE_X (rows), and the panels (or blocks of TILE_W rows)
// are shared out among the threads. Up to 32 rows (cpu_ops.py MAX_ROWS); oneDNN's packed copy (layers/linear.py),
// which the panels beat up to 48 rows, takes more.
void linear_f32(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n, int64_t k,
                int nthreads) {
#if MINILLM_WEIGHT_PANELS
    thread_local std::vector<float> transposed;  // xt [k, m]: each step of k's rows side by side
    transposed.resize(m * k);
    float* xt = transposed.data();
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < k; ++j) xt[j * m + i] = x[i * k + j];
    const int64_t panels = (n + PANEL - 1) / PANEL;
#pragma omp parallel for num_threads(threads_for(n * k, nthreads)) schedule(static)
    for (int64_t p = 0; p < panels; ++p) {
        const float* panel = w + p * PANEL * k;
        const float* ahead = p + 1 < panels ? panel + PANEL * k : nullptr;
        const int64_t c0 = p * PANEL;
        const int columns = static_cast<int>(std::min<int64_t>(PANEL, n - c0));
        f16 out[MAX_TILE_ROWS];
        for (int64_t i0 = 0; i0 < m; i0 += MAX_TILE_ROWS) {  // 32 rows: 31, then 1 from the caches
            const int mr = static_cast<int>(std::min<int64_t>(MAX_TILE_ROWS, m - i0));
            panel_tile_of<MAX_TILE_ROWS>(mr, panel, xt + i0, m, k, i0 == 0 ? ahead : nullptr, out);
            for (int i = 0; i < mr; ++i) {
                float* row = y + (i0 + i) * n + c0;
                std::memcpy(row, &out[i], columns * sizeof(float));
                if (bias)
                    for (int c = 0; c < columns; ++c) row[c] += bias[c0 + c];
            }
        }
    }
#else
    const int64_t blocks = (n + TILE_W - 1) / TILE_W;
#pragma omp parallel for num_threads(threads_for(n * k, nthreads)) schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t r0 = b * TILE_W;
        const int nw = static_cast<int>(std::min<int64_t>(TILE_W, n - r0));
        const float* ahead = b + 1 < blocks ? w + (r0 + TILE_W) * k : nullptr;
        for (int64_t i0 = 0; i0 < m; i0 += TILE_X) {
            const int nx = static_cast<int>(std::min<int64_t>(TILE_X, m - i0));
            tile_of<TILE_W, TILE_X>(nw, nx, x + i0 * k, w + r0 * k, ahead, k, y + i0 * n + r0, n);
        }
        if (bias)
            for (int64_t i = 0; i < m; ++i)
                for (int r = 0; r < nw; ++r) y[i * n + r0 + r] += bias[r0 + r];
    }
#endif
}

// x: [rows, n] with rows ldx apart; w: [n]; y: [rows, n] contiguous. y = rms_norm(x) * w.
void rms_norm_f32(const float* x, int64_t ldx, const float* w, float* y, int64_t rows, int64_t n, float eps,
                  int nthreads) {
#pragma omp parallel for num_threads(threads_for(rows * n, nthreads)) schedule(static)
    for (int64_t r = 0; r < rows; ++r) norm_row(x + r * ldx, w, y + r * n, n, eps);
}

// The residual add and the norm after it: residual += x (in place: the residual stream, [rows, n] contiguous),
// then y = rms_norm(residual) * w. x: [rows, n] with rows ldx apart.
void add_rms_norm_f32(const float* x, int64_t ldx, float* residual, const float* w, float* y, int64_t rows, int64_t n,
                      float eps, int nthreads) {
#pragma omp parallel for num_threads(threads_for(rows * n, nthreads)) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        float* h = residual + r * n;
        const float* xr = x + r * ldx;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) store8(h + i, load8(h + i) + load8(xr + i));
        for (; i < n; ++i) h[i] += xr[i];
        norm_row(h, w, y + r * n, n, eps);
    }
}

// Rotary embeddings in place, rotate-half layout: for each row r and each of its `heads` heads of d floats
// (heads d apart, rows ldx apart), x = x * cos[r] + roll(x, d / 2) * sin_signed[r], where cos and sin_signed
// are the row's position's tables ([rows, d] contiguous; sin_signed is -sin on the first half, sin on the second).
void rotary_f32(float* x, int64_t ldx, const float* cos, const float* sin_signed, int64_t rows, int64_t heads,
                int64_t d, int nthreads) {
    const int64_t half = d / 2;
#pragma omp parallel for num_threads(threads_for(rows * heads * d, nthreads)) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* c = cos + r * d;
        const float* s = sin_signed + r * d;
        for (int64_t h = 0; h < heads; ++h) {
            float* v = x + r * ldx + h * d;
            int64_t i = 0;
            for (; i + 8 <= half; i += 8) {  // the pair (i, i + half) rotated together, in registers
                const f8 lo = load8(v + i), hi = load8(v + i + half);
                store8(v + i, lo * load8(c + i) + hi * load8(s + i));
                store8(v + i + half, hi * load8(c + i + half) + lo * load8(s + i + half));
            }
            for (; i < half; ++i) {
                const float lo = v[i], hi = v[i + half];
                v[i] = lo * c[i] + hi * s[i];
                v[i + half] = hi * c[i + half] + lo * s[i + half];
            }
        }
    }
}

// SwiGLU's middle: out = silu(gate) * up, where each row of gate_up ([rows, 2 * inter], rows ld apart) holds gate
// then up; out: [rows, inter] contiguous.
void silu_mul_f32(const float* gate_up, int64_t ld, float* out, int64_t rows, int64_t inter, int nthreads) {
#pragma omp parallel for num_threads(threads_for(rows * inter, nthreads)) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* gate = gate_up + r * ld;
        const float* up = gate + inter;
        float* o = out + r * inter;
        int64_t i = 0;
        for (; i + 8 <= inter; i += 8) store8(o + i, silu8(load8(gate + i)) * load8(up + i));
        for (; i < inter; ++i) o[i] = silu(gate[i]) * up[i];
    }
}

// A whole decoder layer for a decode step (models/cpu_decode.py): every row is one new token of its own sequence (or
// one of a few consecutive tokens of one: speculative verification, a short prompt), its K/V stored in the paged pool
// and attended there. The same operators as the layer's one-by-one calls, in the same order, so the result is the
// same to the bit; what goes is the ~10 Python calls a layer between them (each through nn.Module, ctypes and torch's
// allocator: about 80 us a layer on SmolLM2, 2.4 ms of a 42 ms step).

// One of the layer's matrix products, y = x W^T (+ bias), by the kind of weight it holds: float32 (linear_f32), or
// int8 / int4 codes read by the quantized layers' kernels (quant/fused_matvec.cpp, another library: `kernel` is the
// address of the function there that the quantized layer itself would call).
enum ProductKind : int32_t { FP32 = 0, INT8 = 1, INT4_U8_ZERO = 2, INT4_F32_ZERO = 3 };
typedef void (*Int8Kernel)(const float*, const int8_t*, const float*, const float*, float*, int64_t, int64_t, int64_t,
                           int);
typedef void (*Int4U8Kernel)(const float*, const uint8_t*, const float*, const uint8_t*, const float*, float*, int64_t,
                             int64_t, int64_t, int64_t, int);
typedef void (*Int4F32Kernel)(const float*, const uint8_t*, const float*, const float*, const float*, float*, int64_t,
                              int64_t, int64_t, int64_t, int);

struct Product {
    int32_t kind;
    const void* weight;  // float32 [n, k], int8 [n, k] or two int4 codes a byte [n, k / 2]
    const float* scale;  // quantized: [n] (int8) or [n, groups] (int4)
    const void* zero;    // int4: [n, groups], uint8 codes or float32 minimums
    const float* bias;   // [n] or null
    void* kernel;
    int64_t n, k, groups;
};

struct LayerWeights {  // one decoder layer's weights and shape
    const float *input_norm, *post_norm;
    Product qkv, o, gate_up, down;
    int64_t hidden, heads, kv_heads, head_dim, inter;
    float eps, scale;  // the norms' epsilon; attention's 1 / sqrt(head_dim), as the kernel's callers round it
};

struct DecodeRows {  // a decode step's rows, the same for every layer
    const int64_t* slot_mapping;  // [rows]: where each row's new K/V go
    const int32_t *tables, *context_lens, *seq_rows;  // [rows, table_width], [rows], [rows] (the kernel's rows)
    const float *cos, *sin_signed;  // [rows, head_dim]: each row's position's rotary tables
    int64_t rows, table_width, block_size;
    int threads;
};

static void product(const Product& p, const float* x, float* y, int64_t rows, int threads) {
    switch (p.kind) {
        case INT8:
            return reinterpret_cast<Int8Kernel>(p.kernel)(x, static_cast<const int8_t*>(p.weight), p.scale, p.bias, y,
                                                          rows, p.n, p.k, threads);
        case INT4_U8_ZERO:
            return reinterpret_cast<Int4U8Kernel>(p.kernel)(x, static_cast<const uint8_t*>(p.weight), p.scale,
                                                            static_cast<const uint8_t*>(p.zero), p.bias, y, rows, p.n,
                                                            p.k, p.groups, threads);
        case INT4_F32_ZERO:
            return reinterpret_cast<Int4F32Kernel>(p.kernel)(x, static_cast<const uint8_t*>(p.weight), p.scale,
                                                             static_cast<const float*>(p.zero), p.bias, y, rows, p.n,
                                                             p.k, p.groups, threads);
        default:
            return linear_f32(x, static_cast<const float*>(p.weight), p.bias, y, rows, p.n, p.k, threads);
    }
}

// h: [rows, hidden], the last sublayer's output; x: the residual stream, updated in place (the first layer: x == h,
// the embeddings, and first = 1: nothing is added); out: [rows, hidden], this layer's MLP output. As the decoder:
// x += h; a = norm(x); qkv = a Wqkv^T (+ b); rotate q, k; store k, v; attend; x += attn Wo^T; a = norm(x);
// out = (silu(gate) * up)(a Wgu^T) Wdown^T.
void decoder_layer_f32(const LayerWeights* w, const DecodeRows* r, float* k_slots, float* v_slots, const float* h,
                       float* x, int first, float* out) {
    const int64_t rows = r->rows, n = w->hidden, d = w->head_dim, heads = w->heads, kv_heads = w->kv_heads;
    const int64_t qk_width = (heads + kv_heads) * d, qkv_width = qk_width + kv_heads * d, inter = w->inter;
    const int threads = r->threads;
    thread_local std::vector<float> normed, qkv, attn, o, gate_up, act;  // scratch, kept between calls
    normed.resize(rows * n);
    qkv.resize(rows * qkv_width);
    attn.resize(rows * heads * d);
    o.resize(rows * n);
    gate_up.resize(rows * 2 * inter);
    act.resize(rows * inter);
    if (first)
        rms_norm_f32(x, n, w->input_norm, normed.data(), rows, n, w->eps, threads);
    else
        add_rms_norm_f32(h, n, x, w->input_norm, normed.data(), rows, n, w->eps, threads);
    product(w->qkv, normed.data(), qkv.data(), rows, threads);
    rotary_f32(qkv.data(), qkv_width, r->cos, r->sin_signed, rows, heads + kv_heads, d, threads);
    const float* q = qkv.data();
    paged::store(q + heads * d, qkv_width, q + qk_width, qkv_width, r->slot_mapping, rows, k_slots, v_slots,
                 kv_heads, d);
    paged::decode(q, qkv_width, k_slots, v_slots, r->tables, r->table_width, r->context_lens, r->seq_rows,
                  attn.data(), rows, heads, kv_heads, d, r->block_size, w->scale, threads);
    product(w->o, attn.data(), o.data(), rows, threads);
    add_rms_norm_f32(o.data(), n, x, w->post_norm, normed.data(), rows, n, w->eps, threads);
    product(w->gate_up, normed.data(), gate_up.data(), rows, threads);
    silu_mul_f32(gate_up.data(), 2 * inter, act.data(), rows, inter, threads);
    product(w->down, act.data(), out, rows, threads);
}

}  // extern "C"
