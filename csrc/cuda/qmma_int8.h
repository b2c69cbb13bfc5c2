// Host entry of the int8-activation kernel (qmma_int8.cu, path "int8" on CUDA). Plain C++ types,
// as qmma_small_m.h, so the torch glue (qmma_binding.cpp) compiles apart from the .cu.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "qmma_small_m.h"
#include "uqr/params.h"

namespace uqr {
namespace cuda {

// Most activation rows (batch * M) the int8 kernel serves: two 8-wide MMA column tiles.
constexpr int kInt8MaxRows = 16;

// nullptr when qmma_int8 takes this call (q4_0 / q4_k 1..16 rows, mlx4 with g = 32 / 64 one row; the
// small-M kernel's shape and alignment rules), else why not.
const char* int8_unsupported(const uqr_gemm_params& p, int rows, bool half_x, uintptr_t x_addr, uintptr_t w_addr,
                             int64_t w_row_stride);

// The launch plan of uqr::_int8_cuda (dispatch.py, plan_int8). `variant` for one activation row:
// kInt8Cols (block columns: the only kernel of mlx4, ternary, var_affine and exl3), kInt8XRing (x
// staged through the weight ring), kInt8XPipe (x from global memory, a stage ahead in registers) or
// kInt8Tiles (x from global memory); more rows take kInt8Tiles.
enum Int8Variant { kInt8Tiles = 0, kInt8XRing = 1, kInt8XPipe = 2, kInt8Cols = 3 };
struct Int8Plan {
  int variant = kInt8Tiles;
  int warps = 1;           // K-splitting warps a CTA (1, 2, 4 or 8)
  bool smem_cap = true;    // pad shared memory so CTAs spread evenly (ksplit::capped_smem)
  bool pdl = false;        // launch as programmatic dependents (sm_90)
};

// nullptr when `plan` can be launched for this call, else why not.
const char* int8_plan_invalid(const uqr_gemm_params& p, int rows, const Int8Plan& plan);

// Residency of the int8 kernel `variant` for this format, x dtype and row count: resident CTAs per
// SM at 1, 2, 4 and 8 K-splitting warps, for the plan's choice of warps.
cudaError_t int8_residency(const uqr_gemm_params& p, bool bf16, int rows, int variant, int (&per_sm)[4]);

// y = x W^T with x rounded to int8 as the CPU int8 path rounds it: bf16 (bf16 = true) or fp16 x and
// y through p's strides. Scratch: xq = batch * M x K bytes (the codes), xm = batch * M x K / 32
// int2 (per 32-element block d and its sum term), both 16-byte aligned.
cudaError_t qmma_int8(const void* x, int8_t* xq, int2* xm, const uint8_t* w, int64_t w_row_stride, void* y,
                      const uqr_gemm_params& p, bool bf16, cudaStream_t stream, const Int8Plan& plan);

}  // namespace cuda
}  // namespace uqr
