// Mid-M tensor-core kernel (more than 16 activation rows, bf16 / fp16 x): the small-M kernel's
// fused decode + mma.sync (qmma_traits.cuh) with x shared by a CTA's warps.
//
// Why not the small-M kernel with more column tiles: there every warp reads its x fragments from
// L2, and its warps split K, so each CTA (16 weight rows) reads all of x once. At M = 128 on
// 14336 x 4096 that is 896 CTAs x 1 MB of x. Here a CTA owns 128 weight rows (8 warps x 16, each
// warp the whole K) and 8 * NT activation rows; every stage of x is copied once into shared memory
// with cp.async and read by all 8 warps, so x costs N / 128 reads per call instead of N / 16.
//
// Pipeline: two stages of 256 (mlx4 g128: 512) K elements. A stage = each warp's 16 rows of weight
// bytes (private slot, as in the small-M kernel) + the CTA's x tile [8 NT][stage] (rows padded so
// the lanes' 8- or 16-byte fragment loads hit distinct banks). One barrier per stage: it publishes
// stage i to every warp and frees the slot stage i - 1 used, which the next copy fills. Two stages
// (not three) so that two CTAs share an SM: the kernel is latency-bound (bench/NOTES.md v11).
//
// The scales are applied to the codes in T before the MMA (subblock_steps), so the weights
// are rounded to T once, as the scratch path's decode rounds them; the small-M kernel's fp32
// scales after the MMA cost 4 FFMA per 2 MMAs and registers here, and measured slower (v11b: q4_0
// M = 128 101.5 vs 83 us).
#include "qmma_small_m.h"
#include "cuda_common.cuh"
#include "qmma_traits.cuh"

namespace uqr {
namespace cuda {
namespace {

using namespace qmma;

constexpr int kMidWarps = 8;  // weight rows per CTA: 8 x 16
constexpr int kMidStages = 2;

// x row pitch in shared memory (elements): the stage plus a pad that moves consecutive rows (the
// 8 g-lanes of a fragment) to other banks - 32 bytes for 8-byte loads (16 lanes a phase: 4 rows x
// 4 lanes of 8 bytes cover the 32 banks once), 64 bytes for mlx4's 16-byte loads (8 lanes a phase).
template <class F>
__host__ __device__ constexpr int x_pitch() {
  return RowRing<F>::kStageElems + (F::kWideX ? 32 : 16);
}

template <class F, int NT>
__host__ __device__ constexpr size_t mid_smem_bytes() {
  return static_cast<size_t>(kMidStages) * (8 * NT * x_pitch<F>() * 2 + kMidWarps * RowRing<F>::kSlotBytes);
}

// Two CTAs per SM where their shared memory fits (<= 113 KB each; then 128 registers a thread).
template <class F, int NT>
__host__ __device__ constexpr int mid_ctas_per_sm() {
  return mid_smem_bytes<F, NT>() <= 113 * 1024 ? 2 : 1;
}

template <class F, typename T, int NT>
__global__ void __launch_bounds__(kMidWarps * 32, (mid_ctas_per_sm<F, NT>())) qmma_mid_m_kernel(const QmmaArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  using Ring = RowRing<F>;
  constexpr int S = kMidStages;
  constexpr int kCols = 8 * NT, kPitch = x_pitch<F>(), kXSlot = kCols * kPitch;
  constexpr int kThreads = kMidWarps * 32;
  // x copies: a stage row of x is kXPieces 16-byte pieces; thread tid copies piece tid % kXPieces of
  // rows tid / kXPieces + u * kRowStep, u < kXCopies.
  constexpr int kXPieces = Ring::kStageElems * static_cast<int>(sizeof(T)) / 16;
  static_assert(kThreads % kXPieces == 0 && kCols % (kThreads / kXPieces) == 0, "x copies split evenly");
  constexpr int kRowStep = kThreads / kXPieces, kXCopies = kCols / kRowStep;

  const uqr_gemm_params& p = a.p;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;
  const int row0 = blockIdx.x * (kMidWarps * kWarpRows) + warp * kWarpRows;
  const int col0 = blockIdx.y * kCols;
  T* xring = reinterpret_cast<T*>(smem);
  unsigned char* wring = smem + static_cast<size_t>(S) * kXSlot * sizeof(T) + static_cast<size_t>(warp) * S * Ring::kSlotBytes;

  const Ring wr(a.w, a.w_row_stride, row0, p.N, 0, lane);
  // This thread's x rows (activation rows past the last re-read it; never stored).
  const T* xsrc[kXCopies];
  const int piece = tid % kXPieces;
#pragma unroll
  for (int u = 0; u < kXCopies; ++u) {
    const int r = min(col0 + tid / kXPieces + u * kRowStep, a.rows - 1);
    const int b = r / p.M, m = r - b * p.M;
    xsrc[u] = static_cast<const T*>(a.x) + uqr_x_row_offset(p, b, m) + piece * (16 / sizeof(T));
  }
  T* const xdst0 = xring + (tid / kXPieces) * kPitch + piece * (16 / sizeof(T));

  const int n_stages = p.K / Ring::kStageElems;
  int slot_in = 0;
  auto issue = [&](int i) {
    if (i < n_stages) {
      wr.copy(wring + slot_in * Ring::kSlotBytes, i, lane);
      const int64_t xo = x_stage_offset(p, i * Ring::kStageElems);
      T* dst = xdst0 + slot_in * kXSlot;
#pragma unroll
      for (int u = 0; u < kXCopies; ++u) cp_async16(dst + u * kRowStep * kPitch, xsrc[u] + xo);
    }
    slot_in = slot_in == S - 1 ? 0 : slot_in + 1;
    cp_async_commit();  // empty groups keep wait_group's count uniform
  };

  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[t][i] = 0.f;

#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue(s);

  int slot_out = 0;
  for (int i = 0; i < n_stages; ++i) {
    cp_async_wait<S - 2>();
    __syncthreads();  // stage i visible to all warps; every warp is done with stage i - 1's slot
    issue(i + S - 1);
    const T* xlane = xring + slot_out * kXSlot + g * kPitch + (F::kWideX ? 8 : 4) * c;
    const T* xst[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) xst[t] = xlane + t * 8 * kPitch;
    stage_steps<F, T, NT, 2>(wring + slot_out * Ring::kSlotBytes, g, c, xst, acc);
    slot_out = slot_out == S - 1 ? 0 : slot_out + 1;
  }
  cp_async_wait<0>();

#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int q = 0; q < 4; ++q) store_acc<T>(p, a.y, a.rows, row0, col0, g, c, t, q, acc[t][q]);
}

template <class F, typename T, int NT>
cudaError_t launch_mid(const QmmaArgs& a, cudaStream_t stream) {
  constexpr size_t smem = mid_smem_bytes<F, NT>();
  static const cudaError_t attr =
      cudaFuncSetAttribute(qmma_mid_m_kernel<F, T, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr != cudaSuccess) return attr;
  const dim3 grid((a.p.N + kMidWarps * kWarpRows - 1) / (kMidWarps * kWarpRows), (a.rows + 8 * NT - 1) / (8 * NT));
  qmma_mid_m_kernel<F, T, NT><<<grid, kMidWarps * 32, smem, stream>>>(a);
  return cudaGetLastError();
}

// Column tile: 64 activation rows (x read N / 128 times), or 32 where 64 would leave SMs idle
// (small N) or would be mostly padding.
inline int pick_mid_nt(const QmmaArgs& a) {
  if (a.rows <= 32) return 4;
  const int row_ctas = (a.p.N + kMidWarps * kWarpRows - 1) / (kMidWarps * kWarpRows);
  return row_ctas * ((a.rows + 63) / 64) >= sm_count() ? 8 : 4;
}

template <class F, typename T>
cudaError_t launch_mid_any(const QmmaArgs& a, cudaStream_t stream) {
  return pick_mid_nt(a) == 8 ? launch_mid<F, T, 8>(a, stream) : launch_mid<F, T, 4>(a, stream);
}

}  // namespace

cudaError_t qmma_mid_m(const QmmaArgs& a, bool bf16, cudaStream_t stream) {
  return with_format(a.p, [&](auto f) {
    using F = decltype(f);
    return bf16 ? launch_mid_any<F, __nv_bfloat16>(a, stream) : launch_mid_any<F, __half>(a, stream);
  });
}

}  // namespace cuda
}  // namespace uqr
