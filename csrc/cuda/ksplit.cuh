// What the two small-M kernels (qmma_small_m.cu: exact bf16/fp16 MMAs; qmma_int8.cu: int8 x) share:
// a CTA owns 16 weight rows and 1-8 warps that split K, each warp streaming its share through a
// private cp.async ring; their partial sums meet in shared memory at the end. This header holds
// that reduction and the host-side choice of how many warps split K.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda_common.cuh"

namespace uqr {
namespace cuda {
namespace ksplit {

constexpr int kMaxWarps = 8;

// After the last stage: drains the cp.async rings, then the partial sums acc[NT][4] of the
// K-splitting warps -> warp 0, which gets the total in `out`; returns false for the other warps
// (nothing left for them to do). The rings' `smem` is reused: it must hold (warps - 1) * NT * 4 * 32
// floats.
template <int NT>
__device__ __forceinline__ bool drain_and_sum(const float (&acc)[NT][4], float* smem, int warp, int warps, int lane,
                                              float (&out)[NT][4]) {
  cp_async_wait<0>();
  __syncthreads();
  if (warp > 0) {
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int q = 0; q < 4; ++q) smem[((warp - 1) * NT * 4 + t * 4 + q) * 32 + lane] = acc[t][q];
  }
  __syncthreads();
  if (warp != 0) return false;
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float v = acc[t][q];
      for (int wk = 1; wk < warps; ++wk) v += smem[((wk - 1) * NT * 4 + t * 4 + q) * 32 + lane];
      out[t][q] = v;
    }
  return true;
}

// Resident CTAs per SM with 1, 2, 4, 8 K-splitting warps (each with its own ring size).
struct Residency {
  cudaError_t err = cudaSuccess;
  int per_sm[4] = {0, 0, 0, 0};
};

// kernel's residency when w warps take ring(w) bytes of dynamic shared memory. The kernel may take
// up to the device's opt-in maximum (capped_smem pads up to it), allowed once first, so no launch
// inside a CUDA-graph capture changes attributes.
template <class Kernel, class RingBytes>
Residency residency_of(Kernel kernel, RingBytes ring) {
  Residency out;
  int dev = 0, optin = 0;
  out.err = cudaGetDevice(&dev);
  if (out.err == cudaSuccess) out.err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (out.err == cudaSuccess) out.err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
  if (out.err != cudaSuccess) return out;
  for (int i = 0, wk = 1; wk <= kMaxWarps; ++i, wk *= 2) {
    out.err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&out.per_sm[i], kernel, wk * 32, ring(wk));
    if (out.err != cudaSuccess) break;
  }
  return out;
}

// Resident CTAs per SM at `warps` (1, 2, 4 or 8) K-splitting warps.
inline int fit_of(const Residency& res, int warps) {
  return res.per_sm[warps == 1 ? 0 : warps == 2 ? 1 : warps == 4 ? 2 : 3];
}

// The launch plan (torch_uqr/triton_kernels/dispatch.py) picks the K-splitting warps per CTA from
// the residency above (uqr::_cuda_residency): as many as keep the whole grid resident in one wave
// (a second, mostly empty wave cost ~2x), with >= 2 stages per warp so the ring has something to
// overlap.
inline bool valid_warps(int warps) { return warps == 1 || warps == 2 || warps == 4 || warps == 8; }

// Dynamic shared memory for a launch of `grid` CTAs of which `fit` may be resident on one SM:
// `need`, or with `cap` (the plan's smem_cap, on by default) when the grid needs at most 2 a SM
// (want = ceil(grid / SMs) < fit), enough more that no SM can take want + 1, so the block scheduler
// cannot stack CTAs on some SMs while others hold fewer: at want = 2 an SM with a third CTA takes
// 1.5x as long (one row on 4096 x 14336, int8: var_affine 24.7 / 25.3 -> 18.8 / 18.3 us, q4_k
// 16.1 / 16.6 -> 15.0 / 14.9). Not at larger want: a stacked CTA costs less there and the padding
// takes L1 from the x reads (16 rows on 14336 x 4096, capped at 7 a SM: mlx4 29.6 us against 27.2).
// residency_of lets the kernel take the result.
inline size_t capped_smem(size_t need, int grid, int fit, bool cap) {
  const int sms = sm_count(), want = (grid + sms - 1) / sms;
  if (!cap || want >= fit || want > 2) return need;
  struct Smem {
    int per_sm = 0, reserved = 0, optin = 0;
  };
  static const Smem sm = [] {
    Smem v;
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v.reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev);
    cudaDeviceGetAttribute(&v.optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    cudaDeviceGetAttribute(&v.per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
    return v;
  }();
  const size_t pad = static_cast<size_t>(sm.per_sm / (want + 1) - sm.reserved + 16);
  return std::min(std::max(need, pad), static_cast<size_t>(sm.optin));
}

}  // namespace ksplit
}  // namespace cuda
}  // namespace uqr
