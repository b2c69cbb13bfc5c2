// The gemm kernels, as templates over the activation type T, the staging type S and the format. The
// instantiations (and so the host names) are in uqr_gemm.metal. Every kernel has the same argument
// list, bound by position: x, w, y, params, threadgroup memory, then thread coordinates. Control
// flow never leaves a kernel early: every thread reaches every barrier, whatever M and N are.
#pragma once
#include "uqr/formats.h"
#include "uqr/params.h"
#include "uqr_tiles.h"
#include "uqr_limits.h"
#include "uqr_loaders.h"
#include "uqr_mma.h"

// Prefill: y tile (tgpig.y, tgpig.x) of batch tgpig.z = x W^T. Per K step, the loaders stage the
// activation tile and the decoded weight tile into threadgroup memory, and the MMA core consumes
// them. Threadgroup memory: [sh_A: BM x BK of S][sh_B: BK x BN of S], later reused as the fp32
// BM x BN output tile (csrc/mps/launch.h sizes it as the larger of the two).
template <typename T, typename S, int FMT>
kernel void uqr_gemm_mma(device const T* x [[buffer(0)]],
                         device const uchar* w [[buffer(1)]],
                         device T* y [[buffer(2)]],
                         constant uqr_gemm_params& p [[buffer(3)]],
                         threadgroup uchar* shmem [[threadgroup(0)]],
                         uint3 tgpig [[threadgroup_position_in_grid]],
                         uint tiitg [[thread_index_in_threadgroup]],
                         uint sgitg [[simdgroup_index_in_threadgroup]],
                         uint tiisg [[thread_index_in_simdgroup]]) {
  threadgroup S* sh_A = (threadgroup S*)shmem;
  threadgroup S* sh_B = sh_A + UQR_MMA_BM * UQR_MMA_BK;
  threadgroup float* sh_C = (threadgroup float*)shmem;
  const int n0 = int(tgpig.x) * UQR_MMA_BN, m0 = int(tgpig.y) * UQR_MMA_BM, b = int(tgpig.z);

  uqr_block_mma<S> mma(sgitg);
  for (int k0 = 0; k0 < p.K; k0 += UQR_MMA_BK) {
    uqr_stage_x_tile<T, S>(x, p, b, m0, k0, sh_A, tiitg);
    uqr_stage_w_tile<S, FMT>(w, p, n0, k0, sh_B, tiitg);
    // The MMA reads tile elements other threads wrote. (A test deletes the next line and expects
    // ThreadSanitizer to report the race: keep it one line.)
    threadgroup_barrier(mem_flags::mem_threadgroup);  // UQR_BARRIER_TILES_STAGED
    mma.step(sh_A, sh_B);
    // The next step's loaders (or the output tile, which aliases the staging area) overwrite tiles
    // other simdgroups may still be reading.
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  mma.store(sh_C);
  threadgroup_barrier(mem_flags::mem_threadgroup);

  // Consecutive threads write consecutive n, which are contiguous in y (within one head for out_heads).
  for (uint i = tiitg; i < UQR_MMA_BM * UQR_MMA_BN; i += UQR_MMA_THREADS) {
    int m = m0 + int(i / UQR_MMA_BN), n = n0 + int(i % UQR_MMA_BN);
    if (m < p.M && n < p.N) y[uqr_y_offset(p, b, m, n)] = T(sh_C[i]);
  }
}

// acc[m] += <x row m, W chunk> for the 8 elements of one decode8 chunk. The ternary format takes its
// add/subtract path here (the "vec" path: no multiply per weight, one multiply by d per chunk);
// every other format decodes and multiplies. FMT is a template constant, so the branch folds.
template <int FMT>
inline void uqr_mv_chunk(device const uchar* blk, int chunk, thread const float* xv,
                         int m_count, thread float* acc) {
  if (FMT == UQR_TERNARY) {
    const float d = uqr_load_half(blk);
    int t[8];
    for (int e = 0; e < 8; ++e) t[e] = uqr_ternary_trit(blk, 8 * chunk + e);
    for (int m = 0; m < UQR_MV_M; ++m) {
      if (m >= m_count) break;
      float s = 0.0f;
      // A zero trit adds x * 0, not 0: NaN or Inf in x stays non-finite as in a float matmul.
      for (int e = 0; e < 8; ++e) s += t[e] > 0 ? xv[8 * m + e] : (t[e] < 0 ? -xv[8 * m + e] : xv[8 * m + e] * 0.0f);
      acc[m] += d * s;
    }
  } else {
    float v[8];
    uqr_decode8(FMT, blk, chunk, v);
    for (int m = 0; m < UQR_MV_M; ++m) {
      if (m >= m_count) break;
      float s = 0.0f;
      for (int e = 0; e < 8; ++e) s = fma(xv[8 * m + e], v[e], s);
      acc[m] += s;
    }
  }
}

// Matrix-vector: simdgroup sgitg of threadgroup tgpig.x computes UQR_MV_ROWS weight rows for the
// UQR_MV_M rows of x starting at tgpig.y * UQR_MV_M (batch tgpig.z). Lanes stride over K in
// 8-element chunks and write their partial sums to threadgroup memory; after a simdgroup barrier
// lane l adds up result l = (m, r) = (l / UQR_MV_ROWS, l % UQR_MV_ROWS) over the 32 lanes.
// Threadgroup memory: UQR_MV_SG x 32 x 32 floats.
template <typename T, int FMT>
kernel void uqr_gemm_mv(device const T* x [[buffer(0)]],
                        device const uchar* w [[buffer(1)]],
                        device T* y [[buffer(2)]],
                        constant uqr_gemm_params& p [[buffer(3)]],
                        threadgroup uchar* shmem [[threadgroup(0)]],
                        uint3 tgpig [[threadgroup_position_in_grid]],
                        uint tiitg [[thread_index_in_threadgroup]],
                        uint sgitg [[simdgroup_index_in_threadgroup]],
                        uint tiisg [[thread_index_in_simdgroup]]) {
  threadgroup float* partial = (threadgroup float*)shmem + sgitg * 32 * 32;
  const int n0 = (int(tgpig.x) * UQR_MV_SG + int(sgitg)) * UQR_MV_ROWS;
  const int m0 = int(tgpig.y) * UQR_MV_M, b = int(tgpig.z);
  const int m_count = min(UQR_MV_M, p.M - m0);

  float acc[UQR_MV_ROWS][UQR_MV_M];
  for (int r = 0; r < UQR_MV_ROWS; ++r)
    for (int m = 0; m < UQR_MV_M; ++m) acc[r][m] = 0.0f;

  for (int c = int(tiisg); c < p.K / 8; c += 32) {
    const int k = 8 * c;
    long col[8];
    for (int e = 0; e < 8; ++e) col[e] = uqr_x_col_offset(p, k + e);
    float xv[UQR_MV_M * 8];  // x rows m0.. at k..k+7, zero past M
    for (int m = 0; m < UQR_MV_M; ++m) {
      const long row = uqr_x_row_offset(p, b, m0 + m);
      for (int e = 0; e < 8; ++e) xv[8 * m + e] = m < m_count ? float(x[row + col[e]]) : 0.0f;
    }
    for (int r = 0; r < UQR_MV_ROWS; ++r) {
      const int n = n0 + r;
      if (n >= p.N) break;
      device const uchar* blk = w + long(n) * p.row_bytes + long(k / p.group_size) * p.block_bytes;
      uqr_mv_chunk<FMT>(blk, (k % p.group_size) / 8, xv, m_count, acc[r]);
    }
  }

  for (int r = 0; r < UQR_MV_ROWS; ++r)
    for (int m = 0; m < UQR_MV_M; ++m) partial[tiisg * 32 + m * UQR_MV_ROWS + r] = acc[r][m];
  simdgroup_barrier(mem_flags::mem_threadgroup);

  float s = 0.0f;
  for (int l = 0; l < 32; ++l) s += partial[l * 32 + tiisg];
  const int m = int(tiisg) / UQR_MV_ROWS, n = n0 + int(tiisg) % UQR_MV_ROWS;
  if (m < m_count && n < p.N) y[uqr_y_offset(p, b, m0 + m, n)] = T(s);
}
