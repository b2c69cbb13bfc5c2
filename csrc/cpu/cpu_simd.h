// The CPU kernels' vector type: 16 floats. With AVX-512 it is one zmm register; without, a plain
// array the compiler vectorizes as it can (the portable build, UQR_NATIVE=0, or non-x86 hosts).
// Everything the kernels need from the ISA is here, so the kernels themselves stay ISA-free.
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__) && \
    defined(__BMI2__)
#define UQR_CPU_AVX512 1
#include <immintrin.h>
#else
#define UQR_CPU_AVX512 0
#endif

#include "uqr/platform.h"

namespace uqr::cpu {

constexpr int kLanes = 16;

#if UQR_CPU_AVX512
using vf = __m512;
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vset1(float a) { return _mm512_set1_ps(a); }
inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline float vsum(vf v) { return _mm512_reduce_add_ps(v); }
// fp16 field of a block -> float in one instruction (F16C) instead of the portable bit-twiddling.
inline float load_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
#else
struct vf {
  float f[kLanes];
};
inline vf vzero() { return vf{}; }
inline vf vset1(float a) {
  vf r;
  for (int i = 0; i < kLanes; ++i) r.f[i] = a;
  return r;
}
inline vf vload(const float* p) {
  vf r;
  std::memcpy(r.f, p, sizeof r.f);
  return r;
}
inline void vstore(float* p, vf v) { std::memcpy(p, v.f, sizeof v.f); }
inline vf vfma(vf a, vf b, vf c) {
  for (int i = 0; i < kLanes; ++i) c.f[i] += a.f[i] * b.f[i];
  return c;
}
inline vf vmul(vf a, vf b) {
  for (int i = 0; i < kLanes; ++i) a.f[i] *= b.f[i];
  return a;
}
inline float vsum(vf v) {
  float s = 0.f;
  for (int i = 0; i < kLanes; ++i) s += v.f[i];
  return s;
}
inline float load_half(const uint8_t* p) { return uqr_load_half(p); }
#endif

// n activations of type T -> float, and back (round to nearest even, as torch's casts do).
void to_float(const float* src, float* dst, int64_t n);
void to_float(const c10::Half* src, float* dst, int64_t n);
void to_float(const c10::BFloat16* src, float* dst, int64_t n);
void from_float(const float* src, float* dst, int64_t n);
void from_float(const float* src, c10::Half* dst, int64_t n);
void from_float(const float* src, c10::BFloat16* dst, int64_t n);

// One vector of 16 floats -> 16 values of dst's type (halves rounded to nearest even; decoded
// weights are finite, so the bf16 rounding needs no NaN case). The float overload lets one panel
// decoder serve the fp32 and the half panels.
inline void vstore_as(float* dst, vf v) { vstore(dst, v); }
inline void vstore_as(c10::Half* dst, vf v) {
#if UQR_CPU_AVX512
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  for (int i = 0; i < kLanes; ++i) dst[i] = static_cast<c10::Half>(v.f[i]);
#endif
}
inline void vstore_as(c10::BFloat16* dst, vf v) {
#if UQR_CPU_AVX512 && defined(__AVX512BF16__)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), (__m256i)_mm512_cvtneps_pbh(v));
#elif UQR_CPU_AVX512
  // Round to nearest even on the bit pattern: add 0x7fff plus the lowest kept bit, keep the top half.
  const __m512i b = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), odd), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi32_epi16(r));
#else
  for (int i = 0; i < kLanes; ++i) dst[i] = static_cast<c10::BFloat16>(v.f[i]);
#endif
}

}  // namespace uqr::cpu
