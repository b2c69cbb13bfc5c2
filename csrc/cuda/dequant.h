// Host entry of the decode-to-dense kernel (dequant.cu): packed weight rows -> a dense row-major
// [N, K] matrix, for the large-M path that decodes once into a scratch buffer and hands the
// product to cuBLAS. Plain C++ types only, so the torch glue (dequant_binding.cpp) and the .cu
// compile separately and the .cu needs no torch headers.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

namespace uqr {
namespace cuda {

enum class DenseType { kBF16 = 0, kF16 = 1, kF32 = 2 };

// Writes out[n * K + k] (n < N, k < K) for the uqr_format `fmt` (an MLX-family format: group_size 32/64/128),
// weight row n at w + n * w_row_stride (any stride and base address: rows are staged bytewise at
// their edges). out must be 16-byte aligned. Returns cudaErrorInvalidValue for an unsupported call
// (the glue checks every argument first, with messages).
cudaError_t dequant_cuda(const uint8_t* w, int64_t w_row_stride, int fmt, int group_size, int64_t N, int64_t K,
                         void* out, DenseType type, cudaStream_t stream);

// The largest K one launch covers (its tiles per row are the grid's y dimension).
int64_t dequant_max_k();

}  // namespace cuda
}  // namespace uqr
