// Hopper (sm_90a) kernel for more than 16 activation rows: the weights are decoded into registers
// as the A operand of wgmma (qmma_traits.cuh's per-format codes, scales applied, rounded to T once
// as in the mid-M kernel) and the activations are the B operand, read by the tensor cores from
// shared memory. The MMA is asynchronous, so a warp decodes the next batch of sub-blocks while the
// previous batch multiplies: what the mid-M mma.sync kernel could not overlap (~9
// issued instructions per MMA at 25 % occupancy). What limits it now (ncu, 128 rows): 2 warps
// per scheduler stalled mostly on the per-batch barrier and on the decode's dependent instructions.
//
// CTA = two warpgroups = 128 weight rows (each warp its 16 rows, as the weight ring of the mid-M
// kernel) x BM activation rows (wgmma's N). K is walked in the formats' 256/512-element stages,
// copied with cp.async: at one CTA an SM in split rings (x a half stage a slot, several batches
// ahead), otherwise in whole stages (WgLayout).
//
// x goes through a small pre-pass (permute_x_kernel): the codes of qmma_traits.cuh sit in the A
// fragment in a permuted k order (a lane's pair (v, v+2) at k positions (2c, 2c+1); q4_k has its
// own order here, one sub-block a lane: WgDecode); mma.sync
// kernels permute x the same way in registers, but wgmma reads B straight from shared memory. So
// each row of x is rewritten once, in the order the codes use, into a contiguous scratch matrix
// (also gathering batched and head-strided x): rows x K elements, a small copy next to the weights
// at these row counts (not timed on its own). The kernel then copies it with cp.async into
// 128-byte-swizzled tiles.
#include <cstdlib>

#include "qmma_small_m.h"
#include "cuda_common.cuh"
#include "qmma_traits.cuh"
#include "wgmma_ops.cuh"

namespace uqr {
namespace cuda {
namespace {

using namespace qmma;

constexpr int kWgWarps = 8;  // two warpgroups: 128 weight rows a CTA
constexpr int kWgMaxStages = 4;
// Shared memory a CTA may use: all of an SM's 227 KB, or half of it for two resident CTAs.
__host__ __device__ constexpr size_t wg_smem_limit(int ctas) { return ctas == 1 ? 227 * 1024 : 113 * 1024; }
constexpr int kXChunk = 64;  // x elements per swizzled 128-byte row

// Batches of U sub-blocks: decoded into registers, then their 2 U MMAs in one commit group, the
// next batch decoded while this one multiplies. 4 a batch at one CTA an SM (batches of 4
// measured no faster than single sub-blocks, and are what the later tunings ran), 2 under two CTAs'
// register cap.
__host__ __device__ constexpr int wg_batch(int ctas) { return ctas == 1 ? 4 : 2; }

// Depth of the split rings below: x slots, weight slots, and how many batches ahead x is copied.
struct SplitDepth {
  int x_slots, w_slots, depth;
};
// The deepest prefetch that fits `limit` bytes, up to 6 batches ahead: copying batch v + D into x
// slot (v + D) % XS needs batch v + D - XS retired by both warpgroups before batch v's barrier
// (D <= XS - 2), and stage (v + D) / 2's weight slot free of stage (v + D) / 2 - WS, decoded by batch
// v - 1 at the latest (D <= 2 WS - 2).
__host__ __device__ constexpr SplitDepth split_depth(int x_bytes, int w_bytes, int limit) {
  SplitDepth best{0, 0, 0};
  for (int ws = 2; ws <= 4; ++ws) {
    const int room = limit - ws * w_bytes;
    if (room < 3 * x_bytes) continue;
    const int xs = room / x_bytes > 8 ? 8 : room / x_bytes;
    const int d = xs - 2 < 2 * ws - 2 ? xs - 2 : 2 * ws - 2;
    if (d > best.depth) best = SplitDepth{d + 2, (d + 3) / 2, d};
  }
  return best;
}

// Shared memory. Two layouts:
// - whole stages (two CTAs an SM, and mlx4 g128's four batches a stage): a stage = the x tile as
//   Ring::kStageElems / 64 chunks of [BM][64] (BM * 128 bytes, 1024-aligned), then the 8 warps'
//   weight slots; as many stages as fit, up to 4 (at 64-row tiles 3-4 stages against 2, q4_0
//   at 64 rows 41.2 -> 39.7 us, mlx4 51.3 -> 38.6);
// - split rings (kSplit: one CTA an SM, two batches a stage): x in slots of one batch (half a stage)
//   and the weights in stage slots, so x is copied several batches ahead. With whole stages at
//   128-row tiles only 2 fit (x alone is 64 KB a stage), and ncu put 18 % of the stall cycles
//   at 128 rows on waiting for those copies (long scoreboard: the decode reads only shared memory).
template <class F, int BM, int CTAS>
struct WgLayout {
  using Ring = RowRing<F>;
  static constexpr int kSubsPerStage = Ring::kStageBlocks * F::kSubs;
  static constexpr int kU = wg_batch(CTAS);
  static constexpr bool kSplit = CTAS == 1 && kSubsPerStage == 2 * kU;
  static constexpr int kLimit = static_cast<int>(wg_smem_limit(CTAS)) - 1024;  // - alignment slack
  static constexpr int kChunks = Ring::kStageElems / kXChunk;
  static constexpr int kXBytes = kChunks * BM * 128;
  static constexpr int kWBytes = kWgWarps * Ring::kSlotBytes;
  static constexpr int kWSlotBytes = (kWBytes + 1023) / 1024 * 1024;
  static constexpr int kStageBytes = kXBytes + kWSlotBytes;
  static constexpr int kFit = kLimit / kStageBytes;
  static constexpr int kStages = kFit < kWgMaxStages ? kFit : kWgMaxStages;
  static constexpr int kHalfXBytes = kXBytes / 2;
  static constexpr SplitDepth kRing = split_depth(kHalfXBytes, kWSlotBytes, kLimit);
  static constexpr bool kFits = kSplit ? kRing.depth >= 1 : kStages >= 2;
  static constexpr size_t kSmem =
      (kSplit ? static_cast<size_t>(kRing.x_slots) * kHalfXBytes + static_cast<size_t>(kRing.w_slots) * kWSlotBytes
              : static_cast<size_t>(kStages) * kStageBytes) + 1024;
};

template <class F, int BM, int CTAS = 1>
__host__ __device__ constexpr bool wg_fits() {
  return WgLayout<F, BM, CTAS>::kFits;
}

// The order x is permuted into (see the file comment): 0 = per 16 elements, the even ones then the
// odd ones; 1 = mlx4's (kWideX); 2 = q4_k's lane-per-sub-block order (WgDecode below).
template <class F>
__host__ __device__ constexpr int wg_perm() {
  return std::is_same<F, Traits<UQR_Q4_K>>::value ? 2 : F::kWideX ? 1 : 0;
}

// The x element that goes to k position kpos (0..31) of a thread's 32 outputs, as an index into
// the 32 elements it loaded (permute_x_kernel):
// kPerm 0: the 32 consecutive elements; per 16, the even ones then the odd ones;
// kPerm 1 (mlx4): the 32 consecutive elements; lane c's k-step h takes elements
//   8c + {2h, 2h+4, 2h+1, 2h+5} at k positions 16h + {2c, 2c+1, 2c+8, 2c+9};
// kPerm 2 (q4_k): 8 consecutive elements of each of four sub-blocks (8c + i: sub-block c's, see
//   permute_x_kernel); the k-step's columns 2c, 2c+1 / 2c+8, 2c+9 take sub-block c's elements
//   (4t, 4t+2) / (4t+1, 4t+3) of its word t, as WgDecode<q4_k>'s code pairs.
template <int kPerm>
__device__ __forceinline__ int permuted_source(int kpos) {
  if constexpr (kPerm == 0) {
    const int q = kpos & 15, base = kpos & ~15;
    return base + (q < 8 ? 2 * q : 2 * (q - 8) + 1);
  } else if constexpr (kPerm == 1) {
    const int base = kpos & ~31, h = (kpos >> 4) & 1, q = kpos & 15, c = (q & 7) >> 1;
    const int off = (q & 1 ? 4 : 0) + (q >= 8 ? 1 : 0);
    return base + 8 * c + 2 * h + off;
  } else {
    const int t = kpos >> 4, col = kpos & 15, c = (col & 7) >> 1;
    return 8 * c + 4 * t + (col >> 3) + 2 * (col & 1);
  }
}

// One thread per 32 elements of one x row: 8-byte loads (qmma_unsupported guarantees alignment),
// the permutation in registers (indices fold to constants), 16-byte stores.
template <typename T, int kPerm>
__global__ void permute_x_kernel(const QmmaArgs a, T* __restrict__ xp) {
  const uqr_gemm_params& p = a.p;
  const int groups = p.K / 32;
  pdl_allow_dependents();
  pdl_wait();  // x may come from the previous kernel
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(a.rows) * groups) return;
  const int r = static_cast<int>(idx / groups), kg = static_cast<int>(idx - static_cast<int64_t>(r) * groups);
  const int b = r / p.M, m = r - b * p.M;
  unsigned short v[32];
  auto load8 = [&](const T* src, int i0) {  // 8 elements into v[i0 ..]
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint2 w = *reinterpret_cast<const uint2*>(src + 4 * i);
      v[i0 + 4 * i] = w.x & 0xFFFFu;
      v[i0 + 4 * i + 1] = w.x >> 16;
      v[i0 + 4 * i + 2] = w.y & 0xFFFFu;
      v[i0 + 4 * i + 3] = w.y >> 16;
    }
  };
  if constexpr (kPerm == 2) {
    // Outputs 32 j .. 32 j + 31 of a 256-element block = k-steps 2j, 2j + 1 = words 2 (j & 3), +1 of
    // sub-blocks 2c + (j >> 2): elements 8 (j & 3) .. +7 of each of those four sub-blocks.
    const int j = kg & 7;
    const T* src = static_cast<const T*>(a.x) + uqr_x_row_offset(p, b, m) + x_stage_offset(p, 256 * (kg >> 3)) +
                   32 * (j >> 2) + 8 * (j & 3);
#pragma unroll
    for (int c = 0; c < 4; ++c) load8(src + 64 * c, 8 * c);
  } else {
    const T* src = static_cast<const T*>(a.x) + uqr_x_row_offset(p, b, m) + x_stage_offset(p, 32 * kg);
#pragma unroll
    for (int i = 0; i < 4; ++i) load8(src + 8 * i, 8 * i);
  }
  uint4* dst = reinterpret_cast<uint4*>(xp + static_cast<int64_t>(r) * p.K + 32 * kg);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t o[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int k = 8 * i + 2 * j;
      o[j] = v[permuted_source<kPerm>(k)] | (static_cast<uint32_t>(v[permuted_source<kPerm>(k + 1)]) << 16);
    }
    dst[i] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

template <typename T>
using TypeTag = typename std::conditional<std::is_same<T, __nv_bfloat16>::value, wg::Bf16Tag, wg::F16Tag>::type;

template <typename T, int BM>
__device__ __forceinline__ void wgmma_step(float (&acc)[BM / 2], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (BM == 128) wg::mma_m64n128k16(acc, a, desc, TypeTag<T>{});
  else wg::mma_m64n64k16(acc, a, desc, TypeTag<T>{});
}

// (lo, lo) (kHigh = false) or (hi, hi) of a T pair.
template <typename T, bool kHigh>
__device__ __forceinline__ uint32_t dup_half(uint32_t v) {
  const Pair<T> p = *reinterpret_cast<const Pair<T>*>(&v);
  Pair<T> r;
  if constexpr (std::is_same<T, __nv_bfloat16>::value) r = kHigh ? __high2bfloat162(p) : __low2bfloat162(p);
  else r = kHigh ? __high2half2(p) : __low2half2(p);
  return *reinterpret_cast<const uint32_t*>(&r);
}

// A batch's A fragments, af[u][kk] = k-step 2u + kk of sub-blocks jb .. jb + U - 1 of the stage at
// buf (this warp's 16 rows, row pitch sb); stage() runs once a stage, before its first batch. Every
// format but q4_k: qmma_traits.cuh's codes and per-sub-block scales, x in order wg_perm 0 or 1.
template <class F, typename T, int U>
struct WgDecode {
  __device__ WgDecode(int) {}
  __device__ void stage(const unsigned char*, int, int) {}
  __device__ void frags(const unsigned char* buf, int sb, int jb, int g, int c, uint32_t (&af)[U][2][4]) const {
    const typename F::Scales sg(buf + g * sb, jb), sg8(buf + (g + 8) * sb, jb);
#pragma unroll
    for (int u = 0; u < U; ++u) a_fragments<F, T>(buf, sb, jb + u, g, c, sg.at(u), sg8.at(u), af[u][0], af[u][1]);
  }
};

// q4_k: lane c of a fragment row owns one whole sub-block per 8 k-steps - sub-block 2c in k-steps
// 0-7 of the stage (the low nibbles of qs[32c .. 32c + 31]), 2c + 1 in k-steps 8-15 (the high ones),
// word t of those 32 bytes in k-step t - and x is permuted to match (wg_perm 2). So a lane needs
// one (a, b) per row and half stage, not all 8 sub-blocks' (the 4 lanes of a row computed the same
// ones: 617 instructions a stage against q4_0's 497), and its codes come in 16-byte loads.
// The weights stay w = fma(q, a, b) in T with a = d sc and b = -dmin m rounded from fp32, as
// Traits<UQR_Q4_K>::WordScales + scale_codes round them.
template <typename T, int U>
struct WgDecode<Traits<UQR_Q4_K>, T, U> {
  static_assert(U == 2 || U == 4, "batches within a half stage");
  static_assert(RowRing<Traits<UQR_Q4_K>>::kStageBlocks == 1 && RowRing<Traits<UQR_Q4_K>>::kStageBytes % 16 == 0,
                "a stage row is one block, 16-byte aligned (uint4 loads)");
  // Lane constants: this lane's scale bytes s' = 2 (c & 1) (half 0) and s' + 1 (half 1) of two
  // words, interleaved; lanes 2, 3 (sub-blocks 4-7) take the high scale / min formula.
  uint32_t sel, mlo, mhi;
  bool up;
  uint32_t ab[2][2];  // T pairs (a, b) of rows g, g + 8 and halves 0, 1 of the current stage
  __device__ WgDecode(int c) {
    const uint32_t s0 = 2u * (c & 1);
    sel = s0 | (s0 + 4) << 4 | (s0 + 1) << 8 | (s0 + 5) << 12;
    up = c >= 2;
    mlo = up ? 0x0F0F0F0Fu : 0x3F3F3F3Fu;
    mhi = up ? 0x30303030u : 0u;
  }
  // Per row: d, dmin and scales[0..11] in one 16-byte load; bytes (sc, m) of both halves as
  // uqr_q4_k_scale_min_words unpacks them, then a = d sc, b = -dmin m.
  __device__ void stage(const unsigned char* buf, int sb, int g) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint4 hd = *reinterpret_cast<const uint4*>(buf + (g + 8 * r) * sb);
      const uint32_t x = __byte_perm(up ? hd.w : hd.y, up ? hd.w >> 4 : hd.z, sel);
      const uint32_t y = __byte_perm(hd.y, hd.z, sel);
      const uint32_t sm = (x & mlo) | ((y >> 2) & mhi);  // sc0, m0, sc1, m1
      const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(hd.x & 0xFFFFu)));
      const float dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(hd.x >> 16)));
#pragma unroll
      for (int h = 0; h < 2; ++h)
        ab[r][h] = pack_pair<T>(d * static_cast<float>((sm >> (16 * h)) & 0xFFu),
                                -dmin * static_cast<float>((sm >> (16 * h + 8)) & 0xFFu));
    }
  }
  __device__ void frags(const unsigned char* buf, int sb, int jb, int g, int c, uint32_t (&af)[U][2][4]) const {
    const int h = jb >> 2, t0 = (2 * jb) & 7;  // half, first word (jb: a multiple of U)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint4* qs = reinterpret_cast<const uint4*>(buf + (g + 8 * r) * sb + 16 + 32 * c + 4 * t0);
      uint32_t w[2 * U];
#pragma unroll
      for (int i = 0; i < U / 2; ++i) {
        const uint4 v = qs[i];
        w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
      }
      const uint32_t a2 = dup_half<T, false>(ab[r][h]), b2 = dup_half<T, true>(ab[r][h]);
#pragma unroll
      for (int t = 0; t < 2 * U; ++t) {
        // The exact code pairs (q, q') in T.
        uint32_t q0 = minus_code<T>(code_pair<T>(w[t], 4 * h), 0);
        uint32_t q1 = minus_code<T>(code_pair<T>(w[t], 4 * h + 8), 0);
        if constexpr (std::is_same<T, __half>::value) {
          if (h == 1) {
            // fp16, high nibbles: left at bits 4-7 (1024 + 16 q, inside the 10-bit mantissa), then
            // (1024 + 16 q) / 16 - 64 = q in one exact HFMA2: one shift a word instead of two.
            q0 = fma_pair<T>(code_pair<T, 0x00F000F0u>(w[t], 0), 0x2C002C00u, 0xD400D400u);
            q1 = fma_pair<T>(code_pair<T, 0x00F000F0u>(w[t], 8), 0x2C002C00u, 0xD400D400u);
          }
        }
        af[t >> 1][t & 1][r] = fma_pair<T>(q0, a2, b2);
        af[t >> 1][t & 1][2 + r] = fma_pair<T>(q1, a2, b2);
      }
    }
  }
};

// q.x = the permuted scratch matrix [q.rows][K] (permute_x_kernel's output); K split over gridDim.z.
using WgArgs = SplitArgs;

// CTAS = CTAs meant to share an SM: 2 caps registers at 128 a thread (smaller batches, U = 2) and
// shared memory at half, so 16 warps hide each other's latency instead of 8. Since the split rings
// it only pays where the grid splits K (the plan's ctas, dispatch.plan_wgmma).
template <class F, typename T, int BM, int CTAS>
__global__ void __launch_bounds__(kWgWarps * 32, CTAS) qmma_wgmma_kernel(const WgArgs wa) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  using L = WgLayout<F, BM, CTAS>;
  using Ring = RowRing<F>;
  constexpr int kThreads = kWgWarps * 32;
  constexpr int U = L::kU;
  constexpr int kSubsPerStage = L::kSubsPerStage;
  static_assert(kSubsPerStage % U == 0, "stages hold a multiple of U sub-blocks");
  constexpr int sb = Ring::kStageBytes;
  // x copies of one slot (a stage, or half of one with split rings): a slot row is kRowPieces
  // 16-byte pieces; thread tid copies piece tid % kRowPieces of rows tid / kRowPieces + u * kRowStep.
  constexpr int kSlotElems = L::kSplit ? Ring::kStageElems / 2 : Ring::kStageElems;
  static_assert(kSlotElems % kXChunk == 0, "x slots hold whole 64-element chunks");
  constexpr int kRowPieces = kSlotElems / 8;
  static_assert(kThreads % kRowPieces == 0, "x pieces split evenly");
  constexpr int kRowStep = kThreads / kRowPieces, kXCopies = BM / kRowStep;
  static_assert(BM % kRowStep == 0, "x rows split evenly");

  const QmmaArgs& a = wa.q;
  // Aligned by an offset from smem_raw, not by casting through an integer: a pointer rebuilt from an
  // integer loses the shared address space, and every weight read became a generic 64-bit LD
  // instead of LDS (SASS).
  unsigned char* smem = smem_raw + ((1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u);
  const uqr_gemm_params& p = a.p;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c = lane & 3;
  const int row0 = blockIdx.x * (kWgWarps * kWarpRows) + warp * kWarpRows;
  const int col0 = blockIdx.y * BM;
  // This CTA's share of the K stages.
  const int n_all = p.K / Ring::kStageElems;
  const int st0 = static_cast<int>(static_cast<int64_t>(n_all) * blockIdx.z / wa.splits);
  const int n_stages = static_cast<int>(static_cast<int64_t>(n_all) * (blockIdx.z + 1) / wa.splits) - st0;
  const Ring wr(a.w, a.w_row_stride, row0, p.N, st0, lane);

  const int piece = tid % kRowPieces, prow = tid / kRowPieces;
  const T* xsrc[kXCopies];
  uint32_t xdst[kXCopies];
  // Rows of the tile past the last activation row are zero-filled, not read: measured 192 rows
  // (a half-empty second tile) slower than 256 (q4_0 95.2 vs 81.9 us) when those rows all re-read
  // the last row, one address for 64 rows' copies.
  uint32_t xvalid = 0;
  static_assert(kXCopies <= 32, "one bit a copy");
#pragma unroll
  for (int u = 0; u < kXCopies; ++u) {
    const int r = prow + u * kRowStep;
    xvalid |= static_cast<uint32_t>(col0 + r < a.rows) << u;
    xsrc[u] = static_cast<const T*>(a.x) + static_cast<int64_t>(min(col0 + r, a.rows - 1)) * p.K +
              static_cast<int64_t>(st0) * Ring::kStageElems + 8 * piece;
    const int chunk = piece / 8, j = piece % 8;
    xdst[u] = static_cast<uint32_t>(chunk * BM * 128 + r * 128 + ((j ^ (r & 7)) << 4));
  }

  pdl_wait();  // a programmatic dependent of the x permutation (cuda_common.cuh): its x is final now

  float acc[BM / 2];
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) acc[i] = 0.f;
  wg::fence_operands(acc);

  // One batch: sub-blocks jb .. jb + U - 1 of the weight slot at buf (this warp's 16 rows), times
  // the x tile whose sub-block jx starts at chunk jx / 2, byte 64 (jx & 1) of the swizzled rows at
  // desc0 (the second k-step 32 bytes further); x_sub0 = jb's sub-block there.
  WgDecode<F, T, U> dec(c);
  auto batch = [&](const unsigned char* buf, int jb, uint64_t desc0, int x_sub0) {
    uint32_t af[U][2][4];
    dec.frags(buf, sb, jb, g, c, af);
    wg::fence();
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int jx = x_sub0 + u;
      const uint32_t off = static_cast<uint32_t>((jx >> 1) * BM * 128 + (jx & 1) * 64);
      wgmma_step<T, BM>(acc, af[u][0], desc0 + (off >> 4));
      wgmma_step<T, BM>(acc, af[u][1], desc0 + ((off + 32) >> 4));
    }
    wg::commit();
    wg::wait<1>();  // the previous batch is done: its registers (and its x) are free
  };

  if constexpr (L::kSplit) {
    // Copy group v = batch v's x (+ stage v / 2's weights when v is even), issued D batches ahead;
    // a batch's barrier both publishes its group and, with every warpgroup past its wait<1>, frees
    // the slots the next copy overwrites (split_depth). So a stage's second batch multiplies while
    // the next stage's first one decodes, and x waits in up to D slots.
    constexpr int XS = L::kRing.x_slots, WS = L::kRing.w_slots, D = L::kRing.depth;
    unsigned char* const xring = smem;
    unsigned char* const wring = smem + XS * L::kHalfXBytes;
    const int n_batches = 2 * n_stages;
    auto issue = [&](int v) {
      if (v < n_batches) {
        if ((v & 1) == 0) wr.copy(wring + ((v >> 1) % WS) * L::kWSlotBytes + warp * Ring::kSlotBytes, v >> 1, lane);
        unsigned char* xs = xring + (v % XS) * L::kHalfXBytes;
        const int64_t xo = static_cast<int64_t>(v) * kSlotElems;
#pragma unroll
        for (int u = 0; u < kXCopies; ++u) cp_async16_zfill(xs + xdst[u], xsrc[u] + xo, (xvalid >> u) & 1u);
      }
      cp_async_commit();  // empty groups keep wait_group's count uniform
    };
#pragma unroll
    for (int v = 0; v < D; ++v) issue(v);
    for (int i = 0; i < n_stages; ++i) {
      const unsigned char* buf = wring + (i % WS) * L::kWSlotBytes + warp * Ring::kSlotBytes;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int v = 2 * i + h;
        cp_async_wait<D - 1>();
        wg::fence_proxy_async();
        __syncthreads();
        issue(v + D);
        if (h == 0) dec.stage(buf, sb, g);
        batch(buf, h * U, wg::smem_desc_sw128(xring + (v % XS) * L::kHalfXBytes), 0);
      }
    }
  } else {
    constexpr int S = L::kStages;
    int slot_in = 0;
    auto issue = [&](int i) {
      if (i < n_stages) {
        unsigned char* st = smem + static_cast<size_t>(slot_in) * L::kStageBytes;
        wr.copy(st + L::kXBytes + warp * Ring::kSlotBytes, i, lane);
        const int64_t xo = static_cast<int64_t>(i) * Ring::kStageElems;
#pragma unroll
        for (int u = 0; u < kXCopies; ++u) cp_async16_zfill(st + xdst[u], xsrc[u] + xo, (xvalid >> u) & 1u);
      }
      slot_in = slot_in == S - 1 ? 0 : slot_in + 1;
      cp_async_commit();
    };
#pragma unroll
    for (int s = 0; s < S - 1; ++s) issue(s);
    int slot_out = 0;
    for (int i = 0; i < n_stages; ++i) {
      cp_async_wait<S - 2>();
      wg::fence_proxy_async();
      __syncthreads();  // stage i visible to every warp and to the tensor cores; stage i - 1's slot free
      issue(i + S - 1);
      const unsigned char* st = smem + static_cast<size_t>(slot_out) * L::kStageBytes;
      const uint64_t desc0 = wg::smem_desc_sw128(st);
      dec.stage(st + L::kXBytes + warp * Ring::kSlotBytes, sb, g);
#pragma unroll
      for (int jb = 0; jb < kSubsPerStage; jb += U) batch(st + L::kXBytes + warp * Ring::kSlotBytes, jb, desc0, jb);
      // Every MMA reading this slot is done before the next barrier hands it to the copies: ptxas
      // cannot keep a stage's last batch in flight across the loop here (warning C7513, wgmmas
      // serialised) under two CTAs' 128-register cap, nor with mlx4 g128's four batches a stage.
      wg::wait<0>();
      slot_out = slot_out == S - 1 ? 0 : slot_out + 1;
    }
  }
  wg::wait<0>();
  cp_async_wait<0>();
  wg::fence_operands(acc);

  // acc[4 t + q]: weight row g (+8 for q >= 2) of this warp, activation row col0 + 8 t + 2c + (q & 1).
  // The epilogue runs once per warp with its code cold in the instruction cache (ncu, 128 rows:
  // 2.4 of 9.7 stall cycles an instruction waited on instruction fetch; the per-value store_acc
  // unrolled to ~6k instructions), so it is kept short: the two weight rows' column offsets once,
  // each activation row's (batch, row) stepped from the previous one instead of divided.
  const int n_lo = row0 + g, n_hi = n_lo + 8;
  const bool ok_lo = n_lo < p.N, ok_hi = n_hi < p.N;
  if (wa.splits == 1) {
    const int64_t co_lo = uqr_y_col_offset(p, n_lo), co_hi = uqr_y_col_offset(p, n_hi);
    T* y = static_cast<T*>(a.y);
    int r = col0 + 2 * c, b = r / p.M, m = r - b * p.M;
#pragma unroll
    for (int t = 0; t < BM / 8; ++t) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int bh = b, mh = m + h;
        if (mh >= p.M) mh -= p.M, ++bh;  // m < M, so one step at most
        if (r + h < a.rows) {
          const int64_t ro = uqr_y_row_offset(p, bh, mh);
          if (ok_lo) y[ro + co_lo] = from_float<T>(acc[4 * t + h]);
          if (ok_hi) y[ro + co_hi] = from_float<T>(acc[4 * t + 2 + h]);
        }
      }
      r += 8, m += 8;
      while (m >= p.M) m -= p.M, ++b;
    }
  } else {
    float* ws = wa.ws + static_cast<int64_t>(blockIdx.z) * a.rows * p.N + static_cast<int64_t>(col0 + 2 * c) * p.N;
    const int r0 = col0 + 2 * c;
#pragma unroll
    for (int t = 0; t < BM / 8; ++t) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (r0 + 8 * t + h < a.rows) {
          float* wr = ws + static_cast<int64_t>(8 * t + h) * p.N;
          if (ok_lo) wr[n_lo] = acc[4 * t + h];
          if (ok_hi) wr[n_hi] = acc[4 * t + 2 + h];
        }
      }
    }
  }
#endif
}

// The launch plan (dispatch.py, plan_wgmma) picks the column tile BM (64 for few rows - less
// padding - and where 128 does not fit, mlx4 g128's stage), the CTAs an SM and the K splits:
// - above 64 rows one CTA with 128-row tiles (128 rows: exl3 75.0 vs 90.4 us at two CTAs of 64);
// - up to 64 rows, 64-row tiles, and two CTAs an SM (whole stages, registers capped at 128) only
//   where the grid splits K (fewer than half an SM's worth of 128-row tiles: N = 4096); one CTA
//   (split rings) against two at 32-64 rows, us: 14336 x 4096 q4_0 35.9-31.5 vs 37.6-36.3, exl3
//   48.6-47.3 vs 49.8-51.4; 4096 x 14336 q4_0 32.9-33.0 vs 31.6-30.6, exl3 44.7-46.0 vs 42.5-43.1;
// - splits over K while the (row, column) tiles leave most CTA slots idle (N = 4096: 32 row tiles),
//   so the grid fills one wave, keeping >= 4 stages per split for the pipeline.

template <class F, typename T, int BM, int CTAS>
cudaError_t launch_wgmma(const WgArgs& wa, cudaStream_t stream, bool pdl) {
  if constexpr (!wg_fits<F, BM, CTAS>()) {
    return cudaErrorInvalidValue;
  } else {
    constexpr size_t smem = WgLayout<F, BM, CTAS>::kSmem;
    static const cudaError_t attr = cudaFuncSetAttribute(qmma_wgmma_kernel<F, T, BM, CTAS>,
                                                         cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (attr != cudaSuccess) return attr;
    const dim3 grid((wa.q.p.N + kWgWarps * kWarpRows - 1) / (kWgWarps * kWarpRows), (wa.q.rows + BM - 1) / BM, wa.splits);
    if (const cudaError_t e = launch_ex(qmma_wgmma_kernel<F, T, BM, CTAS>, grid, dim3(kWgWarps * 32), smem, stream, pdl, wa);
        e != cudaSuccess || wa.splits == 1)
      return e;
    return reduce_splits<T>(wa, stream, pdl);
  }
}

// Whether this binary has the kernel's sm_90a code for the current device: an sm_80 build would
// run the empty body and leave y unwritten, so it refuses instead.
template <class F, typename T>
bool wgmma_compiled() {
  if constexpr (!wg_fits<F, 64>()) {
    return false;  // no tile holds this format's stage (q3_k: 8 blocks of 110 bytes), so no kernel
  } else {
    static const bool ok = [] {
      int dev = 0, major = 0, minor = 0;
      cudaFuncAttributes attr{};
      if (cudaGetDevice(&dev) != cudaSuccess) return false;
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
      if (major != 9 || minor != 0) return false;
      if (cudaFuncGetAttributes(&attr, qmma_wgmma_kernel<F, T, 64, 1>) != cudaSuccess) return false;
      return attr.binaryVersion == 90;
    }();
    return ok;
  }
}

template <class F, typename T>
cudaError_t run_wgmma(WgArgs wa, T* xp, cudaStream_t stream, const WgmmaPlan& plan) {
  if (!wgmma_compiled<F, T>()) return cudaErrorNoKernelImageForDevice;
  QmmaArgs& a = wa.q;
  const int64_t threads = static_cast<int64_t>(a.rows) * (a.p.K / 32);
  if (const cudaError_t e = launch_ex(permute_x_kernel<T, wg_perm<F>()>, dim3(static_cast<unsigned>((threads + 255) / 256)),
                                     dim3(256), 0, stream, plan.pdl, a, xp);
      e != cudaSuccess)
    return e;
  // The kernel reads the permuted copy: contiguous rows of K, no heads, batch folded into rows.
  a.x = xp;
  if (plan.bm == 128) return launch_wgmma<F, T, 128, 1>(wa, stream, plan.pdl);
  return plan.ctas == 2 ? launch_wgmma<F, T, 64, 2>(wa, stream, plan.pdl) : launch_wgmma<F, T, 64, 1>(wa, stream, plan.pdl);
}

}  // namespace

const char* wgmma_unsupported(const uqr_gemm_params& p, int rows, bool half_x, uintptr_t x_addr, uintptr_t w_addr,
                              int64_t w_row_stride) {
  if (const char* why = qmma_unsupported(p, rows, half_x, x_addr, w_addr, w_row_stride, true)) return why;
  if (p.K % 64) return "K must be a multiple of 64";
  return nullptr;
}

const char* wgmma_plan_invalid(const uqr_gemm_params& p, const WgmmaPlan& plan) {
  if (plan.splits < 1) return "splits must be >= 1";
  const char* why = nullptr;
  with_format(p, [&](auto f) {
    using F = decltype(f);
    if (plan.splits > p.K / RowRing<F>::kStageElems) why = "splits must be at most K's stages";
    else if (plan.bm == 128 && plan.ctas == 1) why = wg_fits<F, 128>() ? nullptr : "BM = 128 does not fit this format's stage";
    else if (plan.bm == 64 && plan.ctas == 1) why = wg_fits<F, 64>() ? nullptr : "BM = 64 does not fit this format's stage";
    else if (plan.bm == 64 && plan.ctas == 2) why = wg_fits<F, 64, 2>() ? nullptr : "two CTAs an SM do not fit this format's stage";
    else why = "BM / CTAs must be 128 / 1, 64 / 1 or 64 / 2";
    return cudaSuccess;
  });
  return why;
}

cudaError_t qmma_wgmma(const void* x, void* x_scratch, float* split_ws, const uint8_t* w, int64_t w_row_stride,
                       void* y, const uqr_gemm_params& p, bool bf16, cudaStream_t stream, const WgmmaPlan& plan) {
  const int rows = p.batch * p.M;
  if (wgmma_unsupported(p, rows, true, reinterpret_cast<uintptr_t>(x), reinterpret_cast<uintptr_t>(w), w_row_stride) ||
      wgmma_plan_invalid(p, plan))
    return cudaErrorInvalidValue;
  if (plan.splits > 1 && split_ws == nullptr) return cudaErrorInvalidValue;
  const QmmaArgs a{p, x, y, w, w_row_stride, rows};
  return with_format(a.p, [&](auto f) {
    using F = decltype(f);
    const WgArgs wa{a, split_ws, plan.splits};
    return bf16 ? run_wgmma<F, __nv_bfloat16>(wa, static_cast<__nv_bfloat16*>(x_scratch), stream, plan)
                : run_wgmma<F, __half>(wa, static_cast<__half*>(x_scratch), stream, plan);
  });
}

}  // namespace cuda
}  // namespace uqr
