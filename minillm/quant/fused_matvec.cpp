// Weight-only quantized linear layers for the CPU, reading the engine's own stored format and never
// writing a dequantized weight: each weight row is loaded once, converted to floats in registers and
// multiplied with up to four rows of x at a time. Built by minillm/quant/fused.py (g++ -O3
// -march=native -fopenmp) and called through ctypes; linear.py's plain-PyTorch dequantize-then-matmul
// is their reference.
//
//   int8: y[m, n] = scale[n] * sum_k x[m, k] * q[n, k]                                      (+ bias[n])
//   int4: y[m, n] = sum_g scale[n, g] * (sum_{k in g} x[m, k] * code[n, k] - zero[n, g] * sum_{k in g} x[m, k])
//
// int4 codes sit two a byte along a row (the even input in the low nibble), so x is split once per
// call into its even and odd inputs and every byte feeds two products. The zero point leaves the
// inner loop: it multiplies the group's sum of x, also computed once per call.
// GCC vector types (16 floats, one AVX-512 register; two AVX2 ones elsewhere) keep the inner loops
// vectorized on any compiler flags; rows of W are shared out among the OpenMP threads torch runs on.
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int LANES = 16;
constexpr int X_ROWS = 4;              // rows of x that share one pass over a weight row
constexpr int64_t ROWS_PER_TASK = 16;  // weight rows a thread takes at a time
typedef float f32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef uint8_t u8x16 __attribute__((vector_size(16)));

template <typename V> inline V load(const void* p) {
    V v;
    std::memcpy(&v, p, sizeof(V));  // an unaligned load
    return v;
}
inline f32x16 to_float(i32x16 q) { return __builtin_convertvector(q, f32x16); }
inline f32x16 signed_to_float(const int8_t* p) {
#if defined(__AVX512F__)
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
    // GCC 12 converts a signed byte vector element by element: flip the sign bit (q + 128 as an
    // unsigned byte), convert that one, and take the 128 back
    return to_float(__builtin_convertvector(load<u8x16>(p) ^ 0x80, i32x16)) - 128.0f;
#endif
}
inline float sum(f32x16 v) {
    float s = 0.0f;
    for (int i = 0; i < LANES; ++i) s += v[i];
    return s;
}

// out[r] = sum_j x[r * ldx + j] * q[j] for r < R
template <int R> void int8_dot(const float* x, int64_t ldx, const int8_t* q, int64_t k, float* out) {
    f32x16 acc[2][R] = {};  // two chains, so one FMA need not wait for the last
    int64_t j = 0;
    for (; j + 2 * LANES <= k; j += 2 * LANES)
        for (int h = 0; h < 2; ++h) {
            const f32x16 w = signed_to_float(q + j + h * LANES);
            for (int r = 0; r < R; ++r) acc[h][r] += load<f32x16>(x + r * ldx + j + h * LANES) * w;
        }
    for (; j + LANES <= k; j += LANES) {
        const f32x16 w = signed_to_float(q + j);
        for (int r = 0; r < R; ++r) acc[0][r] += load<f32x16>(x + r * ldx + j) * w;
    }
    for (int r = 0; r < R; ++r) out[r] = sum(acc[0][r] + acc[1][r]);
    for (; j < k; ++j)
        for (int r = 0; r < R; ++r) out[r] += x[r * ldx + j] * static_cast<float>(q[j]);
}

// out[r] = sum_g scale[g] * sum_{bytes j of g} (xe[r, j] * low(b[j]) + xo[r, j] * high(b[j])).
// One pass over the row's bytes, 16 at a time, each vector of them scaled by its group's scale (a
// group of a multiple of 32 inputs holds whole vectors); other even group sizes take the scalar loop.
template <int R> void int4_dot(const float* xe, const float* xo, int64_t ldx, const uint8_t* b, const float* scale,
                               int64_t groups, int64_t half_g, float* out) {
    const int64_t half_k = groups * half_g;
    if (half_g % LANES) {
        for (int r = 0; r < R; ++r) out[r] = 0.0f;
        for (int64_t j = 0; j < half_k; ++j)
            for (int r = 0; r < R; ++r)
                out[r] += scale[j / half_g] * (xe[r * ldx + j] * static_cast<float>(b[j] & 0x0F) +
                                               xo[r * ldx + j] * static_cast<float>(b[j] >> 4));
        return;
    }
    f32x16 acc[2][R] = {};  // two chains, as in int8_dot
    auto step = [&](int64_t j, f32x16* a) {
#if defined(__AVX512F__)
        // 16 bytes widened to 32 bits once, then split: one widening instead of two
        const i32x16 q = (i32x16)_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + j)));
        const f32x16 lo = to_float(q & 0x0F), hi = to_float(q >> 4);
#else
        // split as bytes, then widened: GCC 12 widens a byte vector element by element otherwise
        const u8x16 q = load<u8x16>(b + j);
        const f32x16 lo = to_float(__builtin_convertvector(q & 0x0F, i32x16));
        const f32x16 hi = to_float(__builtin_convertvector(q >> 4, i32x16));
#endif
        const float s = scale[j / half_g];
        for (int r = 0; r < R; ++r)
            a[r] += s * (load<f32x16>(xe + r * ldx + j) * lo + load<f32x16>(xo + r * ldx + j) * hi);
    };
    int64_t j = 0;
    for (; j + 2 * LANES <= half_k; j += 2 * LANES) {
        step(j, acc[0]);
        step(j + LANES, acc[1]);
    }
    if (j < half_k) step(j, acc[0]);
    for (int r = 0; r < R; ++r) out[r] = sum(acc[0][r] + acc[1][r]);
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
    std::vector<float> xe(m_rows * half_k), xo(m_rows * half_k), xsum(m_rows * groups, 0.0f);
    for (int64_t m = 0; m < m_rows; ++m)
        for (int64_t j = 0; j < half_k; ++j) {
            xe[m * half_k + j] = x[m * k + 2 * j];
            xo[m * half_k + j] = x[m * k + 2 * j + 1];
            xsum[m * groups + j / half_g] += x[m * k + 2 * j] + x[m * k + 2 * j + 1];
        }
    for_each_block(n, m_rows, nthreads, [&](int64_t row, int64_t m0, int rows) {
        const float* s = scale + row * groups;
        const float* e = xe.data() + m0 * half_k;
        const float* o = xo.data() + m0 * half_k;
        float out[X_ROWS];
        switch (rows) {
            case 1: int4_dot<1>(e, o, half_k, packed + row * half_k, s, groups, half_g, out); break;
            case 2: int4_dot<2>(e, o, half_k, packed + row * half_k, s, groups, half_g, out); break;
            case 3: int4_dot<3>(e, o, half_k, packed + row * half_k, s, groups, half_g, out); break;
            default: int4_dot<4>(e, o, half_k, packed + row * half_k, s, groups, half_g, out);
        }
        for (int r = 0; r < rows; ++r) {
            float shift = 0.0f;  // sum_g scale * zero * (the group's sum of x)
            for (int64_t g = 0; g < groups; ++g)
                shift += s[g] * static_cast<float>(zero[row * groups + g]) * xsum[(m0 + r) * groups + g];
            y[(m0 + r) * n + row] = out[r] - shift + (bias ? bias[row] : 0.0f);
        }
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
