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

// The launch plan of uqr::_qmma_cuda, decided by the Python router
// (torch_uqr/triton_kernels/dispatch.py, plan_qmma) and passed in as explicit arguments; the C++
// side only checks that a plan is launchable (qmma_plan_invalid).
struct QmmaPlan {
  bool mid = false;        // the mid-M kernel (qmma_mid_m.cu), else the small-M one (<= kQmmaMaxRows rows)
  int warps = 1;           // small-M: K-splitting warps a CTA (1, 2, 4 or 8)
  int mid_cols = 16;       // mid-M: activation rows a column tile (16, 32 or 64)
  int splits = 1;          // mid-M: K splits, the fp32 workspace planes (stream-K: the most pieces a tile has)
  int streamk_ctas = 0;    // mid-M with 16-row tiles: the stream-K grid (0: equal splits over gridDim.z)
  bool wide_regs = false;  // mid-M with 16-row tiles: the build at 2 CTAs an SM (128 registers) instead of 3
  bool smem_cap = true;    // small-M: pad shared memory so CTAs spread evenly over the SMs (ksplit::capped_smem)
  bool pdl = false;        // launch as programmatic dependents (sm_90)
};

// nullptr when the kernel handles this call, else why not. `mid`: the plan runs the mid-M kernel,
// which copies x 16 bytes at a time.
const char* qmma_unsupported(const uqr_gemm_params& p, int rows, bool half_x, uintptr_t x_addr, uintptr_t w_addr,
                             int64_t w_row_stride, bool mid);

// nullptr when `plan` can be launched for this call, else why not.
const char* qmma_plan_invalid(const uqr_gemm_params& p, int rows, const QmmaPlan& plan);

// Residency of the small-M kernel built for this format, x dtype and row count: resident CTAs per
// SM at 1, 2, 4 and 8 K-splitting warps (per_sm[0..3]), for the plan's choice of warps.
cudaError_t qmma_small_m_residency(const uqr_gemm_params& p, bool bf16, int rows, int (&per_sm)[4]);

// Resident CTAs per SM of the mid-M kernel's 16-row, split-K build (the plan's power-of-two split).
cudaError_t qmma_mid_m_split_fit(const uqr_gemm_params& p, int& fit);

// y = x W^T for bf16 (bf16 = true) or fp16 x and y, p.batch * p.M <= kQmmaMidMaxRows rows, through
// p's strides; W rows `w_row_stride` bytes apart; with plan.mid and plan.splits > 1, split_ws holds
// that many fp32 [batch * M][N] planes. Returns cudaErrorInvalidValue for an unsupported call or plan.
cudaError_t qmma_small_m(const void* x, const uint8_t* w, int64_t w_row_stride, void* y, const uqr_gemm_params& p,
                         bool bf16, cudaStream_t stream, const QmmaPlan& plan, float* split_ws = nullptr);

// The launch plan of uqr::_wgmma_cuda (dispatch.py, plan_wgmma): column tile BM (64 or 128), CTAs
// an SM the build is made for (1 or 2; 2 only at BM = 64), K splits (fp32 workspace planes).
struct WgmmaPlan {
  int bm = 64;
  int ctas = 1;
  int splits = 1;
  bool pdl = false;
};

// Hopper (sm_90a) weights-in-registers wgmma kernel (qmma_wgmma.cu) for any row count: the same
// conditions as qmma_unsupported (with x copied 16 bytes at a time) plus K a multiple of 64.
const char* wgmma_unsupported(const uqr_gemm_params& p, int rows, bool half_x, uintptr_t x_addr, uintptr_t w_addr,
                              int64_t w_row_stride);

// nullptr when `plan` can be launched for this format, else why not (a BM / CTAs build whose
// stages do not fit shared memory, splits out of range).
const char* wgmma_plan_invalid(const uqr_gemm_params& p, const WgmmaPlan& plan);

// y = x W^T like qmma_small_m, through x_scratch (batch * M x K elements of x's dtype, 16-byte
// aligned: x rewritten in the codes' k order) and, with plan.splits > 1, split_ws (that many fp32
// [batch * M][N] planes). cudaErrorNoKernelImageForDevice off an sm_90 GPU or in a build without
// sm_90a code.
cudaError_t qmma_wgmma(const void* x, void* x_scratch, float* split_ws, const uint8_t* w, int64_t w_row_stride,
                       void* y, const uqr_gemm_params& p, bool bf16, cudaStream_t stream, const WgmmaPlan& plan);

}  // namespace cuda
}  // namespace uqr
