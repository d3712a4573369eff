// Weight-only quantized linear layers for the CPU, reading the engine's own stored format and never
// writing a dequantized weight: each weight row is loaded once, converted to floats in registers and
// multiplied with up to four rows of x at a time. Built by minillm/quant/fused.py (g++ -O3
// -march=native -fopenmp) and called through ctypes; linear.py's plain-PyTorch dequantize-then-matmul
// is their reference.
//
//   int8: y[m, n] = scale[n] * sum_k x[m, k] * q[n, k]                                      (+ bias[n])
//   int4: y[m, n] = sum_k x[m, k] * (code[n, k] - zero[n, g(k)]) * scale[n, g(k)]                 (+ bias[n])
//
// int4 codes sit two a byte along a row (the even input in the low nibble), so x is split once per
// call into its even and odd inputs and every byte feeds two products.
// Each loop asks for the codes 1-2 KB ahead of those it converts (and for the scales and zero points ahead): the
// conversions are enough work between loads that the memory stream stalls otherwise. Measured on one core of the
// 2-core Intel Xeon, SmolLM2's 120 layer matrices, one row of x, interleaved: int8 16.5-19.4 -> 10.2-12.3 ms, int4
// (group 32, min-max) 11.0 -> 8.5 ms.
// Sixteen floats are one value (vec.h: one AVX-512 register, two AVX2 ones), and the bytes are widened with
// the CPU's own instructions (GCC 12 widens a byte vector one vpextrb a byte); rows of W are shared out among
// the OpenMP threads torch runs on.
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "vec.h"  // minillm/cpp: f8, f16, load16, sum16

namespace {

using namespace vec;

constexpr int WIDTH = 16;              // floats in an f16 (one AVX-512 register, or a pair of eight)
constexpr int X_ROWS = 4;              // rows of x that share one pass over a weight row
constexpr int64_t ROWS_PER_TASK = 16;  // weight rows a thread takes at a time

#if defined(__AVX2__)
VEC_INLINE __m128i load_bytes(const void* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
#endif
#if defined(__AVX512F__)
VEC_INLINE f16 as_f16(__m512 v) { return (f16)v; }
#elif defined(__AVX2__)
VEC_INLINE f16 as_f16(__m256 lo, __m256 hi) { return {(f8)lo, (f8)hi}; }
#else
// 16 floats from a function of the lane: the portable path, for CPUs without AVX2
template <typename F> VEC_INLINE f16 lanes16(F value) {
    float v[16];
    for (int i = 0; i < 16; ++i) v[i] = value(i);
    return load16(v);
}
#endif

// 16 signed bytes as floats
VEC_INLINE f16 signed_to_float(const int8_t* p) {
#if defined(__AVX512F__)
    return as_f16(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load_bytes(p))));
#elif defined(__AVX2__)
    const __m128i q = load_bytes(p);
    return as_f16(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
                  _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))));
#else
    return lanes16([p](int i) { return static_cast<float>(p[i]); });
#endif
}

// out[r] = sum_j x[r * ldx + j] * q[j] for r < R
template <int R> void int8_dot(const float* x, int64_t ldx, const int8_t* q, int64_t k, float* out) {
    f16 acc[2][R] = {};  // two chains, so one FMA need not wait for the last
    int64_t j = 0;
    for (; j + 2 * WIDTH <= k; j += 2 * WIDTH) {
        __builtin_prefetch(q + j + 2048);
        for (int h = 0; h < 2; ++h) {
            const f16 w = signed_to_float(q + j + h * WIDTH);
            for (int r = 0; r < R; ++r) acc[h][r] += load16(x + r * ldx + j + h * WIDTH) * w;
        }
    }
    for (; j + WIDTH <= k; j += WIDTH) {
        const f16 w = signed_to_float(q + j);
        for (int r = 0; r < R; ++r) acc[0][r] += load16(x + r * ldx + j) * w;
    }
    for (int r = 0; r < R; ++r) out[r] = sum16(acc[0][r] + acc[1][r]);
    for (; j < k; ++j)
        for (int r = 0; r < R; ++r) out[r] += x[r * ldx + j] * static_cast<float>(q[j]);
}

// The weights of one group of int4 codes as floats, (code - zero) * scale, sixteen at a time.
struct Int4Group {
#if defined(__AVX512F__)
    // The group's sixteen possible weights sit in one register, and each code picks its weight from it by a
    // permutation (vpermps reads the low four bits of each index, so the low nibble needs no mask): two
    // lookups replace two conversions and the multiply by the scale, and the zero point costs nothing per
    // weight. On the 2-core AMD EPYC (Zen 4), one row of x: 12.6 -> 20.6 G weights/s at group size 32.
    __m512 levels;
    Int4Group(float scale, float zero)
        : levels(_mm512_mul_ps(_mm512_sub_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_ps(zero)),
                               _mm512_set1_ps(scale))) {}
    // the weights of the low and the high nibbles of 16 bytes
    VEC_INLINE void weights(const uint8_t* b, f16& lo, f16& hi) const {
        const __m512i q = _mm512_cvtepu8_epi32(load_bytes(b));
        lo = as_f16(_mm512_permutexvar_ps(q, levels));
        hi = as_f16(_mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), levels));
    }
#elif defined(__AVX2__)
    __m256 scale, zero;
    Int4Group(float s, float z) : scale(_mm256_set1_ps(s)), zero(_mm256_set1_ps(z)) {}
    VEC_INLINE __m256 weight(__m256i codes) const {
        return _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(codes), zero), scale);
    }
    VEC_INLINE void weights(const uint8_t* b, f16& lo, f16& hi) const {
        const __m128i q = load_bytes(b);
        const __m256i q0 = _mm256_cvtepu8_epi32(q), q1 = _mm256_cvtepu8_epi32(_mm_srli_si128(q, 8));
        const __m256i nibble = _mm256_set1_epi32(0x0F);
        lo = as_f16(weight(_mm256_and_si256(q0, nibble)), weight(_mm256_and_si256(q1, nibble)));
        hi = as_f16(weight(_mm256_srli_epi32(q0, 4)), weight(_mm256_srli_epi32(q1, 4)));
    }
#else
    float scale, zero;
    Int4Group(float s, float z) : scale(s), zero(z) {}
    VEC_INLINE void weights(const uint8_t* b, f16& lo, f16& hi) const {
        lo = lanes16([&](int i) { return (static_cast<float>(b[i] & 0x0F) - zero) * scale; });
        hi = lanes16([&](int i) { return (static_cast<float>(b[i] >> 4) - zero) * scale; });
    }
#endif
};

// out[r] = sum_{bytes j} (xe[r, j] * w(low(b[j])) + xo[r, j] * w(high(b[j]))), w(c) = (c - zero[g]) * scale[g] for
// the group g of byte j: the dequantized weight, as the reference computes it. A group of a multiple of 32 inputs
// holds whole vectors of 16 bytes; other even group sizes take the scalar loop.
template <int R, typename Zero>
void int4_dot(const float* xe, const float* xo, int64_t ldx, const uint8_t* b, const float* scale, const Zero* zero,
              int64_t groups, int64_t half_g, float* out) {
    if (half_g % WIDTH) {
        for (int r = 0; r < R; ++r) out[r] = 0.0f;
        for (int64_t j = 0; j < groups * half_g; ++j) {
            const float s = scale[j / half_g], z = static_cast<float>(zero[j / half_g]);
            const float lo = (static_cast<float>(b[j] & 0x0F) - z) * s, hi = (static_cast<float>(b[j] >> 4) - z) * s;
            for (int r = 0; r < R; ++r) out[r] += xe[r * ldx + j] * lo + xo[r * ldx + j] * hi;
        }
        return;
    }
    f16 acc[2][R] = {};  // the even inputs' and the odd inputs' products in two chains
    for (int64_t g = 0; g < groups; ++g) {
        const Int4Group group(scale[g], static_cast<float>(zero[g]));
        __builtin_prefetch(scale + g + 256);
        __builtin_prefetch(zero + g + 256);
        for (int64_t j = g * half_g; j < (g + 1) * half_g; j += WIDTH) {
            __builtin_prefetch(b + j + 1024);
            f16 lo, hi;
            group.weights(b + j, lo, hi);
            for (int r = 0; r < R; ++r) {
                acc[0][r] += load16(xe + r * ldx + j) * lo;
                acc[1][r] += load16(xo + r * ldx + j) * hi;
            }
        }
    }
    for (int r = 0; r < R; ++r) out[r] = sum16(acc[0][r] + acc[1][r]);
}

// Calls body(row, m0, rows) for every weight row and every block of at most X_ROWS rows of x.
template <typename Body> void for_each_block(int64_t n, int64_t m_rows, int nthreads, Body body) {
    const int64_t tasks = (n + ROWS_PER_TASK - 1) / ROWS_PER_TASK;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)
    for (int64_t t = 0; t < tasks; ++t) {
        const int64_t end = (t + 1) * ROWS_PER_TASK < n ? (t + 1) * ROWS_PER_TASK : n;
        for (int64_t row = t * ROWS_PER_TASK; row < end; ++row)
            for (int64_t m0 = 0; m0 < m_rows; m0 += X_ROWS)
                body(row, m0, static_cast<int>(m_rows - m0 < X_ROWS ? m_rows - m0 : X_ROWS));
    }
}

template <typename Zero>
void int4_linear(const float* x, const uint8_t* packed, const float* scale, const Zero* zero, const float* bias,
                 float* y, int64_t m_rows, int64_t n, int64_t k, int64_t groups, int nthreads) {
    const int64_t half_k = k / 2, half_g = half_k / groups;
    std::vector<float> xe(m_rows * half_k), xo(m_rows * half_k);
    for (int64_t m = 0; m < m_rows; ++m)
        for (int64_t j = 0; j < half_k; ++j) {
            xe[m * half_k + j] = x[m * k + 2 * j];
            xo[m * half_k + j] = x[m * k + 2 * j + 1];
        }
    for_each_block(n, m_rows, nthreads, [&](int64_t row, int64_t m0, int rows) {
        const float* s = scale + row * groups;
        const Zero* z = zero + row * groups;
        const float* e = xe.data() + m0 * half_k;
        const float* o = xo.data() + m0 * half_k;
        const uint8_t* b = packed + row * half_k;
        float out[X_ROWS];
        switch (rows) {
            case 1: int4_dot<1>(e, o, half_k, b, s, z, groups, half_g, out); break;
            case 2: int4_dot<2>(e, o, half_k, b, s, z, groups, half_g, out); break;
            case 3: int4_dot<3>(e, o, half_k, b, s, z, groups, half_g, out); break;
            default: int4_dot<4>(e, o, half_k, b, s, z, groups, half_g, out);
        }
        for (int r = 0; r < rows; ++r) y[(m0 + r) * n + row] = out[r] + (bias ? bias[row] : 0.0f);
    });
}

}  // namespace

extern "C" {

// x: [m_rows, k] float32; q: int8 [n, k]; scale: [n]; bias: [n] or null; y: [m_rows, n]
void int8_linear(const float* x, const int8_t* q, const float* scale, const float* bias, float* y, int64_t m_rows,
                 int64_t n, int64_t k, int nthreads) {
    for_each_block(n, m_rows, nthreads, [&](int64_t row, int64_t m0, int rows) {
        float out[X_ROWS];
        const float* xm = x + m0 * k;
        switch (rows) {
            case 1: int8_dot<1>(xm, k, q + row * k, k, out); break;
            case 2: int8_dot<2>(xm, k, q + row * k, k, out); break;
            case 3: int8_dot<3>(xm, k, q + row * k, k, out); break;
            default: int8_dot<4>(xm, k, q + row * k, k, out);
        }
        for (int r = 0; r < rows; ++r) y[(m0 + r) * n + row] = out[r] * scale[row] + (bias ? bias[row] : 0.0f);
    });
}

// x: [m_rows, k] float32, k even; packed: uint8 [n, k / 2]; scale, zero: [n, groups], the group size
// k / groups even; zero uint8 (a code) or float32 (a free minimum); bias: [n] or null; y: [m_rows, n]
void int4_linear_u8zero(const float* x, const uint8_t* packed, const float* scale, const uint8_t* zero,
                        const float* bias, float* y, int64_t m_rows, int64_t n, int64_t k, int64_t groups,
                        int nthreads) {
    int4_linear(x, packed, scale, zero, bias, y, m_rows, n, k, groups, nthreads);
}

void int4_linear_f32zero(const float* x, const uint8_t* packed, const float* scale, const float* zero,
                         const float* bias, float* y, int64_t m_rows, int64_t n, int64_t k, int64_t groups,
                         int nthreads) {
    int4_linear(x, packed, scale, zero, bias, y, m_rows, n, k, groups, nthreads);
}

}  // extern "C"
