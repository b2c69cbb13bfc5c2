// The CPU backend's pieces and how they meet:
//   gemm_cpu.cpp     the op: plan (gemm_args), stage x as fp32 rows, pick a path, allocate y;
//   gemm_fused.cpp   small M: decode + dot fused per weight row, reading only the packed bytes;
//                    also the ternary add/subtract ("vec") kernel;
//   gemm_int8.cpp    path "int8": int8 activations, integer dot products (q4_0, q4_k);
//   gemm_panel.cpp   large M: each thread decodes a panel of weight rows once and multiplies it
//                    against all of M with a register-tiled GEMM microkernel.
// Rows of the activation matrix are numbered r = b*M + m over the whole (batch, M) range.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

#include "uqr/params.h"

namespace uqr::cpu {

// Tuning constants, in one place.
constexpr int kFusedMaxRows = 8;            // rows per fused pass (accumulators held in registers)
constexpr int64_t kFusedXBytes = 24 << 10;  // activation rows kept in L1 per K chunk (L1d = 48 KiB)
constexpr int64_t kPanelRows = 64;          // decoded weight rows per thread (1 MiB at K=4096)
constexpr int64_t kFusedGrainRows = 64;     // weight rows per parallel work unit, fused path

// Writes float results into y through the output strides, converting to y's dtype.
class OutputWriter {
 public:
  OutputWriter(const at::Tensor& y, const uqr_gemm_params& p);
  // y(r, n0 .. n0+count) = src[0 .. count)
  void store(int64_t r, int64_t n0, int64_t count, const float* src) const;

 private:
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
void gemm_ternary_vec(const uint8_t* w, const uqr_gemm_params& p, const float* X, int64_t R,
                      const OutputWriter& out);
// Path "int8" (gemm_int8.cpp): x rows quantized to int8 per 32 elements, integer dot products.
void gemm_int8(const uint8_t* w, const uqr_gemm_params& p, const float* X, int64_t R, const OutputWriter& out);
// Packs rows [0, R) of x as fp32 column blocks xp[mb][k][16] (zero rows past R); xp holds
// ceil(R/16)*16*K floats.
void pack_x(const at::Tensor& x, const uqr_gemm_params& p, int64_t R, float* xp);
// Panel path over the packed activations.
void gemm_panels(const uint8_t* w, const uqr_gemm_params& p, const float* xp, int64_t R,
                 const OutputWriter& out);

}  // namespace uqr::cpu
