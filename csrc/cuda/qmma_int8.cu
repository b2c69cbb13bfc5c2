// Path "int8" on CUDA: q4_0 / q4_k weights times x rounded to int8, 1-16 activation rows, on the
// integer tensor cores (mma.sync m16n8k32, u8 weights x s8 activations -> s32).
//
// Why: the exact small-M kernel (qmma_small_m.cu) is bound by instruction issue - at M = 1 about 45
// instructions per 512 weights, most of them turning codes into bf16 pairs, taking off the zero
// point and applying each block's scale after its MMAs. With x in int8 the
// codes enter the MMA as the block stores them: m16n8k32's A fragment gives lane c of row g the
// bytes k = 4c..4c+3 (a0) and 16+4c..16+4c+3 (a2), and a GGUF q4 code byte i holds elements i (low
// nibble) and i + 16 (high), so a row's two registers are one word masked, and shifted and masked.
// q4_0's -8 zero point is the MMA's C operand (-8 times the block's sum of x codes), so per 32
// weights and output only a convert and one FMA remain; q4_k's sub-block scales and mins multiply
// integer dot products and x sums, and floats appear once per 256 weights.
//
// Numerics are the CPU int8 path's (csrc/cpu/gemm_int8.cpp): one x scale d = amax / 127 per 32
// elements (q4_0) or per 256 (q4_k, so a super-block's sub-block dots add up in integers), codes
// round-half-even(x / d) in fp32. A pre-pass (quantize_x_kernel) writes them for all rows at once;
// each 32-element block's codes in lane order (lane c's b0 and b1 = 8 consecutive bytes at 8c),
// plus {d, q4_0: -8 * sum / q4_k: sum} per block.
//
// Work split as in qmma_small_m.cu: a CTA owns 16 weight rows and 1-8 warps that split K, each
// streaming its rows' stages through a private cp.async ring (RowRing); x comes from global memory
// (L1/L2: every CTA reads all of it, 1 byte an element here). One row runs the block-column form
// (ColsX: each k-slot of the MMA its own block, x only in that block's column, scales once per block;
// 14336 x 4096, us: q4_0 15.8 / 16.2 -> 14.5 / 13.8, q4_k 15.4 / 15.6 -> 14.5 / 14.2); with it
// off (tuning knob int8_cols) one row's x is staged through the ring behind the weights where there are few
// CTAs (SlotLayout), else read a stage ahead into registers (XPipe). Path "int8" runs this kernel
// only where it measured faster than the exact one (configs.INT8_AUTO_MAX_ROWS). The launch plan
// (variant, warps, shared-memory cap, dependent launch) comes from the router (Int8Plan).
#include <cstdlib>
#include <type_traits>

#include "qmma_int8.h"
#include "cuda_common.cuh"
#include "ksplit.cuh"
#include "qmma_traits.cuh"

namespace uqr {
namespace cuda {
namespace {

using namespace qmma;

constexpr int kStages = 3;  // as the exact small-M kernel: the whole grid resident at 14336 rows
constexpr int kQBlock = 32;  // elements per x meta entry and per MMA k-step
// Shared memory past the last ring slot: var_affine's stage reads up to one word beyond a row's
// payload (var_affine_cols_stage), which for the last row of the last slot lies past the rings.
constexpr size_t kRingSlack = 16;

// Format keys of this file's templates: q4_0 and q4_k by their uqr_format ids, mlx4 with its group
// size folded in (mlx4_key<G>; only the one-row block-column kernel takes mlx4).
constexpr int kMlx4Key = 0x100;
template <int G>
__host__ __device__ constexpr int mlx4_key() { return kMlx4Key | G; }
__host__ __device__ constexpr bool is_mlx4(int F) { return (F & kMlx4Key) != 0; }
__host__ __device__ constexpr int mlx4_group(int F) { return F & 0xFF; }
template <int F, bool = is_mlx4(F)>
struct KeyTraitsOf { using type = Traits<F>; };
template <int F>
struct KeyTraitsOf<F, true> { using type = Mlx4<mlx4_group(F)>; };
template <int F>
using KeyTraits = typename KeyTraitsOf<F>::type;

struct Int8Args {
  uqr_gemm_params p;
  const int8_t* xq;  // [rows][K] x codes: lane-ordered per 32-element block, or block-column order
  const int2* xm;    // [rows][K / 32] {bits of d, q4_0: -8 * sum of codes / q4_k: sum / mlx4: group sum}
  void* y;
  const uint8_t* w;
  int64_t w_row_stride;
  int rows;
};

// x scale span per format: 32 for q4_0 and ternary, a super-block for q4_k, var_affine and exl3, a
// group for mlx4 (so that a group's integer dot and code sum take its scale and bias once).
__host__ __device__ constexpr bool super_block_x(int FMT) {
  return FMT == UQR_Q4_K || FMT == UQR_VAR_AFFINE || FMT == UQR_EXL3;
}
template <int FMT>
__host__ __device__ constexpr int x_span() { return super_block_x(FMT) ? 256 : is_mlx4(FMT) ? mlx4_group(FMT) : 32; }
// Lanes (of 8 elements) a meta entry's code sum covers: a 32-element block, an mlx4 group.
template <int FMT>
__host__ __device__ constexpr int sum_lanes() { return is_mlx4(FMT) ? mlx4_group(FMT) / 8 : 4; }

// One thread = 8 consecutive x elements; a span's threads are consecutive lanes of one warp
// (K / 8 per row is a multiple of 32), so the span max and the block sum are shuffles.
// kCols: codes in the one-row block-column kernel's order - element order, and for mlx4 each group's
// even elements (low nibbles) before its odd ones - else in lane order.
template <typename T, int FMT, bool kCols>
__global__ void __launch_bounds__(256) quantize_x_kernel(const uqr_gemm_params p, const T* __restrict__ x, int rows,
                                                         int8_t* __restrict__ xq, int2* __restrict__ xm) {
  // x may come from the previous kernel. The main kernel may start once this one has waited: it
  // copies weights before its own wait, which is safe only behind a kernel that has already waited.
  pdl_wait();
  pdl_allow_dependents();
  const int per_row = p.K / 8;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= static_cast<int64_t>(rows) * per_row) return;  // whole warps
  const int r = static_cast<int>(t / per_row), e = static_cast<int>(t - static_cast<int64_t>(r) * per_row);
  const int b = r / p.M, m = r - b * p.M;
  const T* src = x + uqr_x_row_offset(p, b, m) + x_stage_offset(p, 8 * e);
  const uint2 raw0 = ld_after_wait(reinterpret_cast<const uint2*>(src));
  const uint2 raw1 = ld_after_wait(reinterpret_cast<const uint2*>(src + 4));
  const uint32_t words[4] = {raw0.x, raw0.y, raw1.x, raw1.y};
  float v[8];
  float amax = 0.f, nonfinite = 0.f;  // nonfinite: 0, or NaN once the span holds a NaN or an Inf
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const unsigned short h = static_cast<unsigned short>(words[i / 2] >> (16 * (i & 1)));
    if constexpr (std::is_same<T, __nv_bfloat16>::value) v[i] = __bfloat162float(__ushort_as_bfloat16(h));
    else v[i] = __half2float(__ushort_as_half(h));
    amax = fmaxf(amax, fabsf(v[i]));
    nonfinite += v[i] * 0.f;
  }
#pragma unroll
  for (int o = 1; o < x_span<FMT>() / 8; o <<= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    nonfinite += __shfl_xor_sync(0xFFFFFFFFu, nonfinite, o);
  }
  // IEEE division and rounding (no fast-math in setup.py), as the CPU path's d and 1 / d. A NaN or
  // Inf in the span makes d NaN, so every output the span feeds is NaN (docs/operator.md), and its
  // codes 0.
  const float d = amax / 127.f + nonfinite;
  const float id = d != 0.f && nonfinite == 0.f ? 1.f / d : 0.f;
  uint32_t packed[2] = {0u, 0u};
  int sum = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int q = min(max(__float2int_rn(__fmul_rn(v[i], id)), -128), 127);
    sum += q;
    packed[i / 4] |= (static_cast<uint32_t>(q) & 0xFFu) << (8 * (i & 3));
  }
#pragma unroll
  for (int o = 1; o < sum_lanes<FMT>(); o <<= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
  int2* meta = xm + static_cast<int64_t>(r) * (p.K / kQBlock) + e / 4;
  const int2 mv = make_int2(__float_as_int(d), FMT == UQR_Q4_0 ? -8 * sum : FMT == UQR_TERNARY ? -sum : sum);
  int8_t* row_q = xq + static_cast<int64_t>(r) * p.K;
  if constexpr (kCols && FMT == UQR_TERNARY) {
    // Element i of a block: code class t = i & 3 (its 2 bits' place in a code byte), byte j = (i >> 2)
    // & 3, word i >> 4; the lo piece holds classes 0 and 2, the hi piece 1 and 3 (ternary_cols_stage).
    int8_t* blk = row_q + 32 * (e / 4);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int i = 8 * (e & 3) + k, t = i & 3;
      blk[16 * (t & 1) + 8 * (t >> 1) + 4 * (i >> 4) + ((i >> 2) & 3)] =
          static_cast<int8_t>(packed[k / 4] >> (8 * (k & 3)));
    }
  } else if constexpr (kCols && is_mlx4(FMT)) {
    constexpr int G = mlx4_group(FMT);
    const int in_g = e % (G / 8);  // this thread's 8 elements within its group
    int8_t* grp = row_q + 8 * (e - in_g);
    *reinterpret_cast<uint32_t*>(grp + 4 * in_g) = __byte_perm(packed[0], packed[1], 0x6420);
    *reinterpret_cast<uint32_t*>(grp + G / 2 + 4 * in_g) = __byte_perm(packed[0], packed[1], 0x7531);
  } else if constexpr (kCols) {
    *reinterpret_cast<uint2*>(row_q + 8 * e) = make_uint2(packed[0], packed[1]);
  } else {
    // Lane order: slot c of a 32-element block gets elements 4c..4c+3 (this block's thread c / 2,
    // its low or high word by c's parity) and 16+4c..16+4c+3 (thread 2 + c / 2).
    const int c = e & 3, quad = static_cast<int>(threadIdx.x & 31) & ~3;
    const uint32_t lo_a = __shfl_sync(0xFFFFFFFFu, packed[0], quad + (c >> 1));
    const uint32_t hi_a = __shfl_sync(0xFFFFFFFFu, packed[1], quad + (c >> 1));
    const uint32_t lo_b = __shfl_sync(0xFFFFFFFFu, packed[0], quad + 2 + (c >> 1));
    const uint32_t hi_b = __shfl_sync(0xFFFFFFFFu, packed[1], quad + 2 + (c >> 1));
    *reinterpret_cast<uint2*>(row_q + 8 * e) = make_uint2((c & 1) ? hi_a : lo_a, (c & 1) ? hi_b : lo_b);
  }
  if ((e & 3) == 0) *meta = mv;  // a block's first thread stores its meta
}

// D = A B + C, m16n8k32, A unsigned bytes (the weights' codes), B signed bytes (x), s32.
__device__ __forceinline__ void imma16832(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                          const int (&c)[4]) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
}

constexpr uint32_t kLowNibbles = 0x0F0F0F0Fu;

// This lane's x for column tile t at the current stage: its B fragment (codes) and, for its
// accumulator columns 2c and 2c + 1, the block meta (kOneRow: only column 0 is ever stored, so
// one). In global memory, advanced a stage at a time (kShared = false), or pointers into the ring
// slot where one row's x is staged (SlotLayout).
template <int NT, bool kShared>
struct XLanes {
  const int8_t* frag[NT];
  const int2* meta0[NT];
  const int2* meta1[NT];
  __device__ void advance(int elems) {
#pragma unroll
    for (int t = 0; t < NT; ++t) frag[t] += elems, meta0[t] += elems / kQBlock, meta1[t] += elems / kQBlock;
  }
  // Global loads from global memory (ld_after_wait); plain loads from a ring slot (a global-space
  // load of a shared address faults).
  template <class V>
  __device__ static V load(const V* p) {
    if constexpr (kShared) return *p;
    else return ld_after_wait(p);
  }
  __device__ uint2 codes(int t, int j) const { return load(reinterpret_cast<const uint2*>(frag[t] + kQBlock * j)); }
  __device__ int2 m0(int t, int j) const { return load(meta0[t] + j); }
  __device__ int2 m1(int t, int j) const { return load(meta1[t] + j); }
  __device__ void consumed(int) {}
};

// One activation row's x a stage ahead in registers (global x, one column tile): the stage
// functions read block j from registers, and once they are done with it (consumed) those registers
// load block j of the next stage, a stage of work before it is needed. ncu of the global-x
// kernel at one row: 6.5-7.7 of 18-19 stall cycles an instruction were long-scoreboard waits, the
// x loads from L2 at the start of each stage.
struct XPipe {
  static constexpr int kBlocks = 8;  // 32-element blocks a stage (256 elements for q4_0 and q4_k)
  const int8_t* frag;  // the next stage's codes and meta
  const int2* meta;
  uint2 c[kBlocks];
  int2 m[kBlocks];
  __device__ void load(int j) {
    c[j] = ld_after_wait(reinterpret_cast<const uint2*>(frag + kQBlock * j));
    m[j] = ld_after_wait(meta + j);
  }
  // Stage 0 into the registers; the pointers then at stage 1 (stage 0 again when there is none: a
  // harmless valid reload).
  __device__ void start(const int8_t* f, const int2* mt, bool more) {
    frag = f, meta = mt;
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) load(j);
    if (more) next();
  }
  __device__ void next() { frag += kBlocks * kQBlock, meta += kBlocks; }
  __device__ uint2 codes(int, int j) const { return c[j]; }
  __device__ int2 m0(int, int j) const { return m[j]; }
  __device__ int2 m1(int, int j) const { return m[j]; }
  __device__ void consumed(int j) { load(j); }
};

// q4_0: a stage = 8 blocks of 18 bytes a row; per block one MMA a column tile with C = -8 sum(x),
// then acc += float(dot) * d_w * d_x.
template <int NT, bool kOneRow, class X>
__device__ __forceinline__ void q4_0_stage(const unsigned char* buf, int sb, int g, int c, X& x,
                                           float (&acc)[NT][4]) {
  constexpr int kBytes = UQR_Q4_0_BYTES;
  // At two column tiles, trips of 2 blocks: unrolled whole, the stage's x loads were all hoisted
  // and spilled (sm_80). At one, the whole stage: in trips of 4, one row spilled 4 bytes (sm_90a).
  // jt * U keeps j's parity (u32_in_block's load width) a compile-time constant.
  constexpr int U = NT == 1 ? 8 : 2;
#pragma unroll 1
  for (int jt = 0; jt < 8 / U; ++jt)
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int j = jt * U + u;
    const uint8_t* bg = buf + g * sb + j * kBytes;
    const uint32_t wg = u32_in_block(bg + 2 + 4 * c, j), wg8 = u32_in_block(bg + 8 * sb + 2 + 4 * c, j);
    const uint32_t a[4] = {wg & kLowNibbles, wg8 & kLowNibbles, (wg >> 4) & kLowNibbles, (wg8 >> 4) & kLowNibbles};
    const float dg = half_at(bg), dg8 = half_at(bg + 8 * sb);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const uint2 xv = x.codes(t, j);
      const int2 m0 = x.m0(t, j);
      const int2 m1 = kOneRow ? m0 : x.m1(t, j);
      const int zero[4] = {m0.y, m1.y, m0.y, m1.y};
      int dot[4];
      imma16832(dot, a, xv.x, xv.y, zero);
      const float d0 = __int_as_float(m0.x), d1 = __int_as_float(m1.x);
      acc[t][0] = fmaf(static_cast<float>(dot[0]), dg * d0, acc[t][0]);
      acc[t][2] = fmaf(static_cast<float>(dot[2]), dg8 * d0, acc[t][2]);
      if constexpr (!kOneRow) {
        acc[t][1] = fmaf(static_cast<float>(dot[1]), dg * d1, acc[t][1]);
        acc[t][3] = fmaf(static_cast<float>(dot[3]), dg8 * d1, acc[t][3]);
      }
    }
    x.consumed(j);
  }
}

// q4_k: a stage = one 144-byte super-block a row. Per sub-block j one MMA a column tile; its dot
// times the row's 6-bit scale, and the row's 6-bit min times the column's x sum, add up in
// integers over the 8 sub-blocks (|sum| < 8 * 63 * 61440 < 2^31); then acc += d_x (d I1 - dmin I2).
template <int NT, bool kOneRow, class X>
__device__ __forceinline__ void q4_k_stage(const unsigned char* buf, int sb, int g, int c, X& x,
                                           float (&acc)[NT][4]) {
  float d_x[NT][2];  // the columns' x scales: one a super-block, read before x.consumed() reloads it
#pragma unroll
  for (int t = 0; t < NT; ++t) d_x[t][0] = __int_as_float(x.m0(t, 0).x), d_x[t][1] = kOneRow ? 0.f : __int_as_float(x.m1(t, 0).x);
  const uint8_t* bg = buf + g * sb;
  const uint8_t* bg8 = bg + 8 * sb;
  uint32_t sc[2][2], mn[2][2];  // [row g / g + 8][sub-blocks 0-3 / 4-7], a byte per sub-block
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint8_t* s = (h ? bg8 : bg) + 4;
    const uint32_t w0 = u32_at4(s), w1 = u32_at4(s + 4), w2 = u32_at4(s + 8);
    uqr_q4_k_scale_min_words(w0, w1, w2, false, sc[h][0], mn[h][0]);
    uqr_q4_k_scale_min_words(w0, w1, w2, true, sc[h][1], mn[h][1]);
  }
  int dots[NT][4], mins[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int q = 0; q < 4; ++q) dots[t][q] = 0, mins[t][q] = 0;
  const int none[4] = {0, 0, 0, 0};
#pragma unroll
  for (int pair = 0; pair < 4; ++pair) {
    // qs[32 pair + i]: sub-block 2 pair's element i in the low nibble, 2 pair + 1's in the high.
    const int off = 16 + 32 * pair + 4 * c;
    const uint32_t lo_g = u32_at4(bg + off), hi_g = u32_at4(bg + off + 16);
    const uint32_t lo_g8 = u32_at4(bg8 + off), hi_g8 = u32_at4(bg8 + off + 16);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int j = 2 * pair + half, sh = 4 * half;
      const uint32_t a[4] = {(lo_g >> sh) & kLowNibbles, (lo_g8 >> sh) & kLowNibbles, (hi_g >> sh) & kLowNibbles,
                             (hi_g8 >> sh) & kLowNibbles};
      const uint32_t sel = 0x4440u | static_cast<uint32_t>(j & 3);  // byte j & 3, zero-extended
      const int s_g = static_cast<int>(__byte_perm(sc[0][j >> 2], 0, sel));
      const int s_g8 = static_cast<int>(__byte_perm(sc[1][j >> 2], 0, sel));
      const int m_g = static_cast<int>(__byte_perm(mn[0][j >> 2], 0, sel));
      const int m_g8 = static_cast<int>(__byte_perm(mn[1][j >> 2], 0, sel));
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const uint2 xv = x.codes(t, j);
        const int x0 = x.m0(t, j).y;
        int dot[4];
        imma16832(dot, a, xv.x, xv.y, none);
        dots[t][0] += s_g * dot[0];
        dots[t][2] += s_g8 * dot[2];
        mins[t][0] += m_g * x0;
        mins[t][2] += m_g8 * x0;
        if constexpr (!kOneRow) {
          const int x1 = x.m1(t, j).y;
          dots[t][1] += s_g * dot[1];
          dots[t][3] += s_g8 * dot[3];
          mins[t][1] += m_g * x1;
          mins[t][3] += m_g8 * x1;
        }
      }
      x.consumed(j);
    }
  }
  const uint32_t dd_g = u32_at4(bg), dd_g8 = u32_at4(bg8);
  const float d_w[2] = {__half2float(__ushort_as_half(static_cast<unsigned short>(dd_g & 0xFFFFu))),
                        __half2float(__ushort_as_half(static_cast<unsigned short>(dd_g8 & 0xFFFFu)))};
  const float dmin_w[2] = {__half2float(__ushort_as_half(static_cast<unsigned short>(dd_g >> 16))),
                           __half2float(__ushort_as_half(static_cast<unsigned short>(dd_g8 >> 16)))};
#pragma unroll
  for (int t = 0; t < NT; ++t) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (kOneRow && (q & 1)) continue;
      const int h = q >> 1;
      acc[t][q] = fmaf(d_x[t][q & 1],
                       fmaf(d_w[h], static_cast<float>(dots[t][q]), -dmin_w[h] * static_cast<float>(mins[t][q])),
                       acc[t][q]);
    }
  }
}

// -- One row, a block a column -------------------------------------------------------------------
// At one activation row, 7 of m16n8k32's 8 columns carry nothing in the stage functions above, and
// every MMA needs its block's scales applied after it. Here each of a lane quad's 4 k-slots takes
// the codes of a different block (q4_0: half a block, its low or its high nibbles; q4_k: one
// sub-block), and x enters B only in the column that belongs to that block - every other lane's B
// is zero - so D[row][n] accumulates block n's own integer dot product over several MMAs, and its
// scales are applied once per block and row instead of once per MMA. A lane's codes are then bytes
// of one block in order: 16-byte shared loads for q4_k, and x in element order. High nibbles enter
// as the byte masked (16 x code, a column of its own) and are divided by 16 exactly afterwards.
// Lane (g, c) holds D[g][2c], D[g][2c + 1] and rows g + 8's: lane c's low- and high-nibble columns.
//
// x: lane (2c, c) feeds column 2c (the low nibbles' x of lane c's block), lane (2c + 1, c) column
// 2c + 1 (the high nibbles'), 16 bytes a piece; the other 24 lanes keep zeros. Like XPipe, each
// piece is reloaded with the next stage's once its MMAs have been issued.
struct ColsX {
  const int8_t* frag;  // this lane's two pieces at the next stage: frag and frag + step
  const int4* meta;    // {d, sum} of lane c's blocks 2c and 2c + 1 at the next stage
  int step;
  bool lo_lane, hi_lane;
  uint4 lo[2] = {}, hi[2] = {};  // never loaded, so zero, in lanes that do not feed that column
  int4 m;
  // Piece i of the lanes feeding the low (lo_side) / high (hi_side) columns.
  __device__ void load(int i, bool lo_side = true, bool hi_side = true) {
    if (lo_side && lo_lane) lo[i] = ld_after_wait(reinterpret_cast<const uint4*>(frag + i * step));
    if (hi_side && hi_lane) hi[i] = ld_after_wait(reinterpret_cast<const uint4*>(frag + i * step));
  }
  __device__ void load_meta() { m = ld_after_wait(meta); }
  __device__ void start(const int8_t* f, const int4* mt, int st, int g, int c, bool more) {
    frag = f, meta = mt, step = st;
    lo_lane = g == 2 * c, hi_lane = g == 2 * c + 1;
    load(0), load(1), load_meta();
    if (more) next();
  }
  __device__ void next() { frag += 256, meta += 256 / (2 * kQBlock); }
};

template <int N>
__device__ __forceinline__ uint32_t word_of(const uint4 (&v)[N], int i) {
  const uint4& h = v[i >> 2];
  return (i & 3) == 0 ? h.x : (i & 3) == 1 ? h.y : (i & 3) == 2 ? h.z : h.w;
}
__device__ __forceinline__ uint4 lds16(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }

constexpr uint32_t kHighNibbles = 0xF0F0F0F0u;

// One MMA of the block-column kernels: code words w, w + 1 of rows g (r0) and g + 8 (r1) masked to
// their low or high nibbles, against x words xw, xw + 1.
template <int NR, int NX>
__device__ __forceinline__ void cols_mma(int (&d)[4], const uint4 (&r0)[NR], const uint4 (&r1)[NR], int w,
                                         uint32_t mask, const uint4 (&xs)[NX], int xw) {
  const uint32_t a[4] = {word_of(r0, w) & mask, word_of(r1, w) & mask, word_of(r0, w + 1) & mask,
                         word_of(r1, w + 1) & mask};
  imma16832(d, a, word_of(xs, xw), word_of(xs, xw + 1), d);
}

// q4_0, one row: two rounds of 4 MMAs, lane c taking block 2c + r in round r (so a round's blocks
// share their alignment: even ones start word-aligned, odd ones at 2 mod 4 with word-aligned codes).
__device__ __forceinline__ void q4_0_cols_stage(const unsigned char* buf, int sb, int g, int c, ColsX& x,
                                                float (&acc)[4]) {
  const int4 m = x.m;
  x.load_meta();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    uint4 q[2][1];
    float dw[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint8_t* blk = buf + (g + 8 * h) * sb + 36 * c + 18 * r;
      if (r == 0) {
        uint32_t w[5];
#pragma unroll
        for (int i = 0; i < 5; ++i) w[i] = u32_at4(blk + 4 * i);
        dw[h] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[0] & 0xFFFFu)));
        q[h][0] = make_uint4(__byte_perm(w[0], w[1], 0x5432), __byte_perm(w[1], w[2], 0x5432),
                             __byte_perm(w[2], w[3], 0x5432), __byte_perm(w[3], w[4], 0x5432));
      } else {
        dw[h] = half_at(blk);
        q[h][0] = make_uint4(u32_at4(blk + 2), u32_at4(blk + 6), u32_at4(blk + 10), u32_at4(blk + 14));
      }
    }
    const int zp = r ? m.w : m.y;
    const float dx = __int_as_float(r ? m.z : m.x);
    int d[4] = {zp, 0, zp, 0};
#pragma unroll
    for (int j = 0; j < 2; ++j) cols_mma(d, q[0], q[1], 2 * j, kLowNibbles, x.lo, 4 * r + 2 * j);
#pragma unroll
    for (int j = 0; j < 2; ++j) cols_mma(d, q[0], q[1], 2 * j, kHighNibbles, x.hi, 4 * r + 2 * j);
    x.load(r);
    acc[0] = fmaf(static_cast<float>(d[0] + (d[1] >> 4)), dw[0] * dx, acc[0]);
    acc[2] = fmaf(static_cast<float>(d[2] + (d[3] >> 4)), dw[1] * dx, acc[2]);
  }
}

// q4_k, one row: lane c takes qs[32c..32c+31] of a super-block row, sub-block 2c in its low nibbles
// (4 MMAs) and 2c + 1 in its high (4 MMAs); the 6-bit scales multiply the two integer dots once.
__device__ __forceinline__ void q4_k_cols_stage(const unsigned char* buf, int sb, int g, int c, ColsX& x,
                                                float (&acc)[4]) {
  uint4 qv[2][2];
  uint4 head[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint8_t* row = buf + (g + 8 * h) * sb;
    head[h] = lds16(row);
    qv[h][0] = lds16(row + 16 + 32 * c);
    qv[h][1] = lds16(row + 32 + 32 * c);
  }
  int d[4] = {0, 0, 0, 0};
#pragma unroll
  for (int j = 0; j < 4; ++j) cols_mma(d, qv[0], qv[1], 2 * j, kLowNibbles, x.lo, 2 * j);
  x.load(0, true, false), x.load(1, true, false);
#pragma unroll
  for (int j = 0; j < 4; ++j) cols_mma(d, qv[0], qv[1], 2 * j, kHighNibbles, x.hi, 2 * j);
  x.load(0, false, true), x.load(1, false, true);
  const int4 m = x.m;
  x.load_meta();
  // Sub-blocks 2c and 2c + 1: bytes 2 (c & 1) and 2 (c & 1) + 1 of the lower (c < 2) or upper words.
  const uint32_t sel = 0x4440u | static_cast<uint32_t>(2 * (c & 1));
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t sc_lo, mn_lo, sc_up, mn_up;
    uqr_q4_k_scale_min_words(head[h].y, head[h].z, head[h].w, false, sc_lo, mn_lo);
    uqr_q4_k_scale_min_words(head[h].y, head[h].z, head[h].w, true, sc_up, mn_up);
    const uint32_t sc = c < 2 ? sc_lo : sc_up, mn = c < 2 ? mn_lo : mn_up;
    const int i1 = static_cast<int>(__byte_perm(sc, 0, sel)) * d[2 * h] +
                   static_cast<int>(__byte_perm(sc, 0, sel + 1)) * (d[2 * h + 1] >> 4);
    const int i2 = static_cast<int>(__byte_perm(mn, 0, sel)) * m.y + static_cast<int>(__byte_perm(mn, 0, sel + 1)) * m.w;
    const float d_w = __half2float(__ushort_as_half(static_cast<unsigned short>(head[h].x & 0xFFFFu)));
    const float dmin_w = __half2float(__ushort_as_half(static_cast<unsigned short>(head[h].x >> 16)));
    acc[2 * h] = fmaf(__int_as_float(m.x), fmaf(d_w, static_cast<float>(i1), -dmin_w * static_cast<float>(i2)),
                      acc[2 * h]);
  }
}

// mlx4, one row. A code byte holds element 2i (low nibble) and 2i + 1 (high), so the low-nibble
// column is the group's even elements and the high one its odd elements (x in that order, the
// pre-pass's kCols), and a group's dot takes scale and bias once: y += d_x (scale dot + bias sum).
// g = 64: lane c takes group c of a stage (32 code bytes, as q4_k's sub-block pair); g = 32: block
// 2c + r in round r (16 code bytes, as q4_0).
template <int G>
__device__ __forceinline__ void mlx4_cols_stage(const unsigned char* buf, int sb, int g, int c, ColsX& x,
                                                float (&acc)[4]) {
  static_assert(G == 32 || G == 64, "the block-column kernel's stage is 256 elements");
  constexpr int kBytes = 4 + G / 2, kRounds = G == 32 ? 2 : 1, kWords = G / 8;
  const int4 m = x.m;
  x.load_meta();
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    uint4 q[2][kWords / 4];
    uint32_t head[2];  // scale (low half), bias (high half)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint8_t* blk = buf + (g + 8 * h) * sb + (kRounds * c + r) * kBytes;
      head[h] = u32_at4(blk);
#pragma unroll
      for (int i = 0; i < kWords / 4; ++i)
        q[h][i] = make_uint4(u32_at4(blk + 4 + 16 * i), u32_at4(blk + 8 + 16 * i), u32_at4(blk + 12 + 16 * i),
                             u32_at4(blk + 16 + 16 * i));
    }
    int d[4] = {0, 0, 0, 0};
    // x words of this round: piece r at g = 32 (as q4_0), pieces 0 and 1 at 64 (as q4_k).
#pragma unroll
    for (int j = 0; j < kWords / 2; ++j) cols_mma(d, q[0], q[1], 2 * j, kLowNibbles, x.lo, 4 * r + 2 * j);
    if (G == 64) x.load(0, true, false), x.load(1, true, false);
#pragma unroll
    for (int j = 0; j < kWords / 2; ++j) cols_mma(d, q[0], q[1], 2 * j, kHighNibbles, x.hi, 4 * r + 2 * j);
    if (G == 64) x.load(0, false, true), x.load(1, false, true);
    else x.load(r);
    const float dx = __int_as_float(r ? m.z : m.x);
    const float sx = static_cast<float>(r ? m.w : m.y);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float scale = __half2float(__ushort_as_half(static_cast<unsigned short>(head[h] & 0xFFFFu)));
      const float bias = __half2float(__ushort_as_half(static_cast<unsigned short>(head[h] >> 16)));
      acc[2 * h] = fmaf(dx, fmaf(scale, static_cast<float>(d[2 * h] + (d[2 * h + 1] >> 4)), bias * sx), acc[2 * h]);
    }
  }
}

// ternary, one row: rounds as q4_0's (lane c takes block 2c + r: d, padding, two code words). A code
// byte holds 4 elements, 2 bits each; the byte masked to one of the 4 places (code x 4^t, t = the
// place) is an MMA operand of its own, so the 4 classes go to 4 columns - lo and hi of two
// accumulators - and are divided back exactly afterwards. The -1 of t = code - 1 is C's -sum(x).
__device__ __forceinline__ void ternary_cols_stage(const unsigned char* buf, int sb, int g, int c, ColsX& x,
                                                   float (&acc)[4]) {
  const int4 m = x.m;
  x.load_meta();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    uint4 q[2][1];
    float dw[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint8_t* blk = buf + (g + 8 * h) * sb + 12 * (2 * c + r);
      dw[h] = half_at(blk);
      // invalid code 3 read as 1, a zero trit (formats.h)
      q[h][0] = make_uint4(uqr_ternary_canonical_codes(u32_at4(blk + 4)),
                           uqr_ternary_canonical_codes(u32_at4(blk + 8)), 0u, 0u);
    }
    const int zp = r ? m.w : m.y;
    int d1[4] = {zp, 0, zp, 0}, d2[4] = {0, 0, 0, 0};
    cols_mma(d1, q[0], q[1], 0, 0x03030303u, x.lo, 4 * r);
    cols_mma(d1, q[0], q[1], 0, 0x0C0C0C0Cu, x.hi, 4 * r);
    cols_mma(d2, q[0], q[1], 0, 0x30303030u, x.lo, 4 * r + 2);
    cols_mma(d2, q[0], q[1], 0, 0xC0C0C0C0u, x.hi, 4 * r + 2);
    x.load(r);
    const float dx = __int_as_float(r ? m.z : m.x);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int dot = d1[2 * h] + (d1[2 * h + 1] >> 2) + (d2[2 * h] >> 4) + (d2[2 * h + 1] >> 6);
      acc[2 * h] = fmaf(static_cast<float>(dot), dw[h] * dx, acc[2 * h]);
    }
  }
}

// Signed A (exl3's codebook values) times signed x: m16n8k32, s8 x s8 -> s32.
__device__ __forceinline__ void imma16832_ss(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four B-bit fields at bits 0, B, 2B, 3B (B <= 5) into bytes 0..3: the upper pair moved to bit 16,
// then each pair's second field to its byte, then masked (keep = the B-bit mask in every byte).
// Shift amounts are per lane (rows have their own depths), so no branch.
__device__ __forceinline__ uint32_t fields_to_bytes(uint32_t v, uint32_t B, uint32_t keep) {
  const uint32_t u = __byte_perm(v, v << (16u - 2u * B), 0x7610);
  return __byte_perm(u, u << (8u - B), 0x7250) & keep;
}

// var_affine, one row: lane c takes sub-blocks 2c (column 2c, x.lo) and 2c + 1 (column 2c + 1,
// x.hi) of a super-block row, 4 MMAs each. Sub-block j's 32 codes start at word o_j = B_0 + ... +
// B_{j-1} of qs, and MMA i's 8 codes (elements 8i..8i+7, 8B <= 40 bits from bit 8iB) lie within
// two words (8iB mod 32 is 0, 8, 16 or 24, and 24 + 40 <= 64). x's scale spans the
// super-block, so the two sub-blocks' dots times their scale multipliers add up in integers (|.| <
// 2 * 255 * 32 * 31 * 127 < 2^31) and floats appear once per row and stage:
// y += d_x (d I1 + bias I2), I1 = s_2c dot_2c + s_2c+1 dot_2c+1, I2 = b_2c sum_2c + b_2c+1 sum_2c+1.
__device__ __forceinline__ void var_affine_cols_stage(const unsigned char* buf, int sb, int g, int c, ColsX& x,
                                                      float (&acc)[4]) {
  const int4 m = x.m;
  x.load_meta();
  uint4 head[2][2];  // [row g / g + 8]: {d, bias, scales[0..7], biases[0..3]}, {biases[4..7], modes[0..7], pad}
  const uint32_t* qs[2];
  uint32_t B[2][2], o[2][2];  // [row][sub-block 2c / 2c + 1]: depth and first word
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint8_t* row = buf + (g + 8 * h) * sb;
    head[h][0] = lds16(row);
    head[h][1] = lds16(row + 16);
    qs[h] = reinterpret_cast<const uint32_t*>(row + UQR_VAR_AFFINE_QS);
    // Depths one a byte; times 0x01010101 byte i holds the running sum to i (at most 20: no carries).
    const uint32_t m0 = var_affine_depths(head[h][1].y), m1 = var_affine_depths(head[h][1].z);
    const uint32_t p0 = m0 * 0x01010101u, p1 = m1 * 0x01010101u;
    const uint32_t mine = c < 2 ? m0 : m1, sums = c < 2 ? p0 : p1, sh = 16u * static_cast<uint32_t>(c & 1);
    B[h][0] = (mine >> sh) & 0xFFu;
    B[h][1] = (mine >> (sh + 8u)) & 0xFFu;
    // Words before sub-block 2c: the running sum up to 2c - 1 within its half, plus the first half's.
    o[h][0] = ((sums << 8) >> sh & 0xFFu) + (c < 2 ? 0u : p0 >> 24);
    o[h][1] = o[h][0] + B[h][0];
    // First words clamped so each sub-block's B words end inside qs, whatever the modes hold.
    o[h][0] = min(o[h][0], 32u - B[h][0]);
    o[h][1] = min(o[h][1], 32u - B[h][1]);
  }
  int d[4] = {0, 0, 0, 0};
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    // MMA i's codes start at bit 8iB: word i (B = 4, 5) or i - 1 (B = 3, i > 0), at bit (8i (B - 4))
    // mod 32 of it. So each k-step's two words are loads at constant offsets from one of two
    // pointers, and only the bit offset is computed. Reads may pass qs's last word by one (its
    // codes never need it): the ring has slack behind its last slot (kRingSlack).
    const uint32_t* base[2];
    const uint32_t* back[2];
    uint32_t keep[2], step[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t b = B[h][half];
      base[h] = qs[h] + o[h][half];
      back[h] = base[h] - (b == 3u ? 1 : 0);
      keep[h] = ((1u << b) - 1u) * 0x01010101u;
      step[h] = 8u * b - 32u;  // 8 (B - 4) mod 2^32
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t a[4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t b = B[h][half];
        const uint32_t* wp = i == 0 ? base[h] : back[h] + i;
        const uint32_t w0 = wp[0], w1 = wp[1], off = (static_cast<uint32_t>(i) * step[h]) & 31u;
        const uint32_t lo = __funnelshift_r(w0, w1, off);  // elements 8i.. from bit 0 (>= 4B bits)
        const uint32_t hi = __funnelshift_r(lo, w1 >> off, 4u * b);  // elements 8i + 4.. (bits past 32 from w1)
        a[h] = fields_to_bytes(lo, b, keep[h]);
        a[2 + h] = fields_to_bytes(hi, b, keep[h]);
      }
      if (half == 0) imma16832(d, a, word_of(x.lo, 2 * i), word_of(x.lo, 2 * i + 1), d);
      else imma16832(d, a, word_of(x.hi, 2 * i), word_of(x.hi, 2 * i + 1), d);
    }
    if (half == 0) x.load(0, true, false), x.load(1, true, false);
    else x.load(0, false, true), x.load(1, false, true);
  }
  const uint32_t sel = 0x4440u | static_cast<uint32_t>(2 * (c & 1));  // byte 2 (c & 1), zero-extended
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t sc = c < 2 ? head[h][0].y : head[h][0].z, bs = c < 2 ? head[h][0].w : head[h][1].x;
    const int i1 = static_cast<int>(__byte_perm(sc, 0, sel)) * d[2 * h] +
                   static_cast<int>(__byte_perm(sc, 0, sel + 1)) * d[2 * h + 1];
    const int i2 = static_cast<int>(__byte_perm(bs, 0, sel)) * m.y + static_cast<int>(__byte_perm(bs, 0, sel + 1)) * m.w;
    const float d_w = __half2float(__ushort_as_half(static_cast<unsigned short>(head[h][0].x & 0xFFFFu)));
    const float bias = __half2float(__ushort_as_half(static_cast<unsigned short>(head[h][0].x >> 16)));
    acc[2 * h] = fmaf(__int_as_float(m.x), fmaf(d_w, static_cast<float>(i1), bias * static_cast<float>(i2)), acc[2 * h]);
  }
}

// exl3, one row: as var_affine's lanes and columns, but a code is an index into the block's two
// tables, so each sub-block takes two MMAs a k-step, one with A = P[k] and one with A = R[k] (signed
// bytes, looked up 4 at a time by a PRMT of the 8-byte table with the codes as selector nibbles),
// into two accumulators that the sub-blocks' s_j and r_j weigh in integers (|.| < 4 * 255 * 32 *
// 128 * 127 < 2^31): y += d_x (d I + bias S), S the super-block's x code sum (the four lanes' m.y +
// m.w). The levels are never rounded, where the exact kernel rounds each to bf16 / fp16.
__device__ __forceinline__ void exl3_cols_stage(const unsigned char* buf, int sb, int g, int c, ColsX& x,
                                                float (&acc)[4]) {
  const int4 m = x.m;
  x.load_meta();
  // Per row only what the end needs: {d, bias}, and lane c's scale and residual bytes' words.
  uint32_t dd[2], sc[2], rs[2], P[2][2], R[2][2];
  const uint2* qp[2];  // qs bytes 24c .. 24c + 23: sub-blocks 2c and 2c + 1, 3 words each
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint8_t* row = buf + (g + 8 * h) * sb;
    const uint4 head = lds16(row), mid = lds16(row + 16);
    dd[h] = head.x;
    sc[h] = c < 2 ? head.y : head.z;
    rs[h] = c < 2 ? head.w : mid.x;
    P[h][0] = mid.y, P[h][1] = mid.z, R[h][0] = mid.w, R[h][1] = u32_at4(row + 32);
    qp[h] = reinterpret_cast<const uint2*>(row + UQR_EXL3_QS + 24 * c);
  }
  int dp[4] = {0, 0, 0, 0}, dr[4] = {0, 0, 0, 0};
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    uint32_t q[2][3];  // this sub-block's 96 bits, rows g and g + 8
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint2 v0 = qp[h][0], v1 = qp[h][1], v2 = qp[h][2];
      if (half == 0) q[h][0] = v0.x, q[h][1] = v0.y, q[h][2] = v1.x;
      else q[h][0] = v1.y, q[h][1] = v2.x, q[h][2] = v2.y;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t ap[4], ar[4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t* w = q[h];
        // 8 codes (24 bits) of k-steps 8i..8i+7 from bit 24i of the sub-block's 96.
        const uint32_t v = i == 0 ? w[0] : i == 1 ? __funnelshift_r(w[0], w[1], 24) : i == 2 ? __funnelshift_r(w[1], w[2], 16) : w[2] >> 8;
        // 3-bit codes at 3e -> nibble e (a PRMT selector: byte index 0..7, bit 3 clear): codes 0-3
        // and 4-7 to the two halves, then each byte's pair, then each pair's second to bit 4.
        const uint32_t u = __byte_perm(v, v << 4, 0x7610);
        const uint32_t t = __byte_perm(u, u << 2, 0x7250);
        const uint32_t sel = ((t & 0x07070707u) | ((t << 1) & 0x70707070u));
        ap[h] = __byte_perm(P[h][0], P[h][1], sel);
        ap[2 + h] = __byte_perm(P[h][0], P[h][1], sel >> 16);
        ar[h] = __byte_perm(R[h][0], R[h][1], sel);
        ar[2 + h] = __byte_perm(R[h][0], R[h][1], sel >> 16);
      }
      const uint32_t b0 = half ? word_of(x.hi, 2 * i) : word_of(x.lo, 2 * i);
      const uint32_t b1 = half ? word_of(x.hi, 2 * i + 1) : word_of(x.lo, 2 * i + 1);
      imma16832_ss(dp, ap, b0, b1);
      imma16832_ss(dr, ar, b0, b1);
    }
    if (half == 0) x.load(0, true, false), x.load(1, true, false);
    else x.load(0, false, true), x.load(1, false, true);
  }
  const uint32_t sel = 0x4440u | static_cast<uint32_t>(2 * (c & 1));
  const float sx = static_cast<float>(m.y + m.w);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int I = static_cast<int>(__byte_perm(sc[h], 0, sel)) * dp[2 * h] +
                  static_cast<int>(__byte_perm(sc[h], 0, sel + 1)) * dp[2 * h + 1] +
                  static_cast<int>(__byte_perm(rs[h], 0, sel)) * dr[2 * h] +
                  static_cast<int>(__byte_perm(rs[h], 0, sel + 1)) * dr[2 * h + 1];
    const float d_w = __half2float(__ushort_as_half(static_cast<unsigned short>(dd[h] & 0xFFFFu)));
    const float bias = __half2float(__ushort_as_half(static_cast<unsigned short>(dd[h] >> 16)));
    acc[2 * h] = fmaf(__int_as_float(m.x), fmaf(d_w, static_cast<float>(I), bias * sx), acc[2 * h]);
  }
}

// One activation row stages its x through the weight ring (codes and meta of the stage behind its
// weights, 320 bytes): x operands are then shared-memory loads, which pays where few warps hide the
// L2 latency of global loads (N = 4096: 256 CTAs). Same build, 1 row, staged
// vs global, us: 4096 x 14336 q4_0 18.1 vs 21.4, q4_k 18.1 vs 19.7; 14336 x 4096 17.7 vs 17.2,
// 16.7 vs 16.4. At more rows the copy costs shared memory and so occupancy (16 rows on 14336 x
// 4096: q4_0 56.5 vs 40.2 global), so they read global memory.
template <int FMT, bool kXRing>
struct SlotLayout {
  using Ring = RowRing<KeyTraits<FMT>>;
  static constexpr int kCodes = Ring::kSlotBytes;
  static constexpr int kMeta = kCodes + Ring::kStageElems;
  static constexpr int kBytes = kXRing ? kMeta + Ring::kStageElems / kQBlock * static_cast<int>(sizeof(int2))
                                       : Ring::kSlotBytes;
  static constexpr int kCodePieces = Ring::kStageElems / 16, kXPieces = kCodePieces + Ring::kStageElems / 64;
  static_assert(kCodes % 16 == 0 && kMeta % 16 == 0 && kBytes % 16 == 0 && kXPieces <= 32, "16-byte copies");
};

template <int FMT, typename T, int NT, bool kOneRow, bool kXRing, bool kXPipe = false, bool kCols = false>
__device__ __forceinline__ void int8_gemm(const Int8Args& a) {
  static_assert(!kXRing || kOneRow, "only one activation row is staged");
  static_assert(!kXPipe || (kOneRow && NT == 1 && !kXRing), "one row's global x is pipelined");
  static_assert(!kCols || (kOneRow && NT == 1 && !kXRing && !kXPipe), "block columns are a one-row kernel");
  using Ring = RowRing<KeyTraits<FMT>>;
  static_assert(Ring::kStageElems == XPipe::kBlocks * kQBlock, "a stage is XPipe's 8 blocks");
  using L = SlotLayout<FMT, kXRing>;
  extern __shared__ __align__(16) unsigned char smem[];
  const uqr_gemm_params& p = a.p;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int row0 = blockIdx.x * kWarpRows;
  unsigned char* ring = smem + static_cast<size_t>(warp) * kStages * L::kBytes;

  const int n_stages = p.K / Ring::kStageElems;
  const int warps_k = blockDim.x >> 5;
  const int s0 = n_stages * warp / warps_k, s1 = n_stages * (warp + 1) / warps_k;
  const int n_mine = s1 - s0;
  const Ring wr(a.w, a.w_row_stride, row0, p.N, s0, lane);
  const int k0 = s0 * Ring::kStageElems, nb = p.K / kQBlock;
  // kXRing: row 0's x of stage i into slot, one 16-byte piece a lane (codes, then meta).
  auto copy_x = [&](unsigned char* slot, int i) {
    const int k = k0 + i * Ring::kStageElems;
    if (lane < L::kCodePieces)
      cp_async16(slot + L::kCodes + 16 * lane, a.xq + k + 16 * lane);
    else if (lane < L::kXPieces)
      cp_async16(slot + L::kMeta + 16 * (lane - L::kCodePieces),
                 reinterpret_cast<const unsigned char*>(a.xm + k / kQBlock) + 16 * (lane - L::kCodePieces));
  };
  int slot_in = 0;
  auto issue = [&](int i, bool with_x) {
    if (i < n_mine) {
      wr.copy(ring + slot_in * L::kBytes, i, lane);
      if (kXRing && with_x) copy_x(ring + slot_in * L::kBytes, i);
    }
    slot_in = slot_in == kStages - 1 ? 0 : slot_in + 1;
    cp_async_commit();  // empty groups keep wait_group's count uniform
  };

  // Columns past the last activation row re-read row 0 (never stored).
  XLanes<NT, kXRing> x;
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const int rf = t * 8 + g < a.rows ? t * 8 + g : 0;
    const int r0 = t * 8 + 2 * c < a.rows ? t * 8 + 2 * c : 0;
    const int r1 = t * 8 + 2 * c + 1 < a.rows ? t * 8 + 2 * c + 1 : 0;
    x.frag[t] = a.xq + static_cast<int64_t>(rf) * p.K + k0 + 8 * c;
    x.meta0[t] = a.xm + static_cast<int64_t>(r0) * nb + k0 / kQBlock;
    x.meta1[t] = a.xm + static_cast<int64_t>(r1) * nb + k0 / kQBlock;
  }

  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[t][q] = 0.f;

  // Prologue, with Hopper's programmatic dependent launch (cuda_common.cuh): the kernel starts
  // while the quantize pre-pass runs, copies the first stages' weights (the pre-pass waited for
  // everything before it, so they are final) and then waits for the pre-pass's x (staged: those
  // stages' x copies, all landed before the loop, whose wait_group then covers the stages it issues
  // itself). 1 row on 14336 x 4096, without the dependent launch vs with: q4_k 18.4 -> 16.8
  // us, q4_0 18.3 -> 17.5.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s, false);
  pdl_wait();
  if constexpr (kXRing) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s)
      if (s < n_mine) copy_x(ring + s * L::kBytes, s);
    cp_async_commit();
    cp_async_wait<0>();
    __syncwarp();
  }
  XPipe xp;
  if constexpr (kXPipe) xp.start(x.frag[0], x.meta0[0], n_mine > 1);
  ColsX xc;
  // x pieces: q4_k / mlx4 g = 64, lane c's 64 elements of a stage, lanes 2c and 2c + 1 a half each
  // (sub-block 2c / 2c + 1; even / odd elements), in 16-byte steps; q4_0 / mlx4 g = 32, half g & 1 of
  // block 2c + r, a block (32 bytes) apart.
  constexpr bool kQuadOfBlocks = super_block_x(FMT) || FMT == mlx4_key<64>();
  if constexpr (kCols)
    xc.start(a.xq + k0 + (kQuadOfBlocks ? 32 * g : 64 * c + 16 * (g & 1)),
             reinterpret_cast<const int4*>(a.xm + k0 / kQBlock + 2 * c), kQuadOfBlocks ? 16 : 32, g, c, n_mine > 1);
  auto stage = [&](const unsigned char* buf, auto& xs) {
    if constexpr (kCols) {
      if constexpr (FMT == UQR_Q4_0) q4_0_cols_stage(buf, Ring::kStageBytes, g, c, xs, acc[0]);
      else if constexpr (FMT == UQR_Q4_K) q4_k_cols_stage(buf, Ring::kStageBytes, g, c, xs, acc[0]);
      else if constexpr (FMT == UQR_TERNARY) ternary_cols_stage(buf, Ring::kStageBytes, g, c, xs, acc[0]);
      else if constexpr (FMT == UQR_VAR_AFFINE) var_affine_cols_stage(buf, Ring::kStageBytes, g, c, xs, acc[0]);
      else if constexpr (FMT == UQR_EXL3) exl3_cols_stage(buf, Ring::kStageBytes, g, c, xs, acc[0]);
      else mlx4_cols_stage<mlx4_group(FMT)>(buf, Ring::kStageBytes, g, c, xs, acc[0]);
    } else if constexpr (FMT == UQR_Q4_0) {
      q4_0_stage<NT, kOneRow>(buf, Ring::kStageBytes, g, c, xs, acc);
    } else {
      q4_k_stage<NT, kOneRow>(buf, Ring::kStageBytes, g, c, xs, acc);
    }
  };
  int slot_out = 0;
  for (int i = 0; i < n_mine; ++i) {
    issue(i + kStages - 1, true);
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const unsigned char* buf = ring + slot_out * L::kBytes;
    slot_out = slot_out == kStages - 1 ? 0 : slot_out + 1;
    if constexpr (kXRing) {
      x.frag[0] = reinterpret_cast<const int8_t*>(buf + L::kCodes) + 8 * c;
      x.meta0[0] = reinterpret_cast<const int2*>(buf + L::kMeta);
    }
    if constexpr (kCols) {
      stage(buf, xc);
      if (i + 2 < n_mine) xc.next();
    } else if constexpr (kXPipe) {
      stage(buf, xp);
      if (i + 2 < n_mine) xp.next();
    } else {
      stage(buf, x);
      if constexpr (!kXRing) x.advance(Ring::kStageElems);
    }
    __syncwarp();  // the slot is refilled by the next iteration's issue
  }
  float total[NT][4];
  if (!ksplit::drain_and_sum<NT>(acc, reinterpret_cast<float*>(smem), warp, warps_k, lane, total)) return;
  if constexpr (kCols) {  // a row's blocks were spread over its lane quad; lane c = 0 stores
#pragma unroll
    for (int q = 0; q < 4; q += 2) {
      total[0][q] += __shfl_xor_sync(0xFFFFFFFFu, total[0][q], 1);
      total[0][q] += __shfl_xor_sync(0xFFFFFFFFu, total[0][q], 2);
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int q = 0; q < 4; ++q)
      if (!kOneRow || !(q & 1)) store_acc<T>(p, a.y, a.rows, row0, 0, g, c, t, q, total[t][q]);
}

// x read from global memory: registers as ptxas chooses (a cap makes it take the whole budget, and
// fewer resident warps measured slower: 72-80 registers against 40-64, q4_k 18.1 vs 16.8 us at
// one row on 14336 x 4096).
template <int FMT, typename T, int NT, bool kOneRow, bool kXPipe, bool kCols = false>
__global__ void __launch_bounds__(ksplit::kMaxWarps * 32) qmma_int8_kernel(const Int8Args a) {
  int8_gemm<FMT, T, NT, kOneRow, false, kXPipe, kCols>(a);
}
// One row with x staged: left to itself ptxas settled q4_k at 64 registers with a 4-byte spill
// (sm_90a), and q4_0 spilled at a cap of 72; 80 is spill-free for both. (A function of FMT because
// nvcc refuses a literal __maxnreg__ beside __launch_bounds__; a dependent value passes, as in
// qmma_small_m.cu.)
template <int FMT>
__host__ __device__ constexpr int staged_max_regs() { return 80; }
template <int FMT, typename T>
__global__ void __launch_bounds__(ksplit::kMaxWarps * 32) __maxnreg__((staged_max_regs<FMT>())) qmma_int8_kernel_staged(const Int8Args a) {
  int8_gemm<FMT, T, 1, true, true>(a);
}

// The kernel of one variant, and its residency (resident CTAs an SM at 1-8 K-splitting warps, for
// the plan's warps; its first call lets the kernel take the opt-in shared memory).
template <int FMT, typename T, int NT, bool kOneRow, bool kXRing = false, bool kXPipe = false, bool kCols = false>
struct Tiles {
  static constexpr int kNT = NT;
  static constexpr bool kRow = kOneRow, kRing = kXRing, kPipe = kXPipe, kColsV = kCols;
  using Ring = RowRing<KeyTraits<FMT>>;
  using L = SlotLayout<FMT, kXRing>;
  static constexpr auto kernel() {  // only the variant asked for is instantiated (mlx4 has no staged form)
    if constexpr (kXRing) return qmma_int8_kernel_staged<FMT, T>;
    else return qmma_int8_kernel<FMT, T, NT, kOneRow, kXPipe, kCols>;
  }
  static size_t ring_bytes(int w) { return static_cast<size_t>(w) * kStages * L::kBytes + kRingSlack; }
  static const ksplit::Residency& residency() {
    static const ksplit::Residency res = ksplit::residency_of(kernel(), ring_bytes);
    return res;
  }
};

template <int FMT, typename T, int NT, bool kOneRow, bool kXRing = false, bool kXPipe = false, bool kCols = false>
cudaError_t launch_tiles(const Int8Args& a, cudaStream_t stream, const Int8Plan& plan) {
  using V = Tiles<FMT, T, NT, kOneRow, kXRing, kXPipe, kCols>;
  const ksplit::Residency& res = V::residency();
  if (res.err != cudaSuccess) return res.err;
  const int grid = (a.p.N + kWarpRows - 1) / kWarpRows;
  const int warps = plan.warps;
  const size_t ring = V::ring_bytes(warps);
  const size_t red = static_cast<size_t>(warps - 1) * NT * 4 * 32 * sizeof(float);
  return launch_ex(V::kernel(), dim3(grid), dim3(warps * 32),
                   ksplit::capped_smem(ring > red ? ring : red, grid, ksplit::fit_of(res, warps), plan.smem_cap), stream,
                   plan.pdl, a);
}

// No other int8 kernel for these formats than the one-row block-column one.
constexpr bool cols_only(int fmt) {
  return is_mlx4(fmt) || fmt == UQR_TERNARY || fmt == UQR_VAR_AFFINE || fmt == UQR_EXL3;
}

// The variants of one activation row (the plan's choice, dispatch.py): block columns (ColsX, the
// default for q4_0 / q4_k); else x staged through the ring (SlotLayout) where the grid has fewer
// than 4 CTAs of 16 rows an SM (N = 4096: 256); else x read from global memory a stage ahead in
// registers (XPipe), or without that.
template <int FMT, typename T, class Fn>
cudaError_t with_variant(int rows, int variant, Fn&& fn) {
  if (variant == kInt8Cols) return fn(Tiles<FMT, T, 1, true, false, false, true>{});
  if constexpr (cols_only(FMT)) {
    return cudaErrorInvalidValue;  // int8_plan_invalid: one row only, in block columns
  } else {
    if (rows == 1) {
      if (variant == kInt8XRing) return fn(Tiles<FMT, T, 1, true, true>{});
      if (variant == kInt8XPipe) return fn(Tiles<FMT, T, 1, true, false, true>{});
      return fn(Tiles<FMT, T, 1, true, false>{});
    }
    return rows <= 8 ? fn(Tiles<FMT, T, 1, false>{}) : fn(Tiles<FMT, T, 2, false>{});
  }
}

template <int FMT, typename T>
cudaError_t run(const Int8Args& a, const T* x, int8_t* xq, int2* xm, cudaStream_t stream, const Int8Plan& plan) {
  const int64_t threads = static_cast<int64_t>(a.rows) * (a.p.K / 8);
  const bool cols = plan.variant == kInt8Cols;
  const auto quantize = [cols] {  // only the code orders a format's kernels read are instantiated
    if constexpr (cols_only(FMT)) return quantize_x_kernel<T, FMT, true>;
    else return cols ? quantize_x_kernel<T, FMT, true> : quantize_x_kernel<T, FMT, false>;
  }();
  if (const cudaError_t e = launch_ex(quantize, dim3(static_cast<unsigned>((threads + 255) / 256)), dim3(256), 0,
                                     stream, plan.pdl, a.p, x, a.rows, xq, xm);
      e != cudaSuccess)
    return e;
  return with_variant<FMT, T>(a.rows, plan.variant, [&](auto v) {
    using V = decltype(v);
    return launch_tiles<FMT, T, V::kNT, V::kRow, V::kRing, V::kPipe, V::kColsV>(a, stream, plan);
  });
}

// Calls fn(std::integral_constant<int, key>) for p's format key (mlx4: by group).
template <class Fn>
cudaError_t with_key(const uqr_gemm_params& p, Fn&& fn) {
  if (p.fmt == UQR_Q4_0) return fn(std::integral_constant<int, UQR_Q4_0>{});
  if (p.fmt == UQR_Q4_K) return fn(std::integral_constant<int, UQR_Q4_K>{});
  if (p.fmt == UQR_TERNARY) return fn(std::integral_constant<int, UQR_TERNARY>{});
  if (p.fmt == UQR_VAR_AFFINE) return fn(std::integral_constant<int, UQR_VAR_AFFINE>{});
  if (p.fmt == UQR_EXL3) return fn(std::integral_constant<int, UQR_EXL3>{});
  return p.group_size == 32 ? fn(std::integral_constant<int, mlx4_key<32>()>{})
                            : fn(std::integral_constant<int, mlx4_key<64>()>{});
}

}  // namespace

const char* int8_unsupported(const uqr_gemm_params& p, int rows, bool half_x, uintptr_t x_addr, uintptr_t w_addr,
                             int64_t w_row_stride) {
  if (p.fmt != UQR_Q4_0 && p.fmt != UQR_Q4_K && p.fmt != UQR_MLX4 && p.fmt != UQR_TERNARY &&
      p.fmt != UQR_VAR_AFFINE && p.fmt != UQR_EXL3)
    return "int8 activations are implemented for q4_0, q4_k, mlx4, ternary, var_affine and exl3";
  if (rows < 1 || rows > kInt8MaxRows) return "batch * M must be 1..16";
  if (p.fmt == UQR_MLX4 && (rows != 1 || (p.group_size != 32 && p.group_size != 64)))
    return "int8 activations for mlx4 take one activation row and group size 32 or 64";
  if ((p.fmt == UQR_TERNARY || p.fmt == UQR_VAR_AFFINE || p.fmt == UQR_EXL3) && rows != 1)
    return "int8 activations for ternary, var_affine and exl3 take one activation row";
  return qmma_unsupported(p, rows, half_x, x_addr, w_addr, w_row_stride, false);
}

const char* int8_plan_invalid(const uqr_gemm_params& p, int rows, const Int8Plan& plan) {
  if (!ksplit::valid_warps(plan.warps)) return "warps must be 1, 2, 4 or 8";
  if (plan.variant < kInt8Tiles || plan.variant > kInt8Cols) return "unknown int8 kernel variant";
  if (rows != 1 && plan.variant != kInt8Tiles) return "the one-row int8 variants take one activation row";
  const bool only_cols = p.fmt == UQR_MLX4 || p.fmt == UQR_TERNARY || p.fmt == UQR_VAR_AFFINE || p.fmt == UQR_EXL3;
  if (only_cols && plan.variant != kInt8Cols) return "this format's int8 kernel is the block-column one";
  return nullptr;
}

cudaError_t int8_residency(const uqr_gemm_params& p, bool bf16, int rows, int variant, int (&per_sm)[4]) {
  return with_key(p, [&](auto key) {
    constexpr int F = decltype(key)::value;
    auto get = [&](auto v) {
      const ksplit::Residency& res = decltype(v)::residency();
      for (int i = 0; i < 4; ++i) per_sm[i] = res.per_sm[i];
      return res.err;
    };
    return bf16 ? with_variant<F, __nv_bfloat16>(rows, variant, get) : with_variant<F, __half>(rows, variant, get);
  });
}

cudaError_t qmma_int8(const void* x, int8_t* xq, int2* xm, const uint8_t* w, int64_t w_row_stride, void* y,
                      const uqr_gemm_params& p, bool bf16, cudaStream_t stream, const Int8Plan& plan) {
  const int rows = p.batch * p.M;
  if (int8_unsupported(p, rows, true, reinterpret_cast<uintptr_t>(x), reinterpret_cast<uintptr_t>(w), w_row_stride) ||
      int8_plan_invalid(p, rows, plan))
    return cudaErrorInvalidValue;
  const Int8Args a{p, xq, xm, y, w, w_row_stride, rows};
  return with_key(p, [&](auto key) {
    constexpr int F = decltype(key)::value;
    return bf16 ? run<F>(a, static_cast<const __nv_bfloat16*>(x), xq, xm, stream, plan)
                : run<F>(a, static_cast<const __half*>(x), xq, xm, stream, plan);
  });
}

}  // namespace cuda
}  // namespace uqr
