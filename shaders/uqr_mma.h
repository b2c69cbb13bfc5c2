// The format-blind matrix core of the prefill kernel: 8 x 8 simdgroup_matrix fragments, fp32
// accumulators. Simdgroup (sg_m, sg_n) of the 2 x 2 arrangement owns rows [16 sg_m, 16 sg_m + 16) and
// columns [32 sg_n, 32 sg_n + 32) of the threadgroup's UQR_MMA_BM x UQR_MMA_BN output tile.
#pragma once
#include "uqr_tiles.h"

#define UQR_MMA_FRAG_M (UQR_MMA_BM / UQR_MMA_SG_M / 8)
#define UQR_MMA_FRAG_N (UQR_MMA_BN / UQR_MMA_SG_N / 8)

template <typename S>
struct uqr_block_mma {
  simdgroup_matrix<float, 8, 8> acc[UQR_MMA_FRAG_M][UQR_MMA_FRAG_N];
  uint row0, col0;

  uqr_block_mma(uint sgitg) {
    row0 = (sgitg / UQR_MMA_SG_N) * (8 * UQR_MMA_FRAG_M);
    col0 = (sgitg % UQR_MMA_SG_N) * (8 * UQR_MMA_FRAG_N);
    for (int i = 0; i < UQR_MMA_FRAG_M; ++i)
      for (int j = 0; j < UQR_MMA_FRAG_N; ++j) acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  }

  // acc += sh_A[rows, :] * sh_B[:, cols] over one staged K step (sh_A is BM x BK, sh_B is BK x BN).
  void step(const threadgroup S* sh_A, const threadgroup S* sh_B) {
    for (int kk = 0; kk < UQR_MMA_BK; kk += 8) {
      simdgroup_matrix<S, 8, 8> a[UQR_MMA_FRAG_M];
      simdgroup_matrix<S, 8, 8> bt[UQR_MMA_FRAG_N];
      for (int i = 0; i < UQR_MMA_FRAG_M; ++i)
        simdgroup_load(a[i], sh_A + (row0 + 8 * i) * UQR_MMA_BK + kk, UQR_MMA_BK);
      for (int j = 0; j < UQR_MMA_FRAG_N; ++j)
        simdgroup_load(bt[j], sh_B + kk * UQR_MMA_BN + col0 + 8 * j, UQR_MMA_BN);
      for (int i = 0; i < UQR_MMA_FRAG_M; ++i)
        for (int j = 0; j < UQR_MMA_FRAG_N; ++j) simdgroup_multiply_accumulate(acc[i][j], a[i], bt[j], acc[i][j]);
    }
  }

  // Accumulators to a BM x BN fp32 tile, from which the kernel writes y with bounds and strides
  // (fragments cannot be stored straight to y: y may be ragged, head-strided and of another type).
  void store(threadgroup float* sh_C) const {
    for (int i = 0; i < UQR_MMA_FRAG_M; ++i)
      for (int j = 0; j < UQR_MMA_FRAG_N; ++j)
        simdgroup_store(acc[i][j], sh_C + (row0 + 8 * i) * UQR_MMA_BN + col0 + 8 * j, UQR_MMA_BN);
  }
};
