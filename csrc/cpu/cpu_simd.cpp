// Bulk dtype conversions for staging activations and storing outputs (see cpu_simd.h).
#include "cpu_simd.h"

namespace uqr::cpu {

void to_float(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

void to_float(const c10::Half* src, float* dst, int64_t n) {
  int64_t i = 0;
#if UQR_CPU_AVX512
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
#elif UQR_CPU_AVX2
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

void to_float(const c10::BFloat16* src, float* dst, int64_t n) {
  int64_t i = 0;
#if UQR_CPU_AVX512
  // bf16 is the top half of a float: widen to 32 bits and shift left.
  for (; i + 16 <= n; i += 16) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
  }
#elif UQR_CPU_AVX2
  for (; i + 8 <= n; i += 8) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

void from_float(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

void from_float(const float* src, c10::Half* dst, int64_t n) {
  int64_t i = 0;
#if UQR_CPU_AVX512
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif UQR_CPU_AVX2
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < n; ++i) dst[i] = static_cast<c10::Half>(src[i]);
}

void from_float(const float* src, c10::BFloat16* dst, int64_t n) {
  // c10's conversion rounds to nearest even and keeps NaN a NaN; the compiler vectorizes it well
  // enough for an output pass that is O(M*N) against the O(M*N*K) product.
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<c10::BFloat16>(src[i]);
}

}  // namespace uqr::cpu
