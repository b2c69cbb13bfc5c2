// What the tensor-core kernels (qmma_small_m.cu: <= 16 activation rows; qmma_mid_m.cu: more)
// share: the MMA wrapper and the per-format traits that turn a block's codes into mma.sync A
// fragments; and, for the mid-M kernel, the weight ring and the sub-block step.
//
// Why tensor cores even at M = 1: what limits a GEMV over 4-bit weights on a GPU is instruction
// issue per weight, not FMAs (byte-wise decoders measured issue-bound). Here
// a weight costs about one integer instruction: two codes become one bf16x2 register with a shift
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
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda_common.cuh"
#include "uqr/formats.h"
#include "uqr/params.h"

namespace uqr {
namespace cuda {
namespace qmma {
// Ring stage = the fewest whole blocks spanning >= 256 elements whose bytes are a multiple of 16
// (so every cp.async source stays 16-byte aligned): q4_0 8 blocks = 144 B, q4_k 1 block = 144 B.
__host__ __device__ constexpr int stage_blocks(int block_elems, int block_bytes) {
  int n = block_elems >= 256 ? 1 : 256 / block_elems;
  while ((n * block_bytes) % 16) n *= 2;
  return n;
}

// The largest stage the kernels take (mlx4 g = 128's 512 elements). A larger one does not fit
// their shared memory: q6_k's 210-byte blocks need 8 a stage (2048 elements) to keep the 16-byte
// copies aligned, so q6_k is left to the Triton kernels (qmma_unsupported, dispatch.qmma_fits).
constexpr int kQmmaMaxStageElems = 512;

struct QmmaArgs {
  uqr_gemm_params p;
  const void* x;
  void* y;
  const uint8_t* w;
  int64_t w_row_stride;
  int rows;  // activation rows batch * M
};

// A launch whose grid may split K over gridDim.z: with splits > 1 each CTA writes its fp32 partial
// sums to ws [splits][rows][N] and reduce_splits adds them up into y.
// Stream-K (sk_ctas > 0, mid-M kernel at 9-16 rows): the grid is sk_ctas CTAs in x, and the
// tiles' stages, numbered tile-major (sk_units a tile), are dealt out as equal contiguous ranges,
// CTA c taking [c U / C, (c + 1) U / C); the pieces of a tile go to planes 0, 1, ... of ws in CTA
// order (splits = planes allocated, at least the most pieces any tile has).
struct SplitArgs {
  QmmaArgs q;
  float* ws;
  int splits;
  int sk_ctas = 0;
  int sk_units = 0;
};

constexpr int kSkTileRows = 128;  // weight rows of a stream-K tile: the mid-M kernel's 8 warps x 16

// Stream-K: all tiles' stages, sk_units (= stages) a tile.
__host__ __device__ __forceinline__ int64_t sk_all_units(int N, int sk_units) {
  return static_cast<int64_t>((N + kSkTileRows - 1) / kSkTileRows) * sk_units;
}
// Stream-K: the CTA whose stage range holds global stage u (the last c with c U / C <= u).
__host__ __device__ __forceinline__ int sk_cta_of(int64_t u, int ctas, int64_t units) {
  return static_cast<int>(((u + 1) * ctas - 1) / units);
}
__host__ __device__ __forceinline__ int64_t sk_begin(int c, int ctas, int64_t units) {
  return static_cast<int64_t>(c) * units / ctas;
}

constexpr int kWarpRows = 16;  // weight rows per warp: the MMA's M side

// A warp's 16 weight rows, one stage at a time, copied into a shared-memory slot where the stage's
// bytes lie row after row (pitch kStageBytes). Lane piece idx = lane + 32 u goes to slot + 16 idx:
// consecutive lanes copy consecutive 16-byte pieces (coalesced reads, conflict-free shared stores;
// a row-per-lane mapping measured slower), and only the global offsets need registers.
template <class F>
struct RowRing {
  static constexpr int kStageBlocks = stage_blocks(F::kElems, F::kBytes);
  static constexpr int kStageBytes = kStageBlocks * F::kBytes, kStageElems = kStageBlocks * F::kElems;
  static constexpr int kSlotBytes = kWarpRows * kStageBytes;
  static constexpr int kPieces = kStageBytes / 16, kAll = kWarpRows * kPieces, kCopies = (kAll + 31) / 32;
  const uint8_t* base;     // row min(row0, N - 1), stage 0 of this ring's K range
  uint32_t src[kCopies];  // offsets from base (a few rows of one matrix: far below 4 GB)
  __device__ RowRing(const uint8_t* w, int64_t row_stride, int row0, int N, int stage0, int lane) {
    const int rb = min(row0, N - 1);
    base = w + static_cast<int64_t>(rb) * row_stride + static_cast<int64_t>(stage0) * kStageBytes;
#pragma unroll
    for (int u = 0; u < kCopies; ++u) {
      const int idx = lane + 32 * u, r = idx / kPieces, o = idx - r * kPieces;
      const int row = min(row0 + r, N - 1);  // rows past N re-read the last row; never stored
      src[u] = static_cast<uint32_t>((row - rb) * row_stride + o * 16);
    }
  }
  __device__ void copy(unsigned char* slot, int stage, int lane) const {
    unsigned char* dst = slot + 16 * lane;
    const uint8_t* st = base + static_cast<int64_t>(stage) * kStageBytes;
#pragma unroll
    for (int u = 0; u < kCopies; ++u)
      if (kAll % 32 == 0 || u < kCopies - 1 || lane + 32 * u < kAll) cp_async16(dst + 512 * u, st + src[u]);
  }
};

// x offset (elements) of stage k_stage's first element: a stage lies inside one x head (x_head_dim
// is a multiple of the stage), so one division per stage and every x load is base + constant.
__device__ __forceinline__ int64_t x_stage_offset(const uqr_gemm_params& p, int k_stage) {
  return p.x_head_dim == p.K ? k_stage
                             : static_cast<int64_t>(k_stage / p.x_head_dim) * p.x_head_stride + k_stage % p.x_head_dim;
}

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

// The T pair (lo, hi) of two fp32 values, each rounded to T.
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
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
// Four var_affine mode bytes -> their depths (mode & 7) clamped to [3, 5], one per byte, as
// uqr_var_affine_depth reads them.
__device__ __forceinline__ uint32_t var_affine_depths(uint32_t modes) {
  return __vmaxu4(__vminu4(modes & 0x07070707u, 0x05050505u), 0x03030303u);
}
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
    return pack_pair<T>(static_cast<float>(static_cast<int8_t>((w >> (8 * i)) & 0xFF)),
                        static_cast<float>(static_cast<int8_t>((w >> (8 * j)) & 0xFF)));
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

// Scales of a stage row's sub-blocks js0, js0 + 1, ... within one half super-block of a k-quant
// block (q4_k, q5_k: half d, half dmin, 12 bytes of 6-bit scales and mins, kBytes a block; the
// caller steps by 1, 2 or 4 from a multiple of that): d, dmin and the 6-bit scale / min words are
// read once, and each sub-block's pair is two byte extracts and two multiplies.
template <int kBytes>
struct KQuantScales {
  float d, dmin;
  uint32_t sc, mn;
  int sh;
  __device__ KQuantScales(const uint8_t* row, int js0) : sh(8 * (js0 & 3)) {
    const uint8_t* blk = row + (js0 / 8) * kBytes;
    const uint32_t dd = u32_at4(blk);
    d = __half2float(__ushort_as_half(static_cast<unsigned short>(dd & 0xFFFFu)));
    dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(dd >> 16)));
    uqr_q4_k_scale_min_words(u32_at4(blk + 4), u32_at4(blk + 8), u32_at4(blk + 12), (js0 % 8) >= 4, sc, mn);
  }
  __device__ float2 at(int u) const {
    return make_float2(d * static_cast<float>((sc >> (sh + 8 * u)) & 0xFFu),
                       -dmin * static_cast<float>((mn >> (sh + 8 * u)) & 0xFFu));
  }
};

// q4_k / q5_k code nibbles: qs[32 (s/2) + i] holds sub-block s's element i in the low (s even) or
// high (s odd) nibble.
template <typename T>
__device__ __forceinline__ void k_quant_nibbles(const uint8_t* qs_all, int s, int c, uint32_t (&r)[4]) {
  const uint8_t* qs = qs_all + 32 * (s >> 1);
  const int sh = (s & 1) * 4;
  const uint32_t w0 = u32_at4(qs + 4 * c), w1 = u32_at4(qs + 16 + 4 * c);
  r[0] = code_pair<T>(w0, sh);
  r[1] = code_pair<T>(w0, sh + 8);
  r[2] = code_pair<T>(w1, sh);
  r[3] = code_pair<T>(w1, sh + 8);
}

template <>
struct Traits<UQR_Q4_K> {
  static constexpr int kElems = 256, kSubs = 8;
  static constexpr bool kOffset = true, kWideX = false;
  static constexpr int kBytes = UQR_Q4_K_BYTES;
  template <typename T>
  __device__ static void codes(const uint8_t* blk, int, int s, int c, uint32_t (&r)[4]) {
    k_quant_nibbles<T>(blk + 16, s, c, r);
  }
  using WordScales = KQuantScales<kBytes>;
  using Scales = WordScales;
};

// Bit 4 of 5-bit codes, ORed into code pairs (B + q keeps bit 4 of its 16-bit half free for q < 32):
// lo4 / hi4 hold the high bits of a k-step's elements e..e+3 in bits 0..3 (q5_0, q5_1) or in bit 0
// of bytes 0..3 (q5_k, byte_wise). Pair (e, e + 2) -> bits 4 and 20; pair (e + 1, e + 3) likewise.
template <bool kByteWise>
__device__ __forceinline__ void or_bit4(uint32_t lo4, uint32_t hi4, uint32_t (&r)[4]) {
  auto even = [](uint32_t v) { return kByteWise ? (v << 4) & 0x00100010u : ((v << 4) & 0x10u) | ((v << 18) & 0x100000u); };
  auto odd = [](uint32_t v) { return kByteWise ? (v >> 4) & 0x00100010u : ((v << 3) & 0x10u) | ((v << 17) & 0x100000u); };
  r[0] |= even(lo4);
  r[1] |= odd(lo4);
  r[2] |= even(hi4);
  r[3] |= odd(hi4);
}

// q5_0: q4_0's nibbles (qs at 6) plus bit 4 of element e in bit e of the word qh (at 2); the codes
// carry the -16 (minus_code). Offsets 2 and 6 in a 22-byte block are word-aligned for odd blocks.
template <>
struct Traits<UQR_Q5_0> {
  static constexpr int kElems = 32, kSubs = 1;
  static constexpr bool kOffset = false, kWideX = false;
  static constexpr int kBytes = UQR_Q5_0_BYTES;
  using Scales = BlockScales<Traits>;
  template <typename T>
  __device__ static void codes(const uint8_t* blk, int j, int, int c, uint32_t (&r)[4]) {
    gguf_nibbles<T>(u32_in_block(blk + UQR_Q5_0_QS + 4 * c, j), r);
    const uint32_t qh = u32_in_block(blk + UQR_Q5_0_QH, j);
    or_bit4<false>(qh >> (4 * c), qh >> (16 + 4 * c), r);
#pragma unroll
    for (int i = 0; i < 4; ++i) r[i] = minus_code<T>(r[i], 16);
  }
  __device__ static float2 scale(const uint8_t* blk, int) { return make_float2(half_at(blk), 0.f); }
};

// q5_1: as q5_0 with w = d q + m (24-byte blocks: every field word-aligned).
template <>
struct Traits<UQR_Q5_1> {
  static constexpr int kElems = 32, kSubs = 1;
  static constexpr bool kOffset = true, kWideX = false;
  static constexpr int kBytes = UQR_Q5_1_BYTES;
  using Scales = BlockScales<Traits>;
  template <typename T>
  __device__ static void codes(const uint8_t* blk, int, int, int c, uint32_t (&r)[4]) {
    gguf_nibbles<T>(u32_at4(blk + UQR_Q5_1_QS + 4 * c), r);
    const uint32_t qh = u32_at4(blk + UQR_Q5_1_QH);
    or_bit4<false>(qh >> (4 * c), qh >> (16 + 4 * c), r);
  }
  __device__ static float2 scale(const uint8_t* blk, int) { return make_float2(half_at(blk), half_at(blk + 2)); }
};

// q5_k: q4_k's codes (qs at 48) and scales, plus bit 4 of sub-block s's element i in bit s of qh[i].
template <>
struct Traits<UQR_Q5_K> {
  static constexpr int kElems = 256, kSubs = 8;
  static constexpr bool kOffset = true, kWideX = false;
  static constexpr bool kRegHeavy = true;
  static constexpr int kBytes = UQR_Q5_K_BYTES;
  template <typename T>
  __device__ static void codes(const uint8_t* blk, int, int s, int c, uint32_t (&r)[4]) {
    k_quant_nibbles<T>(blk + UQR_Q5_K_QS, s, c, r);
    const uint8_t* qh = blk + UQR_Q5_K_QH;
    or_bit4<true>(u32_at4(qh + 4 * c) >> s, u32_at4(qh + 16 + 4 * c) >> s, r);
  }
  using Scales = KQuantScales<kBytes>;
};

// q6_k: 16-element sub-blocks with their own int8 scales, so a 32-element step has two scales and
// is not w = a q + b: codes() returns the weights (d scale) (q - 32) in T (exact in fp32, rounded
// once to T, as exl3; kPrescaled), one scale per k-step. Half h = s / 4 of the block: k-step kk of
// lane c has elements e = 32 (s % 4) + 16 kk + 4 c .. + 3 of the half, low nibbles at
// ql[64 h + e % 64] (high nibble for e >= 64), top 2 bits at bits 2 (s % 4) of qh[32 h + e % 32].
// 210-byte blocks are only 2-byte aligned: words are read as two halves. Its stage (8 blocks) is
// above kQmmaMaxStageElems, so with_format does not instantiate the kernels for it yet: these
// traits give the stage size that excludes it and the decode a smaller stage will use.
template <>
struct Traits<UQR_Q6_K> {
  static constexpr int kElems = 256, kSubs = 8;
  static constexpr bool kOffset = false, kWideX = false, kPrescaled = true;
  static constexpr int kBytes = UQR_Q6_K_BYTES;
  using Scales = BlockScales<Traits>;
  template <typename T>
  __device__ static void codes(const uint8_t* blk, int, int s, int c, uint32_t (&r)[4]) {
    const int h = s >> 2, k = s & 3;
    const float d = half_at(blk + UQR_Q6_K_D);
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const uint32_t lo = u32_at2(blk + 64 * h + 32 * (k & 1) + 16 * kk + 4 * c) >> (4 * (k >> 1));
      const uint32_t hi = u32_at2(blk + UQR_Q6_K_QH + 32 * h + 16 * kk + 4 * c) >> (2 * k);
      const float a = d * static_cast<float>(static_cast<int8_t>(blk[UQR_Q6_K_SCALES + 2 * s + kk]));
      float v[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int q = static_cast<int>(((lo >> (8 * t)) & 15u) | (((hi >> (8 * t)) & 3u) << 4));
        v[t] = a * static_cast<float>(q - 32);
      }
      r[2 * kk] = pack_pair<T>(v[0], v[2]);
      r[2 * kk + 1] = pack_pair<T>(v[1], v[3]);
    }
  }
  __device__ static float2 scale(const uint8_t*, int) { return make_float2(1.f, 0.f); }
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
    // Invalid code 3 is read as 1 (a zero trit), as formats.h decodes it.
    const uint32_t b0 = uqr_ternary_canonical_codes(blk[4 + c]), b1 = uqr_ternary_canonical_codes(blk[8 + c]);
    const uint32_t t0 = b0 | (b0 << 12), t1 = b1 | (b1 << 12);
    r[0] = minus_code<T>(code_pair<T, 0x00030003u>(t0, 0), 1);
    r[1] = minus_code<T>(code_pair<T, 0x00030003u>(t0, 2), 1);
    r[2] = minus_code<T>(code_pair<T, 0x00030003u>(t1, 0), 1);
    r[3] = minus_code<T>(code_pair<T, 0x00030003u>(t1, 2), 1);
  }
  __device__ static float2 scale(const uint8_t* blk, int) { return make_float2(half_at(blk), 0.f); }
};

// var_affine: sub-block s holds 32 codes of B = modes[s] & 7 bits (3..5) from bit 32 (B_0 + ...
// + B_{s-1}), i.e. from a word boundary; w = d s_s q + bias b_s. Lane c's four codes of k-step h
// (elements 16h + 4c .. +3) are 4B <= 20 consecutive bits: one funnel shift out of two words. Then
// each pair (e, e + 2) is e's bits in the low half and e + 2's moved to bit 16 (a shift and a
// PRMT), masked and given the exponent (one LOP3), as in code_pair. The rows of a warp have
// different depths, so B is a per-lane value, not a branch.
template <>
struct Traits<UQR_VAR_AFFINE> {
  static constexpr int kElems = 256, kSubs = 8;
  static constexpr bool kOffset = true, kWideX = false;
  static constexpr int kBytes = UQR_VAR_AFFINE_BYTES;
  using Scales = BlockScales<Traits>;
  template <typename T>
  __device__ static void codes(const uint8_t* blk, int, int s, int c, uint32_t (&r)[4]) {
    // Depths of sub-blocks 0-3 and 4-7, one per byte, clamped to [3, 5] (formats.h: any bytes stay
    // in the block); times 0x01010101 each byte holds the running sum of the depths up to it (at
    // most 20: no carries between bytes).
    const uint32_t m0 = var_affine_depths(u32_at4(blk + UQR_VAR_AFFINE_MODES));
    const uint32_t m1 = var_affine_depths(u32_at4(blk + UQR_VAR_AFFINE_MODES + 4));
    const uint32_t ms = s < 4 ? m0 : m1, sh = 8 * (s & 3);
    const uint32_t B = (ms >> sh) & 0xFFu;
    uint32_t before = ((ms * 0x01010101u) << 8 >> sh) & 0xFFu;  // depths of the earlier ones in ms
    if (s >= 4) before += (m0 * 0x01010101u) >> 24;
    before = min(before, 32u - B);  // first word, clamped so the sub-block's B words end inside qs
    const uint32_t* qs = reinterpret_cast<const uint32_t*>(blk + UQR_VAR_AFFINE_QS);
    const uint32_t mask = ((1u << B) - 1u) * 0x00010001u;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t bit = 32u * before + static_cast<uint32_t>(16 * h + 4 * c) * B;
      const uint32_t wi = bit >> 5;
      // The second word is needed only when the codes cross into it; the last word has no
      // successor in the block (its codes never cross), so it is re-read instead.
      const uint32_t v = __funnelshift_r(qs[wi], qs[min(wi + 1u, 31u)], bit & 31u);
      // Codes at bits 0, B, 2B, 3B: (e0, e2) and (e1, e3) with the second moved to bit 16.
      const uint32_t p02 = __byte_perm(v, v << (16u - 2u * B), 0x7610);
      const uint32_t p13 = __byte_perm(v >> B, v << (16u - 3u * B), 0x7610);
      r[2 * h] = (p02 & mask) | Magic<T>::kPair;
      r[2 * h + 1] = (p13 & mask) | Magic<T>::kPair;
    }
  }
  __device__ static float2 scale(const uint8_t* blk, int s) {
    return make_float2(half_at(blk) * static_cast<float>(blk[UQR_VAR_AFFINE_SCALES + s]),
                       half_at(blk + 2) * static_cast<float>(blk[UQR_VAR_AFFINE_BIASES + s]));
  }
};

// exl3: w = d (s_s P[k] + r_s R[k]) + bias is not a q -> a q + b map, so the codes cannot stay
// exact with the scales applied after the MMA: each sub-block gets its own table of 8 weights in T
// (rounded once, as the scratch path's decode rounds them) and the codes look it up. The 4 lanes
// of a fragment row compute 2 levels each and share them by shuffles; a PRMT then looks up 4 codes
// at once in the table's low bytes and one in its high bytes (a code is a byte index 0..7 of two
// registers). kPrescaled: codes() returns the weights themselves (scale() is 1, 0).
template <>
struct Traits<UQR_EXL3> {
  static constexpr int kElems = 256, kSubs = 8;
  static constexpr bool kOffset = false, kWideX = false, kPrescaled = true;
  static constexpr int kBytes = UQR_EXL3_BYTES;
  using Scales = BlockScales<Traits>;
  template <typename T>
  __device__ static void codes(const uint8_t* blk, int, int s, int c, uint32_t (&r)[4]) {
    const uint32_t dd = u32_at4(blk);
    const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(dd & 0xFFFFu)));
    const float bias = __half2float(__ushort_as_half(static_cast<unsigned short>(dd >> 16)));
    const int sj = blk[UQR_EXL3_SCALES + s], rj = blk[UQR_EXL3_RESIDUALS + s];
    const uint8_t* cb = blk + UQR_EXL3_CODEBOOK + 2 * c;  // P[2c], P[2c + 1]; R at + 8
    // s P + r R is an exact integer; only d * and + bias round (as the reference decoder).
    const float l0 = __fmaf_rn(d, static_cast<float>(sj * static_cast<int8_t>(cb[0]) + rj * static_cast<int8_t>(cb[8])), bias);
    const float l1 = __fmaf_rn(d, static_cast<float>(sj * static_cast<int8_t>(cb[1]) + rj * static_cast<int8_t>(cb[9])), bias);
    const uint32_t mine = pack_pair<T>(l0, l1);
    const uint32_t w0 = __shfl_sync(0xFFFFFFFFu, mine, 0, 4), w1 = __shfl_sync(0xFFFFFFFFu, mine, 1, 4);
    const uint32_t w2 = __shfl_sync(0xFFFFFFFFu, mine, 2, 4), w3 = __shfl_sync(0xFFFFFFFFu, mine, 3, 4);
    // Low and high bytes of levels 0..7: byte k of (lo_a, lo_b) is level k's low byte.
    const uint32_t lo_a = __byte_perm(w0, w1, 0x6420), lo_b = __byte_perm(w2, w3, 0x6420);
    const uint32_t hi_a = __byte_perm(w0, w1, 0x7531), hi_b = __byte_perm(w2, w3, 0x7531);
    const uint32_t* qs = reinterpret_cast<const uint32_t*>(blk + UQR_EXL3_QS + 12 * s);  // 96 bits
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // Lane c's codes of k-step h: elements 16h + 4c .. +3, 12 bits from bit 48h + 12c; past
      // the sub-block's third word they never reach (re-read it instead).
      const uint32_t bit = static_cast<uint32_t>(48 * h + 12 * c), wi = bit >> 5;
      const uint32_t v = __funnelshift_r(qs[wi], qs[min(wi + 1u, 2u)], bit & 31u);
      // 3-bit codes at bits 0, 3, 6, 9 -> PRMT selector nibbles 0, 4, 8, 12.
      const uint32_t sel = (v & 0x7u) | ((v << 1) & 0x70u) | ((v << 2) & 0x700u) | ((v << 3) & 0x7000u);
      const uint32_t lo = __byte_perm(lo_a, lo_b, sel), hi = __byte_perm(hi_a, hi_b, sel);
      r[2 * h] = __byte_perm(lo, hi, 0x6240);      // (e0, e2)
      r[2 * h + 1] = __byte_perm(lo, hi, 0x7351);  // (e1, e3)
    }
  }
  __device__ static float2 scale(const uint8_t*, int) { return make_float2(1.f, 0.f); }
};

// Whether F's codes() already returns the weights (exl3), so no scale is applied to them.
template <class F, class = void>
struct Prescaled : std::false_type {};
template <class F>
struct Prescaled<F, std::void_t<decltype(F::kPrescaled)>> : std::integral_constant<bool, F::kPrescaled> {};

// Whether F's decode keeps more values live than a 4-bit affine format's (q5_k: the fifth bit plane
// and paired 6-bit scales; iq4_xs and mxfp4: the 16-entry value table): those get the wide-x
// formats' register budget in the small-M kernel and two CTAs an SM (not three) in the split
// build, where the default budgets make ptxas spill.
template <class F, class = void>
struct RegHeavy : std::false_type {};
template <class F>
struct RegHeavy<F, std::void_t<decltype(F::kRegHeavy)>> : std::integral_constant<bool, F::kRegHeavy> {};

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

// B fragments of one sub-block for k-steps 0 (b00, b01) and 1 (b10, b11) from this lane's x in
// shared memory at p (element 4c, mlx4 8c, of the sub-block), in the pairing codes() uses.
template <class F, typename T>
__device__ __forceinline__ void x_frags(const T* p, uint32_t& b00, uint32_t& b01, uint32_t& b10, uint32_t& b11) {
  if constexpr (F::kWideX) {
    const uint4 xv = *reinterpret_cast<const uint4*>(p);
    xfrag(xv.x, xv.z, b00, b01);
    xfrag(xv.y, xv.w, b10, b11);
  } else {
    const uint2 x0 = *reinterpret_cast<const uint2*>(p), x1 = *reinterpret_cast<const uint2*>(p + 16);
    xfrag(x0.x, x0.y, b00, b01);
    xfrag(x1.x, x1.y, b10, b11);
  }
}

// A lane's x of one sub-block as global memory holds it (wide: elements 8c..8c+7; else 4c..4c+3 in
// v.x, v.y and 16+4c..+3 in v.z, v.w) -> its B registers (b00, b01, b10, b11), as x_frags pairs them.
template <class F>
__device__ __forceinline__ uint4 frag_order(const uint4 v) {
  uint4 o;
  if constexpr (F::kWideX) {
    xfrag(v.x, v.z, o.x, o.y);
    xfrag(v.y, v.w, o.z, o.w);
  } else {
    xfrag(v.x, v.y, o.x, o.y);
    xfrag(v.z, v.w, o.z, o.w);
  }
  return o;
}

// The T pair (v, v) of an fp32 scale, and T-pair arithmetic on packed registers.
template <typename T>
__device__ __forceinline__ uint32_t scale_pair(float v) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    const __nv_bfloat162 r = __float2bfloat162_rn(v);
    return *reinterpret_cast<const uint32_t*>(&r);
  } else {
    const __half2 r = __float2half2_rn(v);
    return *reinterpret_cast<const uint32_t*>(&r);
  }
}
template <typename T>
using Pair = typename std::conditional<std::is_same<T, __nv_bfloat16>::value, __nv_bfloat162, __half2>::type;
template <typename T>
__device__ __forceinline__ uint32_t fma_pair(uint32_t x, uint32_t a, uint32_t b) {
  const Pair<T> r = __hfma2(*reinterpret_cast<const Pair<T>*>(&x), *reinterpret_cast<const Pair<T>*>(&a),
                            *reinterpret_cast<const Pair<T>*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}
template <typename T>
__device__ __forceinline__ uint32_t mul_pair(uint32_t x, uint32_t a) {
  const Pair<T> r = __hmul2(*reinterpret_cast<const Pair<T>*>(&x), *reinterpret_cast<const Pair<T>*>(&a));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// A row's four code registers -> the weights themselves, w = a q + b in T: offset formats' B + q
// first lose B (exact), then one fma; the others carry q - zero already (or q: q8_0).
template <class F, typename T>
__device__ __forceinline__ void scale_codes(uint32_t (&r)[4], float2 s) {
  const uint32_t a2 = scale_pair<T>(s.x);
  if constexpr (Prescaled<F>::value) {
    return;
  } else if constexpr (F::kOffset) {
    const uint32_t b2 = scale_pair<T>(s.y);
#pragma unroll
    for (int i = 0; i < 4; ++i) r[i] = fma_pair<T>(minus_code<T>(r[i], 0), a2, b2);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) r[i] = mul_pair<T>(r[i], a2);
  }
}

// The mid-M kernel's sub-blocks js = jb .. jb + U - 1 of a stage for one warp's 16 weight rows and
// NT column tiles: buf = the stage's bytes (row pitch sb), xst[t] = this lane's x of column tile t
// at sub-block jb, in shared memory. The scales are applied to the codes before the MMA (weights
// rounded to T once, as the scratch path's decode does), so the MMAs accumulate straight into acc.
// (The small-M kernel keeps its own loop with fp32 scales after the MMA: exact codes, and its
// code generation, which a shared version of this step changed: mlx4 at M = 1 24.4-24.9 us
// against 20.0-20.5. Even sharing only the js -> (j, s, block) lines below through a
// helper changed mlx4's PTX, so those few lines are repeated there on purpose.)
// The A fragments (k-step 0 in a0, k-step 1 in a1) of sub-block js of a warp's 16 weight rows in a
// stage at buf (row pitch sb), with the rows' scales s_g (row g) and s_g8 (row g + 8) applied:
// mma.sync's m16n8k16 A layout, which is also each warp's share of wgmma's m64 A in registers.
template <class F, typename T>
__device__ __forceinline__ void a_fragments(const unsigned char* buf, int sb, int js, int g, int c, float2 s_g,
                                            float2 s_g8, uint32_t (&a0)[4], uint32_t (&a1)[4]) {
  const int j = js / F::kSubs, s = js % F::kSubs;
  const uint8_t* blk_g = buf + g * sb + j * F::kBytes;
  uint32_t rg[4], rg8[4];
  F::template codes<T>(blk_g, j, s, c, rg);
  F::template codes<T>(blk_g + 8 * sb, j, s, c, rg8);
  scale_codes<F, T>(rg, s_g);
  scale_codes<F, T>(rg8, s_g8);
  a0[0] = rg[0], a0[1] = rg8[0], a0[2] = rg[1], a0[3] = rg8[1];
  a1[0] = rg[2], a1[1] = rg8[2], a1[2] = rg[3], a1[3] = rg8[3];
}

// PX: x lies in shared memory in fragment order (the mid-M kernel's permuted staging): a lane's four
// B registers of a sub-block are one 16-byte word at xst[t] + 32 u.
template <class F, typename T, int NT, int U, bool PX = false>
__device__ __forceinline__ void subblock_steps(const unsigned char* buf, int sb, int jb, int g, int c,
                                               const T* const (&xst)[NT], float (&acc)[NT][4]) {
  const typename F::Scales sg(buf + g * sb, jb), sg8(buf + (g + 8) * sb, jb);
#pragma unroll
  for (int u = 0; u < U; ++u) {
    uint32_t a0[4], a1[4];
    a_fragments<F, T>(buf, sb, jb + u, g, c, sg.at(u), sg8.at(u), a0, a1);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      uint32_t b00, b01, b10, b11;
      if constexpr (PX) {
        const uint4 v = *reinterpret_cast<const uint4*>(xst[t] + 32 * u);
        b00 = v.x, b01 = v.y, b10 = v.z, b11 = v.w;
      } else {
        x_frags<F, T>(xst[t] + 32 * u, b00, b01, b10, b11);
      }
      mma16816<T>(acc[t], a0, b00, b01, acc[t]);
      mma16816<T>(acc[t], a1, b10, b11, acc[t]);
    }
  }
}

// One stage (its bytes at buf, row pitch RowRing's kStageBytes) of a warp's 16 rows: the stage's
// 32-element sub-blocks U at a time. xst[t] = this lane's x at the stage's first sub-block,
// advanced by pointer so each load is pointer + immediate; jb = jq * U keeps jb's low bits known
// to the compiler, so (jb + u)'s parity (q4_k's nibble half) and 4-alignment fold to constants.
template <class F, typename T, int NT, int U, bool PX = false>
__device__ __forceinline__ void stage_steps(const unsigned char* buf, int g, int c, const T* (&xst)[NT],
                                            float (&acc)[NT][4]) {
  using Ring = RowRing<F>;
  static_assert((Ring::kStageBlocks * F::kSubs) % 4 == 0, "stages hold a multiple of 4 sub-blocks");
#pragma unroll 1
  for (int jq = 0; jq < Ring::kStageBlocks * F::kSubs / U; ++jq) {
    subblock_steps<F, T, NT, U, PX>(buf, Ring::kStageBytes, jq * U, g, c, xst, acc);
#pragma unroll
    for (int t = 0; t < NT; ++t) xst[t] += 32 * U;
  }
}

// ---- GGUF iq4_nl, iq4_xs, q3_k, q2_k, mxfp4 ----
// Table formats (iq4_nl, iq4_xs, mxfp4): a code is a level of a 16-entry table of small integers,
// exact in either T, so codes() returns the levels themselves (kOffset = false) and scale() the
// block's multiplier. Level pairs follow gguf_nibbles' pairing of the 4 bytes w (elements e..e+3
// in the low nibbles, e+16..e+19 in the high ones).
template <typename T, bool kMx>
__device__ __forceinline__ uint32_t level_pair(uint32_t w, int sh) {
  const uint32_t qa = (w >> sh) & 15u, qb = (w >> (sh + 16)) & 15u;
  const int a = kMx ? uqr_mxfp4_level(qa) : uqr_iq4_level(qa), b = kMx ? uqr_mxfp4_level(qb) : uqr_iq4_level(qb);
  return pack_pair<T>(static_cast<float>(a), static_cast<float>(b));
}
template <typename T, bool kMx>
__device__ __forceinline__ void level_nibbles(uint32_t w, uint32_t (&r)[4]) {
  r[0] = level_pair<T, kMx>(w, 0);
  r[1] = level_pair<T, kMx>(w, 8);
  r[2] = level_pair<T, kMx>(w, 4);
  r[3] = level_pair<T, kMx>(w, 12);
}
// A 32-bit word at any byte address (mxfp4's 17-byte blocks align nothing).
__device__ __forceinline__ uint32_t u32_at1(const uint8_t* p) { return uqr_load_u32(p); }

template <>
struct Traits<UQR_IQ4_NL> {
  static constexpr int kElems = 32, kSubs = 1;
  static constexpr bool kOffset = false, kWideX = false;
  static constexpr int kBytes = UQR_IQ4_NL_BYTES;
  using Scales = BlockScales<Traits>;
  template <typename T>
  __device__ static void codes(const uint8_t* blk, int j, int, int c, uint32_t (&r)[4]) {
    level_nibbles<T, false>(u32_in_block(blk + 2 + 4 * c, j), r);  // q4_0's 18-byte layout
  }
  __device__ static float2 scale(const uint8_t* blk, int) { return make_float2(half_at(blk), 0.f); }
};

template <>
struct Traits<UQR_MXFP4> {
  static constexpr int kElems = 32, kSubs = 1;
  static constexpr bool kOffset = false, kWideX = false;
  static constexpr bool kRegHeavy = true;
  static constexpr int kBytes = UQR_MXFP4_BYTES;
  using Scales = BlockScales<Traits>;
  template <typename T>
  __device__ static void codes(const uint8_t* blk, int, int, int c, uint32_t (&r)[4]) {
    level_nibbles<T, true>(u32_at1(blk + 1 + 4 * c), r);
  }
  __device__ static float2 scale(const uint8_t* blk, int) { return make_float2(uqr_e8m0_half(blk[0]), 0.f); }
};

// iq4_xs: sub-block s is 16 bytes of qs in q4_0's nibble order (136-byte blocks start 8-byte
// aligned in a stage, so the words are aligned); scale d (ls_s - 32), exact in fp32.
template <>
struct Traits<UQR_IQ4_XS> {
  static constexpr int kElems = 256, kSubs = 8;
  static constexpr bool kOffset = false, kWideX = false;
  static constexpr bool kRegHeavy = true;
  static constexpr int kBytes = UQR_IQ4_XS_BYTES;
  using Scales = BlockScales<Traits>;
  template <typename T>
  __device__ static void codes(const uint8_t* blk, int, int s, int c, uint32_t (&r)[4]) {
    level_nibbles<T, false>(u32_at4(blk + UQR_IQ4_XS_QS + 16 * s + 4 * c), r);
  }
  __device__ static float2 scale(const uint8_t* blk, int s) {
    return make_float2(half_at(blk) * static_cast<float>(uqr_iq4_xs_scale(blk, s) - 32), 0.f);
  }
};

// q3_k / q2_k: 32-element sub-block s of a block is h = s / 4, quarter s % 4 of the layout in
// formats.h: element i's low code bits are bits 2 (s % 4) of qs[32h + i]. Its two halves have their
// own 16-element scales, and a k-step lies inside one half (k-step 0: elements 4c..4c+3, 1: 16 + ...).
// q3_k folds the half's integer scale into the codes: (sc - 32)(q - 4) is an integer of magnitude
// <= 128, exact in either T, so scale() is just d. Blocks are 110 bytes (2-byte aligned words).
template <>
struct Traits<UQR_Q3_K> {
  static constexpr int kElems = 256, kSubs = 8;
  static constexpr bool kOffset = false, kWideX = false;
  static constexpr int kBytes = UQR_Q3_K_BYTES;
  using Scales = BlockScales<Traits>;
  template <typename T>
  __device__ static void codes(const uint8_t* blk, int, int s, int c, uint32_t (&r)[4]) {
    const int sh = 2 * (s & 3);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = 16 * h + 4 * c;
      const uint32_t lo = u32_at2(blk + UQR_Q3_K_QS + 32 * (s >> 2) + i), hm = u32_at2(blk + i);
      const int sc = uqr_q3_k_scale(blk, 2 * s + h) - 32;
      float v[4];
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int q = static_cast<int>((lo >> (8 * b + sh)) & 3u) | static_cast<int>(((hm >> (8 * b + s)) & 1u) << 2);
        v[b] = static_cast<float>(sc * (q - 4));
      }
      r[2 * h] = pack_pair<T>(v[0], v[2]);
      r[2 * h + 1] = pack_pair<T>(v[1], v[3]);
    }
  }
  __device__ static float2 scale(const uint8_t* blk, int) { return make_float2(half_at(blk + UQR_Q3_K_D), 0.f); }
};

// q2_k: each half has its own min, so w = a q + b does not hold per 32 elements: codes() returns the
// weights (d sc) q - dmin m rounded to T once (kPrescaled, as exl3). 84-byte blocks: aligned words.
template <>
struct Traits<UQR_Q2_K> {
  static constexpr int kElems = 256, kSubs = 8;
  static constexpr bool kOffset = false, kWideX = false, kPrescaled = true;
  static constexpr int kBytes = UQR_Q2_K_BYTES;
  using Scales = BlockScales<Traits>;
  template <typename T>
  __device__ static void codes(const uint8_t* blk, int, int s, int c, uint32_t (&r)[4]) {
    const uint32_t dd = u32_at4(blk + UQR_Q2_K_D);
    const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(dd & 0xFFFFu)));
    const float dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(dd >> 16)));
    const int sh = 2 * (s & 3);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t sc = blk[2 * s + h];
      const float a = d * static_cast<float>(sc & 15u), b = dmin * static_cast<float>(sc >> 4);
      const uint32_t lo = u32_at4(blk + UQR_Q2_K_QS + 32 * (s >> 2) + 16 * h + 4 * c);
      float v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = a * static_cast<float>((lo >> (8 * k + sh)) & 3u) - b;  // a q exact
      r[2 * h] = pack_pair<T>(v[0], v[2]);
      r[2 * h + 1] = pack_pair<T>(v[1], v[3]);
    }
  }
  __device__ static float2 scale(const uint8_t*, int) { return make_float2(1.f, 0.f); }
};

// fn(F{}) for the format traits F of p's format (and mlx4 group); cudaErrorInvalidValue for a
// format the tensor-core kernels do not handle.
template <class Fn>
cudaError_t with_format(const uqr_gemm_params& p, Fn&& fn) {
  switch (p.fmt) {
#define UQR_TRAITS_CASE(id, name)                                                   \
  case id:                                                                          \
    if constexpr (RowRing<Traits<id>>::kStageElems <= kQmmaMaxStageElems) {         \
      return fn(Traits<id>{});                                                      \
    } else {                                                                        \
      return cudaErrorInvalidValue;                                                 \
    }
    UQR_FIXED_BLOCK_LIST(UQR_TRAITS_CASE)
#undef UQR_TRAITS_CASE
    case UQR_MLX4:
      if (p.group_size == 32) return fn(Mlx4<32>{});
      if (p.group_size == 64) return fn(Mlx4<64>{});
      return fn(Mlx4<128>{});
    default: return cudaErrorInvalidValue;
  }
}

// Accumulator q of a warp's tile: weight row g (+8 for q >= 2), activation row t * 8 + 2c + (q & 1).
template <typename T>
__device__ __forceinline__ void store_acc(const uqr_gemm_params& p, void* y, int rows, int n0, int r0, int g, int c,
                                          int t, int q, float v) {
  const int n = n0 + g + (q >= 2 ? 8 : 0);
  const int r = r0 + t * 8 + 2 * c + (q & 1);
  if (n < p.N && r < rows) {
    const int b = r / p.M, m = r - b * p.M;
    static_cast<T*>(y)[uqr_y_offset(p, b, m, n)] = from_float<T>(v);
  }
}

// y = the sum of the splits' partial products. kVec: a thread adds 4 consecutive outputs of a row
// (one 16-byte load a split, one 8-byte store; reduce_splits checks that y allows it), else one.
// The splits are read 4 at a time, so their loads are in flight together: the kernel waits on L2
// latency, not bandwidth (ncu: 4 us for 16 x 14336 outputs at one split at a time).
template <typename T, bool kVec>
__global__ void reduce_splits_kernel(const SplitArgs sa) {
  pdl_wait();  // the partial sums of the kernel before
  const QmmaArgs& a = sa.q;
  constexpr int V = kVec ? 4 : 1;
  using Vals = typename std::conditional<kVec, float4, float>::type;
  const int64_t plane = static_cast<int64_t>(a.rows) * a.p.N;
  const int64_t idx = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (idx >= plane) return;
  const Vals* src = reinterpret_cast<const Vals*>(sa.ws + idx);
  const int64_t step = plane / V;
  float v[V] = {};
  auto add = [&](const Vals& w) {
    if constexpr (kVec) {
      v[0] += w.x, v[1] += w.y, v[2] += w.z, v[3] += w.w;
    } else {
      v[0] += w;
    }
  };
  const int r = static_cast<int>(idx / a.p.N), n = static_cast<int>(idx - static_cast<int64_t>(r) * a.p.N);
  int pieces = sa.splits;
  if (sa.sk_ctas > 0) {  // this output's row tile has the pieces of the CTAs its stages went to
    const int64_t t0 = static_cast<int64_t>(n / kSkTileRows) * sa.sk_units;
    const int64_t all = sk_all_units(a.p.N, sa.sk_units);
    pieces = sk_cta_of(t0 + sa.sk_units - 1, sa.sk_ctas, all) - sk_cta_of(t0, sa.sk_ctas, all) + 1;
  }
  int s = 0;
  for (; s + 4 <= pieces; s += 4) {
    const Vals w0 = ld_after_wait(src + s * step), w1 = ld_after_wait(src + (s + 1) * step);
    const Vals w2 = ld_after_wait(src + (s + 2) * step), w3 = ld_after_wait(src + (s + 3) * step);
    add(w0), add(w1), add(w2), add(w3);
  }
  for (; s < pieces; ++s) add(ld_after_wait(src + s * step));
  const int b = r / a.p.M, m = r - b * a.p.M;
  T* const y = static_cast<T*>(a.y) + uqr_y_offset(a.p, b, m, n);
  if constexpr (kVec) {
    *reinterpret_cast<uint2*>(y) = make_uint2(pack_pair<T>(v[0], v[1]), pack_pair<T>(v[2], v[3]));
  } else {
    *y = from_float<T>(v[0]);
  }
}

// Launches the reduction of sa's splits (a programmatic dependent of the kernel that wrote them):
// 4 outputs a thread where N, y's heads, strides and base keep every group of 4 contiguous and
// 8-byte aligned.
template <typename T>
cudaError_t reduce_splits(const SplitArgs& sa, cudaStream_t stream, bool pdl) {
  const uqr_gemm_params& p = sa.q.p;
  const bool vec = p.N % 4 == 0 && p.y_head_dim % 4 == 0 && p.y_row_stride % 4 == 0 && p.y_batch_stride % 4 == 0 &&
                   p.y_head_stride % 4 == 0 && reinterpret_cast<uintptr_t>(sa.q.y) % 8 == 0;
  const int64_t threads = static_cast<int64_t>(sa.q.rows) * p.N / (vec ? 4 : 1);
  const dim3 grid(static_cast<unsigned>((threads + 255) / 256));
  return vec ? launch_ex(reduce_splits_kernel<T, true>, grid, dim3(256), 0, stream, pdl, sa)
             : launch_ex(reduce_splits_kernel<T, false>, grid, dim3(256), 0, stream, pdl, sa);
}

}  // namespace qmma

// The mid-M kernel's part of the launch plan (QmmaPlan): activation rows a column tile (16: the
// split-K build, 32, 64), K splits (workspace planes), the stream-K grid (0: off) and, for the
// 16-row build, its 2-CTAs-an-SM (128-register) variant.
struct SplitPlan {
  int cols = 16;
  int splits = 1;
  int sk_ctas = 0;
  bool wide_regs = false;
};

// The mid-M kernel (qmma_mid_m.cu): more than kQmmaMaxRows activation rows, and 9-16 rows with K
// split over CTAs; sa's call already checked by qmma_unsupported and mid_m_plan_invalid.
cudaError_t qmma_mid_m(const qmma::SplitArgs& sa, const SplitPlan& plan, bool bf16, cudaStream_t stream, bool pdl);
// nullptr when `plan` can be launched by the mid-M kernel for this call, else why not.
const char* mid_m_plan_invalid(const uqr_gemm_params& p, int rows, const SplitPlan& plan);

}  // namespace cuda
}  // namespace uqr
