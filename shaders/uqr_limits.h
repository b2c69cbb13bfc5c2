// Apple GPU launch limits, and the checks that the tile constants of uqr_tiles.h respect them. One
// header read by the three parties that must agree: the shaders (so Apple's Metal compiler and the
// strict CI compile evaluate the checks), csrc/mps/launch.h (so the Objective-C++ glue and the CPU
// emulator, which both compile it, evaluate them too) and, through launch.h, the emulator's driver,
// which also checks every planned launch against them at run time.
#pragma once
#include "uqr_tiles.h"

// Threads per simdgroup on every Apple GPU family the project targets. The kernels hard-code it: a
// matrix-vector simdgroup reduces exactly 32 partial results, one per lane.
#define UQR_SIMD_WIDTH 32
// Threadgroup memory: Apple GPUs guarantee 32 KiB per threadgroup, and
// setThreadgroupMemoryLength:atIndex: takes only multiples of 16 bytes.
#define UQR_MAX_THREADGROUP_MEMORY 32768
#define UQR_THREADGROUP_MEMORY_ALIGN 16
// Threads per threadgroup: the device-wide maximum (a pipeline may allow fewer; the glue asks it).
#define UQR_MAX_THREADS_PER_THREADGROUP 1024

// Threadgroup memory each kernel asks for (launch.h computes the launch from these).
// Prefill: the staged tiles (E bytes per element: 2 for half staging, 4 for float), later reused
// as the fp32 output tile, so the larger of the two.
#define UQR_MMA_STAGED_BYTES(E) ((UQR_MMA_BM * UQR_MMA_BK + UQR_MMA_BK * UQR_MMA_BN) * (E))
#define UQR_MMA_OUT_TILE_BYTES (UQR_MMA_BM * UQR_MMA_BN * 4)
#define UQR_MMA_TG_BYTES(E) \
  (UQR_MMA_STAGED_BYTES(E) > UQR_MMA_OUT_TILE_BYTES ? UQR_MMA_STAGED_BYTES(E) : UQR_MMA_OUT_TILE_BYTES)
// Matrix-vector: per simdgroup, 32 lanes x 32 partial results of 4 bytes.
#define UQR_MV_TG_BYTES (UQR_MV_SG * UQR_SIMD_WIDTH * 32 * 4)

#define UQR_TG_MEMORY_OK(bytes) \
  ((bytes) > 0 && (bytes) <= UQR_MAX_THREADGROUP_MEMORY && (bytes) % UQR_THREADGROUP_MEMORY_ALIGN == 0)
#define UQR_THREADS_OK(n) \
  ((n) > 0 && (n) <= UQR_MAX_THREADS_PER_THREADGROUP && (n) % UQR_SIMD_WIDTH == 0)

static_assert(UQR_TG_MEMORY_OK(UQR_MMA_TG_BYTES(2)),
              "prefill threadgroup memory (half staging) must be <= 32 KiB and a multiple of 16 bytes");
static_assert(UQR_TG_MEMORY_OK(UQR_MMA_TG_BYTES(4)),
              "prefill threadgroup memory (float staging) must be <= 32 KiB and a multiple of 16 bytes");
static_assert(UQR_TG_MEMORY_OK(UQR_MV_TG_BYTES),
              "matrix-vector threadgroup memory must be <= 32 KiB and a multiple of 16 bytes");
static_assert(UQR_THREADS_OK(UQR_MMA_THREADS),
              "prefill threadgroup size must be whole simdgroups of 32 threads, at most 1024");
static_assert(UQR_THREADS_OK(UQR_MV_THREADS),
              "matrix-vector threadgroup size must be whole simdgroups of 32 threads, at most 1024");
static_assert(UQR_MMA_SG_M * UQR_MMA_SG_N * UQR_SIMD_WIDTH == UQR_MMA_THREADS,
              "prefill: one simdgroup per (sg_m, sg_n) cell of the output tile");
static_assert(UQR_MV_M * UQR_MV_ROWS == UQR_SIMD_WIDTH,
              "matrix-vector: each of the 32 lanes reduces exactly one (row of x, weight row) result");
