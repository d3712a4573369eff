// A decoder layer's operators in C++ for the CPU, in float32: the product of a few rows by a weight (single-stream
// decode, speculative verification), and the small operators between the matrix products, fused: the residual add
// with the RMSNorm after it, rotary embeddings in place, SwiGLU's SiLU-and-multiply; and, for a decode step, the
// whole layer in one call made of them (decoder_layer_f32, at the end). Built by minillm/cpp (g++ -O3 -march=native
// -fopenmp) and called through ctypes from cpu_ops.py and models/cpu_decode.py; linear.py, rmsnorm.py, rotary.py and
// mlp.py keep the plain-PyTorch formulas, which are their reference in the tests.
//
// Why: a decode step at batch 1 streams every weight from memory once. The product reads each weight row once,
// sixteen floats at a time in four independent sums, which keeps the memory system busy (with the weights in huge
// pages, models/huge_pages.py, it streamed SmolLM2's 540 MB at 32 GB/s on one core of the 2-core AMD EPYC, against
// 17-20 for torch's F.linear; a pass at 2 and 4 rows took 25.9 and 30.9 ms against oneDNN's packed 49.4 and 34.1). And between two weight streams the cache holds none of the code
// or data of the operators in between: PyTorch's rms_norm is about ten operator calls, rotary four,
// SiLU-and-multiply three, each paying Python, the dispatcher and cold caches; here each is one call that reads its
// rows once. Rows are shared out among the OpenMP threads torch runs on when there are many.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <vector>

#include "paged_attention.h"  // minillm/cpp: paged::store, paged::decode (decoder_layer_f32's attention)
#include "vec.h"              // minillm/cpp: f8, f16, lanes, i8, load8, load16, load_lanes, store8, sum8, exp8

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

// The product's tile: NW rows of w by NX rows of x, NW * NX sums of sixteen lanes (eight without AVX-512) held in
// registers over the whole of k. Each step loads NW + NX vectors for NW * NX multiply-adds, so from two rows of x on
// the multiply-adds, not the loads, set the pace (a tile of one weight row by R rows of x, the last version, loaded
// 2 + 2R vectors for 2R of them); and one row of x streams four weight rows at once. With AVX-512, 4 x 6: 24 sums, four
// weight vectors and one of x in 29 of the 32 registers; on AVX2's 16 registers 3 x 4 (12 + 3 + 1).
// Every sum adds its products in the order of k, sixteen lanes at a time, then the lanes as a tree, then the tail.
#if defined(__AVX512F__)
constexpr int TILE_W = 4, TILE_X = 6;
#else
constexpr int TILE_W = 3, TILE_X = 4;
#endif

// y[i * n + r] = x[i] . w[r] for the tile's rows (x: rows k apart, w: rows k apart). `ahead`: the next weight rows,
// asked for into the L2 cache one tile ahead (null for the last tile). Without it the weight stream stalls while the
// multiply-adds run: a pass over SmolLM2's 120 layer matrices at 16 rows took 63-68 ms; asked for into the L1 cache,
// 51-57; into L2 (prefetcht1, which leaves the L1's few miss buffers to the loads), 47-50 (one core, Intel Xeon).
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

}  // namespace

extern "C" {

// y = x w^T + bias for a few rows of x (decode: one a sequence; speculative verification: k + 1 a sequence): x [m, k]
// contiguous, w [n, k] contiguous (nn.Linear's weight, row by row), bias [n] or null, y [m, n]. w is read from memory
// once: TILE_W of its rows at a time, each multiplied with every row of x, TILE_X rows of x a tile, while those weight
// rows sit in the L1 cache; the blocks of TILE_W rows are shared out among the threads. Up to 32 rows (cpu_ops.py
// MAX_ROWS), where the packed copy oneDNN multiplies (layers/linear.py) draws level at one thread. A pass over
// SmolLM2's 120 layer matrices, one core of the 2-core Intel Xeon, ms: 1 row 26-27 (F.linear 28-30), 2 rows 30
// (the packed copy 29-34), 4 rows 28-30 (48; the last version of this kernel 37), 8 rows 34-35 (44), 16 rows 50-52
// (55-57), 24 rows 69-70 (65; on a slower evening 80-83 against 90-91), 32 rows 101-105 (102-103); at two threads 16,
// 18, 19, 26 and 37 ms at 1, 4, 8, 16 and 24 rows against 20, 23, 27, 31 and 38, and 53-55 at 32 rows against 60.
// Past 16 rows the decode step gains more than the products: its layers stay in one C++ call each (models/
// cpu_decode.py) instead of ten from Python, and a step of SmolLM2 took at 17, 20, 24, 28 and 32 sequences 96, 102,
// 117, 138 and 158 ms against 122, 120, 132, 145 and 157 with the C++ path stopping at 16 (one core).
void linear_f32(const float* x, const float* w, const float* bias, float* y, int64_t m, int64_t n, int64_t k,
                int nthreads) {
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
