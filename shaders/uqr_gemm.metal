// torch-uqr gemm kernels for Apple GPUs. This file only instantiates: the kernels live in
// uqr_gemm_kernels.h, the formats in csrc/include/uqr/formats.h. Host names spell the kernel kind,
// the weight format and the activation dtype, e.g. uqr_gemm_mma_q4_k_f16; csrc/mps/launch.h builds
// the same strings. The CPU emulator (torch_uqr/metal_emu) compiles this very file.
#include <metal_stdlib>
using namespace metal;

#include "uqr_metal_compat.h"
#include "uqr_gemm_kernels.h"

// fp16 activations stage as half (simdgroup_matrix<half>); bf16 and fp32 stage as float, which keeps
// bf16's exponent range and needs no bfloat matrix support from the GPU.
#if UQR_HAS_BFLOAT
  #define UQR_BF16_KERNELS(FMT, fname)                                               \
    UQR_KERNEL_INSTANCE("uqr_gemm_mma_" fname "_bf16", uqr_gemm_mma, bfloat, float, FMT) \
    UQR_KERNEL_INSTANCE("uqr_gemm_mv_" fname "_bf16", uqr_gemm_mv, bfloat, FMT)
#else
  #define UQR_BF16_KERNELS(FMT, fname)
#endif

#define UQR_FORMAT_KERNELS(FMT, fname)                                             \
  UQR_KERNEL_INSTANCE("uqr_gemm_mma_" fname "_f16", uqr_gemm_mma, half, half, FMT)    \
  UQR_KERNEL_INSTANCE("uqr_gemm_mma_" fname "_f32", uqr_gemm_mma, float, float, FMT)  \
  UQR_KERNEL_INSTANCE("uqr_gemm_mv_" fname "_f16", uqr_gemm_mv, half, FMT)            \
  UQR_KERNEL_INSTANCE("uqr_gemm_mv_" fname "_f32", uqr_gemm_mv, float, FMT)           \
  UQR_BF16_KERNELS(FMT, fname)

// Every format of the format table (csrc/include/uqr/format_table.h, generated).
UQR_FORMAT_LIST(UQR_FORMAT_KERNELS)
