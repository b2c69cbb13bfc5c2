// Tile loaders of the prefill kernel: they turn global memory into the threadgroup tiles the MMA core
// consumes. The weight loader is the only code that knows about formats, and it knows them only
// through the shared decoders of csrc/include/uqr/formats.h (8 elements per call).
#pragma once
#include "uqr/formats.h"
#include "uqr/params.h"
#include "uqr_tiles.h"

// sh_A[r][kk] = x(b, m0 + r, k0 + kk) for the UQR_MMA_BM x UQR_MMA_BK activation tile, rows past M
// zero-filled so the MMA core never needs a bound. x is read through the params strides, which is
// how head-strided input costs no copy. S is the staging type (half for fp16 x, float otherwise).
template <typename T, typename S>
inline void uqr_stage_x_tile(device const T* x, constant uqr_gemm_params& p, int b, int m0, int k0,
                             threadgroup S* sh_A, uint tiitg) {
  for (uint i = tiitg; i < UQR_MMA_BM * UQR_MMA_BK; i += UQR_MMA_THREADS) {
    int r = int(i / UQR_MMA_BK), kk = int(i % UQR_MMA_BK);
    int m = m0 + r;
    sh_A[i] = m < p.M ? S(float(x[uqr_x_offset(p, b, m, k0 + kk)])) : S(0.0f);
  }
}

// sh_B[kk][c] = W(n0 + c, k0 + kk), stored K-major so that 8 x 8 fragments of W^T load with a plain
// row stride. One work item = one decode8 call (8 consecutive k of one weight row); consecutive
// threads take the chunks of the same row, i.e. of the same block. Rows past N are zero-filled.
template <typename S, int FMT>
inline void uqr_stage_w_tile(device const uchar* w, constant uqr_gemm_params& p, int n0, int k0,
                             threadgroup S* sh_B, uint tiitg) {
  const uint chunks = UQR_MMA_BK / 8;
  for (uint i = tiitg; i < UQR_MMA_BN * chunks; i += UQR_MMA_THREADS) {
    int c = int(i / chunks), ch = int(i % chunks);
    int n = n0 + c, k = k0 + 8 * ch;
    float v[8];
    if (n < p.N) {
      device const uchar* blk = w + long(n) * p.row_bytes + long(k / p.group_size) * p.block_bytes;
      uqr_decode8(FMT, blk, (k % p.group_size) / 8, v);
    } else {
      for (int e = 0; e < 8; ++e) v[e] = 0.0f;
    }
    for (int e = 0; e < 8; ++e) sh_B[(8 * ch + e) * UQR_MMA_BN + c] = S(v[e]);
  }
}
