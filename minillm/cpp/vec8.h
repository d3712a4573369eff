// Eight floats as one value, for the engine's C++ CPU kernels (kernels/paged_decode_cpu.cpp,
// layers/fused_cpu.cpp): minillm/cpp builds them with this folder on the include path.
#pragma once
#include <cstdint>
#include <cstring>

namespace vec8 {

// Eight floats as one value (GCC and Clang vector extensions: AVX on x86, NEON pairs on Arm, plain code
// elsewhere). Loads and stores go through memcpy, which makes no alignment assumption and compiles to one move.
typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));

inline f8 load8(const float* p) {
    f8 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

inline void store8(float* p, f8 v) { std::memcpy(p, &v, sizeof v); }

inline float sum8(f8 v) {
    float s = 0.0f;
    for (int i = 0; i < 8; ++i) s += v[i];
    return s;
}

// e^x for x <= 0, eight at a time: x log2(e) = n + f with n an integer and |f| <= 1/2; 2^f from its Taylor
// series in f ln 2 to degree 6 (relative error under 2e-7), 2^n written into the float's exponent bits.
// Below 2^-126 (x < -87.3) the result is 0: a softmax term that small adds nothing to a sum of 1 or more.
inline f8 exp8(f8 x) {
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
}  // namespace vec8
