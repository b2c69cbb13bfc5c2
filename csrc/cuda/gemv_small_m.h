// Host entry of the small-M CUDA kernel (gemv_small_m.cu). Plain C++ types only, so the torch glue
// (gemv_binding.cpp) and the .cu compile separately and the .cu needs no torch headers.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "uqr/params.h"

namespace uqr {
namespace cuda {

enum GemvDtype { kGemvFloat32 = 0, kGemvFloat16 = 1, kGemvBFloat16 = 2 };

// Most activation rows (batch * M) one launch serves: x is staged in shared memory as fp32 for all
// of them and every lane keeps one accumulator per (weight row, activation row).
constexpr int kGemvMaxRows = 8;

// y = x W^T for p.batch * p.M <= kGemvMaxRows rows; x and y addressed through p's strides, W rows
// `w_row_stride` bytes apart. Returns cudaSuccess or the launch error; writes nothing on error.
cudaError_t gemv_small_m(const void* x, const uint8_t* w, int64_t w_row_stride, void* y,
                         const uqr_gemm_params& p, GemvDtype dtype, cudaStream_t stream);

}  // namespace cuda
}  // namespace uqr
