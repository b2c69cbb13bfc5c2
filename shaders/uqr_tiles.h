// Tuning constants of the Metal kernels, in one place: read by the shaders (tile loops, threadgroup
// memory carving) and by csrc/mps/launch.h (grid, threadgroup size, memory length), which is shared
// by the Objective-C++ glue and the CPU emulator. Plain macros so Metal, C++ and Objective-C++ all
// read the same numbers.
#pragma once

// Prefill (MMA) kernel: one threadgroup computes a UQR_MMA_BM x UQR_MMA_BN tile of y (rows of x by
// weight rows), stepping K by UQR_MMA_BK. Four simdgroups in a 2 x 2 arrangement, each owning a
// 16 x 32 sub-tile = 2 x 4 fragments of 8 x 8. BK = 32 divides every block size (32, 64, 128, 256),
// so a K step never straddles a block and every decode8 call lands inside one block.
#define UQR_MMA_BM 32
#define UQR_MMA_BN 64
#define UQR_MMA_BK 32
#define UQR_MMA_SG_M 2
#define UQR_MMA_SG_N 2
#define UQR_MMA_THREADS (32 * UQR_MMA_SG_M * UQR_MMA_SG_N)

// Matrix-vector kernel (small M, and ternary's add/subtract path at any M): each simdgroup computes
// UQR_MV_ROWS weight rows for up to UQR_MV_M rows of x; its 32 lanes split K in 8-element chunks and
// reduce the 32 partial sums through threadgroup memory (UQR_MV_M * UQR_MV_ROWS == 32: one result
// per lane).
#define UQR_MV_M 8
#define UQR_MV_ROWS 4
#define UQR_MV_SG 2
#define UQR_MV_THREADS (32 * UQR_MV_SG)

// "auto" sends M <= UQR_MV_MAX_M to the matrix-vector kernel: below that the 32-row MMA tile would
// mostly multiply padding (the same split as MLX's qmv / llama.cpp's mul_mv).
#define UQR_MV_MAX_M 8
