// Small-M tensor-core kernel (batch * M <= 16 activation rows, bf16 / fp16 x): weights streamed
// once through shared memory, their integer codes turned into mma.sync A fragments, x read
// straight into B fragments.
//
// Why tensor cores at M = 1: what limits a GEMV over 4-bit weights on a GPU is instruction issue
// per weight, not FMAs (bench/NOTES.md: the byte-wise decoders of v8 were issue-bound). Here a
// weight costs about one integer instruction: two codes become one bf16x2 register with a shift
// and one LOP3 (mask, then OR of the exponent 0x43: the bf16 value 128 + q, exact), and the
// multiply-add happens in the MMA. The formats' scales are applied per 32-element sub-block in
// fp32, after the MMA:
//     sum_k w_k x_k = a * sum_k (B + q_k) x_k + (b - a B) * sum_k x_k      (w = a q + b, B = 128)
// where sum_k x_k comes from a second MMA with an all-ones A. So codes and products are exact and
// only the fp32 accumulation rounds, as on the CPU path.
//
// The k order inside a sub-block does not matter to a dot product, so each lane takes the codes
// that are contiguous in its format's bytes and loads x at the same k positions (4 consecutive x
// values = one 8-byte load per k-step): no shuffle of either operand.
//
// Work split: a CTA owns 16 weight rows (the MMA's M side) and 1-8 warps that split K; each
// warp streams its 16 rows' bytes in stages of 256 (mlx4 g128: 512) elements through a private
// cp.async ring, and the warps' partial sums meet in shared memory at the end.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "qmma_small_m.h"
#include "cuda_common.cuh"
#include "uqr/formats.h"

namespace uqr {
namespace cuda {
namespace {

constexpr int kMaxWarpsK = 8;
// Three stages: enough to overlap (each is 2.3-4.4 KB per warp) and small enough that a whole
// 14336-row grid is resident at once (v9: with four, 896 CTAs needed 1.13 waves).
constexpr int kStages = 3;
constexpr int kRows = 16;  // weight rows per CTA: the MMA's M side (v10: two tiles per warp measured slower)

// Ring stage = the fewest whole blocks spanning >= 256 elements whose bytes are a multiple of 16
// (so every cp.async source stays 16-byte aligned): q4_0 8 blocks = 144 B, q4_k 1 block = 144 B.
__host__ __device__ constexpr int stage_blocks(int block_elems, int block_bytes) {
  int n = block_elems >= 256 ? 1 : 256 / block_elems;
  while ((n * block_bytes) % 16) n *= 2;
  return n;
}

struct QmmaArgs {
  uqr_gemm_params p;
  const void* x;
  void* y;
  const uint8_t* w;
  int64_t w_row_stride;
  int rows;  // activation rows batch * M
};

// D = A B + C, m16n8k16, fp32 accumulators; T selects bf16 or fp16 operands.
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                         const float (&c)[4]) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  } else {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  }
}

// 16-bit pattern of (B + q) for a small code q < 256: the exponent of B with q as mantissa bits.
// bf16: 0x4300 = 128 (mantissa step 1 up to 256); fp16: 0x6400 = 1024 (step 1 up to 2048).
template <typename T>
struct Magic {
  static constexpr uint32_t kPair = std::is_same<T, __nv_bfloat16>::value ? 0x43004300u : 0x64006400u;
  static constexpr float kBias = std::is_same<T, __nv_bfloat16>::value ? 128.f : 1024.f;
  static constexpr uint32_t kOne = std::is_same<T, __nv_bfloat16>::value ? 0x3F803F80u : 0x3C003C00u;
};

// The two 4-bit codes at bits [sh, sh + 4) and [sh + 16, sh + 20) of w -> the T pair
// (B + q_lo, B + q_hi): one shift and one LOP3 ((w >> sh) & 0x000F000F | magic). Pairing the codes
// 16 bits apart is what makes this one instruction; which elements end up paired does not matter
// to the dot product as long as the x fragment pairs the same elements (xfrag below).
template <typename T, uint32_t kMask = 0x000F000Fu>
__device__ __forceinline__ uint32_t code_pair(uint32_t w, int sh) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(w >> sh), "n"(kMask), "r"(Magic<T>::kPair));
  return r;
}

// (B + q) - (B + o) = q - o, exact: for formats whose zero point is a constant code (q4_0's 8,
// ternary's 1) the codes can carry it, so no offset term (and no second MMA) is needed.
template <typename T>
__device__ __forceinline__ uint32_t minus_code(uint32_t v, uint32_t o) {
  const uint32_t c = Magic<T>::kPair | (o * 0x00010001u);
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    const __nv_bfloat162 r = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&v), *reinterpret_cast<const __nv_bfloat162*>(&c));
    return *reinterpret_cast<const uint32_t*>(&r);
  } else {
    const __half2 r = __hsub2(*reinterpret_cast<const __half2*>(&v), *reinterpret_cast<const __half2*>(&c));
    return *reinterpret_cast<const uint32_t*>(&r);
  }
}

__device__ __forceinline__ float half_at(const uint8_t* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
}
// A 32-bit word at an address that is only 2-byte aligned (18- and 34-byte GGUF blocks).
__device__ __forceinline__ uint32_t u32_at2(const uint8_t* p) {
  const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
  return __byte_perm(h[0], h[1], 0x5410);
}
__device__ __forceinline__ uint32_t u32_at4(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
// A word at offset 2 mod 4 of block j of an 18- or 34-byte format (q4_0, q8_0) in a stage row that
// starts 16-byte aligned: such offsets are word-aligned exactly for odd j, so odd blocks take one
// 4-byte load instead of two 2-byte loads and a permute (j's parity is a compile-time constant in
// the unrolled sub-block loop).
__device__ __forceinline__ uint32_t u32_in_block(const uint8_t* p, int j) { return (j & 1) ? u32_at4(p) : u32_at2(p); }

// Four codes of one row from the 4 bytes w that hold elements e..e+3 in their low nibbles and
// e+16..e+19 in their high nibbles (GGUF q4 layout): r = k-step 0 {(e, e+2), (e+1, e+3)},
// k-step 1 {(e+16, e+18), (e+17, e+19)}.
template <typename T>
__device__ __forceinline__ void gguf_nibbles(uint32_t w, uint32_t (&r)[4]) {
  r[0] = code_pair<T>(w, 0);
  r[1] = code_pair<T>(w, 8);
  r[2] = code_pair<T>(w, 4);
  r[3] = code_pair<T>(w, 12);
}

// Scales of a stage row's sub-blocks from js0 on: at(u) = (a, b) of sub-block js0 + u (w = a q + b),
// read per sub-block through F::scale. Each format names its kind as F::Scales; q4_k's unpacks its
// word-packed scales once for four sub-blocks instead (Traits<UQR_Q4_K>::WordScales).
template <class F>
struct BlockScales {
  const uint8_t* row;
  int js0;
  __device__ BlockScales(const uint8_t* r, int j) : row(r), js0(j) {}
  __device__ float2 at(int u) const { return F::scale(row + ((js0 + u) / F::kSubs) * F::kBytes, (js0 + u) % F::kSubs); }
};

// Format traits. For sub-block s (32 elements) of a block and lane c (0..3) of a fragment row:
//   codes()  -> the row's A registers [k-step 0 a0, a2, k-step 1 a0, a2]; each holds the pair of
//               elements (v, v + 2) resp. (v + 1, v + 3) of the k-step's 4 x values v..v+3 (mlx4:
//               see kWideX) as T values B + q (q8_0: q itself);
//   kWideX   -> false: k-step h multiplies x[32 s + 16 h + 4 c .. +3];
//               true (mlx4): lane c owns x[32 s + 8 c .. +7], k-step h = elements {2h, 2h+1, 2h+4, 2h+5};
//   scale(s) -> (a, b) with w = a q + b.
template <int FMT>
struct Traits;

template <>
struct Traits<UQR_Q4_0> {
  static constexpr int kElems = 32, kSubs = 1;
  static constexpr bool kOffset = false, kWideX = false;  // codes carry the -8 (minus_code)
  static constexpr int kBytes = UQR_Q4_0_BYTES;
  using Scales = BlockScales<Traits>;
  template <typename T>
  __device__ static void codes(const uint8_t* blk, int j, int, int c, uint32_t (&r)[4]) {
    gguf_nibbles<T>(u32_in_block(blk + 2 + 4 * c, j), r);
#pragma unroll
    for (int i = 0; i < 4; ++i) r[i] = minus_code<T>(r[i], 8);
  }
  __device__ static float2 scale(const uint8_t* blk, int) { return make_float2(half_at(blk), 0.f); }
};

template <>
struct Traits<UQR_Q4_1> {
  static constexpr int kElems = 32, kSubs = 1;
  static constexpr bool kOffset = true, kWideX = false;
  static constexpr int kBytes = UQR_Q4_1_BYTES;
  using Scales = BlockScales<Traits>;
  template <typename T>
  __device__ static void codes(const uint8_t* blk, int, int, int c, uint32_t (&r)[4]) {
    gguf_nibbles<T>(u32_at4(blk + 4 + 4 * c), r);
  }
  __device__ static float2 scale(const uint8_t* blk, int) { return make_float2(half_at(blk), half_at(blk + 2)); }
};

template <>
struct Traits<UQR_Q8_0> {
  static constexpr int kElems = 32, kSubs = 1;
  static constexpr bool kOffset = false, kWideX = false;
  static constexpr int kBytes = UQR_Q8_0_BYTES;
  using Scales = BlockScales<Traits>;
  template <typename T>
  __device__ static uint32_t pack2(uint32_t w, int i, int j) {
    // Signed bytes i and j of w -> two exact T values (|q| <= 128 fits either mantissa).
    const float lo = static_cast<float>(static_cast<int8_t>((w >> (8 * i)) & 0xFF));
    const float hi = static_cast<float>(static_cast<int8_t>((w >> (8 * j)) & 0xFF));
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
      return *reinterpret_cast<const uint32_t*>(&v);
    } else {
      const __half2 v = __floats2half2_rn(lo, hi);
      return *reinterpret_cast<const uint32_t*>(&v);
    }
  }
  template <typename T>
  __device__ static void codes(const uint8_t* blk, int j, int, int c, uint32_t (&r)[4]) {
    const uint32_t w0 = u32_in_block(blk + 2 + 4 * c, j), w1 = u32_in_block(blk + 18 + 4 * c, j);
    r[0] = pack2<T>(w0, 0, 2);
    r[1] = pack2<T>(w0, 1, 3);
    r[2] = pack2<T>(w1, 0, 2);
    r[3] = pack2<T>(w1, 1, 3);
  }
  __device__ static float2 scale(const uint8_t* blk, int) { return make_float2(half_at(blk), 0.f); }
};

template <>
struct Traits<UQR_Q4_K> {
  static constexpr int kElems = 256, kSubs = 8;
  static constexpr bool kOffset = true, kWideX = false;
  static constexpr int kBytes = UQR_Q4_K_BYTES;
  template <typename T>
  __device__ static void codes(const uint8_t* blk, int, int s, int c, uint32_t (&r)[4]) {
    // qs[32 (s/2) + i]: sub-block s's element i in the low (s even) or high (s odd) nibble.
    const uint8_t* qs = blk + 16 + 32 * (s >> 1);
    const int sh = (s & 1) * 4;
    const uint32_t w0 = u32_at4(qs + 4 * c), w1 = u32_at4(qs + 16 + 4 * c);
    r[0] = code_pair<T>(w0, sh);
    r[1] = code_pair<T>(w0, sh + 8);
    r[2] = code_pair<T>(w1, sh);
    r[3] = code_pair<T>(w1, sh + 8);
  }
  // Scales of a stage row's sub-blocks js0, js0 + 1, ... within one half super-block (the caller
  // steps by 1, 2 or 4 from a multiple of that): d, dmin and the 6-bit scale / min words are read
  // once, and each sub-block's pair is two byte extracts and two multiplies.
  struct WordScales {
    float d, dmin;
    uint32_t sc, mn;
    int sh;
    __device__ WordScales(const uint8_t* row, int js0) : sh(8 * (js0 & 3)) {
      const uint8_t* blk = row + (js0 / kSubs) * kBytes;
      const uint32_t dd = u32_at4(blk);
      d = __half2float(__ushort_as_half(static_cast<unsigned short>(dd & 0xFFFFu)));
      dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(dd >> 16)));
      uqr_q4_k_scale_min_words(u32_at4(blk + 4), u32_at4(blk + 8), u32_at4(blk + 12), (js0 % kSubs) >= 4, sc, mn);
    }
    __device__ float2 at(int u) const {
      return make_float2(d * static_cast<float>((sc >> (sh + 8 * u)) & 0xFFu),
                         -dmin * static_cast<float>((mn >> (sh + 8 * u)) & 0xFFu));
    }
  };
  using Scales = WordScales;
};

// mlx4 with its group size as a template argument (32, 64, 128).
template <int G>
struct Mlx4 {
  static constexpr int kElems = G, kSubs = G / 32;
  static constexpr bool kOffset = true, kWideX = true;
  static constexpr int kBytes = 4 + G / 2;
  using Scales = BlockScales<Mlx4>;
  template <typename T>
  __device__ static void codes(const uint8_t* blk, int, int s, int c, uint32_t (&r)[4]) {
    // Byte i: element 2i (low nibble), 2i + 1 (high). Lane c takes bytes 16s + 4c..+3, i.e. the 8
    // consecutive elements 8c..8c+7 of the sub-block: bits 4e hold element e.
    const uint32_t w = u32_at4(blk + 4 + 16 * s + 4 * c);
    r[0] = code_pair<T>(w, 0);   // (0, 4)
    r[1] = code_pair<T>(w, 4);   // (1, 5)
    r[2] = code_pair<T>(w, 8);   // (2, 6)
    r[3] = code_pair<T>(w, 12);  // (3, 7)
  }
  __device__ static float2 scale(const uint8_t* blk, int) { return make_float2(half_at(blk), half_at(blk + 2)); }
};

template <>
struct Traits<UQR_TERNARY> {
  static constexpr int kElems = 32, kSubs = 1;
  static constexpr bool kOffset = false, kWideX = false;  // codes carry the -1 (minus_code)
  static constexpr int kBytes = UQR_TERNARY_BYTES;
  using Scales = BlockScales<Traits>;
  template <typename T>
  __device__ static void codes(const uint8_t* blk, int, int, int c, uint32_t (&r)[4]) {
    // Code byte j: elements 4j..4j+3, 2 bits each. Lane c takes code bytes c (k-step 0) and 4 + c.
    // b | b << 12 puts element 0 at bit 0 and element 2 at bit 16 (1 and 3: two bits higher).
    const uint32_t b0 = blk[4 + c], b1 = blk[8 + c];
    const uint32_t t0 = b0 | (b0 << 12), t1 = b1 | (b1 << 12);
    r[0] = minus_code<T>(code_pair<T, 0x00030003u>(t0, 0), 1);
    r[1] = minus_code<T>(code_pair<T, 0x00030003u>(t0, 2), 1);
    r[2] = minus_code<T>(code_pair<T, 0x00030003u>(t1, 0), 1);
    r[3] = minus_code<T>(code_pair<T, 0x00030003u>(t1, 2), 1);
  }
  __device__ static float2 scale(const uint8_t* blk, int) { return make_float2(half_at(blk), 0.f); }
};

// B fragment from two words of x: (wa, wb) = ((v, v+1), (v+2, v+3)) -> b0 = (v, v+2), b1 = (v+1, v+3).
__device__ __forceinline__ void xfrag(uint32_t wa, uint32_t wb, uint32_t& b0, uint32_t& b1) {
  b0 = __byte_perm(wa, wb, 0x5410);
  b1 = __byte_perm(wa, wb, 0x7632);
}

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) return __bfloat162float(v);
  else return __half2float(v);
}
template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) return __float2bfloat16_rn(v);
  else return __float2half_rn(v);
}

// Sub-blocks unrolled per loop trip: 4 at one column tile, 2 at two (whose MMAs already give the
// scheduler independent work; 4 would cost registers and so occupancy), except mlx4, whose wide x
// loads want the longer unroll (v9 at 4: 29.8 us at M = 16, v10 at 2: 34.5).
template <class F, int NT>
__host__ __device__ constexpr int unroll_subs() { return NT == 1 || F::kWideX ? 4 : 2; }
// Register cap per thread. 72 lets 7 CTAs of 4 warps share an SM, so a 14336-row grid (896 CTAs)
// is resident at once with 4 K-splitting warps (mlx4 spills below 80). Two column tiles are left
// uncapped: capped at 72 their x loads' L2 latency was exposed (v10: q4_0 M = 16 47.7 us vs 35).
template <class F, int NT>
__host__ __device__ constexpr int max_regs() {
  return NT == 1 ? (F::kWideX ? 80 : 72) : 128;
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

  // The stage's bytes, row after row, land contiguously in the slot (row pitch = sb), so lane
  // piece idx = lane + 32 u goes to slot + 16 idx: consecutive lanes copy consecutive 16-byte
  // pieces (coalesced reads, conflict-free shared stores; v10's row-per-lane mapping measured
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
  int slot_out = 0;  // ring slot this iteration reads
  for (int i = 0; i < n_mine; ++i) {
    issue(i + kStages - 1);
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const unsigned char* buf = ring + slot_out * kRows * sb;
    slot_out = slot_out == kStages - 1 ? 0 : slot_out + 1;
    const int k_stage = (s0 + i) * kStageElems;
    // A stage lies inside one x head (x_head_dim is a multiple of the stage): one division here,
    // and every x load below is this lane's base plus a constant.
    const int64_t x_stage = (p.x_head_dim == p.K ? k_stage
        : static_cast<int64_t>(k_stage / p.x_head_dim) * p.x_head_stride + k_stage % p.x_head_dim) +
        (F::kWideX ? 8 : 4) * c;
    // x of the current U sub-blocks, advanced by pointer so each load is pointer + immediate (an
    // int index jb * 32 cost a 64-bit address computation per load in v10's SASS).
    const T* xst[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) xst[t] = xrow[t] + x_stage;
    // The stage's 32-element sub-blocks, U at a time: enough independent loads and MMAs in flight
    // without the register growth of a full unroll (q4_k spilled at 8); x addresses stay
    // base + immediate.
    static_assert((kStageBlocks * F::kSubs) % 4 == 0, "stages hold a multiple of 4 sub-blocks");
    // jb = jq * U keeps jb's low bits known to the compiler, so (jb + u)'s parity (q4_k's nibble
    // half) and 4-alignment fold to constants.
#pragma unroll 1
    for (int jq = 0; jq < kStageBlocks * F::kSubs / U; ++jq) {
      const int jb = jq * U;
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
          uint32_t b00, b01, b10, b11;
          if constexpr (F::kWideX) {
            const uint4 xv = __ldg(reinterpret_cast<const uint4*>(xst[t] + 32 * u));
            xfrag(xv.x, xv.z, b00, b01);
            xfrag(xv.y, xv.w, b10, b11);
          } else {
            const uint2 x0 = __ldg(reinterpret_cast<const uint2*>(xst[t] + 32 * u));
            const uint2 x1 = __ldg(reinterpret_cast<const uint2*>(xst[t] + 32 * u + 16));
            xfrag(x0.x, x0.y, b00, b01);
            xfrag(x1.x, x1.y, b10, b11);
          }
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
#pragma unroll
      for (int t = 0; t < NT; ++t) xst[t] += 32 * U;
    }
    __syncwarp();  // the slot is refilled by the next iteration's issue
  }
  cp_async_wait<0>();
  __syncthreads();

  // Partial sums of the K-splitting warps -> warp 0 (the ring is free now).
  float* red = reinterpret_cast<float*>(smem);
  if (warp > 0) {
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int q = 0; q < 4; ++q) red[((warp - 1) * NT * 4 + t * 4 + q) * 32 + lane] = acc[t][q];
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float v = acc[t][q];
      for (int wk = 1; wk < warps_k; ++wk) v += red[((wk - 1) * NT * 4 + t * 4 + q) * 32 + lane];
      // Accumulator q: weight row g (+8 for q >= 2), activation row t * 8 + 2c + (q & 1).
      const int n = row0 + g + (q >= 2 ? 8 : 0);
      const int r = t * 8 + 2 * c + (q & 1);
      if (n < p.N && r < a.rows) {
        const int b = r / p.M, m = r - b * p.M;
        static_cast<T*>(a.y)[uqr_y_offset(p, b, m, n)] = from_float<T>(v);
      }
    }
}

constexpr size_t ring_bytes(int warps_k, int sb) { return static_cast<size_t>(warps_k) * kStages * kRows * sb; }

// The largest shared-memory request any launch of this instantiation makes, allowed once (so no
// call being captured into a CUDA graph has to change function attributes, and the occupancy
// query below sees the real limit).
template <class F, typename T, int NT>
cudaError_t allow_smem() {
  constexpr int sb = stage_blocks(F::kElems, F::kBytes) * F::kBytes;
  static const cudaError_t attr = cudaFuncSetAttribute(
      qmma_small_m_kernel<F, T, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(ring_bytes(kMaxWarpsK, sb)));
  return attr;
}

// Resident CTAs per SM for 1, 2, 4, 8 K-splitting warps (each with its own ring size): depends
// only on the instantiation, so it is asked once instead of on every call.
static_assert(kMaxWarpsK == 8, "Residency holds 1, 2, 4, 8 warps");
struct Residency {
  cudaError_t err = cudaSuccess;
  int per_sm[4] = {0, 0, 0, 0};
};

template <class F, typename T, int NT>
const Residency& residency() {
  static const Residency r = [] {
    Residency out;
    constexpr int sb = stage_blocks(F::kElems, F::kBytes) * F::kBytes;
    if ((out.err = allow_smem<F, T, NT>()) != cudaSuccess) return out;
    for (int i = 0, wk = 1; wk <= kMaxWarpsK; ++i, wk *= 2) {
      out.err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&out.per_sm[i], qmma_small_m_kernel<F, T, NT>,
                                                              wk * 32, ring_bytes(wk, sb));
      if (out.err != cudaSuccess) break;
    }
    return out;
  }();
  return r;
}

// K-splitting warps per CTA: as many as keep the whole grid resident in one wave (a second, mostly
// empty wave cost ~2x in v9), with >= 2 stages per warp so the ring has something to overlap.
inline int pick_warps_k(const Residency& res, int n_stages, int grid) {
  const int sms = sm_count();
  int warps_k = 1;
  for (int i = 3, wk = kMaxWarpsK; wk >= 1; --i, wk /= 2) {
    if (wk > 1 && n_stages < 2 * wk) continue;
    warps_k = wk;
    if (static_cast<int64_t>(res.per_sm[i]) * sms >= grid) break;
  }
  return warps_k;
}

template <class F, typename T, int NT>
cudaError_t launch_grid(const QmmaArgs& a, int grid, int warps_k, cudaStream_t stream) {
  constexpr int sb = stage_blocks(F::kElems, F::kBytes) * F::kBytes;
  const size_t ring = ring_bytes(warps_k, sb);
  const size_t red = static_cast<size_t>(warps_k - 1) * NT * 4 * 32 * sizeof(float);
  qmma_small_m_kernel<F, T, NT><<<grid, warps_k * 32, ring > red ? ring : red, stream>>>(a);
  return cudaGetLastError();
}

template <class F, typename T, int NT>
cudaError_t launch_nt(const QmmaArgs& a, cudaStream_t stream) {
  constexpr int kStageElems = stage_blocks(F::kElems, F::kBytes) * F::kElems;
  const Residency& res = residency<F, T, NT>();
  if (res.err != cudaSuccess) return res.err;
  const int grid = (a.p.N + kRows - 1) / kRows;
  return launch_grid<F, T, NT>(a, grid, pick_warps_k(res, a.p.K / kStageElems, grid), stream);
}

template <class F, typename T>
cudaError_t launch(QmmaArgs& a, cudaStream_t stream) {
  return a.rows <= 8 ? launch_nt<F, T, 1>(a, stream) : launch_nt<F, T, 2>(a, stream);
}

template <typename T>
cudaError_t dispatch(QmmaArgs& a, cudaStream_t stream) {
  switch (a.p.fmt) {
    case UQR_Q4_0: return launch<Traits<UQR_Q4_0>, T>(a, stream);
    case UQR_Q4_1: return launch<Traits<UQR_Q4_1>, T>(a, stream);
    case UQR_Q8_0: return launch<Traits<UQR_Q8_0>, T>(a, stream);
    case UQR_Q4_K: return launch<Traits<UQR_Q4_K>, T>(a, stream);
    case UQR_TERNARY: return launch<Traits<UQR_TERNARY>, T>(a, stream);
    case UQR_MLX4:
      if (a.p.group_size == 32) return launch<Mlx4<32>, T>(a, stream);
      if (a.p.group_size == 64) return launch<Mlx4<64>, T>(a, stream);
      return launch<Mlx4<128>, T>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

const char* qmma_unsupported(const uqr_gemm_params& p, int rows, bool half_x, uintptr_t x_addr, uintptr_t w_addr,
                             int64_t w_row_stride) {
  if (!half_x) return "x must be bfloat16 or float16";
  if (rows < 1 || rows > kQmmaMaxRows) return "batch * M must be 1..16";
  switch (p.fmt) {
    case UQR_Q4_0: case UQR_Q4_1: case UQR_Q8_0: case UQR_Q4_K: case UQR_TERNARY: break;
    case UQR_MLX4:
      if (p.group_size != 32 && p.group_size != 64 && p.group_size != 128) return "mlx4 group must be 32/64/128";
      break;
    default: return "format not handled by this kernel";
  }
  const int n = stage_blocks(p.group_size, p.block_bytes);
  if (p.K % (n * p.group_size)) return "K must be a multiple of the stage";
  if (p.x_head_dim % (n * p.group_size)) return "x's head dim must be a multiple of the stage";
  if (w_addr % 16 || w_row_stride % 16) return "weight rows must be 16-byte aligned";
  // 4 consecutive x values per 8-byte load: head dim, strides and base must keep that aligned.
  if (x_addr % 8 || p.x_row_stride % 4 || p.x_batch_stride % 4 || p.x_head_stride % 4)
    return "x must allow aligned 4-element loads";
  return nullptr;
}

cudaError_t qmma_small_m(const void* x, const uint8_t* w, int64_t w_row_stride, void* y, const uqr_gemm_params& p,
                         bool bf16, cudaStream_t stream) {
  const int rows = p.batch * p.M;
  if (qmma_unsupported(p, rows, true, reinterpret_cast<uintptr_t>(x), reinterpret_cast<uintptr_t>(w), w_row_stride))
    return cudaErrorInvalidValue;
  QmmaArgs a{};
  a.p = p;
  a.x = x;
  a.y = y;
  a.w = w;
  a.w_row_stride = w_row_stride;
  a.rows = rows;
  return bf16 ? dispatch<__nv_bfloat16>(a, stream) : dispatch<__half>(a, stream);
}

}  // namespace cuda
}  // namespace uqr
