// The CPU backend's pieces and how they meet:
//   gemm_cpu.cpp     the op: plan (gemm_args), stage x as fp32 rows, pick a path, allocate y;
//   gemm_fused.cpp   small M: decode + dot fused per weight row, reading only the packed bytes;
//                    also the ternary add/subtract ("vec") kernel;
//   gemm_int8.cpp    path "int8": int8 activations, integer dot products (q4_0, q4_k);
//   gemm_panel.cpp   large M (AVX-512): each thread decodes a panel of weight rows once and
//                    multiplies it against all of M with a register-tiled GEMM microkernel;
//   gemm_half.cpp    large M otherwise (half x; fp32 x without AVX-512): decoded panels, ATen's mm.
// Rows of the activation matrix are numbered r = b*M + m over the whole (batch, M) range.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "uqr/params.h"

namespace uqr::cpu {

// Tuning constants, in one place.
constexpr int kFusedMaxRows = 8;            // rows per fused pass (accumulators held in registers)
constexpr int64_t kFusedXBytes = 24 << 10;  // activation rows kept in L1 per K chunk (L1d = 48 KiB)
constexpr int64_t kPanelRows = 64;          // decoded weight rows per thread (1 MiB at K=4096)
constexpr int64_t kFusedGrainRows = 64;     // weight rows per parallel work unit, fused path
constexpr int64_t kLibraryPanelRows = 1024;  // weight rows decoded per library GEMM (gemm_half.cpp)

// Writes float results into y through the output strides, converting to y's dtype.
class OutputWriter {
 public:
  OutputWriter(const at::Tensor& y, const uqr_gemm_params& p);
  // y(r, n0 .. n0+count) = src[0 .. count)
  void store(int64_t r, int64_t n0, int64_t count, const float* src) const;
  // The same from values already in y's dtype (the half library path): copies, no rounding.
  void store(int64_t r, int64_t n0, int64_t count, const c10::Half* src) const;
  void store(int64_t r, int64_t n0, int64_t count, const c10::BFloat16* src) const;

 private:
  // f(offset into y, offset into src, run length) for each contiguous run of y(r, n0 .. n0+count).
  template <class F>
  void for_runs(int64_t r, int64_t n0, int64_t count, F&& f) const;

  void* base_;
  at::ScalarType dtype_;
  const uqr_gemm_params& p_;
};

// Copies activation rows [r0, r0+rows) into dst (fp32, row-major, leading dim K), reading x
// through its strides (so head-strided x is gathered here, never permuted by a separate pass).
void stage_rows(const at::Tensor& x, const uqr_gemm_params& p, int64_t r0, int64_t rows, float* dst);

// Fused decode+dot for all R rows of X (fp32 [R, K]), processed kFusedMaxRows rows at a time.
void gemm_fused(const uint8_t* w, const uqr_gemm_params& p, const float* X, int64_t R,
                const OutputWriter& out);
// Ternary add/subtract path: no multiply per weight, one multiply by d per block and row.
// nan_rows: take_nonfinite_rows' flags of X's rows (or nullptr).
void gemm_ternary_vec(const uint8_t* w, const uqr_gemm_params& p, const float* X, int64_t R,
                      const OutputWriter& out, const uint8_t* nan_rows);
// Path "int8" (gemm_int8.cpp): x rows quantized to int8 per 32 elements, integer dot products.
void gemm_int8(const uint8_t* w, const uqr_gemm_params& p, const float* X, int64_t R, const OutputWriter& out,
               const uint8_t* nan_rows);
// Packs rows [0, R) of x as fp32 column blocks xp[mb][k][16] (zero rows past R); xp holds
// ceil(R/16)*16*K floats.
void pack_x(const at::Tensor& x, const uqr_gemm_params& p, int64_t R, float* xp);
// x as an [R, K] matrix with unit column stride: a view of x when its rows have one stride,
// otherwise a copy gathered through the head strides (gemm_half.cpp).
at::Tensor x_matrix(const at::Tensor& x, const uqr_gemm_params& p, int64_t R);

// ---- shared by the small-M kernels ----
// Weight rows per tile for MR activation rows: enough independent accumulator chains at M = 1, 2.
template <int MR>
constexpr int weight_rows_per_tile() {
  return MR == 1 ? 4 : MR == 2 ? 2 : 1;
}

// Runtime row count (1 .. kFusedMaxRows) -> f(std::integral_constant<int, MR>{}).
template <class F>
inline void with_rows(int rows, F&& f) {
  switch (rows) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

// K elements per pass so that MR activation rows of `elem_bytes` each stay in L1 (kFusedXBytes)
// while every weight row of the work unit streams past them; a multiple of 256, which every block
// size divides.
template <int MR>
int64_t fused_k_chunk(int64_t K, int64_t elem_bytes) {
  const int64_t fit = kFusedXBytes / (elem_bytes * MR) / 256 * 256;
  return std::min<int64_t>(K, std::max<int64_t>(256, fit));
}

// Rows of X (fp32 [R, K]) that hold a NaN or an Inf, one flag per row (empty when there is none);
// their non-finite elements are set to 0 in X. For the kernels that do not multiply every x by its
// weight in float (int8 codes, ternary add/subtract), which cannot carry such an element into the
// outputs it feeds (and must never convert NaN to an integer): fused_driver then writes NaN to
// every output of a flagged row, as non-finite as a float matmul makes it (docs/operator.md).
std::vector<uint8_t> take_nonfinite_rows(float* X, int64_t R, int64_t K);

// Parallel over weight rows; inside each unit, all R rows in passes of kFusedMaxRows:
// rows_fn(rows, r0, n0, n1, tile, ld) fills tile[m * ld + (n - n0)] for m < rows, which is then
// stored through the output strides (as NaN for the rows nan_rows flags, if given).
template <class RowsFn>
void fused_driver(const uqr_gemm_params& p, int64_t R, const OutputWriter& out, RowsFn rows_fn,
                  const uint8_t* nan_rows = nullptr) {
  at::parallel_for(0, p.N, kFusedGrainRows, [&](int64_t begin, int64_t end) {
    float tile[kFusedMaxRows * kFusedGrainRows];
    for (int64_t n0 = begin; n0 < end; n0 += kFusedGrainRows) {
      const int64_t n1 = std::min(end, n0 + kFusedGrainRows);
      for (int64_t r0 = 0; r0 < R; r0 += kFusedMaxRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kFusedMaxRows, R - r0));
        rows_fn(rows, r0, n0, n1, tile, kFusedGrainRows);
        for (int m = 0; m < rows; ++m) {
          if (nan_rows && nan_rows[r0 + m])
            std::fill_n(tile + m * kFusedGrainRows, n1 - n0, std::numeric_limits<float>::quiet_NaN());
          out.store(r0 + m, n0, n1 - n0, tile + m * kFusedGrainRows);
        }
      }
    }
  });
}

// Panel path over the packed activations.
void gemm_panels(const uint8_t* w, const uqr_gemm_params& p, const float* xp, int64_t R,
                 const OutputWriter& out);
// Larger M through ATen's mm (gemm_half.cpp): weights decoded into x's dtype a panel at a time,
// multiplied by the library (oneDNN / MKL; AMX for bf16), results stored into y (y has x's dtype).
void gemm_library(const uint8_t* w, const uqr_gemm_params& p, const at::Tensor& x, int64_t R, const at::Tensor& y,
                  const OutputWriter& out);

}  // namespace uqr::cpu
