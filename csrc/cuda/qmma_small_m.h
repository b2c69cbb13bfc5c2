// Host entry of the tensor-core kernels (qmma_small_m.cu up to kQmmaMaxRows activation rows,
// qmma_mid_m.cu above). Plain C++ types only, so the torch glue (qmma_binding.cpp) and the .cu
// files compile separately and the .cu files need no torch headers.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "uqr/params.h"

namespace uqr {
namespace cuda {

// Most activation rows (batch * M) the small-M kernel serves: two 8-wide MMA column tiles.
constexpr int kQmmaMaxRows = 16;
// Most activation rows the mid-M kernel serves (its grid's y dimension counts 32-row tiles).
constexpr int kQmmaMidMaxRows = 1 << 20;

// nullptr when the kernel handles this call, else why not (the caller falls back to Triton).
const char* qmma_unsupported(const uqr_gemm_params& p, int rows, bool half_x, uintptr_t x_addr, uintptr_t w_addr,
                             int64_t w_row_stride);

// Whether `rows` activation rows go to the mid-M kernel (above kQmmaMaxRows, and from 9 rows on,
// where it splits K over CTAs) rather than the small-M one.
bool mid_m_takes(int rows);

// How many ways qmma_small_m splits K for this call (> 1: it needs split_ws).
int qmma_splits(const uqr_gemm_params& p, int rows);

// y = x W^T for bf16 (bf16 = true) or fp16 x and y, p.batch * p.M <= kQmmaMidMaxRows rows, through
// p's strides; W rows `w_row_stride` bytes apart; with splits = qmma_splits(p, rows) > 1, split_ws
// holds that many fp32 [batch * M][N] planes. Returns cudaErrorInvalidValue for an unsupported call.
cudaError_t qmma_small_m(const void* x, const uint8_t* w, int64_t w_row_stride, void* y, const uqr_gemm_params& p,
                         bool bf16, cudaStream_t stream, int splits = 1, float* split_ws = nullptr);

// Hopper (sm_90a) weights-in-registers wgmma kernel (qmma_wgmma.cu) for any row count: the same
// conditions as qmma_unsupported plus K a multiple of 64.
const char* wgmma_unsupported(const uqr_gemm_params& p, int rows, bool half_x, uintptr_t x_addr, uintptr_t w_addr,
                              int64_t w_row_stride);

// How many ways qmma_wgmma splits K for this call (> 1: it needs split_ws).
int wgmma_splits(const uqr_gemm_params& p, int rows);

// y = x W^T like qmma_small_m, through x_scratch (batch * M x K elements of x's dtype, 16-byte
// aligned: x rewritten in the codes' k order) and, with splits = wgmma_splits(p, rows) > 1,
// split_ws (that many fp32 [batch * M][N] planes). cudaErrorNoKernelImageForDevice off an sm_90
// GPU or in a build without sm_90a code.
cudaError_t qmma_wgmma(const void* x, void* x_scratch, int splits, float* split_ws, const uint8_t* w,
                       int64_t w_row_stride, void* y, const uqr_gemm_params& p, bool bf16, cudaStream_t stream);

}  // namespace cuda
}  // namespace uqr
