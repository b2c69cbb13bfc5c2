// Portability layer for the shared decode code: the same header text compiles as plain C++ (CPU
// kernels, the Metal emulator), as CUDA C++ and as Metal Shading Language. Everything that differs
// between the three (address spaces, fixed-width types, fp16 conversion) is behind these names.
#pragma once

#if defined(__METAL_VERSION__) || defined(UQR_METAL)
  // Metal Shading Language (or the C++ shim that emulates it: it defines UQR_METAL and provides
  // half, as_type, device, thread).
  #define UQR_FN inline
  #define UQR_GLOBAL device
  #define UQR_CONST constant
  #define UQR_THREAD thread
  // Kernel arguments such as the gemm parameter struct arrive in Metal's `constant` address space;
  // helpers that take them must say so (a `thread` reference cannot bind to `constant` data).
  #define UQR_PARAMS_SPACE constant
  typedef uchar uqr_u8;
  typedef char uqr_i8;
  typedef ushort uqr_u16;
  typedef uint uqr_u32;
  typedef int uqr_i32;
  typedef long uqr_i64;
  typedef ulong uqr_u64;
  UQR_FN float uqr_half_bits_to_float(uqr_u16 bits) { return float(as_type<half>(bits)); }
#else
  #include <stdint.h>
  #if defined(__CUDACC__)
    #include <cuda_fp16.h>
    #define UQR_FN __host__ __device__ __forceinline__
  #else
    #include <string.h>
    #define UQR_FN inline
  #endif
  #define UQR_GLOBAL
  #define UQR_CONST
  #define UQR_THREAD
  #define UQR_PARAMS_SPACE
  typedef uint8_t uqr_u8;
  typedef int8_t uqr_i8;
  typedef uint16_t uqr_u16;
  typedef uint32_t uqr_u32;
  typedef int32_t uqr_i32;
  typedef int64_t uqr_i64;
  typedef uint64_t uqr_u64;

  // IEEE binary16 -> binary32, exact for every input (subnormals, inf, NaN). Written out rather than
  // taken from a library so the CPU build needs no F16C and CUDA/host code agree bit for bit.
  UQR_FN float uqr_half_bits_to_float(uqr_u16 h) {
  #if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h));
  #else
    uqr_u32 sign = (uqr_u32)(h & 0x8000u) << 16;
    uqr_u32 exp = (h >> 10) & 0x1fu;
    uqr_u32 man = h & 0x3ffu;
    uqr_u32 bits;
    if (exp == 0x1fu) {
      bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
      bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
      bits = sign;
    } else {
      // Subnormal half: renormalise so the float keeps every bit.
      int shift = 0;
      while ((man & 0x400u) == 0) { man <<= 1; ++shift; }
      man &= 0x3ffu;
      bits = sign | ((uqr_u32)(113 - shift) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
  #endif
  }
#endif

// a * b rounded to float on its own. nvcc contracts `a * b + c` into one FMA (one rounding); where
// the product is inexact that differs from the float32 reference decoders, which round twice.
UQR_FN float uqr_mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// Blocks are byte arrays with no alignment promise beyond 2 bytes (q4_0 blocks are 18 bytes), so
// multi-byte fields are assembled from bytes: little-endian by the spec, whatever the host is.
UQR_FN uqr_u16 uqr_load_u16(const UQR_GLOBAL uqr_u8* p) {
  return (uqr_u16)(p[0] | (p[1] << 8));
}
UQR_FN uqr_u32 uqr_load_u32(const UQR_GLOBAL uqr_u8* p) {
  return (uqr_u32)p[0] | ((uqr_u32)p[1] << 8) | ((uqr_u32)p[2] << 16) | ((uqr_u32)p[3] << 24);
}
UQR_FN float uqr_load_half(const UQR_GLOBAL uqr_u8* p) { return uqr_half_bits_to_float(uqr_load_u16(p)); }
