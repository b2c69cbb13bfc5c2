// Small M, bf16 x: the fused decode+dot with avx512_bf16 dot products instead of fp32 FMAs.
//
// Every format here is "scale x small integer code (+ offset)": the codes (q4_0: q - 8; mlx4,
// q4_k: q) are exact in bf16 and so are x's values, so vdpbf16ps forms exact
// products summed in fp32, 32 elements per instruction. The block's fp32 scale multiplies that
// sum once, and an affine block's offset contributes offset x sum(x over the block), with the
// sums of x taken in fp32 once per call. The result is therefore as exact as the fp32 path (it
// differs only in the fp32 rounding order), which is why it is the default for bf16 x.
// The decode is also shorter than the fp32 one: the 4-bit codes become bf16 by one 16-bit table
// permute (vpermw, 32 entries, so the bit above a nibble needs no mask) instead of two float
// permutes and two scale multiplies.
//
// Used for one activation row only (see gemm_bf16_dot). q4_1 and q8_0 kernels of the same kind
// were measured slower than the fp32 kernel even there (q4_1's offset FMA per block, q8_0's
// int8 -> bf16 conversion through fp32) and were dropped; they and the other formats stay on the
// fp32 fused path. A build without avx512_bf16 compiles none of this and always returns false.
#include <array>
#include <cstring>
#include <vector>

#include "block_decode.h"
#include "kernels.h"

namespace uqr::cpu {

#if UQR_CPU_AVX512 && defined(__AVX512BF16__)
namespace {

using bf16 = c10::BFloat16;

// bf16 bit pattern of a small integer (|n| < 256): exact, exponent and 7 explicit mantissa bits.
constexpr uint16_t bf16_of_int(int n) {
  if (n == 0) return 0;
  const uint16_t sign = n < 0 ? 0x8000 : 0;
  const unsigned a = static_cast<unsigned>(n < 0 ? -n : n);
  int e = 0;
  while ((a >> (e + 1)) != 0) ++e;
  return static_cast<uint16_t>(sign | ((127 + e) << 7) | ((a - (1u << e)) << (7 - e)));
}

// 32-entry tables for vpermw, indexed by the low 5 bits: entry i = bf16((i & 15) + bias).
constexpr std::array<uint16_t, 32> nibble_codes(int bias) {
  std::array<uint16_t, 32> t{};
  for (int i = 0; i < 32; ++i) t[i] = bf16_of_int((i & 15) + bias);
  return t;
}
alignas(64) constexpr std::array<uint16_t, 32> kSigned4 = nibble_codes(-8);
alignas(64) constexpr std::array<uint16_t, 32> kUnsigned4 = nibble_codes(0);

inline __m512bh lookup(__m512i idx, const std::array<uint16_t, 32>& table) {
  return (__m512bh)_mm512_permutexvar_epi16(idx, _mm512_load_si512(table.data()));
}
inline __m512 dot32(__m512 acc, __m512bh q, const bf16* x) {
  return _mm512_dpbf16_ps(acc, q, (__m512bh)_mm512_loadu_si512(x));
}
// 16 bytes -> 32 16-bit lanes: lane j holds byte j (its low nibble is element j), lane 16 + j
// byte j >> 4 (element 16 + j): the q4_0 element order. The bytes are broadcast by the
// load and widened once; the shift is masked to the upper half (no cross-lane insert: the
// shuffle port is what this kernel is bound by).
inline __m512i split_nibbles(const uint8_t* p) {
  const __m512i v = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  return _mm512_mask_srli_epi16(v, 0xFFFF0000u, v, 4);
}

// Block kernels: apply<MR>(block, f, x, ldx, xs, ldxs, acc, lin) adds the block's dot with MR
// rows of x (row m at x + m ldx, at the block's first element) into acc[m] (scaled lanes) and
// lin[m] (offset terms; xs + m ldxs are the row's sums of x per 32 elements at the block).
// kHalfFields leading fp16 fields of the block (scale, then min / bias) arrive converted in
// f[0], f[kStage], read by broadcast loads: converting them one by one would add two shuffle-port
// uops per block (see bf16_tile).
constexpr int kStage = 16;  // blocks whose fp16 fields are converted together

template <int FMT, int G = 0>
struct Bf16Block;

template <>
struct Bf16Block<UQR_Q4_0> {
  static constexpr int kElems = UQR_Q4_0_BLOCK, kBytes = UQR_Q4_0_BYTES, kHalfFields = 1;
  template <int MR>
  static inline void apply(const uint8_t* blk, const float* f, const bf16* x, int64_t ldx, const float*, int64_t,
                           __m512* acc, __m512*) {
    const __m512 d = _mm512_set1_ps(f[0]);
    const __m512bh q = lookup(split_nibbles(blk + 2), kSigned4);
    for (int m = 0; m < MR; ++m) acc[m] = _mm512_fmadd_ps(dot32(_mm512_setzero_ps(), q, x + m * ldx), d, acc[m]);
  }
};

// q4_k: eight sub-blocks of 32, each with its own scale d sc_j (one multiply per sub-block dot)
// and offset dmin m_j (eight lanes against the eight sums of x in one FMA).
template <>
struct Bf16Block<UQR_Q4_K> {
  static constexpr int kElems = UQR_Q4_K_BLOCK, kBytes = UQR_Q4_K_BYTES, kHalfFields = 0;
  template <int MR>
  static inline void apply(const uint8_t* blk, const float*, const bf16* x, int64_t ldx, const float* xs,
                           int64_t ldxs, __m512* acc, __m512* lin) {
    alignas(64) float f[16];
    q4_k_factors(blk, f);
    for (int c = 0; c < 4; ++c) {
      // 32 bytes: low nibbles = sub-block 2c, high nibbles = sub-block 2c + 1.
      const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * c)));
      const __m512bh q_lo = lookup(v, kUnsigned4), q_hi = lookup(_mm512_srli_epi16(v, 4), kUnsigned4);
      const __m512 a_lo = _mm512_set1_ps(f[2 * c]), a_hi = _mm512_set1_ps(f[2 * c + 1]);
      for (int m = 0; m < MR; ++m) {
        const bf16* xm = x + m * ldx + 64 * c;
        acc[m] = _mm512_fmadd_ps(dot32(_mm512_setzero_ps(), q_lo, xm), a_lo, acc[m]);
        acc[m] = _mm512_fmadd_ps(dot32(_mm512_setzero_ps(), q_hi, xm + 32), a_hi, acc[m]);
      }
    }
    const __m512 mins = _mm512_maskz_loadu_ps(0xFF, f + 8);
    for (int m = 0; m < MR; ++m) lin[m] = _mm512_fnmadd_ps(mins, _mm512_maskz_loadu_ps(0xFF, xs + m * ldxs), lin[m]);
  }
};

// mlx4: neighbours share a byte (even element = low nibble). A byte in a 32-bit lane, or-ed with
// itself shifted by 12, puts element 2i in the lane's low 16 bits and element 2i + 1 in its high
// 16 bits (both still carrying bits that the 32-entry table ignores). One scale per group, so the
// group's dots are chained and scaled once.
template <int G>
struct Bf16Block<UQR_MLX4, G> {
  static constexpr int kElems = G, kBytes = 4 + G / 2, kHalfFields = 2;
  template <int MR>
  static inline void apply(const uint8_t* blk, const float* f, const bf16* x, int64_t ldx, const float* xs,
                           int64_t ldxs, __m512* acc, __m512* lin) {
    const __m512 s = _mm512_set1_ps(f[0]), b = _mm512_set1_ps(f[kStage]);
    __m512 t[MR];
    for (int m = 0; m < MR; ++m) t[m] = _mm512_setzero_ps();
    for (int c = 0; c < G / 32; ++c) {
      const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 4 + 16 * c)));
      const __m512bh q = lookup(_mm512_or_si512(v, _mm512_slli_epi32(v, 12)), kUnsigned4);
      for (int m = 0; m < MR; ++m) t[m] = dot32(t[m], q, x + m * ldx + 32 * c);
    }
    constexpr __mmask16 kSums = (1u << (G / 32)) - 1;
    for (int m = 0; m < MR; ++m) {
      acc[m] = _mm512_fmadd_ps(t[m], s, acc[m]);
      lin[m] = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(kSums, xs + m * ldxs), lin[m]);
    }
  }
};

// The blocks' fp16 fields are first copied, kStage blocks at a time, with scalar moves (load and
// store ports only) and converted by one vcvtph2ps per field and row.
template <class B, int NR>
inline void stage_fields(const uint8_t* w, int64_t row_bytes, int64_t b0, int64_t nb, float* f) {
  if constexpr (B::kHalfFields > 0) {
    alignas(32) uint16_t h[NR * B::kHalfFields * kStage];
    for (int r = 0; r < NR; ++r)
      for (int i = 0; i < B::kHalfFields; ++i)
        for (int64_t j = 0; j < kStage; ++j) {
          uint16_t v = 0;
          if (j < nb) std::memcpy(&v, w + r * row_bytes + (b0 + j) * B::kBytes + 2 * i, 2);
          h[(r * B::kHalfFields + i) * kStage + j] = v;
        }
    for (int t = 0; t < NR * B::kHalfFields; ++t)
      _mm512_store_ps(f + t * kStage, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(h + t * kStage))));
  }
}

template <class B, int MR, int NR>
inline void bf16_tile(const uint8_t* w, int64_t row_bytes, int64_t nblocks, const bf16* X, int64_t ldx,
                      const float* XS, int64_t ldxs, float* res, int64_t ld_res, bool accumulate) {
  __m512 acc[NR][MR], lin[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = lin[r][m] = _mm512_setzero_ps();
  constexpr int kFieldFloats = B::kHalfFields > 0 ? NR * B::kHalfFields * kStage : 1;
  alignas(64) float f[kFieldFloats];
  for (int64_t b0 = 0; b0 < nblocks; b0 += kStage) {
    const int64_t nb = std::min<int64_t>(kStage, nblocks - b0);
    stage_fields<B, NR>(w, row_bytes, b0, nb, f);
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t b = b0 + j;
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r)
        B::template apply<MR>(w + r * row_bytes + b * B::kBytes, f + r * B::kHalfFields * kStage + j,
                              X + b * B::kElems, ldx, XS + b * (B::kElems / 32), ldxs, acc[r], lin[r]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) {
      const float s = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][m], lin[r][m]));
      res[m * ld_res + r] = accumulate ? res[m * ld_res + r] + s : s;
    }
}

template <class B, int MR>
void bf16_rows(const uint8_t* w, const uqr_gemm_params& p, const bf16* X, int64_t ldx, const float* XS,
               int64_t ldxs, int64_t n0, int64_t n1, float* res, int64_t ld_res) {
  constexpr int NR = weight_rows_per_tile<MR>();
  const int64_t chunk = fused_k_chunk<MR>(p.K, sizeof(bf16));
  for (int64_t k0 = 0; k0 < p.K; k0 += chunk) {
    const int64_t nblocks = std::min(chunk, p.K - k0) / B::kElems;
    const uint8_t* wk = w + (k0 / B::kElems) * B::kBytes;
    const bf16* xk = X + k0;
    const float* xsk = XS + k0 / 32;
    int64_t n = n0;
    for (; n + NR <= n1; n += NR)
      bf16_tile<B, MR, NR>(wk + n * p.row_bytes, p.row_bytes, nblocks, xk, ldx, xsk, ldxs, res + (n - n0), ld_res, k0 > 0);
    for (; n < n1; ++n)
      bf16_tile<B, MR, 1>(wk + n * p.row_bytes, p.row_bytes, nblocks, xk, ldx, xsk, ldxs, res + (n - n0), ld_res, k0 > 0);
  }
}

// Sums of x over every 32 elements, in fp32: the offset terms' factor (xs[r][k / 32]).
std::vector<float> sums_of_32(const bf16* X, int64_t ldx, int64_t R, int64_t K) {
  std::vector<float> xs(static_cast<size_t>(R * (K / 32)));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < K / 32; ++c) {
      const __m512i v = _mm512_loadu_si512(X + r * ldx + 32 * c);
      const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      const __m512 hi = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
      xs[r * (K / 32) + c] = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
    }
  return xs;
}

template <class B>
void run(const uint8_t* w, const uqr_gemm_params& p, const at::Tensor& x, int64_t R, const OutputWriter& out) {
  const at::Tensor xm = x_matrix(x, p, R);
  const bf16* X = xm.const_data_ptr<bf16>();
  const int64_t ldx = xm.stride(0);
  const std::vector<float> xs = sums_of_32(X, ldx, R, p.K);
  const int64_t ldxs = p.K / 32;
  fused_driver(p, R, out, [&](int rows, int64_t r0, int64_t n0, int64_t n1, float* res, int64_t ld) {
    with_rows(rows, [&](auto mr) {
      bf16_rows<B, decltype(mr)::value>(w, p, X + r0 * ldx, ldx, xs.data() + r0 * ldxs, ldxs, n0, n1, res, ld);
    });
  });
}

}  // namespace

bool gemm_bf16_dot(const uint8_t* w, const uqr_gemm_params& p, const at::Tensor& x, int64_t R,
                   const OutputWriter& out) {
  // Measured against the fp32 fused kernel (docs/bench_cpu.md): faster only for one activation
  // row. Each further row costs a vdpbf16ps and a scale FMA per 32 elements where the fp32
  // kernel needs two FMAs, and from two rows on the fp32 kernel measured faster.
  if (R != 1) return false;
  switch (p.fmt) {
    case UQR_Q4_0: run<Bf16Block<UQR_Q4_0>>(w, p, x, R, out); return true;
    case UQR_Q4_K: run<Bf16Block<UQR_Q4_K>>(w, p, x, R, out); return true;
    case UQR_MLX4:
      if (p.group_size == 32) run<Bf16Block<UQR_MLX4, 32>>(w, p, x, R, out);
      else if (p.group_size == 64) run<Bf16Block<UQR_MLX4, 64>>(w, p, x, R, out);
      else run<Bf16Block<UQR_MLX4, 128>>(w, p, x, R, out);
      return true;
    default: return false;
  }
}

#else

bool gemm_bf16_dot(const uint8_t*, const uqr_gemm_params&, const at::Tensor&, int64_t, const OutputWriter&) {
  return false;
}

#endif

}  // namespace uqr::cpu
