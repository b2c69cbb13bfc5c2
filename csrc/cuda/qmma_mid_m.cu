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
// (not three) so that two CTAs share an SM: the kernel is latency-bound.
//
// The scales are applied to the codes in T before the MMA (subblock_steps), so the weights
// are rounded to T once, as the scratch path's decode rounds them; the small-M kernel's fp32
// scales after the MMA cost 4 FFMA per 2 MMAs and registers here, and measured slower (q4_0
// M = 128 101.5 vs 83 us).
#include "qmma_small_m.h"
#include "cuda_common.cuh"
#include "qmma_traits.cuh"

#include <algorithm>
#include <type_traits>

namespace uqr {
namespace cuda {
namespace {

using namespace qmma;

constexpr int kMidWarps = 8;  // weight rows per CTA: 8 x 16
static_assert(kMidWarps * kWarpRows == kSkTileRows, "stream-K's tiles are this kernel's CTAs");
constexpr int kMidStages = 2;

// x row pitch in shared memory (elements): the stage plus a pad that moves consecutive rows (the
// 8 g-lanes of a fragment) to other banks - 32 bytes for 8-byte loads (16 lanes a phase: 4 rows x
// 4 lanes of 8 bytes cover the 32 banks once), 64 bytes for mlx4's 16-byte loads (8 lanes a phase).
// In fragment order (PX) every lane loads 16 bytes, so the pad is 64 bytes for every format.
template <class F, bool PX = false>
__host__ __device__ constexpr int x_pitch() {
  return RowRing<F>::kStageElems + (F::kWideX || PX ? 32 : 16);
}

template <class F, int NT, int S = kMidStages, bool PX = false>
__host__ __device__ constexpr size_t mid_smem_bytes() {
  return static_cast<size_t>(S) * (8 * NT * x_pitch<F, PX>() * 2 + kMidWarps * RowRing<F>::kSlotBytes);
}

// Two CTAs per SM where their shared memory fits (<= 113 KB each; then 128 registers a thread).
template <class F, int NT>
__host__ __device__ constexpr int mid_ctas_per_sm() {
  return mid_smem_bytes<F, NT>() <= 113 * 1024 ? 2 : 1;
}

// MINB: CTAs an SM the registers must allow (mid_ctas_per_sm, or split_minb at 9-16 rows);
// S: ring stages. PX: x goes into shared memory through registers, rewritten in fragment order
// (frag_order), instead of by cp.async in its own order: each lane then reads its sub-block's B
// registers with one 16-byte load instead of two 8-byte loads and four PRMTs, once per warp, while
// the rewrite costs each thread a few instructions a stage.
// sm_80's ptxas spills exl3 at 85 registers with 4 sub-blocks a trip (12 bytes), so there it gets 128.
template <class F, int MINB, int U>
__host__ __device__ constexpr int arch_minb() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  return U == 4 && MINB > 2 && std::is_same<F, Traits<UQR_EXL3>>::value ? 2 : MINB;
#else
  return MINB;
#endif
}

template <class F, typename T, int NT, int MINB, int S, bool PX, int U>
__global__ void __launch_bounds__(kMidWarps * 32, (arch_minb<F, MINB, U>())) qmma_mid_m_kernel(const SplitArgs sa) {
  extern __shared__ __align__(16) unsigned char smem[];
  const QmmaArgs& a = sa.q;
  using Ring = RowRing<F>;
  constexpr int kCols = 8 * NT, kPitch = x_pitch<F, PX>(), kXSlot = kCols * kPitch;
  constexpr int kThreads = kMidWarps * 32;
  // x copies: a stage row of x is kXPieces 16-byte pieces; thread tid copies piece tid % kXPieces of
  // rows tid / kXPieces + u * kRowStep, u < kXCopies.
  constexpr int kXPieces = Ring::kStageElems * static_cast<int>(sizeof(T)) / 16;
  static_assert(kThreads % kXPieces == 0 && kCols % (kThreads / kXPieces) == 0, "x copies split evenly");
  constexpr int kRowStep = kThreads / kXPieces, kXCopies = kCols / kRowStep;

  const uqr_gemm_params& p = a.p;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;
  const int col0 = blockIdx.y * kCols;
  T* xring = reinterpret_cast<T*>(smem);
  unsigned char* wring = smem + static_cast<size_t>(S) * kXSlot * sizeof(T) + static_cast<size_t>(warp) * S * Ring::kSlotBytes;

  // This CTA's stages: n_stages of them, the first n_first (all unless stream-K crosses a tile
  // boundary) from stage st0 of row tile `tile`, the rest from stage 0 of the next tile; `plane`
  // is where the first tile's partial sums go when K is split.
  const int n_all = p.K / Ring::kStageElems;
  int tile, st0, n_stages, n_first, plane;
  constexpr bool kStreamK = PX;  // only the 9-16-row launch (streamk_ctas) may deal stages out
  if (kStreamK && sa.sk_ctas > 0) {
    const int64_t units = sk_all_units(p.N, n_all);
    const int64_t u0 = sk_begin(blockIdx.x, sa.sk_ctas, units), u1 = sk_begin(blockIdx.x + 1, sa.sk_ctas, units);
    tile = static_cast<int>(u0 / n_all);
    st0 = static_cast<int>(u0 - static_cast<int64_t>(tile) * n_all);
    n_stages = static_cast<int>(u1 - u0);
    n_first = min(n_stages, n_all - st0);
    plane = blockIdx.x - sk_cta_of(static_cast<int64_t>(tile) * n_all, sa.sk_ctas, units);
  } else {
    tile = blockIdx.x;
    st0 = static_cast<int>(static_cast<int64_t>(n_all) * blockIdx.z / sa.splits);
    n_stages = static_cast<int>(static_cast<int64_t>(n_all) * (blockIdx.z + 1) / sa.splits) - st0;
    n_first = n_stages;
    plane = blockIdx.z;
  }
  int row0 = tile * (kMidWarps * kWarpRows) + warp * kWarpRows;
  // Stage of K that local stage i reads.
  auto k_stage = [&](int i) { return i < n_first ? st0 + i : i - n_first; };
  Ring wr(a.w, a.w_row_stride, row0, p.N, st0, lane);
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

  // PX: thread tid rewrites units tid + kThreads u of the stage's x, unit = (row, sub-block js,
  // lane c): the 16 bytes lane c's fragments need, from one 16-byte (wide) or two 8-byte loads.
  constexpr int kSubs = Ring::kStageElems / 32, kUnits = PX ? kCols * kSubs * 4 / kThreads : 1;
  static_assert(!PX || (kCols * kSubs * 4) % kThreads == 0, "x units split evenly");
  const T* usrc[kUnits];
  int udst[kUnits];
  if constexpr (PX) {
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int id = tid + kThreads * u, row = id / (kSubs * 4), js = id / 4 % kSubs, cc = id % 4;
      const int r = min(col0 + row, a.rows - 1);
      const int b = r / p.M, m = r - b * p.M;
      usrc[u] = static_cast<const T*>(a.x) + uqr_x_row_offset(p, b, m) + 32 * js + (F::kWideX ? 8 : 4) * cc;
      udst[u] = row * kPitch + 32 * js + 8 * cc;
    }
  }
  auto load_units = [&](int i, uint4 (&v)[kUnits]) {
    const int64_t xo = x_stage_offset(p, k_stage(i) * Ring::kStageElems);
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      if constexpr (F::kWideX) {
        v[u] = ld_after_wait(reinterpret_cast<const uint4*>(usrc[u] + xo));
      } else {
        const uint2 lo = ld_after_wait(reinterpret_cast<const uint2*>(usrc[u] + xo));
        const uint2 hi = ld_after_wait(reinterpret_cast<const uint2*>(usrc[u] + xo + 16));
        v[u] = make_uint4(lo.x, lo.y, hi.x, hi.y);
      }
    }
  };
  auto store_units = [&](int slot, const uint4 (&v)[kUnits]) {
#pragma unroll
    for (int u = 0; u < kUnits; ++u) *reinterpret_cast<uint4*>(xring + slot * kXSlot + udst[u]) = frag_order<F>(v[u]);
  };

  int slot_in = 0;
  auto issue = [&](int i) {
    if (i < n_stages) {
      // Stream-K's second tile: the ring moves 128 rows on, to stage 0 (copies are issued in
      // stage order, so this happens once, before its first copy).
      if (kStreamK && i == n_first) wr = Ring(a.w, a.w_row_stride, row0 + kMidWarps * kWarpRows, p.N, 0, lane);
      wr.copy(wring + slot_in * Ring::kSlotBytes, i < n_first ? i : i - n_first, lane);
      if constexpr (!PX) {
        const int64_t xo = x_stage_offset(p, k_stage(i) * Ring::kStageElems);
        T* dst = xdst0 + slot_in * kXSlot;
#pragma unroll
        for (int u = 0; u < kXCopies; ++u) cp_async16(dst + u * kRowStep * kPitch, xsrc[u] + xo);
      }
    }
    slot_in = slot_in == S - 1 ? 0 : slot_in + 1;
    cp_async_commit();  // empty groups keep wait_group's count uniform
  };

  // K split: this warp's fp32 partial sums of weight rows r0.. into plane `pl` of the workspace.
  auto store_partial = [&](const float (&v)[NT][4], int r0, int pl) {
    float* ws = sa.ws + static_cast<int64_t>(pl) * a.rows * p.N;
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int n = r0 + g + (q >= 2 ? 8 : 0), r = col0 + t * 8 + 2 * c + (q & 1);
        if (n < p.N && r < a.rows) ws[static_cast<int64_t>(r) * p.N + n] = v[t][q];
      }
  };
  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[t][i] = 0.f;

  pdl_wait();  // launched as a programmatic dependent (cuda_common.cuh): x, w and y are final now
#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue(s);
  if constexpr (PX) {
    uint4 v[kUnits];
    load_units(0, v);
    store_units(0, v);
  }

  int slot_out = 0;
  for (int i = 0; i < n_stages; ++i) {
    cp_async_wait<S - 2>();
    __syncthreads();  // stage i visible to all warps; every warp is done with stage i - 1's slot
    issue(i + S - 1);
    // PX: stage i + 1's x is loaded now and stored after this stage's work, into the slot stage
    // i + 1 - S left (free since the barrier above), so its latency hides behind the work.
    uint4 xnext[kUnits];
    const bool more = PX && i + 1 < n_stages;
    if (more) load_units(i + 1, xnext);
    const T* xlane = xring + slot_out * kXSlot + g * kPitch + (PX ? 8 : F::kWideX ? 8 : 4) * c;
    const T* xst[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) xst[t] = xlane + t * 8 * kPitch;
    stage_steps<F, T, NT, U, PX>(wring + slot_out * Ring::kSlotBytes, g, c, xst, acc);
    if (more) store_units((i + 1) % S, xnext);
    slot_out = slot_out == S - 1 ? 0 : slot_out + 1;
    if (kStreamK && i + 1 == n_first && n_first < n_stages) {  // stream-K: the first tile's share is done
      store_partial(acc, row0, plane);
      row0 += kMidWarps * kWarpRows;
      plane = 0;  // this CTA is the first to hold stages of the next tile
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[t][q] = 0.f;
    }
  }
  cp_async_wait<0>();

  if (sa.splits == 1) {
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int q = 0; q < 4; ++q) store_acc<T>(p, a.y, a.rows, row0, col0, g, c, t, q, acc[t][q]);
    return;
  }
  store_partial(acc, row0, plane);
}

// 9-16 rows (two column tiles), where K is split over the grid so that the CTAs of a 16-row x tile
// fill the GPU: two ring stages, x in fragment order, 3 CTAs an SM (registers capped at 85) except
// mlx4 g128, which spills there (2: 128), and 4 sub-blocks a loop trip except for mlx4's wide x
// loads and var_affine, which spills at 4 (16 rows, us, U = 2 -> 4: q4_k 27.9 -> 26.1, exl3
// 41.2 -> 36.5, q4_0 23.0 -> 22.7, mlx4 21.7 -> 22.6 on 14336 x 4096).
constexpr int kSplitStages = 2;
template <class F>
constexpr int split_minb() {
  return std::is_same<F, Mlx4<128>>::value || RegHeavy<F>::value ? 2 : 3;
}
template <class F>
constexpr int split_u() {
  return F::kWideX || std::is_same<F, Traits<UQR_VAR_AFFINE>>::value ? 2 : 4;
}

template <class F, typename T, int NT, int MINB, int S, bool PX, int U = 2>
cudaError_t launch_mid(const SplitArgs& sa, cudaStream_t stream, bool pdl) {
  constexpr size_t smem = mid_smem_bytes<F, NT, S, PX>();
  static const cudaError_t attr = cudaFuncSetAttribute(qmma_mid_m_kernel<F, T, NT, MINB, S, PX, U>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr != cudaSuccess) return attr;
  const QmmaArgs& a = sa.q;
  const dim3 grid = sa.sk_ctas > 0 ? dim3(sa.sk_ctas)
                                   : dim3((a.p.N + kMidWarps * kWarpRows - 1) / (kMidWarps * kWarpRows),
                                          (a.rows + 8 * NT - 1) / (8 * NT), sa.splits);
  if (const cudaError_t e = launch_ex(qmma_mid_m_kernel<F, T, NT, MINB, S, PX, U>, grid, dim3(kMidWarps * 32), smem,
                                      stream, pdl, sa);
      e != cudaSuccess || sa.splits == 1)
    return e;
  return reduce_splits<T>(sa, stream, pdl);
}

// The plan's column tile (dispatch.py): 16 activation rows at 9-16 rows; else 64 (x read N / 128
// times), or 32 where 64 would leave SMs idle (small N) or would be mostly padding.
//
// At 16 rows the plan may deal the stages out by stream-K (sk_ctas > 0) and take the build for 2
// CTAs an SM (128 registers a thread) instead of the 3 the power-of-two split's grid needs (85):
// stream-K launches 2 an SM, so the 85 cap buys it no residency. On the H100 that paid (5-7 %) only
// for the formats whose builds gain most registers (q4_k and exl3: 80 -> 100 / 112) and was within
// noise for the rest, so by default the plan takes it only for those (docs/perf/history.md).
template <class F, typename T>
cudaError_t launch_mid_any(const SplitArgs& sa, const SplitPlan& plan, cudaStream_t stream, bool pdl) {
  switch (plan.cols) {
    case 16: {
      SplitArgs sk = sa;
      sk.sk_ctas = plan.sk_ctas;
      if (plan.sk_ctas > 0) sk.sk_units = sa.q.p.K / RowRing<F>::kStageElems;
      if (plan.wide_regs) return launch_mid<F, T, 2, 2, kSplitStages, true, split_u<F>()>(sk, stream, pdl);
      return launch_mid<F, T, 2, split_minb<F>(), kSplitStages, true, split_u<F>()>(sk, stream, pdl);
    }
    case 32: return launch_mid<F, T, 4, mid_ctas_per_sm<F, 4>(), kMidStages, false>(sa, stream, pdl);
    default: return launch_mid<F, T, 8, mid_ctas_per_sm<F, 8>(), kMidStages, false>(sa, stream, pdl);
  }
}

// Resident CTAs an SM of the 16-row split build, for the plan's power-of-two split of K at 9-16
// rows (the most splits that keep the grid within one wave, with >= 2 stages a split).
template <class F>
int split_fit() {
  static const int per_sm = [] {
    constexpr size_t smem = mid_smem_bytes<F, 2, kSplitStages, true>();
    auto kernel = qmma_mid_m_kernel<F, __nv_bfloat16, 2, split_minb<F>(), kSplitStages, true, split_u<F>()>;
    int fit = 0;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, kMidWarps * 32, smem) != cudaSuccess) fit = 1;
    return fit > 0 ? fit : 1;
  }();
  return per_sm;
}

}  // namespace

// Stream-K at 9-16 rows (the plan's streamk_ctas): a grid of CTAs dealt equal ranges of all tiles'
// stages. With 2 K-splits of 112 row tiles (14336 x 4096) 92 SMs held two CTAs and 40 one, so the
// SMs were busy 78 % of the kernel (ncu); equal ranges give every SM the same work (16 rows, 3-9 %
// faster for every format). It needs more CTAs than tiles (a range then spans at most two tiles),
// at most one CTA a stage, and as many workspace planes as a tile has pieces.
const char* mid_m_plan_invalid(const uqr_gemm_params& p, int rows, const SplitPlan& plan) {
  if (plan.cols != 16 && plan.cols != 32 && plan.cols != 64) return "the mid-M column tile must be 16, 32 or 64 rows";
  if ((rows <= kQmmaMaxRows) != (plan.cols == 16)) return "the mid-M kernel takes 16-row column tiles at 1-16 rows only";
  if (plan.splits < 1) return "splits must be >= 1";
  if (plan.wide_regs && plan.cols != 16) return "the 128-register build is the 16-row tile's";
  if (plan.sk_ctas < 0) return "stream-K CTAs must be >= 0";
  const int n_stages = p.K / stage_blocks(p.group_size, p.block_bytes) / p.group_size;
  if (plan.sk_ctas == 0) return plan.splits <= n_stages ? nullptr : "splits must be at most K's stages";
  if (plan.cols != 16) return "stream-K needs the 16-row column tile";
  const int64_t units = sk_all_units(p.N, n_stages), tiles = units / n_stages;
  if (plan.sk_ctas <= tiles || plan.sk_ctas > units) return "stream-K needs more CTAs than row tiles, at most one a stage";
  if (plan.splits < (n_stages - 1) / (units / plan.sk_ctas) + 2) return "stream-K needs a plane for each piece of a tile";
  return nullptr;
}

cudaError_t qmma_mid_m(const SplitArgs& sa, const SplitPlan& plan, bool bf16, cudaStream_t stream, bool pdl) {
  if (sa.splits < 1 || (sa.splits > 1 && sa.ws == nullptr)) return cudaErrorInvalidValue;
  return with_format(sa.q.p, [&](auto f) {
    using F = decltype(f);
    return bf16 ? launch_mid_any<F, __nv_bfloat16>(sa, plan, stream, pdl)
                : launch_mid_any<F, __half>(sa, plan, stream, pdl);
  });
}

cudaError_t qmma_mid_m_split_fit(const uqr_gemm_params& p, int& fit) {
  return with_format(p, [&](auto f) {
    fit = split_fit<decltype(f)>();
    return cudaSuccess;
  });
}

}  // namespace cuda
}  // namespace uqr
