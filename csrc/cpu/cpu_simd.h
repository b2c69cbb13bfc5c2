// The CPU kernels' vector type: 16 floats. With AVX-512 it is one zmm register, with AVX2 + FMA +
// F16C two ymm registers, with NEON (aarch64) four q registers; otherwise a plain array the
// compiler vectorizes as it can (the portable build, UQR_NATIVE=0, on x86 without AVX2).
// Everything the kernels need from the ISA is here, so the kernels themselves stay ISA-free; the
// few integer kernels that need more (gemm_int8.cpp) test the same UQR_CPU_* macros.
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

#if !UQR_CPU_AVX512 && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define UQR_CPU_AVX2 1
#include <immintrin.h>
#else
#define UQR_CPU_AVX2 0
#endif

#if defined(__aarch64__) && defined(__ARM_NEON)
#define UQR_CPU_NEON 1
#include <arm_neon.h>
#else
#define UQR_CPU_NEON 0
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
inline vf vfms(vf a, vf b, vf c) { return _mm512_fmsub_ps(a, b, c); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
inline float vsum(vf v) { return _mm512_reduce_add_ps(v); }
#elif UQR_CPU_AVX2
struct vf {
  __m256 lo, hi;
};
inline vf vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline vf vset1(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
inline vf vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void vstore(float* p, vf v) { _mm256_storeu_ps(p, v.lo), _mm256_storeu_ps(p + 8, v.hi); }
inline vf vfma(vf a, vf b, vf c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline vf vfms(vf a, vf b, vf c) { return {_mm256_fmsub_ps(a.lo, b.lo, c.lo), _mm256_fmsub_ps(a.hi, b.hi, c.hi)}; }
inline vf vmul(vf a, vf b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline vf vadd(vf a, vf b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline float hsum256(__m256 v) {
  const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
}
inline float vsum(vf v) { return hsum256(_mm256_add_ps(v.lo, v.hi)); }
#elif UQR_CPU_NEON
struct vf {
  float32x4_t q[4];
};
inline vf vzero() { return {{vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f)}}; }
inline vf vset1(float a) { return {{vdupq_n_f32(a), vdupq_n_f32(a), vdupq_n_f32(a), vdupq_n_f32(a)}}; }
inline vf vload(const float* p) { return {{vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)}}; }
inline void vstore(float* p, vf v) {
  for (int i = 0; i < 4; ++i) vst1q_f32(p + 4 * i, v.q[i]);
}
inline vf vfma(vf a, vf b, vf c) {
  for (int i = 0; i < 4; ++i) c.q[i] = vfmaq_f32(c.q[i], a.q[i], b.q[i]);
  return c;
}
// a b - c with one rounding: fma(a, b, -c).
inline vf vfms(vf a, vf b, vf c) {
  for (int i = 0; i < 4; ++i) c.q[i] = vfmaq_f32(vnegq_f32(c.q[i]), a.q[i], b.q[i]);
  return c;
}
inline vf vmul(vf a, vf b) {
  for (int i = 0; i < 4; ++i) a.q[i] = vmulq_f32(a.q[i], b.q[i]);
  return a;
}
inline vf vadd(vf a, vf b) {
  for (int i = 0; i < 4; ++i) a.q[i] = vaddq_f32(a.q[i], b.q[i]);
  return a;
}
inline float vsum(vf v) { return vaddvq_f32(vaddq_f32(vaddq_f32(v.q[0], v.q[1]), vaddq_f32(v.q[2], v.q[3]))); }
inline float load_half(const uint8_t* p) {
  __fp16 h;
  std::memcpy(&h, p, 2);
  return static_cast<float>(h);
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
inline vf vfms(vf a, vf b, vf c) {
  for (int i = 0; i < kLanes; ++i) c.f[i] = a.f[i] * b.f[i] - c.f[i];
  return c;
}
inline vf vmul(vf a, vf b) {
  for (int i = 0; i < kLanes; ++i) a.f[i] *= b.f[i];
  return a;
}
inline vf vadd(vf a, vf b) {
  for (int i = 0; i < kLanes; ++i) a.f[i] += b.f[i];
  return a;
}
inline float vsum(vf v) {
  float s = 0.f;
  for (int i = 0; i < kLanes; ++i) s += v.f[i];
  return s;
}
inline float load_half(const uint8_t* p) { return uqr_load_half(p); }
#endif

#if UQR_CPU_AVX512 || UQR_CPU_AVX2
// fp16 field of a block -> float in one instruction (F16C) instead of the portable bit-twiddling.
inline float load_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
#endif

// ---- byte codes -> float lanes (the block decoders' building blocks; integers convert exactly) ----
// 16 signed bytes -> 16 floats.
inline vf vfrom_s8(const uint8_t* p) {
#if UQR_CPU_AVX512
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif UQR_CPU_AVX2
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)))};
#elif UQR_CPU_NEON
  const int8x16_t q = vld1q_s8(reinterpret_cast<const int8_t*>(p));
  const int16x8_t a = vmovl_s8(vget_low_s8(q)), b = vmovl_s8(vget_high_s8(q));
  return {{vcvtq_f32_s32(vmovl_s16(vget_low_s16(a))), vcvtq_f32_s32(vmovl_s16(vget_high_s16(a))),
           vcvtq_f32_s32(vmovl_s16(vget_low_s16(b))), vcvtq_f32_s32(vmovl_s16(vget_high_s16(b)))}};
#else
  vf r;
  for (int i = 0; i < kLanes; ++i) r.f[i] = static_cast<float>(static_cast<int8_t>(p[i]));
  return r;
#endif
}

// 16 unsigned bytes -> 16 floats.
inline vf vfrom_u8(const uint8_t* p) {
#if UQR_CPU_AVX512
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif UQR_CPU_AVX2
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8)))};
#elif UQR_CPU_NEON
  const uint8x16_t q = vld1q_u8(p);
  const uint16x8_t a = vmovl_u8(vget_low_u8(q)), b = vmovl_u8(vget_high_u8(q));
  return {{vcvtq_f32_u32(vmovl_u16(vget_low_u16(a))), vcvtq_f32_u32(vmovl_u16(vget_high_u16(a))),
           vcvtq_f32_u32(vmovl_u16(vget_low_u16(b))), vcvtq_f32_u32(vmovl_u16(vget_high_u16(b)))}};
#else
  vf r;
  for (int i = 0; i < kLanes; ++i) r.f[i] = static_cast<float>(p[i]);
  return r;
#endif
}

// The same from 16 bytes held in two words (lo: bytes 0-7, little-endian), for codes assembled in
// general registers (SWAR): they go to the vector unit without a store and a wider reload.
inline vf vfrom_u8(uint64_t lo, uint64_t hi) {
#if UQR_CPU_AVX512
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_set_epi64x(static_cast<long long>(hi), static_cast<long long>(lo))));
#elif UQR_CPU_AVX2
  const __m128i q = _mm_set_epi64x(static_cast<long long>(hi), static_cast<long long>(lo));
  return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8)))};
#else
  uint8_t b[16];
  std::memcpy(b, &lo, 8), std::memcpy(b + 8, &hi, 8);
  return vfrom_u8(b);
#endif
}
inline vf vfrom_s8(uint64_t lo, uint64_t hi) {
#if UQR_CPU_AVX512
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_set_epi64x(static_cast<long long>(hi), static_cast<long long>(lo))));
#elif UQR_CPU_AVX2
  const __m128i q = _mm_set_epi64x(static_cast<long long>(hi), static_cast<long long>(lo));
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)))};
#else
  uint8_t b[16];
  std::memcpy(b, &lo, 8), std::memcpy(b + 8, &hi, 8);
  return vfrom_s8(b);
#endif
}

// A 16-entry table of signed bytes (a non-linear 4-bit codebook), 16-byte aligned for one load.
struct alignas(16) Lut16 {
  int8_t v[16];
};
// The table packed as four little-endian words (w0: entries 0-3), as uqr/formats.h spells them.
constexpr Lut16 lut16_from_words(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  const uint32_t w[4] = {w0, w1, w2, w3};
  Lut16 t{};
  for (int i = 0; i < 16; ++i) {
    const int b = static_cast<int>((w[i >> 2] >> (8 * (i & 3))) & 0xFFu);
    t.v[i] = static_cast<int8_t>(b < 128 ? b : b - 256);
  }
  return t;
}

// 16 code bytes -> tbl[low nibble] (lo) and tbl[high nibble] (hi), 16 floats each, in byte order:
// one byte shuffle per 16 codes (pshufb / tbl) before the widen, instead of a per-element lookup.
inline void vnibbles_lut(const uint8_t* p, const Lut16& tbl, vf& lo, vf& hi) {
#if UQR_CPU_AVX512 || UQR_CPU_AVX2
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), m = _mm_set1_epi8(15);
  const __m128i t = _mm_load_si128(reinterpret_cast<const __m128i*>(tbl.v));
  // pshufb reads index bits 0-3 (and zeroes on bit 7): both indices are masked to 0-15 first.
  const __m128i l = _mm_shuffle_epi8(t, _mm_and_si128(q, m));
  const __m128i h = _mm_shuffle_epi8(t, _mm_and_si128(_mm_srli_epi16(q, 4), m));
#if UQR_CPU_AVX512
  lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(l));
  hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(h));
#else
  lo = {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(l)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(l, 8)))};
  hi = {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(h)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(h, 8)))};
#endif
#elif UQR_CPU_NEON
  const uint8x16_t q = vld1q_u8(p);
  const int8x16_t t = vld1q_s8(tbl.v);
  auto widen = [](int8x16_t b) -> vf {
    const int16x8_t a = vmovl_s8(vget_low_s8(b)), c = vmovl_s8(vget_high_s8(b));
    return {{vcvtq_f32_s32(vmovl_s16(vget_low_s16(a))), vcvtq_f32_s32(vmovl_s16(vget_high_s16(a))),
             vcvtq_f32_s32(vmovl_s16(vget_low_s16(c))), vcvtq_f32_s32(vmovl_s16(vget_high_s16(c)))}};
  };
  lo = widen(vqtbl1q_s8(t, vandq_u8(q, vdupq_n_u8(15))));
  hi = widen(vqtbl1q_s8(t, vshrq_n_u8(q, 4)));
#else
  for (int i = 0; i < kLanes; ++i)
    lo.f[i] = static_cast<float>(tbl.v[p[i] & 15]), hi.f[i] = static_cast<float>(tbl.v[p[i] >> 4]);
#endif
}

// 16 code bytes -> their low nibbles (lo) and high nibbles (hi), 16 floats each, in byte order.
inline void vnibbles(const uint8_t* p, vf& lo, vf& hi) {
#if UQR_CPU_AVX512
  const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i m = _mm512_set1_epi32(15);
  lo = _mm512_cvtepi32_ps(_mm512_and_si512(q, m));
  hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4));
#elif UQR_CPU_AVX2
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), m = _mm_set1_epi8(15);
  const __m128i l = _mm_and_si128(q, m), h = _mm_and_si128(_mm_srli_epi16(q, 4), m);
  lo = {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(l)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(l, 8)))};
  hi = {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(h, 8)))};
#elif UQR_CPU_NEON
  const uint8x16_t q = vld1q_u8(p);
  const uint8x16_t l = vandq_u8(q, vdupq_n_u8(15)), h = vshrq_n_u8(q, 4);
  auto widen = [](uint8x16_t b) -> vf {
    const uint16x8_t a = vmovl_u8(vget_low_u8(b)), c = vmovl_u8(vget_high_u8(b));
    return {{vcvtq_f32_u32(vmovl_u16(vget_low_u16(a))), vcvtq_f32_u32(vmovl_u16(vget_high_u16(a))),
             vcvtq_f32_u32(vmovl_u16(vget_low_u16(c))), vcvtq_f32_u32(vmovl_u16(vget_high_u16(c)))}};
  };
  lo = widen(l);
  hi = widen(h);
#else
  for (int i = 0; i < kLanes; ++i) lo.f[i] = static_cast<float>(p[i] & 15), hi.f[i] = static_cast<float>(p[i] >> 4);
#endif
}

// 16 code bytes holding 32 4-bit codes in element order (element 2i = low nibble of byte i, 2i+1 =
// its high nibble, as MLX packs): e0 = elements 0-15, e1 = 16-31.
inline void vnibble_pairs(const uint8_t* p, vf& e0, vf& e1) {
#if UQR_CPU_AVX512 || UQR_CPU_AVX2
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), m = _mm_set1_epi8(15);
  const __m128i l = _mm_and_si128(q, m), h = _mm_and_si128(_mm_srli_epi16(q, 4), m);
  const __m128i a = _mm_unpacklo_epi8(l, h), b = _mm_unpackhi_epi8(l, h);
#if UQR_CPU_AVX512
  e0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(a));
  e1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
#else
  e0 = {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(a)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(a, 8)))};
  e1 = {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)))};
#endif
#elif UQR_CPU_NEON
  const uint8x16_t q = vld1q_u8(p);
  const uint8x16x2_t z = vzipq_u8(vandq_u8(q, vdupq_n_u8(15)), vshrq_n_u8(q, 4));
  auto widen = [](uint8x16_t b) -> vf {
    const uint16x8_t a = vmovl_u8(vget_low_u8(b)), c = vmovl_u8(vget_high_u8(b));
    return {{vcvtq_f32_u32(vmovl_u16(vget_low_u16(a))), vcvtq_f32_u32(vmovl_u16(vget_high_u16(a))),
             vcvtq_f32_u32(vmovl_u16(vget_low_u16(c))), vcvtq_f32_u32(vmovl_u16(vget_high_u16(c)))}};
  };
  e0 = widen(z.val[0]);
  e1 = widen(z.val[1]);
#else
  for (int i = 0; i < 8; ++i) {
    e0.f[2 * i] = static_cast<float>(p[i] & 15), e0.f[2 * i + 1] = static_cast<float>(p[i] >> 4);
    e1.f[2 * i] = static_cast<float>(p[8 + i] & 15), e1.f[2 * i + 1] = static_cast<float>(p[8 + i] >> 4);
  }
#endif
}

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
#elif UQR_CPU_AVX2
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_cvtps_ph(v.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 8), _mm256_cvtps_ph(v.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  alignas(64) float f[kLanes];
  vstore(f, v);
  for (int i = 0; i < kLanes; ++i) dst[i] = static_cast<c10::Half>(f[i]);
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
#elif UQR_CPU_AVX2
  // The same rounding, 8 lanes at a time; packus keeps the 16-bit halves in lane order per 128 bits.
  auto round8 = [](__m256 x) {
    const __m256i b = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), odd), 16);
  };
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(round8(v.lo), round8(v.hi)), 0xD8);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), packed);
#else
  alignas(64) float f[kLanes];
  vstore(f, v);
  for (int i = 0; i < kLanes; ++i) dst[i] = static_cast<c10::BFloat16>(f[i]);
#endif
}

}  // namespace uqr::cpu
