// Path "int8": activations quantized to int8 (one fp32 scale per 32 elements for q4_0 and ternary,
// per 256 for q4_k, var_affine and exl3, per group for mlx4), the weights' integer codes (4-bit;
// ternary 2-bit; var_affine 3-5 bit; exl3 the int8 codebook values its 3-bit indices pick)
// multiplied in with integer dot products (u8 x s8 -> int32: AVX-512 VNNI's vpdpbusd where a VNNI
// form exists; AVX2's vpmaddubsw + vpmaddwd for q4_0, q4_k and mlx4).
//
// Why: the fp32 fused kernel widens every nibble to a float lane (permutes and broadcasts on
// port 5, ~9-12 cycles per 32-weight block measured); one vpdpbusd consumes 32 nibbles against
// 32 int8 activations after just a mask and a shift. The price is the activation rounding:
// a few 1e-3 relative error instead of fp32 accumulation error, hence opt-in.
//
// Integer identities used (x_s8 = round(x / dx), sx = sum of the block's x_s8):
//   q4_0: sum_j d (q_j - 8) x_j  ~  d dx (dot(q, x_s8) - 8 sx)
//   q4_k: per super-block (one dx): d dx sum_j sc_j dot_j(q, x_s8) - dmin dx sum_j m_j sx_j, both
//         sums over the 8 sub-blocks in integers
//   mlx4: per group (one dx): dx (scale dot(q, x_s8) + bias sx)
//   ternary: sum_j d (c_j - 1) x_j  ~  d dx (dot(c, x_s8) - sx)
//   var_affine: per block (one dx): dx (d sum_j s_j dot_j(q, x_s8) + bias sum_j b_j sx_j)
//   exl3: per block (one dx): dx (d sum_j (s_j dot_j(P[k], x_s8) + r_j dot_j(R[k], x_s8)) + bias sx),
//         sx over the whole block
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_simd.h"
#include "kernels.h"
#include "uqr/formats.h"

#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512VBMI__) && defined(__GFNI__) && \
    UQR_CPU_AVX512
#define UQR_CPU_VNNI 1
#else
#define UQR_CPU_VNNI 0
#endif

namespace uqr::cpu {
namespace {

constexpr int kQBlock = 32;

// Activation rows in int8: q[R][K], per 32-element block d (scale: the block's for q4_0, its
// super-block's for q4_k) and s (sum of the int8 codes).
struct QRows {
  int64_t K = 0, nb = 0;
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> s;
  std::vector<float> ds;  // d * s: the block's sum of x as the codes give it (q4_k's min term)
  // With VNNI, per-lane terms in groups of 16 per row: q4_0 one group per block quad (quad_up_q4_0:
  // qinit, qdx), q4_k one per super-block (interleave_q4_k: qdx lane 0 = dx, qinit = the 8 block
  // sums as int16 words).
  // mlx4: one group of 16 per 128 elements (pack_mlx4: qdx = each lane's group's dx, qb = its
  // group's dx * sum spread over the group's lanes).
  int64_t nq = 0;
  std::vector<int32_t> qinit;
  std::vector<float> qdx, qb;
};

// Codes of 32 elements at 1/d = id (round half to even, as std::nearbyint): returns their sum.
int32_t encode_block(const float* x, float id, int8_t* q) {
#if UQR_CPU_AVX512
  // cvtps rounds with MXCSR's default mode, nearest-even: the same as std::nearbyint below.
  const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), _mm512_set1_ps(id)));
  const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16), _mm512_set1_ps(id)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(qa));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(qb));
  return _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
#else
  int32_t s = 0;
  for (int i = 0; i < kQBlock; ++i) {
    const int v = static_cast<int>(std::nearbyint(x[i] * id));
    q[i] = static_cast<int8_t>(std::clamp(v, -128, 127));
    s += q[i];
  }
  return s;
#endif
}

float abs_max(const float* x, int64_t n) {
#if UQR_CPU_AVX512
  __m512 m = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
  return _mm512_reduce_max_ps(m);
#else
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
#endif
}

// One scale d = amax / 127 for `span` elements (32, or 256 for q4_k: one per super-block, so
// that a super-block's sub-block dots add up in integers); per 32-element block its d (the
// span's) and code sum s.
void quantize_span(const float* x, int64_t span, int8_t* q, float* d_out, int32_t* s_out) {
  const float d = abs_max(x, span) / 127.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  for (int64_t b = 0; b < span / kQBlock; ++b) {
    d_out[b] = d;
    s_out[b] = encode_block(x + b * kQBlock, id, q + b * kQBlock);
  }
}

QRows quantize_rows(const float* X, int64_t R, int64_t K, int64_t span) {
  QRows xq;
  xq.K = K;
  xq.nb = K / kQBlock;
  xq.q.resize(static_cast<size_t>(R * K));
  xq.d.resize(static_cast<size_t>(R * xq.nb));
  xq.s.resize(static_cast<size_t>(R * xq.nb));
  xq.ds.resize(static_cast<size_t>(R * xq.nb));
  const int64_t per = span / kQBlock;
  at::parallel_for(0, R * K / span, std::max<int64_t>(1, 32768 / span), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      quantize_span(X + i * span, span, xq.q.data() + i * span, xq.d.data() + i * per, xq.s.data() + i * per);
      for (int64_t b = i * per; b < (i + 1) * per; ++b) xq.ds[b] = xq.d[b] * static_cast<float>(xq.s[b]);
    }
  });
  return xq;
}

// A tile's view of MR quantized rows from block kb on: row m's codes at q + m * ldq.
struct QView {
  const int8_t* q;
  const float* d;
  const int32_t* s;
  const float* ds;
  const int32_t* qinit;
  const float* qdx;
  int64_t ldq, ldb, ldqd;
  const float* qb;
};


#if UQR_CPU_AVX2
// 32 codes of 0..15 (one per byte) x 32 int8 x -> 8 int32 partial sums: vpmaddubsw adds pairs
// (|sum| <= 2 * 15 * 128, no int16 saturation), vpmaddwd with ones widens them.
inline __m256i dot_u4s8(__m256i q, __m256i x) { return _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), _mm256_set1_epi16(1)); }

// 16 code bytes -> 32 codes, one per byte: all low nibbles then all high nibbles, or (pairs) in
// MLX's element order, low and high nibble of each byte side by side.
inline __m256i nibbles32(const uint8_t* p, bool pairs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), m4 = _mm_set1_epi8(0x0F);
  const __m128i l = _mm_and_si128(q, m4), h = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
  return pairs ? _mm256_set_m128i(_mm_unpackhi_epi8(l, h), _mm_unpacklo_epi8(l, h)) : _mm256_set_m128i(h, l);
}

template <int NR, int MR>
inline void zero_acc(__m256 (&acc)[NR][MR]) {
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = _mm256_setzero_ps();
}
#endif

// ---- q4_0 ----------------------------------------------------------------------------------
#if UQR_CPU_VNNI
// Four q4_0 blocks (72 bytes) are one pass of 512-bit registers. Two overlapping 64-byte loads
// hold them; one byte permute (vpermt2b) gathers the four 16-byte code fields into one zmm,
// whose low nibbles are elements 0-15 of the four blocks and high nibbles elements 16-31, and one
// word permute picks the four fp16 scales (at even offsets 0, 18, 36, 54) for their 4 lanes
// each. So x is stored per quad as [b0 0-15 | b1 0-15 | b2 0-15 | b3 0-15 | b0 16-31 | ... b3
// 16-31], with per lane the dot's starting value (-2 sx: four lanes per block carry -8 sx) and dx.
// Blocks past the last whole quad stay in plain order (the single-block step).
void quad_up_q4_0(QRows& xq, int64_t R) {
  xq.nq = xq.nb / 4;
  xq.qinit.resize(static_cast<size_t>(R * xq.nq * 16));
  xq.qdx.resize(static_cast<size_t>(R * xq.nq * 16));
  for (int64_t i = 0; i < R * xq.nq; ++i) {
    const int64_t r = i / xq.nq, qb = i % xq.nq, b = r * xq.nb + 4 * qb;
    int8_t* q = xq.q.data() + r * xq.K + qb * 128;
    int8_t tmp[128];
    std::memcpy(tmp, q, 128);
    for (int k = 0; k < 4; ++k) {
      std::memcpy(q + 16 * k, tmp + 32 * k, 16);
      std::memcpy(q + 64 + 16 * k, tmp + 32 * k + 16, 16);
    }
    for (int l = 0; l < 16; ++l) {
      xq.qinit[i * 16 + l] = -2 * xq.s[b + l / 4];
      xq.qdx[i * 16 + l] = xq.d[b + l / 4];
    }
  }
}

// q4_k: a super-block's x codes stored as sub-blocks 0 2 1 3 4 6 5 7, so that one 512-bit load
// of 64 code bytes (two 32-byte groups, each a low-nibble and a high-nibble sub-block) lines up
// its low nibbles with sub-blocks 4h, 4h+2 and its high nibbles with 4h+1, 4h+3. Per super-block
// also (group of 16 lanes) its x scale dx (qdx lane 0) and, as int16 words 4-7 and 12-15 of qinit
// (the others 0), its eight sub-block code sums: the places of the mins m_0..3, m_4..7 in
// q4_k_tile's word vector of scales and mins, so one vpmaddwd gives the min term's sum.
void interleave_q4_k(QRows& xq, int64_t R) {
  xq.nq = xq.K / 256;
  xq.qdx.assign(static_cast<size_t>(R * xq.nq * 16), 0.f);
  xq.qinit.assign(static_cast<size_t>(R * xq.nq * 16), 0);
  for (int64_t i = 0; i < R * xq.nq; ++i) {
    xq.qdx[i * 16] = xq.d[i * 8];
    int16_t* sums = reinterpret_cast<int16_t*>(xq.qinit.data() + i * 16);
    for (int j = 0; j < 8; ++j) sums[(j < 4 ? 4 : 8) + j] = static_cast<int16_t>(xq.s[i * 8 + j]);
    int8_t* q = xq.q.data() + i * 256;
    for (int h = 0; h < 2; ++h) {
      int8_t tmp[32];
      std::memcpy(tmp, q + 128 * h + 32, 32);
      std::memcpy(q + 128 * h + 32, q + 128 * h + 64, 32);
      std::memcpy(q + 128 * h + 64, tmp, 32);
    }
  }
}

// vpermt2b indices: the code bytes of blocks 0-3 from A = quad bytes 0-63 and B = bytes 8-71
// (index 64 + i is B's byte i); B starts at 8 so that neither load reads past the quad.
alignas(64) constexpr uint8_t kQuadCodes[64] = {
    2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17,
    20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35,
    38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53,
    112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127};
#endif

template <int MR, int NR>
void q4_0_tile(const uint8_t* w, int64_t row_bytes, int64_t nblocks, const QView& x, float* res, int64_t ld,
               bool acc0) {
#if UQR_CPU_VNNI
  __m512 acc[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i codes = _mm512_load_si512(kQuadCodes);
  const __m256i scales = _mm256_setr_epi16(0, 0, 0, 0, 9, 9, 9, 9, 18, 18, 18, 18, 27, 27, 27, 27);
  const int64_t nquads = nblocks / 4;
  for (int64_t qb = 0; qb < nquads; ++qb) {
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + r * row_bytes + qb * 4 * UQR_Q4_0_BYTES;
      // The next tile's row, same position: a whole row ahead, which the hardware prefetcher
      // does not run (weights from DRAM: ~30% faster in a standalone test). Two lines per 72-byte quad
      // so none is skipped. Past the end of w this only misses: prefetches do not fault.
      _mm_prefetch(reinterpret_cast<const char*>(blk + NR * row_bytes), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(blk + NR * row_bytes + 64), _MM_HINT_T0);
      const __m512i a = _mm512_loadu_si512(blk), b = _mm512_loadu_si512(blk + 8);
      const __m512i raw = _mm512_permutex2var_epi8(a, codes, b);
      const __m512i lo = _mm512_and_si512(raw, m4), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
      const __m512 dw = _mm512_cvtph_ps(
          _mm512_castsi512_si256(_mm512_permutexvar_epi16(_mm512_castsi256_si512(scales), a)));
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const int8_t* xq = x.q + m * x.ldq + qb * 128;
        const int64_t qi = (m * x.ldqd + qb) * 16;
        __m512i dot = _mm512_loadu_si512(x.qinit + qi);
        dot = _mm512_dpbusd_epi32(dot, lo, _mm512_loadu_si512(xq));
        dot = _mm512_dpbusd_epi32(dot, hi, _mm512_loadu_si512(xq + 64));
        acc[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, _mm512_loadu_ps(x.qdx + qi)), acc[r][m]);
      }
    }
  }
  for (int64_t b = nquads * 4; b < nblocks; ++b) {
    const __m128i m4x = _mm_set1_epi8(0x0F);
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + r * row_bytes + b * UQR_Q4_0_BYTES;
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
      const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4x), _mm_and_si128(raw, m4x));
      for (int m = 0; m < MR; ++m) {
        // Each of the 8 lanes starts at -sx: the lanes' total carries the -8 sx term.
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + m * x.ldq + b * 32));
        const __m256i dot = _mm256_dpbusd_epi32(_mm256_set1_epi32(-x.s[m * x.ldb + b]), q, xv);
        acc[r][m] = _mm512_add_ps(acc[r][m], _mm512_zextps256_ps512(_mm256_mul_ps(
            _mm256_cvtepi32_ps(dot), _mm256_set1_ps(load_half(blk) * x.d[m * x.ldb + b]))));
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) res[m * ld + r] = (acc0 ? res[m * ld + r] : 0.f) + _mm512_reduce_add_ps(acc[r][m]);
#elif UQR_CPU_AVX2
  // Per block: the 16 code bytes as 32 nibbles in element order (low nibbles = elements 0-15),
  // dotted with the 32 int8 x; every one of the 8 int32 lanes adds -sx (the -8 sx term).
  __m256 acc[NR][MR];
  zero_acc(acc);
  for (int64_t b = 0; b < nblocks; ++b) {
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + r * row_bytes + b * UQR_Q4_0_BYTES;
      const __m256i q = nibbles32(blk + 2, false);
      const float dw = load_half(blk);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const int64_t xb = m * x.ldb + b;
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + m * x.ldq + b * 32));
        const __m256i dot = _mm256_add_epi32(dot_u4s8(q, xv), _mm256_set1_epi32(-x.s[xb]));
        acc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * x.d[xb]), acc[r][m]);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) res[m * ld + r] = (acc0 ? res[m * ld + r] : 0.f) + hsum256(acc[r][m]);
#else
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) {
      float acc = 0.f;
      for (int64_t b = 0; b < nblocks; ++b) {
        const uint8_t* blk = w + r * row_bytes + b * UQR_Q4_0_BYTES;
        const int8_t* xb = x.q + m * x.ldq + b * 32;
        int32_t dot = -8 * x.s[m * x.ldb + b];
        for (int j = 0; j < 16; ++j) dot += (blk[2 + j] & 15) * xb[j] + (blk[2 + j] >> 4) * xb[j + 16];
        acc += static_cast<float>(dot) * (load_half(blk) * x.d[m * x.ldb + b]);
      }
      res[m * ld + r] = (acc0 ? res[m * ld + r] : 0.f) + acc;
    }
#endif
}

// ---- q4_k ----------------------------------------------------------------------------------
// All eight 6-bit scales and mins from the 12 scale bytes as three little-endian words, through
// the shared word-wise unpack of formats.h: lo = bytes [sc_0..3 | m_0..3], hi = [sc_4..7 | m_4..7].
inline void q4_k_scale_min_words(const uint8_t* s12, uint64_t& lo, uint64_t& hi) {
  uint32_t w[3], sc, mn;
  std::memcpy(w, s12, 12);
  uqr_q4_k_scale_min_words(w[0], w[1], w[2], false, sc, mn);
  lo = sc | (static_cast<uint64_t>(mn) << 32);
  uqr_q4_k_scale_min_words(w[0], w[1], w[2], true, sc, mn);
  hi = sc | (static_cast<uint64_t>(mn) << 32);
}

inline void q4_k_scales_mins(const uint8_t* s12, uint64_t& sc, uint64_t& mn) {
  uint64_t lo, hi;
  q4_k_scale_min_words(s12, lo, hi);
  sc = (lo & 0xFFFFFFFFull) | (hi << 32);
  mn = (lo >> 32) | (hi & 0xFFFFFFFF00000000ull);
}

// vpermb indices (even bytes; the odd ones are zeroed by the mask) that put row r's sub-block
// scales (128-bit lane r of the unpacked bytes [sc_0..3 | m_0..3 | sc_4..7 | m_4..7]) where
// q4_k_tile's packed dots of half h have their sub-blocks: in 128-bit lane k, words 0-3 are
// sub-block 4h + 2 (k >> 1) (low nibbles), words 4-7 the next one (high nibbles).
struct ScalePick {
  alignas(64) uint8_t idx[4][2][64];
  constexpr ScalePick() : idx{} {
    for (int r = 0; r < 4; ++r)
      for (int h = 0; h < 2; ++h)
        for (int w = 0; w < 32; ++w) {
          const int j = 4 * h + 2 * (w / 16) + (w % 8) / 4;
          idx[r][h][2 * w] = idx[r][h][2 * w + 1] = static_cast<uint8_t>(16 * r + (j < 4 ? j : j + 4));
        }
  }
};
constexpr ScalePick kScalePick{};

template <int MR, int NR>
void q4_k_tile(const uint8_t* w, int64_t row_bytes, int64_t nblocks, const QView& x, float* res, int64_t ld,
               bool acc0) {
#if UQR_CPU_VNNI
  // x has one scale per super-block, so a super-block's eight sub-block dots are scaled in
  // integers: vpdpbusd per 64 code bytes, the low- and high-nibble dots packed into int16 words,
  // vpmaddwd / vpdpwssd with the 6-bit scales in the matching words; one conversion and FMA per
  // super-block and row (d dx). The NR rows' 16 head bytes (d, dmin, 12 scale bytes) share one
  // 512-bit register (row r in lane r): the 6-bit unpack, the fp16 conversion and the min term
  // dmin dx sum_j m_j sx_j (vpmaddwd against qinit's sums, two rows per vector) run once for all.
  constexpr int NP = (NR + 1) / 2;  // row pairs
  __m512 acc[NR][MR], mins[NP][MR];
  for (int m = 0; m < MR; ++m) {
    for (int r = 0; r < NR; ++r) acc[r][m] = _mm512_setzero_ps();
    for (int i = 0; i < NP; ++i) mins[i][m] = _mm512_setzero_ps();
  }
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i shr4 = _mm512_set1_epi64(0x1020408000000000ll);  // gf2p8affine: byte >> 4
  // Per lane: X1 = scale bytes [0..7 | 8..11 | 8..11], X2 = [0 x 8 | 0..7] (head offset 4).
  const __m512i sh1 = _mm512_broadcast_i32x4(_mm_setr_epi8(4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 12, 13, 14, 15));
  const __m512i sh2 = _mm512_broadcast_i32x4(_mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m512i keep1 = _mm512_broadcast_i32x4(_mm_setr_epi8(63, 63, 63, 63, 63, 63, 63, 63, 15, 15, 15, 15, 0, 0, 0, 0));
  const __m512i keep2 = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
  const __m512i c30 = _mm512_set1_epi8(0x30);
  const __m512i dpick = _mm512_zextsi256_si512(_mm256_setr_epi16(0, 1, 8, 9, 16, 17, 24, 25, 0, 0, 0, 0, 0, 0, 0, 0));
  for (int64_t b = 0; b < nblocks; ++b) {
    const uint8_t* blk0 = w + b * UQR_Q4_K_BYTES;
    __m512i head = _mm512_zextsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk0)));
    if constexpr (NR > 1)
      head = _mm512_inserti32x4(head, _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk0 + row_bytes)), 1);
    if constexpr (NR > 2) {
      head = _mm512_inserti32x4(head, _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk0 + 2 * row_bytes)), 2);
      head = _mm512_inserti32x4(head, _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk0 + 3 * row_bytes)), 3);
    }
    // 6-bit unpack (formats.h's rule): sc_j = s_j & 63, m_j = s_{j+4} & 63 (j < 4); sc_j =
    // (s_{j+4} & 15) | (s_{j-4} >> 6) << 4, m_j = (s_{j+4} >> 4) | (s_j >> 6) << 4 (j >= 4).
    const __m512i x1 = _mm512_shuffle_epi8(head, sh1), x2 = _mm512_shuffle_epi8(head, sh2);
    const __m512i low = _mm512_ternarylogic_epi32(_mm512_and_si512(x1, keep1), _mm512_srli_epi16(x1, 4), keep2, 0xF8);
    const __m512i scales = _mm512_ternarylogic_epi32(low, _mm512_srli_epi16(x2, 2), c30, 0xF8);  // a | (b & c)
    // [d_0, dmin_0, d_1, dmin_1, ...] as fp32
    const __m256 dd = _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi16(dpick, head)));
    __m512i mwords[NP];
    mwords[0] = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(scales));
    if constexpr (NP > 1) mwords[1] = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(scales, 1));
    __m512 f[MR];  // [d dx, dmin dx] per row
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const int64_t qi = (m * x.ldqd + b) * 16;
      f[m] = _mm512_zextps256_ps512(_mm256_mul_ps(dd, _mm256_set1_ps(x.qdx[qi])));
      const __m512i sums = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qinit + qi)));
#pragma GCC unroll 2
      for (int i = 0; i < NP; ++i) {
        const __m512i dm = _mm512_setr_epi32(4 * i + 1, 4 * i + 1, 4 * i + 1, 4 * i + 1, 4 * i + 1, 4 * i + 1, 4 * i + 1,
                                             4 * i + 1, 4 * i + 3, 4 * i + 3, 4 * i + 3, 4 * i + 3, 4 * i + 3, 4 * i + 3,
                                             4 * i + 3, 4 * i + 3);
        mins[i][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_madd_epi16(mwords[i], sums)),
                                     _mm512_permutexvar_ps(dm, f[m]), mins[i][m]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = blk0 + r * row_bytes;
      for (int o = 0; o < UQR_Q4_K_BYTES; o += 64)  // as for q4_0: the next tile's row
        _mm_prefetch(reinterpret_cast<const char*>(blk + NR * row_bytes + o), _MM_HINT_T0);
      __m512i sc[2], code[4];
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        sc[h] = _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, _mm512_load_si512(kScalePick.idx[r][h]), scales);
        const __m512i raw = _mm512_loadu_si512(blk + 16 + 64 * h);
        code[2 * h] = _mm512_and_si512(raw, m4);
        code[2 * h + 1] = _mm512_gf2p8affine_epi64_epi8(raw, shr4, 0);
      }
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const int8_t* xq = x.q + m * x.ldq + b * 256;
        // vpdpbusd per 64 code bytes (lanes 0-7 one sub-block, 8-15 the other; |dot| <= 4 * 15 *
        // 127 fits int16), the low- and high-nibble dots packed into int16 words (vpackssdw, no
        // saturation), then one vpmaddwd / vpdpwssd with the scales per half.
        __m512i dot[2];
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h)
          dot[h] = _mm512_packs_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), code[2 * h], _mm512_loadu_si512(xq + 128 * h)),
                                      _mm512_dpbusd_epi32(_mm512_setzero_si512(), code[2 * h + 1],
                                                          _mm512_loadu_si512(xq + 128 * h + 64)));
        const __m512i isum = _mm512_dpwssd_epi32(_mm512_madd_epi16(dot[0], sc[0]), dot[1], sc[1]);
        acc[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum),
                                    _mm512_permutexvar_ps(_mm512_set1_epi32(2 * r), f[m]), acc[r][m]);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m)
      res[m * ld + r] = (acc0 ? res[m * ld + r] : 0.f) + (_mm512_reduce_add_ps(acc[r][m]) -
                                                          _mm512_mask_reduce_add_ps(r & 1 ? 0xFF00 : 0x00FF, mins[r / 2][m]));
#elif UQR_CPU_AVX2
  // Per super-block and row: the 128 code bytes as 8 vectors of 32 nibbles (one sub-block each),
  // vpmaddubsw against the sub-block's x codes, then vpmaddwd with the sub-block's 6-bit scale
  // broadcast to int16 words sums the 8 scaled dots in int32 (|sc dot| <= 63 * 32 * 15 * 128,
  // times 8 < 2^31); one conversion and FMA by d dx per super-block. The min term
  // dmin dx sum_j m_j sx_j is summed in integers per super-block, scalar.
  __m256 acc[NR][MR];
  float mins[NR][MR] = {};
  zero_acc(acc);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < nblocks; ++b) {
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + r * row_bytes + b * UQR_Q4_K_BYTES;
      uint64_t sc, mn;
      q4_k_scales_mins(blk + 4, sc, mn);
      const float d = load_half(blk), dmin = load_half(blk + 2);
      __m256i code[8], scw[8];
      for (int c = 0; c < 4; ++c) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * c));
        code[2 * c] = _mm256_and_si256(raw, m4);
        code[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      }
      for (int j = 0; j < 8; ++j) scw[j] = _mm256_set1_epi16(static_cast<int16_t>((sc >> (8 * j)) & 63));
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const int8_t* xq = x.q + m * x.ldq + b * 256;
        __m256i isum = _mm256_setzero_si256();
        for (int j = 0; j < 8; ++j) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * j));
          isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(code[j], xv), scw[j]));
        }
        const int64_t xj = m * x.ldb + b * 8;
        int32_t msum = 0;
        for (int j = 0; j < 8; ++j) msum += static_cast<int32_t>((mn >> (8 * j)) & 63) * x.s[xj + j];
        acc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d * x.d[xj]), acc[r][m]);
        mins[r][m] += dmin * x.d[xj] * static_cast<float>(msum);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) res[m * ld + r] = (acc0 ? res[m * ld + r] : 0.f) + (hsum256(acc[r][m]) - mins[r][m]);
#else
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) {
      float acc = 0.f, mins = 0.f;
      for (int64_t b = 0; b < nblocks; ++b) {
        const uint8_t* blk = w + r * row_bytes + b * UQR_Q4_K_BYTES;
        uint64_t sc, mn;
        q4_k_scales_mins(blk + 4, sc, mn);
        const float d = load_half(blk), dmin = load_half(blk + 2);
        for (int j = 0; j < 8; ++j) {
          const uint8_t* qs = blk + 16 + 32 * (j >> 1);
          const int8_t* xb = x.q + m * x.ldq + b * 256 + 32 * j;
          int32_t dot = 0;
          for (int i = 0; i < 32; ++i) dot += ((qs[i] >> ((j & 1) * 4)) & 15) * xb[i];
          const int64_t xj = m * x.ldb + b * 8 + j;
          acc += static_cast<float>(dot) * (d * static_cast<float>((sc >> (8 * j)) & 63) * x.d[xj]);
          mins += dmin * static_cast<float>((mn >> (8 * j)) & 63) * x.ds[xj];
        }
      }
      res[m * ld + r] = (acc0 ? res[m * ld + r] : 0.f) + (acc - mins);
    }
#endif
}

// ---- mlx4 ----------------------------------------------------------------------------------
// Groups of g (32, 64, 128) with one x scale each (quantize_rows' span = g): y += dx (scale
// dot(q, x_s8) + bias sx). With VNNI, 128 elements (4, 2 or 1 groups) are one pass: one byte permute
// (vpermt2b) of two overlapping 64-byte loads gathers their 64 code bytes, whose low nibbles are the
// even elements and high nibbles the odd ones, so x is stored per 128 as [evens | odds] (pack_mlx4);
// the dot's int32 lane l belongs to group 8 l / g, whose scale and bias a word permute of the first
// load picks (headers at even offsets), and whose dx and dx * sum (spread over its lanes) come
// from qdx / qb. Groups past the last whole 128 stay in plain order (the per-group step).
#if UQR_CPU_VNNI
void pack_mlx4(QRows& xq, int64_t R, int g) {
  xq.nq = xq.K / 128;
  xq.qdx.resize(static_cast<size_t>(R * xq.nq * 16));
  xq.qb.resize(static_cast<size_t>(R * xq.nq * 16));
  const int per = g / kQBlock;
  for (int64_t i = 0; i < R * xq.nq; ++i) {
    const int64_t r = i / xq.nq, pk = i % xq.nq;
    int8_t* q = xq.q.data() + r * xq.K + pk * 128;
    int8_t tmp[128];
    for (int j = 0; j < 64; ++j) tmp[j] = q[2 * j], tmp[64 + j] = q[2 * j + 1];
    std::memcpy(q, tmp, 128);
    const int lanes = g / 8;  // dot lanes per group
    for (int k = 0; k < 128 / g; ++k) {
      const int64_t b = r * xq.nb + pk * 4 + k * per;  // the group's first x block
      float sx = 0.f;
      for (int j = 0; j < per; ++j) sx += xq.ds[b + j];
      for (int l = k * lanes; l < (k + 1) * lanes; ++l) {
        xq.qdx[i * 16 + l] = xq.d[b];
        xq.qb[i * 16 + l] = sx / static_cast<float>(lanes);
      }
    }
  }
}

// vpermt2b indices per g: pack byte p = code byte p % (g/2) of group p / (g/2), from A = bytes
// 0-63 and B = bytes span-64 .. span-1 (index 64 + i is B's byte i; span = the pack's bytes).
struct Mlx4Pick {
  alignas(64) uint8_t idx[3][64];
  alignas(32) int16_t hdr[3][16];  // per dot lane: its group's scale word in A
  constexpr Mlx4Pick() : idx{}, hdr{} {
    for (int gi = 0; gi < 3; ++gi) {
      const int g = 32 << gi, bytes = 4 + g / 2, span = 128 / g * bytes;
      for (int p = 0; p < 64; ++p) {
        const int src = p / (g / 2) * bytes + 4 + p % (g / 2);
        idx[gi][p] = static_cast<uint8_t>(src < 64 ? src : 64 + src - (span - 64));
      }
      for (int l = 0; l < 16; ++l) hdr[gi][l] = static_cast<int16_t>(8 * l / g * bytes / 2);
    }
  }
};
constexpr Mlx4Pick kMlx4Pick{};
#endif

template <int MR, int NR>
void mlx4_tile(const uint8_t* w, int64_t row_bytes, int64_t nblocks, int g, const QView& x, float* res, int64_t ld,
               bool acc0) {
  const int64_t bytes = 4 + g / 2, per = g / kQBlock;
  float part[NR][MR] = {};  // the VNNI passes' sums
  int64_t b0 = 0;  // first group of the per-group step
#if UQR_CPU_VNNI
  const int gi = g == 32 ? 0 : g == 64 ? 1 : 2;
  const int64_t gpp = 128 / g, span = gpp * bytes, npacks = nblocks / gpp;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i codes = _mm512_load_si512(kMlx4Pick.idx[gi]);
  const __m512i hdr = _mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(kMlx4Pick.hdr[gi])));
  const __m512i hdr_b = _mm512_add_epi16(hdr, _mm512_set1_epi16(1));
  __m512 acc[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = _mm512_setzero_ps();
  for (int64_t pk = 0; pk < npacks; ++pk) {
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + r * row_bytes + pk * span;
      const __m512i a = _mm512_loadu_si512(blk), b = _mm512_loadu_si512(blk + span - 64);
      const __m512i raw = _mm512_permutex2var_epi8(a, codes, b);
      const __m512i lo = _mm512_and_si512(raw, m4), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
      const __m512 scale = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(hdr, a)));
      const __m512 bias = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(hdr_b, a)));
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const int8_t* xq = x.q + m * x.ldq + pk * 128;
        const int64_t qi = (m * x.ldqd + pk) * 16;
        __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xq));
        dot = _mm512_dpbusd_epi32(dot, hi, _mm512_loadu_si512(xq + 64));
        acc[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale, _mm512_loadu_ps(x.qdx + qi)),
                                    acc[r][m]);
        acc[r][m] = _mm512_fmadd_ps(bias, _mm512_loadu_ps(x.qb + qi), acc[r][m]);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) part[r][m] = _mm512_reduce_add_ps(acc[r][m]);
  b0 = npacks * gpp;
#elif UQR_CPU_AVX2
  // Per 32 elements: 16 code bytes split into nibbles and interleaved back into element order
  // (punpcklbw / punpckhbw), dotted with x; per group one FMA by dx scale and the bias term
  // dx bias sx in a scalar sum.
  __m256 acc[NR][MR];
  zero_acc(acc);
  for (int64_t b = 0; b < nblocks; ++b) {
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + r * row_bytes + b * bytes;
      const float scale = load_half(blk), bias = load_half(blk + 2);
      __m256i e[4];
      for (int c = 0; c < per; ++c) e[c] = nibbles32(blk + 4 + 16 * c, true);
      for (int m = 0; m < MR; ++m) {
        const int8_t* xq = x.q + m * x.ldq + b * g;
        const int64_t xb = m * x.ldb + b * per;
        __m256i isum = _mm256_setzero_si256();
        int32_t sx = 0;
        for (int c = 0; c < per; ++c) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * c));
          isum = _mm256_add_epi32(isum, dot_u4s8(e[c], xv));
          sx += x.s[xb + c];
        }
        acc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(x.d[xb] * scale), acc[r][m]);
        part[r][m] += x.d[xb] * bias * static_cast<float>(sx);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) part[r][m] += hsum256(acc[r][m]);
  b0 = nblocks;
#endif
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) {
      float acc = part[r][m];
      for (int64_t b = b0; b < nblocks; ++b) {
        const uint8_t* blk = w + r * row_bytes + b * bytes;
        const int8_t* xb = x.q + m * x.ldq + b * g;
        int32_t dot = 0, sx = 0;
        for (int i = 0; i < g / 2; ++i) dot += (blk[4 + i] & 15) * xb[2 * i] + (blk[4 + i] >> 4) * xb[2 * i + 1];
        for (int64_t j = 0; j < per; ++j) sx += x.s[m * x.ldb + b * per + j];
        acc += x.d[m * x.ldb + b * per] *
               (load_half(blk) * static_cast<float>(dot) + load_half(blk + 2) * static_cast<float>(sx));
      }
      res[m * ld + r] = (acc0 ? res[m * ld + r] : 0.f) + acc;
    }
}

// ---- ternary ---------------------------------------------------------------------------------
// With VNNI a block's 8 code bytes, shifted right by 0, 2, 4, 6 in four 64-bit lanes and masked to
// 2 bits, are 32 code bytes in which position 8t + b holds element 4b + t; x is stored per block in
// that order (permute_ternary), so a block is one 256-bit vpdpbusd.
#if UQR_CPU_VNNI
void permute_ternary(QRows& xq, int64_t R) {
  for (int64_t i = 0; i < R * xq.K / kQBlock; ++i) {
    int8_t* q = xq.q.data() + i * kQBlock;
    int8_t tmp[kQBlock];
    for (int p = 0; p < kQBlock; ++p) tmp[p] = q[4 * (p % 8) + p / 8];
    std::memcpy(q, tmp, kQBlock);
  }
}
#endif

template <int MR, int NR>
void ternary_tile(const uint8_t* w, int64_t row_bytes, int64_t nblocks, const QView& x, float* res, int64_t ld,
                  bool acc0) {
#if UQR_CPU_VNNI
  const __m256i shifts = _mm256_setr_epi64x(0, 2, 4, 6), m2 = _mm256_set1_epi8(3);
  __m256 acc[NR][MR];
  float acc0s[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = _mm256_setzero_ps(), acc0s[r][m] = 0.f;
  for (int64_t b = 0; b < nblocks; ++b) {
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + r * row_bytes + b * UQR_TERNARY_BYTES;
      // code 3 (invalid) as code 1, a zero trit, as formats.h decodes it
      const uint64_t qs = static_cast<uint64_t>(uqr_ternary_canonical_codes(uqr_load_u32(blk + 4))) |
                          static_cast<uint64_t>(uqr_ternary_canonical_codes(uqr_load_u32(blk + 8))) << 32;
      const __m256i codes =
          _mm256_and_si256(_mm256_srlv_epi64(_mm256_set1_epi64x(static_cast<long long>(qs)), shifts), m2);
      const float dw = load_half(blk);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + m * x.ldq + b * kQBlock));
        const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), codes, xv);
        const int64_t xb = m * x.ldb + b;
        acc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * x.d[xb]), acc[r][m]);
        acc0s[r][m] -= dw * x.ds[xb];
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) {
      const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(acc[r][m]), _mm256_extractf128_ps(acc[r][m], 1));
      const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
      const float v = _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1))) + acc0s[r][m];
      res[m * ld + r] = (acc0 ? res[m * ld + r] : 0.f) + v;
    }
#else
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) {
      float acc = 0.f;
      for (int64_t b = 0; b < nblocks; ++b) {
        const uint8_t* blk = w + r * row_bytes + b * UQR_TERNARY_BYTES;
        const int8_t* xb = x.q + m * x.ldq + b * kQBlock;
        int32_t dot = -x.s[m * x.ldb + b];
        const uint32_t c0 = uqr_ternary_canonical_codes(uqr_load_u32(blk + 4));
        const uint32_t c1 = uqr_ternary_canonical_codes(uqr_load_u32(blk + 8));
        for (int i = 0; i < kQBlock; ++i)
          dot += static_cast<int32_t>(((i < 16 ? c0 : c1) >> (2 * (i % 16))) & 3u) * xb[i];
        acc += static_cast<float>(dot) * (load_half(blk) * x.d[m * x.ldb + b]);
      }
      res[m * ld + r] = (acc0 ? res[m * ld + r] : 0.f) + acc;
    }
#endif
}

// ---- var_affine and exl3 ----------------------------------------------------------------------
// Both are 256-element blocks of w = d * (integer) + bias * (integer) with x one scale per block
// (span 256), so a block and x row reduce to two int32 sums A, B and one float step:
//   y += dx * fmaf(d, float(A), bias * float(B))      (acc = fmaf(dx, that, acc))
// the CUDA int8 kernel's expression (csrc/cuda/qmma_int8.cu), so the two paths round alike.
//   var_affine: A = sum_j s_j dot_j(q, x_s8), B = sum_j b_j sx_j. With q <= 31, s_j, b_j <= 255 and
//     |x_s8| <= 128: |A| <= 8 * 255 * 32 * 31 * 128 < 2^28, |B| <= 8 * 255 * 32 * 128 < 2^23.
//   exl3: A = sum_j (s_j dot_j(P[k], x_s8) + r_j dot_j(R[k], x_s8)), B = sum of the 256 x_s8. P, R
//     and x_s8 in [-128, 127]: |A| <= 16 * 255 * 32 * 128 * 128 = 2139095040 < 2^31 - 1 (every
//     partial sum too, each a subset of the terms), |B| <= 2^15.
// Portable loops only (no VNNI form yet): a weight row's block is unpacked once into bytes through
// formats.h's bit readers, then the tile's MR x rows take their dots from those bytes.
struct VarAffineInts {
  static constexpr int64_t kBytes = UQR_VAR_AFFINE_BYTES;
  uint8_t q[UQR_VAR_AFFINE_BLOCK];
  void unpack(const uint8_t* blk) {
    for (int c = 0; c < UQR_VAR_AFFINE_BLOCK / 8; ++c) uqr_codes8_var_affine(blk, c, q + 8 * c);
  }
  void sums(const uint8_t* blk, const int8_t* xq, const int32_t* sx, int32_t& a, int32_t& b) const {
    a = b = 0;
    for (int j = 0; j < 8; ++j) {
      int32_t dot = 0;
      for (int i = 32 * j; i < 32 * j + 32; ++i) dot += q[i] * xq[i];
      a += blk[UQR_VAR_AFFINE_SCALES + j] * dot;
      b += blk[UQR_VAR_AFFINE_BIASES + j] * sx[j];
    }
  }
};

struct Exl3Ints {
  static constexpr int64_t kBytes = UQR_EXL3_BYTES;
  // P[k_i] + 128 and R[k_i] + 128: unsigned, so the dots are u8 x s8 as var_affine's (which GCC
  // turns into vpdpbusd where VNNI is on); dot(P, x) = dot(P + 128, x) - 128 sx exactly.
  uint8_t p[UQR_EXL3_BLOCK], r[UQR_EXL3_BLOCK];
  void unpack(const uint8_t* blk) {
    const uint8_t* cb = blk + UQR_EXL3_CODEBOOK;
    for (int c = 0; c < UQR_EXL3_BLOCK / 8; ++c) {
      const uint32_t bits = uqr_exl3_bits8(blk, c);
      for (int i = 0; i < 8; ++i) {
        const int k = static_cast<int>((bits >> (3 * i)) & 7u);
        p[8 * c + i] = static_cast<uint8_t>(cb[k] ^ 0x80);  // int8 v -> v + 128
        r[8 * c + i] = static_cast<uint8_t>(cb[8 + k] ^ 0x80);
      }
    }
  }
  void sums(const uint8_t* blk, const int8_t* xq, const int32_t* sx, int32_t& a, int32_t& b) const {
    a = b = 0;
    for (int j = 0; j < 8; ++j) {
      int32_t dp = -128 * sx[j], dr = -128 * sx[j];
      for (int i = 32 * j; i < 32 * j + 32; ++i) dp += p[i] * xq[i], dr += r[i] * xq[i];
      a += blk[UQR_EXL3_SCALES + j] * dp + blk[UQR_EXL3_RESIDUALS + j] * dr;
      b += sx[j];
    }
  }
};

template <int MR, int NR, class Ints>
void affine_block_tile(const uint8_t* w, int64_t row_bytes, int64_t nblocks, const QView& x, float* res, int64_t ld,
                       bool acc0) {
  float acc[NR][MR] = {};
  Ints wi;
  for (int64_t b = 0; b < nblocks; ++b)
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + r * row_bytes + b * Ints::kBytes;
      wi.unpack(blk);
      const float d = load_half(blk), bias = load_half(blk + 2);
      for (int m = 0; m < MR; ++m) {
        const int64_t xb = m * x.ldb + b * 8;  // the block's first of 8 x sub-blocks (one dx)
        int32_t ia, ib;
        wi.sums(blk, x.q + m * x.ldq + b * 256, x.s + xb, ia, ib);
        acc[r][m] = std::fma(x.d[xb], std::fma(d, static_cast<float>(ia), bias * static_cast<float>(ib)), acc[r][m]);
      }
    }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) res[m * ld + r] = (acc0 ? res[m * ld + r] : 0.f) + acc[r][m];
}

// ---- q4_1, q5_0, q5_1, q8_0 (32-element blocks) and q6_k --------------------------------------
// The GGUF block formats that llama.cpp's CPU decode also runs on int8 activations. Each 32-element
// block gives its 32 codes as bytes, c (unsigned for q4_1 / q5_x, signed for q8_0), and
// w = a c + b per element, so dot(w, x) ~ dx (a dot(c, x_s8) + b sx), with x rounded per block
// (span 32). q6_k's codes are (q - 32) with one int8 scale per 16 elements: per 256-element
// super-block (one dx) the scaled integer dots add up in int32 (|sum| < 2^25), then one fp32
// multiply by d dx.
//
// x86: vpmaddubsw takes an unsigned and a signed operand; signed codes go in as |c| against
// x with c's sign (vpsignb), the usual trick: |x| <= 127 after rounding, so no lane saturates.
#if defined(__AVX2__) && defined(__FMA__)
#define UQR_INT8_BYTE_CODES_X86 1
#else
#define UQR_INT8_BYTE_CODES_X86 0
#endif

template <int FMT>
struct ByteCodes32 {
  static_assert(FMT == UQR_Q4_1 || FMT == UQR_Q5_0 || FMT == UQR_Q5_1 || FMT == UQR_Q8_0);
  static constexpr bool kSigned = FMT == UQR_Q8_0;
  static constexpr int kBytes = FMT == UQR_Q4_1 ? UQR_Q4_1_BYTES : FMT == UQR_Q5_0 ? UQR_Q5_0_BYTES
                              : FMT == UQR_Q5_1 ? UQR_Q5_1_BYTES : UQR_Q8_0_BYTES;
  static float scale(const uint8_t* blk) { return load_half(blk); }
  // b: q5_0's codes are offset by 16 (y = (q - 16) d); q4_1 / q5_1 carry their min m.
  static float offset(const uint8_t* blk) {
    if constexpr (FMT == UQR_Q4_1 || FMT == UQR_Q5_1) return load_half(blk + 2);
    else if constexpr (FMT == UQR_Q5_0) return -16.f * load_half(blk);
    else return 0.f;
  }
  static const uint8_t* qs(const uint8_t* blk) {
    return blk + (FMT == UQR_Q4_1 ? 4 : FMT == UQR_Q5_0 ? UQR_Q5_0_QS : FMT == UQR_Q5_1 ? UQR_Q5_1_QS : 2);
  }
  // Element i's code (portable path): the nibble layout of q4_0 (qs[j]: element j low, j + 16
  // high), bit 4 of element i of q5_x in bit i of the little-endian 32-bit qh.
  static int code(const uint8_t* blk, int i) {
    const uint8_t* q = qs(blk);
    if constexpr (kSigned) return static_cast<int8_t>(q[i]);
    const int nib = (q[i & 15] >> (i < 16 ? 0 : 4)) & 15;
    if constexpr (FMT == UQR_Q4_1) return nib;
    const uint8_t* qh = blk + (FMT == UQR_Q5_0 ? UQR_Q5_0_QH : UQR_Q5_1_QH);
    return nib | (((qh[i >> 3] >> (i & 7)) & 1) << 4);
  }
#if UQR_INT8_BYTE_CODES_X86
  static __m256i codes(const uint8_t* blk) {
    const uint8_t* q = qs(blk);
    if constexpr (kSigned) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)), m4 = _mm_set1_epi8(0x0F);
    const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
    if constexpr (FMT == UQR_Q4_1) return nib;
    // qh's bit i to byte i: byte i holds qh byte i / 8 (the 32-bit word sits in both 128-bit
    // lanes, so the in-lane shuffle reaches it), tested against its bit i % 8.
    uint32_t qh;
    std::memcpy(&qh, blk + (FMT == UQR_Q5_0 ? UQR_Q5_0_QH : UQR_Q5_1_QH), 4);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(static_cast<int32_t>(qh)),
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
  }
#endif
};

#if UQR_INT8_BYTE_CODES_X86
// 32 codes (unsigned, or signed with kSigned) x 32 int8 x -> 16 int16 pair sums (no saturation:
// unsigned codes are below 64, signed ones pair |c| <= 128 with |x| <= 127).
template <bool kSigned>
inline __m256i pair_dots(__m256i c, __m256i x) {
  if constexpr (kSigned) return _mm256_maddubs_epi16(_mm256_sign_epi8(c, c), _mm256_sign_epi8(x, c));
  else return _mm256_maddubs_epi16(c, x);
}

template <int NR, int MR>
inline void zero_acc8(__m256 (&acc)[NR][MR]) {
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = _mm256_setzero_ps();
}

inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
#endif

template <int MR, int NR, int FMT>
void byte_codes_tile(const uint8_t* w, int64_t row_bytes, int64_t nblocks, const QView& x, float* res, int64_t ld,
                     bool acc0) {
  using F = ByteCodes32<FMT>;
  float off[NR][MR] = {};  // the b sx terms, as b * (dx sx)
#if UQR_INT8_BYTE_CODES_X86
  __m256 acc[NR][MR];
  zero_acc8(acc);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nblocks; ++b) {
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + r * row_bytes + b * F::kBytes;
      // The next tile's row at this position (rows are read one after another): see q4_0_tile.
      _mm_prefetch(reinterpret_cast<const char*>(blk + NR * row_bytes), _MM_HINT_T0);
      const __m256i c = F::codes(blk);
      const float a = F::scale(blk), o = F::offset(blk);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const int64_t xb = m * x.ldb + b;
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + m * x.ldq + b * 32));
        const __m256i dot = _mm256_madd_epi16(pair_dots<F::kSigned>(c, xv), ones);
        acc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(a * x.d[xb]), acc[r][m]);
        off[r][m] += o * x.ds[xb];
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) res[m * ld + r] = (acc0 ? res[m * ld + r] : 0.f) + hsum8(acc[r][m]) + off[r][m];
#else
  float acc[NR][MR] = {};
  for (int64_t b = 0; b < nblocks; ++b)
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + r * row_bytes + b * F::kBytes;
      int c[32];
      for (int i = 0; i < 32; ++i) c[i] = F::code(blk, i);
      const float a = F::scale(blk), o = F::offset(blk);
      for (int m = 0; m < MR; ++m) {
        const int64_t xb = m * x.ldb + b;
        const int8_t* xq = x.q + m * x.ldq + b * 32;
        int32_t dot = 0;
        for (int i = 0; i < 32; ++i) dot += c[i] * xq[i];
        acc[r][m] += static_cast<float>(dot) * (a * x.d[xb]);
        off[r][m] += o * x.ds[xb];
      }
    }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) res[m * ld + r] = (acc0 ? res[m * ld + r] : 0.f) + acc[r][m] + off[r][m];
#endif
}

// q6_k: element 128h + 32g + l (h = 0, 1; g = 0..3; l = 0..31) takes its low 4 bits from
// ql[64h + 32 (g & 1) + l] (high nibble for g >= 2) and its top 2 from bits 2g of qh[32h + l];
// its scale is scales[(128h + 32g + l) / 16].
template <int MR, int NR>
void q6_k_tile(const uint8_t* w, int64_t row_bytes, int64_t nblocks, const QView& x, float* res, int64_t ld,
               bool acc0) {
#if UQR_INT8_BYTE_CODES_X86
  __m256 acc[NR][MR];
  zero_acc8(acc);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03), k32 = _mm256_set1_epi8(32);
  for (int64_t b = 0; b < nblocks; ++b) {
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + r * row_bytes + b * UQR_Q6_K_BYTES;
      for (int l = 0; l < UQR_Q6_K_BYTES; l += 64)
        _mm_prefetch(reinterpret_cast<const char*>(blk + NR * row_bytes + l), _MM_HINT_T0);
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + UQR_Q6_K_SCALES);
      __m256i isum[MR];
      for (int m = 0; m < MR; ++m) isum[m] = _mm256_setzero_si256();
      for (int h = 0; h < 2; ++h) {
        const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h));
        const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + UQR_Q6_K_QH + 32 * h));
#pragma GCC unroll 4
        for (int g = 0; g < 4; ++g) {
          const __m256i ql = (g & 1) ? ql1 : ql0;
          const __m256i lo = _mm256_and_si256(g >= 2 ? _mm256_srli_epi16(ql, 4) : ql, m4);
          const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), m2), 4);
          const __m256i c = _mm256_sub_epi8(_mm256_or_si256(lo, hi), k32);
          const int s = 8 * h + 2 * g;
          const __m256i scales = _mm256_set_m128i(_mm_set1_epi16(sc[s + 1]), _mm_set1_epi16(sc[s]));
#pragma GCC unroll 8
          for (int m = 0; m < MR; ++m) {
            const __m256i xv = _mm256_loadu_si256(
                reinterpret_cast<const __m256i*>(x.q + m * x.ldq + b * 256 + 128 * h + 32 * g));
            isum[m] = _mm256_add_epi32(isum[m], _mm256_madd_epi16(pair_dots<true>(c, xv), scales));
          }
        }
      }
      const float d = load_half(blk + UQR_Q6_K_D);
      for (int m = 0; m < MR; ++m)
        acc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[m]), _mm256_set1_ps(d * x.d[m * x.ldb + b * 8]), acc[r][m]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) res[m * ld + r] = (acc0 ? res[m * ld + r] : 0.f) + hsum8(acc[r][m]);
#else
  float acc[NR][MR] = {};
  for (int64_t b = 0; b < nblocks; ++b)
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + r * row_bytes + b * UQR_Q6_K_BYTES;
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + UQR_Q6_K_SCALES);
      int c[256];
      for (int h = 0; h < 2; ++h)
        for (int g = 0; g < 4; ++g)
          for (int l = 0; l < 32; ++l) {
            const int lo = (blk[64 * h + 32 * (g & 1) + l] >> (g >= 2 ? 4 : 0)) & 15;
            const int hi = (blk[UQR_Q6_K_QH + 32 * h + l] >> (2 * g)) & 3;
            c[128 * h + 32 * g + l] = (lo | (hi << 4)) - 32;
          }
      const float d = load_half(blk + UQR_Q6_K_D);
      for (int m = 0; m < MR; ++m) {
        const int8_t* xq = x.q + m * x.ldq + b * 256;
        int32_t dot = 0;
        for (int s = 0; s < 16; ++s) {
          int32_t part = 0;
          for (int i = 16 * s; i < 16 * s + 16; ++i) part += c[i] * xq[i];
          dot += sc[s] * part;
        }
        acc[r][m] += static_cast<float>(dot) * (d * x.d[m * x.ldb + b * 8]);
      }
    }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) res[m * ld + r] = (acc0 ? res[m * ld + r] : 0.f) + acc[r][m];
#endif
}

// ---- driver ------------------------------------------------------------------------------
template <int MR>
constexpr int weight_rows_per_tile() {
  return MR == 1 ? 4 : MR == 2 ? 2 : 1;
}

// K elements per pass so that MR quantized rows (~2.5 bytes per element with their per-block
// terms) stay in L1 while the work unit's weight rows stream past; a multiple of 256, so a pass
// holds whole 256-element blocks (q4_k, var_affine, exl3) and whole q4_0 block quads.
template <int MR>
int64_t int8_k_chunk(int64_t K) {
  const int64_t fit = kFusedXBytes / (3 * MR) / 256 * 256;
  return std::min<int64_t>(K, std::max<int64_t>(256, fit));
}

template <int MR, int FMT>
void int8_rows(const uint8_t* w, const uqr_gemm_params& p, const QView& x, int64_t n0, int64_t n1, float* res,
               int64_t ld) {
  constexpr bool KQuant = FMT == UQR_Q4_K;
  constexpr int NR = weight_rows_per_tile<MR>();
  const int64_t kElems = p.group_size, kBytes = p.block_bytes;
  const int64_t chunk = int8_k_chunk<MR>(p.K);
  for (int64_t k0 = 0; k0 < p.K; k0 += chunk) {
    const int64_t nblocks = std::min(chunk, p.K - k0) / kElems;
    const uint8_t* wk = w + (k0 / kElems) * kBytes;
    // per-lane groups of 16: one per q4_0 quad (128 elements), one per q4_k super-block (256)
    const int64_t xb = k0 / kQBlock, xqd = k0 / (KQuant ? 256 : 128) * 16;
    const QView xc{x.q + k0, x.d + xb, x.s + xb, x.ds + xb, x.qinit ? x.qinit + xqd : nullptr,
                   x.qdx ? x.qdx + xqd : nullptr, x.ldq, x.ldb, x.ldqd, x.qb ? x.qb + xqd : nullptr};
    auto tile = [&](auto nr, int64_t n) {
      constexpr int R = decltype(nr)::value;
      float* out = res + (n - n0);
      if constexpr (KQuant) q4_k_tile<MR, R>(wk + n * p.row_bytes, p.row_bytes, nblocks, xc, out, ld, k0 > 0);
      else if constexpr (FMT == UQR_MLX4)
        mlx4_tile<MR, R>(wk + n * p.row_bytes, p.row_bytes, nblocks, p.group_size, xc, out, ld, k0 > 0);
      else if constexpr (FMT == UQR_TERNARY)
        ternary_tile<MR, R>(wk + n * p.row_bytes, p.row_bytes, nblocks, xc, out, ld, k0 > 0);
      else if constexpr (FMT == UQR_VAR_AFFINE)
        affine_block_tile<MR, R, VarAffineInts>(wk + n * p.row_bytes, p.row_bytes, nblocks, xc, out, ld, k0 > 0);
      else if constexpr (FMT == UQR_EXL3)
        affine_block_tile<MR, R, Exl3Ints>(wk + n * p.row_bytes, p.row_bytes, nblocks, xc, out, ld, k0 > 0);
      else if constexpr (FMT == UQR_Q6_K) q6_k_tile<MR, R>(wk + n * p.row_bytes, p.row_bytes, nblocks, xc, out, ld, k0 > 0);
      else if constexpr (FMT == UQR_Q4_1 || FMT == UQR_Q5_0 || FMT == UQR_Q5_1 || FMT == UQR_Q8_0)
        byte_codes_tile<MR, R, FMT>(wk + n * p.row_bytes, p.row_bytes, nblocks, xc, out, ld, k0 > 0);
      else q4_0_tile<MR, R>(wk + n * p.row_bytes, p.row_bytes, nblocks, xc, out, ld, k0 > 0);
    };
    int64_t n = n0;
    for (; n + NR <= n1; n += NR) tile(std::integral_constant<int, NR>{}, n);
    for (; n < n1; ++n) tile(std::integral_constant<int, 1>{}, n);
  }
}

}  // namespace

void gemm_int8(const uint8_t* w, const uqr_gemm_params& p, const float* X, int64_t R, const OutputWriter& out,
               const uint8_t* nan_rows) {
  const bool kquant = p.fmt == UQR_Q4_K, mlx4 = p.fmt == UQR_MLX4, ternary = p.fmt == UQR_TERNARY;
  const bool var_affine = p.fmt == UQR_VAR_AFFINE, exl3 = p.fmt == UQR_EXL3;
  // One x scale per weight block (256 elements for the super-block formats), per group for mlx4.
  QRows xq = quantize_rows(X, R, p.K, kquant || var_affine || exl3 || p.fmt == UQR_Q6_K ? 256
                                      : mlx4 ? p.group_size : kQBlock);
#if UQR_CPU_VNNI
  // (var_affine and exl3 have only the portable tile, which reads x in plain order.)
  if (kquant) interleave_q4_k(xq, R);
  else if (mlx4) pack_mlx4(xq, R, p.group_size);
  else if (ternary) permute_ternary(xq, R);
  else if (p.fmt == UQR_Q4_0) quad_up_q4_0(xq, R);
#endif
  fused_driver(p, R, out, [&](int rows, int64_t r0, int64_t n0, int64_t n1, float* res, int64_t ld) {
    const QView x{xq.q.data() + r0 * xq.K, xq.d.data() + r0 * xq.nb, xq.s.data() + r0 * xq.nb,
                  xq.ds.data() + r0 * xq.nb, xq.qinit.data() + r0 * xq.nq * 16, xq.qdx.data() + r0 * xq.nq * 16,
                  xq.K, xq.nb, xq.nq, xq.qb.empty() ? nullptr : xq.qb.data() + r0 * xq.nq * 16};
    with_rows(rows, [&](auto mr) {
      constexpr int MR = decltype(mr)::value;
      if (kquant) int8_rows<MR, UQR_Q4_K>(w, p, x, n0, n1, res, ld);
      else if (mlx4) int8_rows<MR, UQR_MLX4>(w, p, x, n0, n1, res, ld);
      else if (ternary) int8_rows<MR, UQR_TERNARY>(w, p, x, n0, n1, res, ld);
      else if (var_affine) int8_rows<MR, UQR_VAR_AFFINE>(w, p, x, n0, n1, res, ld);
      else if (exl3) int8_rows<MR, UQR_EXL3>(w, p, x, n0, n1, res, ld);
      else if (p.fmt == UQR_Q4_1) int8_rows<MR, UQR_Q4_1>(w, p, x, n0, n1, res, ld);
      else if (p.fmt == UQR_Q5_0) int8_rows<MR, UQR_Q5_0>(w, p, x, n0, n1, res, ld);
      else if (p.fmt == UQR_Q5_1) int8_rows<MR, UQR_Q5_1>(w, p, x, n0, n1, res, ld);
      else if (p.fmt == UQR_Q8_0) int8_rows<MR, UQR_Q8_0>(w, p, x, n0, n1, res, ld);
      else if (p.fmt == UQR_Q6_K) int8_rows<MR, UQR_Q6_K>(w, p, x, n0, n1, res, ld);
      else int8_rows<MR, UQR_Q4_0>(w, p, x, n0, n1, res, ld);
    });
  }, nan_rows);
}

}  // namespace uqr::cpu
