// Whole-block decoders for the CPU kernels: BlockDecoder<FMT, G>::decode(block, out) turns one
// packed block into kVecs vectors of 16 floats, in element order. The fused small-M kernel keeps
// them in registers and multiplies them straight into the accumulators; the panel path stores them
// into the panel buffer. Both therefore read only the packed bytes and share one decoder per format.
//
// The 4-bit formats, q8_0, ternary and exl3 have AVX-512 decoders (codes moved into 32-bit lanes,
// then a 16-entry table permute or an int->float convert); var_affine has a block-level scalar
// decoder (its code width changes per sub-block). Without AVX-512 the q4/q8/mlx4 formats have
// decoders written on cpu_simd.h's vector helpers (AVX2, NEON or the portable array); ternary and
// exl3 go through the shared scalar uqr_decode8_* of uqr/formats.h. The newer GGUF formats (q5_0,
// q5_1, q5_k, q6_k, q3_k, q2_k, iq4_nl, iq4_xs, mxfp4) have one decoder each on the vector helpers
// for every ISA, and so do the MLX family's other widths (MlxBitsDecoder, one for all of them).
// The tests hold each of them bit-equal to the Python reference decoder
// (tests/test_cpu_decode_exact.py).
#pragma once
#include <c10/util/Exception.h>

#include <cstring>
#include <type_traits>

#include "cpu_simd.h"
#include "uqr/formats.h"
#include "uqr/params.h"

namespace uqr::cpu {

template <int FMT>
inline void decode8(const uint8_t* blk, int chunk, float* out) { uqr_decode8_fmt<FMT>(blk, chunk, out); }

// Scalar decoder over the shared uqr_decode8_*: the reference-equal fallback for every format.
template <int FMT, int G = 0>
struct GenericDecoder {
  static constexpr int kElems = uqr_block_elems(FMT, G);
  static constexpr int kBytes = uqr_block_bytes(FMT, G);
  static constexpr int kVecs = kElems / kLanes;
  static inline void decode(const uint8_t* blk, vf* out) {
    alignas(64) float tmp[kElems];
    for (int c = 0; c < kElems / 8; ++c) decode8<FMT>(blk, c, tmp + 8 * c);
    for (int v = 0; v < kVecs; ++v) out[v] = vload(tmp + kLanes * v);
  }
};

// The MLX family's bitstream widths (mlx2/3/5/6/8), every ISA: a chunk of 8 codes is exactly B
// bytes from byte B chunk, so one little-endian load of those bytes holds all 8 and shifts split
// them (uqr_decode8_mlx_bits reads byte by byte). scale q + bias: the product is exact, so a
// contracted FMA rounds the same as the reference.
template <int FMT, int G>
struct MlxBitsDecoder : GenericDecoder<FMT, G> {
  static constexpr int kBits = uqr_code_bits(FMT);
  static_assert(kBits > 0 && kBits <= 8, "an MLX-family width");
  static inline void decode(const uint8_t* blk, vf* out) {
    const float s = load_half(blk), b = load_half(blk + 2);
    alignas(64) float tmp[G];
    for (int c = 0; c < G / 8; ++c) {
      uint64_t v = 0;
      std::memcpy(&v, blk + 4 + kBits * c, kBits);  // the host is little-endian (x86-64, aarch64)
      for (int i = 0; i < 8; ++i)
        tmp[8 * c + i] = static_cast<float>((v >> (kBits * i)) & ((1u << kBits) - 1u)) * s + b;
    }
    for (int v = 0; v < G / kLanes; ++v) out[v] = vload(tmp + kLanes * v);
  }
};

// Grouped formats (mlx4 has its own nibble decoders below) take MlxBitsDecoder, the others the
// shared scalar decoder unless specialized below.
template <int FMT, int G = 0>
struct BlockDecoder : std::conditional_t<(uqr_code_bits(FMT) > 0), MlxBitsDecoder<FMT, G>, GenericDecoder<FMT, G>> {};

// The 8 sub-block scales and mins of a q4_k / q5_k super-block (d, dmin, 12 bytes of 6-bit
// fields at blk + 4), times d and dmin.
struct KSubScales {
  float s[8], m[8];
  explicit KSubScales(const uint8_t* blk) {
    const float d = load_half(blk), dmin = load_half(blk + 2);
    uint32_t w[3], sc[2], mn[2];
    std::memcpy(w, blk + 4, 12);
    uqr_q4_k_scale_min_words(w[0], w[1], w[2], false, sc[0], mn[0]);
    uqr_q4_k_scale_min_words(w[0], w[1], w[2], true, sc[1], mn[1]);
    for (int j = 0; j < 8; ++j) {
      s[j] = d * static_cast<float>((sc[j >> 2] >> (8 * (j & 3))) & 0xFF);
      m[j] = dmin * static_cast<float>((mn[j >> 2] >> (8 * (j & 3))) & 0xFF);
    }
  }
};

#if UQR_CPU_AVX512

// 16 bytes -> 16 int32 lanes, each holding one byte (two nibbles).
inline __m512i widen_bytes(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// vpermps reads only the low 4 bits of each index, so a 16-entry table indexed by a lane that still
// carries the high nibble needs no mask: the table lookup is the nibble extraction.
inline __m512 nibble_table(float base) {
  return _mm512_add_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_ps(base));
}

template <>
struct BlockDecoder<UQR_Q4_0, 0> : GenericDecoder<UQR_Q4_0, 0> {
  static inline void decode(const uint8_t* blk, vf* out) {
    // The scale is applied to the 16-entry table once instead of to the 32 looked-up values:
    // (q - 8) d is the same single rounding either way, for one multiply instead of two.
    const __m512 tbl = _mm512_mul_ps(nibble_table(-8.f), _mm512_set1_ps(load_half(blk)));
    const __m512i q = widen_bytes(blk + 2);
    out[0] = _mm512_permutexvar_ps(q, tbl);
    out[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), tbl);
  }
};

template <>
struct BlockDecoder<UQR_Q4_1, 0> : GenericDecoder<UQR_Q4_1, 0> {
  static inline void decode(const uint8_t* blk, vf* out) {
    // q d + m evaluated on the table (one FMA, same rounding as per element).
    const __m512 tbl = _mm512_fmadd_ps(nibble_table(0.f), _mm512_set1_ps(load_half(blk)), _mm512_set1_ps(load_half(blk + 2)));
    const __m512i q = widen_bytes(blk + 4);
    out[0] = _mm512_permutexvar_ps(q, tbl);
    out[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), tbl);
  }
};

template <>
struct BlockDecoder<UQR_Q8_0, 0> : GenericDecoder<UQR_Q8_0, 0> {
  static inline void decode(const uint8_t* blk, vf* out) {
    const __m512 d = _mm512_set1_ps(load_half(blk));
    for (int v = 0; v < 2; ++v) {
      __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2 + 16 * v)));
      out[v] = _mm512_mul_ps(_mm512_cvtepi32_ps(q), d);
    }
  }
};

// q4_k: the 8 six-bit scales and mins are unpacked with four 32-bit word operations (ggml's
// packing, byte-parallel) and scaled by d / dmin 16 lanes at once; the per-sub-block factors are
// then broadcast from memory (a load, not a shuffle: the shuffle port is the decoder's bottleneck).
// f[j] = d sc_j, f[8 + j] = dmin m_j of one q4_k block.
inline void q4_k_factors(const uint8_t* blk, float* f) {
  const float d = load_half(blk), dmin = load_half(blk + 2);
  const uint32_t w0 = uqr_load_u32(blk + 4), w1 = uqr_load_u32(blk + 8), w2 = uqr_load_u32(blk + 12);
  // bytes: sc0..3 | sc4..7 | m0..3 | m4..7, as docs/formats.md's q4_k scale rules, 4 at a time.
  const __m128i packed = _mm_setr_epi32(
      static_cast<int>(w0 & 0x3f3f3f3fu),
      static_cast<int>((w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u)),
      static_cast<int>(w1 & 0x3f3f3f3fu),
      static_cast<int>(((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u)));
  const __m512 mult = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(d), _mm512_set1_ps(dmin));
  _mm512_storeu_ps(f, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(packed)), mult));
}

template <>
struct BlockDecoder<UQR_Q4_K, 0> : GenericDecoder<UQR_Q4_K, 0> {
  static inline void decode(const uint8_t* blk, vf* out) {
    alignas(64) float f[16];
    q4_k_factors(blk, f);
    const __m512 tbl = nibble_table(0.f);
    for (int c = 0; c < 4; ++c) {
      // Bytes qs[32c..32c+31]: low nibbles = sub-block 2c, high nibbles = sub-block 2c+1. Each
      // sub-block's 16 possible values are computed once (same rounding as per element).
      const __m512 t_lo = _mm512_fmsub_ps(tbl, _mm512_set1_ps(f[2 * c]), _mm512_set1_ps(f[8 + 2 * c]));
      const __m512 t_hi = _mm512_fmsub_ps(tbl, _mm512_set1_ps(f[2 * c + 1]), _mm512_set1_ps(f[9 + 2 * c]));
      const __m512i q0 = widen_bytes(blk + 16 + 32 * c), q1 = widen_bytes(blk + 16 + 32 * c + 16);
      out[4 * c + 0] = _mm512_permutexvar_ps(q0, t_lo);
      out[4 * c + 1] = _mm512_permutexvar_ps(q1, t_lo);
      out[4 * c + 2] = _mm512_permutexvar_ps(_mm512_srli_epi32(q0, 4), t_hi);
      out[4 * c + 3] = _mm512_permutexvar_ps(_mm512_srli_epi32(q1, 4), t_hi);
    }
  }
};

// mlx4 packs neighbours into one byte (even element = low nibble), so bytes are split into nibbles
// and re-interleaved in element order before widening.
template <int G>
struct BlockDecoder<UQR_MLX4, G> : GenericDecoder<UQR_MLX4, G> {
  static inline void decode(const uint8_t* blk, vf* out) {
    const __m512 s = _mm512_set1_ps(load_half(blk)), b = _mm512_set1_ps(load_half(blk + 2));
    const __m128i mask = _mm_set1_epi8(15);
    for (int c = 0; c < G / 32; ++c) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 4 + 16 * c));
      const __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
      const __m128i e0 = _mm_unpacklo_epi8(lo, hi), e1 = _mm_unpackhi_epi8(lo, hi);
      out[2 * c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(e0)), s, b);
      out[2 * c + 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(e1)), s, b);
    }
  }
};

// ternary for the decode (mma) path: lane i takes code bits 2i..2i+1 of its 32-bit word; the table
// maps the low 4 index bits (this code + the next one's low bits) to code - 1.
template <>
struct BlockDecoder<UQR_TERNARY, 0> : GenericDecoder<UQR_TERNARY, 0> {
  static inline void decode(const uint8_t* blk, vf* out) {
    const __m512 d = _mm512_set1_ps(load_half(blk));
    const __m512 tbl = _mm512_setr_ps(-1, 0, 1, 0, -1, 0, 1, 0, -1, 0, 1, 0, -1, 0, 1, 0);
    const __m512i shifts = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    for (int v = 0; v < 2; ++v) {
      const __m512i w = _mm512_set1_epi32(static_cast<int>(uqr_load_u32(blk + 4 + 4 * v)));
      out[v] = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srlv_epi32(w, shifts), tbl), d);
    }
  }
};


// exl3: each sub-block has its own 8-entry table y_k = d (s P[k] + r R[k]) + bias, computed once
// (in the reference's order: integer bracket, times d, plus bias) and replicated to 16 lanes;
// lane i then gets its 3-bit index shifted to the bottom, and vpermps (low 4 bits) looks it up.
// The bit above the index belongs to the next element, which the replication makes harmless.
template <>
struct BlockDecoder<UQR_EXL3, 0> : GenericDecoder<UQR_EXL3, 0> {
  static inline void decode(const uint8_t* blk, vf* out) {
    const __m512 d = _mm512_set1_ps(load_half(blk)), bias = _mm512_set1_ps(load_half(blk + 2));
    // lanes 0..7 = P, 8..15 = R (int8 -> float, exact)
    const __m512 cb = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + UQR_EXL3_CODEBOOK))));
    const __m512 R = _mm512_shuffle_f32x4(cb, cb, _MM_SHUFFLE(3, 2, 3, 2));  // R into lanes 0..7
    const __m512i even = _mm512_setr_epi64(0, 6, 12, 18, 24, 30, 36, 42);
    const __m512i odd = _mm512_setr_epi64(3, 9, 15, 21, 27, 33, 39, 45);
    const uint8_t* qs = blk + UQR_EXL3_QS;
    for (int j = 0; j < 8; ++j) {
      const __m512 s = _mm512_set1_ps(blk[UQR_EXL3_SCALES + j]), r = _mm512_set1_ps(blk[UQR_EXL3_RESIDUALS + j]);
      const __m512 t = _mm512_add_ps(_mm512_mul_ps(_mm512_fmadd_ps(cb, s, _mm512_mul_ps(R, r)), d), bias);
      const __m512 table = _mm512_shuffle_f32x4(t, t, _MM_SHUFFLE(1, 0, 1, 0));
      for (int h = 0; h < 2; ++h) {
        uint64_t bits = 0;
        std::memcpy(&bits, qs + 12 * j + 6 * h, 6);  // 16 indices x 3 bits; never past the block
        const __m512i v = _mm512_set1_epi64(static_cast<long long>(bits));
        const __m512i idx = _mm512_mask_blend_epi32(0xAAAA, _mm512_srlv_epi64(v, even),
                                                    _mm512_slli_epi64(_mm512_srlv_epi64(v, odd), 32));
        out[2 * j + h] = _mm512_permutexvar_ps(idx, table);
      }
    }
  }
};

#else  // !UQR_CPU_AVX512

// The other vector ISAs (AVX2, NEON, the portable array): codes widened to float lanes by the
// cpu_simd.h helpers, then one FMA per 16 elements with the block's factors. fma(q, d, -8d) is the
// reference's (q - 8) d with its single rounding (8d is exact), and likewise q d + m, sc q - off.

// A 32-weight block of 16 code bytes (elements 0-15 in the low nibbles, 16-31 in the high ones):
// q d + offset per element.
inline void nibble_block(const uint8_t* qs, float d, float offset, vf* out) {
  const vf vd = vset1(d), off = vset1(offset);
  vf lo, hi;
  vnibbles(qs, lo, hi);
  out[0] = vfma(lo, vd, off);
  out[1] = vfma(hi, vd, off);
}

template <>
struct BlockDecoder<UQR_Q4_0, 0> : GenericDecoder<UQR_Q4_0, 0> {
  static inline void decode(const uint8_t* blk, vf* out) {
    const float d = load_half(blk);
    nibble_block(blk + 2, d, -8.f * d, out);
  }
};

template <>
struct BlockDecoder<UQR_Q4_1, 0> : GenericDecoder<UQR_Q4_1, 0> {
  static inline void decode(const uint8_t* blk, vf* out) { nibble_block(blk + 4, load_half(blk), load_half(blk + 2), out); }
};

template <>
struct BlockDecoder<UQR_Q8_0, 0> : GenericDecoder<UQR_Q8_0, 0> {
  static inline void decode(const uint8_t* blk, vf* out) {
    const vf d = vset1(load_half(blk));
    out[0] = vmul(vfrom_s8(blk + 2), d);
    out[1] = vmul(vfrom_s8(blk + 18), d);
  }
};


template <>
struct BlockDecoder<UQR_Q4_K, 0> : GenericDecoder<UQR_Q4_K, 0> {
  static inline void decode(const uint8_t* blk, vf* out) {
    const KSubScales k(blk);
    for (int c = 0; c < 4; ++c) {
      // qs[32c .. 32c+31]: sub-block 2c in the low nibbles, 2c+1 in the high ones.
      const vf s0 = vset1(k.s[2 * c]), m0 = vset1(k.m[2 * c]);
      const vf s1 = vset1(k.s[2 * c + 1]), m1 = vset1(k.m[2 * c + 1]);
      vf lo0, hi0, lo1, hi1;
      vnibbles(blk + 16 + 32 * c, lo0, hi0);
      vnibbles(blk + 16 + 32 * c + 16, lo1, hi1);
      out[4 * c + 0] = vfms(lo0, s0, m0);
      out[4 * c + 1] = vfms(lo1, s0, m0);
      out[4 * c + 2] = vfms(hi0, s1, m1);
      out[4 * c + 3] = vfms(hi1, s1, m1);
    }
  }
};

template <int G>
struct BlockDecoder<UQR_MLX4, G> : GenericDecoder<UQR_MLX4, G> {
  static inline void decode(const uint8_t* blk, vf* out) {
    const vf s = vset1(load_half(blk)), b = vset1(load_half(blk + 2));
    for (int c = 0; c < G / 32; ++c) {
      vf e0, e1;
      vnibble_pairs(blk + 4 + 16 * c, e0, e1);
      out[2 * c] = vfma(e0, s, b);
      out[2 * c + 1] = vfma(e1, s, b);
    }
  }
};

#endif  // UQR_CPU_AVX512

// The newer GGUF formats, one decoder per format for every vector ISA. Each assembles its integer
// codes (already offset, as int8, where the reference subtracts before converting) in fixed-size byte
// loops the compiler vectorizes (q5_k, q6_k) or in 64-bit words (q5_0, q5_1, q3_k, q2_k: a handful
// of ALU operations per 8 codes, whatever the vectorizer decides in the caller), a byte shuffle
// (the codebook formats), then converts 16 at a time and applies the sub-block factors with
// the reference's own operations: (q - z) d is a convert and a multiply of the offset code (not
// fma(q, d, -z d), which differs from it for an infinite d), and the affine forms q s + m / q s - m
// are FMAs because their products are exact (at most 11 + 6 + 5 significant bits), so fusing
// changes no rounding.

// Bits 0-7 of b -> bytes 0-7 of the result, each 0x10 (bit set) or 0: byte i of b * 0x01..01 is
// b, the mask keeps its bit i, and adding 0x7F carries into bit 7 exactly when that bit is set.
inline uint64_t bits_to_0x10_bytes(uint32_t b) {
  const uint64_t spread = ((static_cast<uint64_t>(b & 0xFFu) * 0x0101010101010101ull) & 0x8040201008040201ull);
  return ((spread + 0x7F7F7F7F7F7F7F7Full) >> 3) & 0x1010101010101010ull;
}

// q5_0 / q5_1 codes as four words of 8 bytes (elements 8i..8i+7 in word i), assembled SWAR-style:
// word i takes the low 4 bits from qs (low nibbles for words 0-1, high for 2-3) and bit 4 from qh
// byte i. q5_0's words hold q - 16 as int8: the low nibble, with 0xF0 above it when bit 4 is clear.
template <bool kSigned>
inline void q5_codes(const uint8_t* qh_p, const uint8_t* qs, uint64_t* c) {
  const uint32_t qh = uqr_load_u32(qh_p);
  uint64_t w0, w1;
  std::memcpy(&w0, qs, 8), std::memcpy(&w1, qs + 8, 8);
  const uint64_t m = 0x0F0F0F0F0F0F0F0Full;
  const uint64_t nib[4] = {w0 & m, w1 & m, (w0 >> 4) & m, (w1 >> 4) & m};
  for (int i = 0; i < 4; ++i) {
    const uint64_t h = bits_to_0x10_bytes(qh >> (8 * i));
    c[i] = kSigned ? nib[i] | ((h ^ 0x1010101010101010ull) * 0x0F) : nib[i] | h;
  }
}

template <>
struct BlockDecoder<UQR_Q5_0, 0> : GenericDecoder<UQR_Q5_0, 0> {
  static inline void decode(const uint8_t* blk, vf* out) {
    const vf d = vset1(load_half(blk));
    uint64_t c[4];
    q5_codes<true>(blk + UQR_Q5_0_QH, blk + UQR_Q5_0_QS, c);
    out[0] = vmul(vfrom_s8(c[0], c[1]), d);
    out[1] = vmul(vfrom_s8(c[2], c[3]), d);
  }
};

template <>
struct BlockDecoder<UQR_Q5_1, 0> : GenericDecoder<UQR_Q5_1, 0> {
  static inline void decode(const uint8_t* blk, vf* out) {
    const vf d = vset1(load_half(blk)), m = vset1(load_half(blk + 2));
    uint64_t c[4];
    q5_codes<false>(blk + UQR_Q5_1_QH, blk + UQR_Q5_1_QS, c);
    out[0] = vfma(vfrom_u8(c[0], c[1]), d, m);
    out[1] = vfma(vfrom_u8(c[2], c[3]), d, m);
  }
};

// q5_k: q4_k's scales and nibbles, bit 4 of sub-block j's element i in bit j of qh[i].
template <>
struct BlockDecoder<UQR_Q5_K, 0> : GenericDecoder<UQR_Q5_K, 0> {
  static inline void decode(const uint8_t* blk, vf* out) {
    const KSubScales k(blk);
    const uint8_t* qh = blk + UQR_Q5_K_QH;
    for (int c = 0; c < 4; ++c) {
      // qs[32c .. 32c+31]: sub-block 2c in the low nibbles, 2c+1 in the high ones.
      const uint8_t* qs = blk + UQR_Q5_K_QS + 32 * c;
      alignas(32) uint8_t q0[32], q1[32];
      for (int i = 0; i < 32; ++i) {
        q0[i] = static_cast<uint8_t>((qs[i] & 15) | (((qh[i] >> (2 * c)) & 1) << 4));
        q1[i] = static_cast<uint8_t>((qs[i] >> 4) | (((qh[i] >> (2 * c + 1)) & 1) << 4));
      }
      const vf s0 = vset1(k.s[2 * c]), m0 = vset1(k.m[2 * c]);
      const vf s1 = vset1(k.s[2 * c + 1]), m1 = vset1(k.m[2 * c + 1]);
      out[4 * c + 0] = vfms(vfrom_u8(q0), s0, m0);
      out[4 * c + 1] = vfms(vfrom_u8(q0 + 16), s0, m0);
      out[4 * c + 2] = vfms(vfrom_u8(q1), s1, m1);
      out[4 * c + 3] = vfms(vfrom_u8(q1 + 16), s1, m1);
    }
  }
};

// q6_k: per half h and quarter t (elements 128h + 32t + l), low 4 bits from
// ql[64h + 32 (t & 1) + l] (high nibble for t >= 2), top 2 from bits 2t of qh[32h + l].
template <>
struct BlockDecoder<UQR_Q6_K, 0> : GenericDecoder<UQR_Q6_K, 0> {
  static inline void decode(const uint8_t* blk, vf* out) {
    const float d = load_half(blk + UQR_Q6_K_D);
    const int8_t* scales = reinterpret_cast<const int8_t*>(blk + UQR_Q6_K_SCALES);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = blk + 64 * h;
      const uint8_t* qh = blk + UQR_Q6_K_QH + 32 * h;
      alignas(32) uint8_t q[4][32];
      for (int l = 0; l < 32; ++l) {
        q[0][l] = static_cast<uint8_t>(((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
        q[1][l] = static_cast<uint8_t>(((ql[32 + l] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
        q[2][l] = static_cast<uint8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        q[3][l] = static_cast<uint8_t>(((ql[32 + l] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      }
      for (int v = 0; v < 8; ++v) {
        const vf s = vset1(d * static_cast<float>(scales[8 * h + v]));
        out[8 * h + v] = vmul(s, vfrom_s8(q[v >> 1] + 16 * (v & 1)));
      }
    }
  }
};

// iq4_nl / mxfp4: q4_0's nibble layout through a 16-entry codebook, y = d V[q] (exact).
inline void lut_block(const uint8_t* qs, const Lut16& tbl, float d, vf* out) {
  const vf vd = vset1(d);
  vf lo, hi;
  vnibbles_lut(qs, tbl, lo, hi);
  out[0] = vmul(lo, vd);
  out[1] = vmul(hi, vd);
}

inline constexpr Lut16 kIq4Levels = lut16_from_words(UQR_IQ4_WORDS);
inline constexpr Lut16 kMxfp4Levels = lut16_from_words(UQR_MXFP4_WORDS);

template <>
struct BlockDecoder<UQR_IQ4_NL, 0> : GenericDecoder<UQR_IQ4_NL, 0> {
  static inline void decode(const uint8_t* blk, vf* out) { lut_block(blk + 2, kIq4Levels, load_half(blk), out); }
};

template <>
struct BlockDecoder<UQR_MXFP4, 0> : GenericDecoder<UQR_MXFP4, 0> {
  static inline void decode(const uint8_t* blk, vf* out) { lut_block(blk + 1, kMxfp4Levels, uqr_e8m0_half(blk[0]), out); }
};

// iq4_xs: sub-block j is 16 bytes of qs in iq4_nl's layout, with the factor d (ls_j - 32).
template <>
struct BlockDecoder<UQR_IQ4_XS, 0> : GenericDecoder<UQR_IQ4_XS, 0> {
  static inline void decode(const uint8_t* blk, vf* out) {
    const float d = load_half(blk);
    for (int j = 0; j < 8; ++j)
      lut_block(blk + UQR_IQ4_XS_QS + 16 * j, kIq4Levels, d * static_cast<float>(uqr_iq4_xs_scale(blk, j) - 32),
                out + 2 * j);
  }
};

// q3_k / q2_k: element 128h + 32s + l takes bits 2s of qs[32h + l], so the 32 codes of one (h, s)
// are the four 8-byte words of qs[32h..32h+31] shifted by 2s and masked per byte (SWAR; words 0-1
// are sub-block 8h + 2s, words 2-3 the next one).
constexpr uint64_t kBytes01 = 0x0101010101010101ull;

// q3_k: bit 2 of the code is bit 4h + s of hmask[l]; the int8 q - 4 is the low 2 bits, with 0xFC
// above them where that bit is clear.
template <>
struct BlockDecoder<UQR_Q3_K, 0> : GenericDecoder<UQR_Q3_K, 0> {
  static inline void decode(const uint8_t* blk, vf* out) {
    const float d = load_half(blk + UQR_Q3_K_D);
    uint64_t hm[4];
    std::memcpy(hm, blk, 32);
    for (int h = 0; h < 2; ++h) {
      uint64_t qs[4];
      std::memcpy(qs, blk + UQR_Q3_K_QS + 32 * h, 32);
      for (int s = 0; s < 4; ++s) {
        uint64_t c[4];
        for (int i = 0; i < 4; ++i)
          c[i] = ((qs[i] >> (2 * s)) & (3 * kBytes01)) | ((((hm[i] >> (4 * h + s)) & kBytes01) ^ kBytes01) * 0xFC);
        const int j = 8 * h + 2 * s;
        out[j] = vmul(vfrom_s8(c[0], c[1]), vset1(d * static_cast<float>(uqr_q3_k_scale(blk, j) - 32)));
        out[j + 1] = vmul(vfrom_s8(c[2], c[3]), vset1(d * static_cast<float>(uqr_q3_k_scale(blk, j + 1) - 32)));
      }
    }
  }
};

// q2_k: y = (d sc) q - dmin m with scales[j] = sc | m << 4.
template <>
struct BlockDecoder<UQR_Q2_K, 0> : GenericDecoder<UQR_Q2_K, 0> {
  static inline void decode(const uint8_t* blk, vf* out) {
    const float d = load_half(blk + UQR_Q2_K_D), dmin = load_half(blk + UQR_Q2_K_DMIN);
    for (int h = 0; h < 2; ++h) {
      uint64_t qs[4];
      std::memcpy(qs, blk + UQR_Q2_K_QS + 32 * h, 32);
      for (int s = 0; s < 4; ++s) {
        uint64_t c[4];
        for (int i = 0; i < 4; ++i) c[i] = (qs[i] >> (2 * s)) & (3 * kBytes01);
        for (int half = 0; half < 2; ++half) {
          const int j = 8 * h + 2 * s + half;
          const uint32_t sc = blk[j];
          const vf dl = vset1(d * static_cast<float>(sc & 15u)), ml = vset1(dmin * static_cast<float>(sc >> 4));
          out[j] = vfms(vfrom_u8(c[2 * half], c[2 * half + 1]), dl, ml);
        }
      }
    }
  }
};

// var_affine: codes of 3-5 bits, byte-aligned per sub-block (32 codes x B bits = 4B bytes). The
// payload is copied into a zero-padded local buffer so every code is one unaligned 64-bit load
// and a shift, then each sub-block is converted and scaled 16 lanes at a time. Depth and start
// are clamped as in formats.h, so any modes keep the loads inside the buffer (start + 31 B / 8 +
// 8 <= 128 - 4 B + 4 B + 8).
template <>
struct BlockDecoder<UQR_VAR_AFFINE, 0> : GenericDecoder<UQR_VAR_AFFINE, 0> {
  static inline void decode(const uint8_t* blk, vf* out) {
    const float d = load_half(blk), bias = load_half(blk + 2);
    uint8_t qs[128 + 8] = {};
    std::memcpy(qs, blk + UQR_VAR_AFFINE_QS, 128);
    int byte0 = 0;
    for (int j = 0; j < 8; ++j) {
      const int B = static_cast<int>(uqr_var_affine_depth(blk[UQR_VAR_AFFINE_MODES + j]));
      const int start = static_cast<int>(uqr_var_affine_start(static_cast<uint32_t>(byte0), B));
      const uint64_t mask = (1u << B) - 1u;
      const float scale = d * static_cast<float>(blk[UQR_VAR_AFFINE_SCALES + j]);
      const float shift = bias * static_cast<float>(blk[UQR_VAR_AFFINE_BIASES + j]);
      alignas(64) float q[32];
      for (int t = 0; t < 32; ++t) {
        uint64_t word;
        std::memcpy(&word, qs + start + ((t * B) >> 3), 8);
        q[t] = static_cast<float>((word >> ((t * B) & 7)) & mask);
      }
      const vf vs = vset1(scale), vb = vset1(shift);
      out[2 * j] = vfma(vload(q), vs, vb);
      out[2 * j + 1] = vfma(vload(q + 16), vs, vb);
      byte0 += 4 * B;
    }
  }
};

// Weight rows [n0, n0 + rows) decoded into panel (row r at panel + r * ld), as T (float or half).
template <class Dec, class T>
inline void decode_rows(const uint8_t* w, const uqr_gemm_params& p, int64_t n0, int64_t rows, T* panel,
                        int64_t ld) {
  const int64_t nblocks = p.K / Dec::kElems;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = w + (n0 + r) * p.row_bytes;
    T* dst = panel + r * ld;
    for (int64_t b = 0; b < nblocks; ++b) {
      vf v[Dec::kVecs];
      Dec::decode(row + b * Dec::kBytes, v);
      for (int i = 0; i < Dec::kVecs; ++i) vstore_as(dst + b * Dec::kElems + i * kLanes, v[i]);
    }
  }
}

template <class T>
struct Tag {
  using type = T;
};

// Calls f(Tag<Decoder>{}) with the decoder of `fmt` (a grouped format: of group size g), so format dispatch
// happens once per call and the hot loops are compiled per format (C++17: a generic lambda
// recovers the type with `typename decltype(tag)::type`).
template <class F>
inline void with_decoder(int fmt, int g, F&& f) {
#define UQR_DECODER_CASE(id, name) \
  case id: f(Tag<BlockDecoder<id>>{}); return;
  switch (fmt) {
    UQR_FIXED_BLOCK_LIST(UQR_DECODER_CASE)
  }
#undef UQR_DECODER_CASE
#define UQR_GROUPED_DECODER_CASE(id, G) \
  if (fmt == id && g == G) { f(Tag<BlockDecoder<id, G>>{}); return; }
  UQR_GROUPED_CASES(UQR_GROUPED_DECODER_CASE)
#undef UQR_GROUPED_DECODER_CASE
  TORCH_INTERNAL_ASSERT(false, "uqr: no CPU decoder for format id ", fmt);
}

}  // namespace uqr::cpu
