// Small-M kernels: each weight block is decoded into registers once and multiplied into up to
// kFusedMaxRows activation rows, so the weight traffic is exactly the packed bytes.
//
// K is walked in chunks that keep the MR activation rows in L1 (at M = 8, K = 4096 the rows are
// 128 KiB and the FMAs would otherwise wait on L2); partial sums are added in the result tile.
//
// Accumulator layout: acc[NR][MR] vectors of 16 partial sums (NR weight rows x MR activation
// rows). FMA latency is ~4 cycles, so one row (MR = 1) alone would serialize on its single
// accumulator; taking NR = 4 weight rows at once gives four independent chains.
#include <ATen/Parallel.h>

#include <algorithm>

#include "block_decode.h"
#include "kernels.h"

namespace uqr::cpu {
namespace {

template <class Dec, int MR, int NR>
inline void fused_tile(const uint8_t* w, int64_t row_bytes, int64_t nblocks, const float* X,
                       int64_t K, float* res, int64_t ld_res, bool accumulate, int64_t prefetch = 0) {
  vf acc[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = vzero();
  for (int64_t b = 0; b < nblocks; ++b) {
    const float* xb = X + b * Dec::kElems;
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      vf wv[Dec::kVecs];
      if (prefetch) __builtin_prefetch(w + r * row_bytes + b * Dec::kBytes + prefetch);
      Dec::decode(w + r * row_bytes + b * Dec::kBytes, wv);
#pragma GCC unroll 16
      for (int v = 0; v < Dec::kVecs; ++v)
#pragma GCC unroll 8
        for (int m = 0; m < MR; ++m) acc[r][m] = vfma(wv[v], vload(xb + m * K + v * kLanes), acc[r][m]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) {
      const float s = vsum(acc[r][m]);
      res[m * ld_res + r] = accumulate ? res[m * ld_res + r] + s : s;
    }
}

// Weight rows [n0, n1) against MR staged rows; results into res[m * ld_res + (n - n0)].
template <class Dec, int MR>
void fused_rows(const uint8_t* w, const uqr_gemm_params& p, const float* X, int64_t n0, int64_t n1,
                float* res, int64_t ld_res) {
  constexpr int NR = weight_rows_per_tile<MR>();
  const int64_t chunk = fused_k_chunk<MR>(p.K, sizeof(float));
  // A tile reads NR short rows side by side and the next tile's rows start new streams, which the
  // hardware prefetchers pick up late: one-row calls on weights past the L2 ran at a third to a
  // half of the bandwidth of long rows. Each block therefore prefetches the same block two tiles
  // ahead, where that stays within L1-sized distances (long rows stream well on their own).
  const int64_t prefetch = 2 * NR * p.row_bytes <= 32768 ? 2 * NR * p.row_bytes : 0;
  for (int64_t k0 = 0; k0 < p.K; k0 += chunk) {
    const int64_t nblocks = std::min(chunk, p.K - k0) / Dec::kElems;
    const uint8_t* wk = w + (k0 / Dec::kElems) * Dec::kBytes;
    int64_t n = n0;
    for (; n + NR <= n1; n += NR)
      fused_tile<Dec, MR, NR>(wk + n * p.row_bytes, p.row_bytes, nblocks, X + k0, p.K, res + (n - n0), ld_res, k0 > 0,
                              prefetch);
    for (; n < n1; ++n)
      fused_tile<Dec, MR, 1>(wk + n * p.row_bytes, p.row_bytes, nblocks, X + k0, p.K, res + (n - n0), ld_res, k0 > 0);
  }
}

// ---- ternary add/subtract ------------------------------------------------------------------
// Per block: +1 codes add x, -1 codes subtract it, 0 codes skip it; the block's sum is scaled by
// d once. With AVX-512 the selection is two lane masks per 16 elements (from the code bits by
// pext), so there is no multiply and no branch per weight.
template <int MR, int NR>
inline void ternary_tile(const uint8_t* w, int64_t row_bytes, int64_t nblocks, const float* X, int64_t K,
                         float* res, int64_t ld_res, bool accumulate) {
  vf acc[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = vzero();
  for (int64_t b = 0; b < nblocks; ++b) {
    const float* xb = X + b * UQR_TERNARY_BLOCK;
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + r * row_bytes + b * UQR_TERNARY_BYTES;
      const vf d = vset1(load_half(blk));
      uint64_t codes;
      std::memcpy(&codes, blk + 4, 8);
#if UQR_CPU_AVX512
      // code 0 -> -1, 1 -> 0, 2 -> +1: bit pairs (hi, lo) = (1, 0) add, (0, 0) subtract.
      const uint32_t lo = static_cast<uint32_t>(_pext_u64(codes, 0x5555555555555555ull));
      const uint32_t hi = static_cast<uint32_t>(_pext_u64(codes, 0xAAAAAAAAAAAAAAAAull));
      const uint32_t plus = hi & ~lo, minus = ~(hi | lo);
      const __mmask16 p0 = static_cast<__mmask16>(plus), p1 = static_cast<__mmask16>(plus >> 16);
      const __mmask16 s0 = static_cast<__mmask16>(minus), s1 = static_cast<__mmask16>(minus >> 16);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const __m512 x0 = _mm512_loadu_ps(xb + m * K), x1 = _mm512_loadu_ps(xb + m * K + 16);
        __m512 s = _mm512_maskz_mov_ps(p0, x0);
        s = _mm512_mask_sub_ps(s, s0, s, x0);
        s = _mm512_mask_add_ps(s, p1, s, x1);
        s = _mm512_mask_sub_ps(s, s1, s, x1);
        acc[r][m] = _mm512_fmadd_ps(s, d, acc[r][m]);
      }
#else
      for (int m = 0; m < MR; ++m) {
        float s[kLanes] = {};
        for (int i = 0; i < UQR_TERNARY_BLOCK; ++i) {
          const int code = static_cast<int>((codes >> (2 * i)) & 3u);
          const float xv = xb[m * K + i];
          s[i % kLanes] += code == 2 ? xv : code == 0 ? -xv : 0.f;
        }
        acc[r][m] = vfma(vload(s), d, acc[r][m]);
      }
#endif
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) {
      const float s = vsum(acc[r][m]);
      res[m * ld_res + r] = accumulate ? res[m * ld_res + r] + s : s;
    }
}

template <int MR>
void ternary_rows(const uint8_t* w, const uqr_gemm_params& p, const float* X, int64_t n0, int64_t n1,
                  float* res, int64_t ld_res) {
  constexpr int NR = weight_rows_per_tile<MR>();
  const int64_t chunk = fused_k_chunk<MR>(p.K, sizeof(float));
  for (int64_t k0 = 0; k0 < p.K; k0 += chunk) {
    const int64_t nblocks = std::min(chunk, p.K - k0) / UQR_TERNARY_BLOCK;
    const uint8_t* wk = w + (k0 / UQR_TERNARY_BLOCK) * UQR_TERNARY_BYTES;
    int64_t n = n0;
    for (; n + NR <= n1; n += NR)
      ternary_tile<MR, NR>(wk + n * p.row_bytes, p.row_bytes, nblocks, X + k0, p.K, res + (n - n0), ld_res, k0 > 0);
    for (; n < n1; ++n)
      ternary_tile<MR, 1>(wk + n * p.row_bytes, p.row_bytes, nblocks, X + k0, p.K, res + (n - n0), ld_res, k0 > 0);
  }
}

}  // namespace

void gemm_fused(const uint8_t* w, const uqr_gemm_params& p, const float* X, int64_t R, const OutputWriter& out) {
  with_decoder(p.fmt, p.group_size, [&](auto tag) {
    using Dec = typename decltype(tag)::type;
    fused_driver(p, R, out, [&](int rows, int64_t r0, int64_t n0, int64_t n1, float* res, int64_t ld) {
      with_rows(rows, [&](auto mr) { fused_rows<Dec, decltype(mr)::value>(w, p, X + r0 * p.K, n0, n1, res, ld); });
    });
  });
}

void gemm_ternary_vec(const uint8_t* w, const uqr_gemm_params& p, const float* X, int64_t R,
                      const OutputWriter& out, const uint8_t* nan_rows) {
  fused_driver(
      p, R, out,
      [&](int rows, int64_t r0, int64_t n0, int64_t n1, float* res, int64_t ld) {
        with_rows(rows, [&](auto mr) { ternary_rows<decltype(mr)::value>(w, p, X + r0 * p.K, n0, n1, res, ld); });
      },
      nan_rows);
}

}  // namespace uqr::cpu
