// Small-M tensor-core kernel (batch * M <= 16 activation rows, bf16 / fp16 x): weights streamed
// once through shared memory, their integer codes turned into mma.sync A fragments
// (qmma_traits.cuh, which also says why tensor cores at M = 1), x read straight from global memory
// into B fragments.
//
// Work split: a CTA owns 16 weight rows (the MMA's M side) and 1-8 warps that split K; each
// warp streams its 16 rows' bytes in stages of 256 (mlx4 g128: 512) elements through a private
// cp.async ring, and the warps' partial sums meet in shared memory at the end. The copy and
// sub-block loops stay written out here, as measured: routing the sub-block loop through
// the mid-M kernel's subblock_steps cost mlx4 ~20 % at M = 1, and the shared
// RowRing adds 64-bit address work to every stage's copies (PTX), so neither is used here.
#include "qmma_small_m.h"
#include "cuda_common.cuh"
#include "ksplit.cuh"
#include "qmma_traits.cuh"

namespace uqr {
namespace cuda {
namespace {

using namespace qmma;

constexpr int kMaxWarpsK = ksplit::kMaxWarps;
// Three stages: enough to overlap (each is 2.3-4.4 KB per warp) and small enough that a whole
// 14336-row grid is resident at once (with four, 896 CTAs needed 1.13 waves).
constexpr int kStages = 3;
constexpr int kRows = kWarpRows;  // weight rows per CTA (two tiles per warp measured slower)

// Sub-blocks unrolled per loop trip: 4 at one column tile, 2 at two (whose MMAs already give the
// scheduler independent work; 4 would cost registers and so occupancy), except mlx4, whose wide x
// loads want the longer unroll (at 4: 29.8 us at M = 16, at 2: 34.5).
template <class F, int NT>
__host__ __device__ constexpr int unroll_subs() { return NT == 1 || F::kWideX ? 4 : 2; }
// Register cap per thread. 72 lets 7 CTAs of 4 warps share an SM, so a 14336-row grid (896 CTAs)
// is resident at once with 4 K-splitting warps (mlx4, exl3 and the RegHeavy formats spill below 80). Two column tiles are left
// uncapped: capped at 72 their x loads' L2 latency was exposed (q4_0 M = 16 47.7 us vs 35).
template <class F, int NT>
__host__ __device__ constexpr int max_regs() {
  return NT == 1 ? (F::kWideX || Prescaled<F>::value || RegHeavy<F>::value ? 80 : 72) : 128;
}

template <class F, typename T, int NT>
__global__ void __launch_bounds__(kMaxWarpsK * 32) __maxnreg__((max_regs<F, NT>())) qmma_small_m_kernel(const QmmaArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const uqr_gemm_params& p = a.p;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int row0 = blockIdx.x * kRows;
  constexpr int kStageBlocks = stage_blocks(F::kElems, F::kBytes);
  constexpr int sb = kStageBlocks * F::kBytes, kStageElems = kStageBlocks * F::kElems;
  unsigned char* ring = smem + static_cast<size_t>(warp) * kStages * kRows * sb;

  // This warp's stages: a contiguous share of K.
  const int n_stages = p.K / kStageElems;
  const int warps_k = blockDim.x >> 5;
  const int s0 = n_stages * warp / warps_k, s1 = n_stages * (warp + 1) / warps_k;
  const int n_mine = s1 - s0;
  pdl_wait();  // launched as a programmatic dependent (cuda_common.cuh): x, w and y are final now

  // The stage's bytes, row after row, land contiguously in the slot (row pitch = sb), so lane
  // piece idx = lane + 32 u goes to slot + 16 idx: consecutive lanes copy consecutive 16-byte
  // pieces (coalesced reads, conflict-free shared stores; a row-per-lane mapping measured
  // slower), and only the global offsets need registers.
  constexpr int kPieces = sb / 16, kAll = kRows * kPieces;
  constexpr int kCopies = (kAll + 31) / 32;
  const uint8_t* cta_w = a.w + static_cast<int64_t>(row0) * a.w_row_stride + static_cast<int64_t>(s0) * sb;
  uint32_t src[kCopies];  // offsets from cta_w (a few rows of one matrix: far below 4 GB)
#pragma unroll
  for (int u = 0; u < kCopies; ++u) {
    const int idx = lane + 32 * u, r = idx / kPieces, o = idx - r * kPieces;
    const int row = min(row0 + r, p.N - 1);  // rows past N re-read the last row; never stored
    src[u] = static_cast<uint32_t>((row - row0) * a.w_row_stride + o * 16);
  }
  int slot_in = 0;  // ring slot the next issue fills
  auto issue = [&](int i) {
    if (i < n_mine) {
      unsigned char* slot = ring + slot_in * kRows * sb + 16 * lane;
      const uint8_t* stage = cta_w + static_cast<int64_t>(i) * sb;
#pragma unroll
      for (int u = 0; u < kCopies; ++u)
        if (kAll % 32 == 0 || u < kCopies - 1 || lane + 32 * u < kAll) cp_async16(slot + 512 * u, stage + src[u]);
    }
    slot_in = slot_in == kStages - 1 ? 0 : slot_in + 1;
    cp_async_commit();  // empty groups keep wait_group's count uniform
  };

  // x rows of this lane's B fragments (columns t * 8 + g; rows past the last re-read row 0).
  const T* xrow[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    int r = t * 8 + g;
    if (r >= a.rows) r = 0;
    const int b = r / p.M, m = r - b * p.M;
    xrow[t] = static_cast<const T*>(a.x) + uqr_x_row_offset(p, b, m);
  }

  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[t][i] = 0.f;
  const float zero[4] = {0.f, 0.f, 0.f, 0.f};
  const uint32_t ones[4] = {Magic<T>::kOne, Magic<T>::kOne, Magic<T>::kOne, Magic<T>::kOne};
  const float bias = F::kOffset ? Magic<T>::kBias : 0.f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);

  constexpr int U = unroll_subs<F, NT>();
  constexpr int kTrips = kStageBlocks * F::kSubs / U;  // loop trips of U sub-blocks a stage
  // At two column tiles the x loads (from L2: every CTA reads all of x) are issued one trip ahead,
  // into the other of two register sets, so their latency overlaps a trip of decode and MMAs
  // (long-scoreboard stalls were half the cycles without it). Not for mlx4's wide x (its two sets
  // spill), nor for formats of more than a byte a weight: their wider weight stages leave
  // it behind on the N = 4096 shapes (docs/perf/history.md).
  constexpr bool kPrefetchX = NT == 2 && !F::kWideX && F::kBytes <= F::kElems;
  const int lane_x = (F::kWideX ? 8 : 4) * c;
  using XTrip = uint32_t[U][NT][4];
  // The four x words of one sub-block of one column tile at p, in the order xfrag pairs them.
  auto x_words = [](const T* xs, uint32_t (&w)[4]) {
    if constexpr (F::kWideX) {
      const uint4 v = ld_after_wait(reinterpret_cast<const uint4*>(xs));
      w[0] = v.x, w[1] = v.z, w[2] = v.y, w[3] = v.w;
    } else {
      const uint2 v0 = ld_after_wait(reinterpret_cast<const uint2*>(xs));
      const uint2 v1 = ld_after_wait(reinterpret_cast<const uint2*>(xs + 16));
      w[0] = v0.x, w[1] = v0.y, w[2] = v1.x, w[3] = v1.y;
    }
  };
  auto load_x = [&](XTrip& xr, const T* const (&ptr)[NT]) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int t = 0; t < NT; ++t) x_words(ptr[t] + 32 * u, xr[u][t]);
  };
  // U sub-blocks from jb on of the stage in buf, with their x in xr (prefetched) or, without the
  // prefetch, loaded here from xq one sub-block at a time (as late as the original loop: loading a
  // whole trip up front spilled q4_k at the 72-register cap).
  auto trip = [&](const unsigned char* buf, int jb, const XTrip& xr, const T* const (&xq)[NT]) {
    const typename F::Scales sg(buf + g * sb, jb), sg8(buf + (g + 8) * sb, jb);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int js = jb + u, j = js / F::kSubs, s = js % F::kSubs;
      const uint8_t* blk_g = buf + g * sb + j * F::kBytes;
      uint32_t rg[4], rg8[4];
      F::template codes<T>(blk_g, j, s, c, rg);
      F::template codes<T>(blk_g + 8 * sb, j, s, c, rg8);
      const uint32_t a0[4] = {rg[0], rg8[0], rg[1], rg8[1]};
      const uint32_t a1[4] = {rg[2], rg8[2], rg[3], rg8[3]};
      const float2 s_g = sg.at(u), s_g8 = sg8.at(u);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        uint32_t w[4];
        if constexpr (kPrefetchX) {
#pragma unroll
          for (int i = 0; i < 4; ++i) w[i] = xr[u][t][i];
        } else {
          x_words(xq[t] + 32 * u, w);
        }
        uint32_t b00, b01, b10, b11;
        xfrag(w[0], w[1], b00, b01);
        xfrag(w[2], w[3], b10, b11);
        float sq[4];
        mma16816<T>(sq, a0, b00, b01, zero);
        mma16816<T>(sq, a1, b10, b11, sq);
        float* ac = acc[t];
        if constexpr (F::kOffset) {
          // w = a q + b = a (B + q) + (b - a B): the MMA saw B + q; sum(x) from the ones-MMA.
          float sx[4];
          mma16816<T>(sx, ones, b00, b01, zero);
          mma16816<T>(sx, ones, b10, b11, sx);
          const float og = s_g.y - s_g.x * bias, og8 = s_g8.y - s_g8.x * bias;
          ac[0] = fmaf(og, sx[0], fmaf(s_g.x, sq[0], ac[0]));
          ac[1] = fmaf(og, sx[1], fmaf(s_g.x, sq[1], ac[1]));
          ac[2] = fmaf(og8, sx[2], fmaf(s_g8.x, sq[2], ac[2]));
          ac[3] = fmaf(og8, sx[3], fmaf(s_g8.x, sq[3], ac[3]));
        } else {
          ac[0] = fmaf(s_g.x, sq[0], ac[0]);
          ac[1] = fmaf(s_g.x, sq[1], ac[1]);
          ac[2] = fmaf(s_g8.x, sq[2], ac[2]);
          ac[3] = fmaf(s_g8.x, sq[3], ac[3]);
        }
      }
    }
  };
  static_assert((kStageBlocks * F::kSubs) % 4 == 0, "stages hold a multiple of 4 sub-blocks");
  static_assert(!kPrefetchX || kTrips % 2 == 0, "x register sets alternate within a stage");

  // x of the trip to load next (prefetch) or of the current stage; rows past the last re-read row 0.
  const T* xp[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) xp[t] = xrow[t] + x_stage_offset(p, s0 * kStageElems) + lane_x;
  XTrip xa, xb;
  if constexpr (kPrefetchX) load_x(xa, xp);

  int slot_out = 0;  // ring slot this iteration reads
  for (int i = 0; i < n_mine; ++i) {
    issue(i + kStages - 1);
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const unsigned char* buf = ring + slot_out * kRows * sb;
    slot_out = slot_out == kStages - 1 ? 0 : slot_out + 1;
    if constexpr (kPrefetchX) {
      // The next stage's x (this one's again at the last stage: a harmless valid reload).
      const int64_t x_next = x_stage_offset(p, (s0 + min(i + 1, n_mine - 1)) * kStageElems) + lane_x;
      // Trips in pairs: compute from one register set while the next trip's x fills the other.
#pragma unroll 1
      for (int jq = 0; jq < kTrips; jq += 2) {
#pragma unroll
        for (int t = 0; t < NT; ++t) xp[t] += 32 * U;
        load_x(xb, xp);
        trip(buf, jq * U, xa, xp);
        if (jq + 2 < kTrips) {
#pragma unroll
          for (int t = 0; t < NT; ++t) xp[t] += 32 * U;
        } else {
#pragma unroll
          for (int t = 0; t < NT; ++t) xp[t] = xrow[t] + x_next;
        }
        load_x(xa, xp);
        trip(buf, (jq + 1) * U, xb, xp);
      }
    } else {
      if (i > 0) {
#pragma unroll
        for (int t = 0; t < NT; ++t) xp[t] = xrow[t] + x_stage_offset(p, (s0 + i) * kStageElems) + lane_x;
      }
      // jb = jq * U keeps jb's low bits known to the compiler, so (jb + u)'s parity (q4_k's nibble
      // half) and 4-alignment fold to constants. x addresses stay pointer + immediate.
#pragma unroll 1
      for (int jq = 0; jq < kTrips; ++jq) {
        trip(buf, jq * U, xa, xp);
#pragma unroll
        for (int t = 0; t < NT; ++t) xp[t] += 32 * U;
      }
    }
    __syncwarp();  // the slot is refilled by the next iteration's issue
  }
  float total[NT][4];
  if (!ksplit::drain_and_sum<NT>(acc, reinterpret_cast<float*>(smem), warp, warps_k, lane, total)) return;
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int q = 0; q < 4; ++q) store_acc<T>(p, a.y, a.rows, row0, 0, g, c, t, q, total[t][q]);
}

constexpr size_t ring_bytes(int warps_k, int sb) { return static_cast<size_t>(warps_k) * kStages * kRows * sb; }

template <class F, typename T, int NT>
const ksplit::Residency& residency() {
  constexpr int sb = stage_blocks(F::kElems, F::kBytes) * F::kBytes;
  static const ksplit::Residency r =
      ksplit::residency_of(qmma_small_m_kernel<F, T, NT>, [](int wk) { return ring_bytes(wk, sb); });
  return r;
}

template <class F, typename T, int NT>
cudaError_t launch_nt(const QmmaArgs& a, cudaStream_t stream, const QmmaPlan& plan) {
  constexpr int sb = stage_blocks(F::kElems, F::kBytes) * F::kBytes;
  const ksplit::Residency& res = residency<F, T, NT>();
  if (res.err != cudaSuccess) return res.err;
  const int grid = (a.p.N + kRows - 1) / kRows;
  const int warps_k = plan.warps;
  const size_t ring = ring_bytes(warps_k, sb);
  const size_t red = static_cast<size_t>(warps_k - 1) * NT * 4 * 32 * sizeof(float);
  return launch_ex(qmma_small_m_kernel<F, T, NT>, dim3(grid), dim3(warps_k * 32),
                   ksplit::capped_smem(ring > red ? ring : red, grid, ksplit::fit_of(res, warps_k), plan.smem_cap),
                   stream, plan.pdl, a);
}

template <class F, typename T>
cudaError_t launch(QmmaArgs& a, cudaStream_t stream, const QmmaPlan& plan) {
  return a.rows <= 8 ? launch_nt<F, T, 1>(a, stream, plan) : launch_nt<F, T, 2>(a, stream, plan);
}

}  // namespace

cudaError_t qmma_small_m_residency(const uqr_gemm_params& p, bool bf16, int rows, int (&per_sm)[4]) {
  return with_format(p, [&](auto f) {
    using F = decltype(f);
    const ksplit::Residency& res =
        rows <= 8 ? (bf16 ? residency<F, __nv_bfloat16, 1>() : residency<F, __half, 1>())
                  : (bf16 ? residency<F, __nv_bfloat16, 2>() : residency<F, __half, 2>());
    for (int i = 0; i < 4; ++i) per_sm[i] = res.per_sm[i];
    return res.err;
  });
}

const char* qmma_unsupported(const uqr_gemm_params& p, int rows, bool half_x, uintptr_t x_addr, uintptr_t w_addr,
                             int64_t w_row_stride, bool mid) {
  if (!half_x) return "x must be bfloat16 or float16";
  if (rows < 1 || rows > kQmmaMidMaxRows) return "batch * M must be 1..2^20";
  switch (p.fmt) {
#define UQR_FIXED_CASE(id, name) case id:
    UQR_FIXED_BLOCK_LIST(UQR_FIXED_CASE) break;
#undef UQR_FIXED_CASE
    case UQR_MLX4:
      if (p.group_size != 32 && p.group_size != 64 && p.group_size != 128) return "mlx4 group must be 32/64/128";
      break;
    default: return "format not handled by this kernel";
  }
  const int n = stage_blocks(p.group_size, p.block_bytes);
  if (n * p.group_size > kQmmaMaxStageElems) return "the format's stage is too large for these kernels";
  if (p.K % (n * p.group_size)) return "K must be a multiple of the stage";
  if (p.x_head_dim % (n * p.group_size)) return "x's head dim must be a multiple of the stage";
  if (w_addr % 16 || w_row_stride % 16) return "weight rows must be 16-byte aligned";
  // 4 consecutive x values per 8-byte load: head dim, strides and base must keep that aligned.
  if (x_addr % 8 || p.x_row_stride % 4 || p.x_batch_stride % 4 || p.x_head_stride % 4)
    return "x must allow aligned 4-element loads";
  // In the mid-M kernel x is staged with 16-byte copies.
  if (mid && (x_addr % 16 || p.x_row_stride % 8 || p.x_batch_stride % 8 || p.x_head_stride % 8))
    return "x must allow aligned 8-element copies";
  return nullptr;
}

const char* qmma_plan_invalid(const uqr_gemm_params& p, int rows, const QmmaPlan& plan) {
  if (!plan.mid) {
    if (rows > kQmmaMaxRows) return "the small-M kernel takes at most 16 activation rows";
    if (!ksplit::valid_warps(plan.warps)) return "warps must be 1, 2, 4 or 8";
    return nullptr;
  }
  return mid_m_plan_invalid(p, rows, SplitPlan{plan.mid_cols, plan.splits, plan.streamk_ctas, plan.wide_regs});
}

cudaError_t qmma_small_m(const void* x, const uint8_t* w, int64_t w_row_stride, void* y, const uqr_gemm_params& p,
                         bool bf16, cudaStream_t stream, const QmmaPlan& plan, float* split_ws) {
  const int rows = p.batch * p.M;
  if (qmma_unsupported(p, rows, true, reinterpret_cast<uintptr_t>(x), reinterpret_cast<uintptr_t>(w), w_row_stride,
                       plan.mid) ||
      qmma_plan_invalid(p, rows, plan))
    return cudaErrorInvalidValue;
  QmmaArgs a{};
  a.p = p;
  a.x = x;
  a.y = y;
  a.w = w;
  a.w_row_stride = w_row_stride;
  a.rows = rows;
  if (plan.mid) {
    SplitArgs sa{a, split_ws, plan.splits};
    sa.sk_ctas = plan.streamk_ctas;
    return qmma_mid_m(sa, SplitPlan{plan.mid_cols, plan.splits, plan.streamk_ctas, plan.wide_regs}, bf16, stream,
                      plan.pdl);
  }
  return with_format(a.p, [&](auto f) {
    using F = decltype(f);
    return bf16 ? launch<F, __nv_bfloat16>(a, stream, plan) : launch<F, __half>(a, stream, plan);
  });
}

}  // namespace cuda
}  // namespace uqr
