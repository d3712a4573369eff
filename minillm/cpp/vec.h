// Eight and sixteen floats as one value, for the engine's C++ CPU kernels (kernels/paged_decode_cpu.cpp,
// layers/cpu_ops.cpp, quant/fused_matvec.cpp): minillm/cpp builds them with this folder on the include path.
#pragma once
#include <cstdint>
#include <cstring>

// Small helpers are always inlined: a vector passed to a function that is not inlined goes through memory.
#define VEC_INLINE inline __attribute__((always_inline))

namespace vec {

// Eight floats as one value (GCC and Clang vector extensions: AVX on x86, NEON pairs on Arm, plain code
// elsewhere). Loads and stores go through memcpy, which makes no alignment assumption and compiles to one move.
typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));

VEC_INLINE f8 load8(const float* p) {
    f8 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

VEC_INLINE void store8(float* p, f8 v) { std::memcpy(p, &v, sizeof v); }

// the sum of the lanes as a tree, in registers: three dependent additions instead of eight
VEC_INLINE float sum8(f8 v) {
    typedef float f4 __attribute__((vector_size(16)));
    const f4 a = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
    return (a[0] + a[2]) + (a[1] + a[3]);
}

// Sixteen floats as one value: one AVX-512 register, or elsewhere a pair of eight-float vectors. A 64-byte
// vector type on a CPU whose registers hold 32 bytes is kept in memory by GCC 12: built for AVX2, the fp32
// matrix-vector product of cpu_ops.cpp ran at 3.8 G weights/s on the AMD EPYC, with the pair at full speed.
#if defined(__AVX512F__)
typedef float f16 __attribute__((vector_size(64)));

VEC_INLINE f16 load16(const float* p) {
    f16 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// one float in all sixteen lanes (an initializer, which GCC folds into the multiply-add's broadcast from memory;
// `f16{} + v` cost an addition a use)
VEC_INLINE f16 broadcast16(float v) { return f16{v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v}; }

VEC_INLINE float sum16(f16 v) {
    return sum8(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
}
#else
struct f16 {
    f8 lo, hi;
};

VEC_INLINE f16 operator+(f16 a, f16 b) { return {a.lo + b.lo, a.hi + b.hi}; }
VEC_INLINE f16 operator*(f16 a, f16 b) { return {a.lo * b.lo, a.hi * b.hi}; }
VEC_INLINE f16& operator+=(f16& a, f16 b) { return a = a + b; }
VEC_INLINE f16 load16(const float* p) { return {load8(p), load8(p + 8)}; }
VEC_INLINE f16 broadcast16(float v) {
    const f8 b = {v, v, v, v, v, v, v, v};
    return {b, b};
}
VEC_INLINE float sum16(f16 v) { return sum8(v.lo + v.hi); }
#endif

// The widest vector of the build, for loops over many floats: f16 with AVX-512 (one register), f8 elsewhere (a
// pair of f8 in f16 would take two registers, which tiles of many sums cannot spare on AVX2's sixteen).
#if defined(__AVX512F__)
typedef f16 lanes;
constexpr int LANES = 16;
VEC_INLINE lanes load_lanes(const float* p) { return load16(p); }
VEC_INLINE float sum_lanes(lanes v) { return sum16(v); }
#else
typedef f8 lanes;
constexpr int LANES = 8;
VEC_INLINE lanes load_lanes(const float* p) { return load8(p); }
VEC_INLINE float sum_lanes(lanes v) { return sum8(v); }
#endif

// e^x for x <= 0, eight at a time: x log2(e) = n + f with n an integer and |f| <= 1/2; 2^f from its Taylor
// series in f ln 2 to degree 6 (relative error under 2e-7), 2^n written into the float's exponent bits.
// Below 2^-126 (x < -87.3) the result is 0: a softmax term that small adds nothing to a sum of 1 or more.
VEC_INLINE f8 exp8(f8 x) {
    const f8 t = x * 1.4426950408889634f;
    const i8 n = __builtin_convertvector(t + 127.5f, i8) - 127;  // rounds t to the nearest (t + 127.5 > 0)
    const f8 f = (t - __builtin_convertvector(n, f8)) * 0.6931471805599453f;  // |f| <= ln(2) / 2
    f8 p = f * (1.0f / 720) + 1.0f / 120;
    p = p * f + 1.0f / 24;
    p = p * f + 1.0f / 6;
    p = p * f + 0.5f;
    p = p * f + 1.0f;
    p = p * f + 1.0f;
    const i8 bits = (n + 127) << 23;
    f8 scale;
    std::memcpy(&scale, &bits, sizeof scale);
    const i8 keep = n > -127;  // all ones where 2^n is a normal float
    f8 out = p * scale;
    i8 out_bits;
    std::memcpy(&out_bits, &out, sizeof out);
    out_bits &= keep;
    std::memcpy(&out, &out_bits, sizeof out);
    return out;
}
}  // namespace vec
