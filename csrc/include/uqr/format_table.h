// Generated from torch_uqr/formats/table.py by `python -m torch_uqr.formats.table --write`;
// do not edit. The format ids, block sizes, names and per-backend paths of every format.
#pragma once
#include "platform.h"

enum uqr_format {
  UQR_Q4_0 = 0,
  UQR_Q4_1 = 1,
  UQR_Q8_0 = 2,
  UQR_Q4_K = 3,
  UQR_MLX4 = 4,
  UQR_VAR_AFFINE = 5,
  UQR_EXL3 = 6,
  UQR_TERNARY = 7,
  UQR_Q5_0 = 8,
  UQR_Q5_1 = 9,
  UQR_Q6_K = 10,
  UQR_Q5_K = 11,
  UQR_IQ4_NL = 12,
  UQR_IQ4_XS = 13,
  UQR_Q3_K = 14,
  UQR_Q2_K = 15,
  UQR_MXFP4 = 16,
  UQR_MLX2 = 17,
  UQR_MLX3 = 18,
  UQR_MLX5 = 19,
  UQR_MLX6 = 20,
  UQR_MLX8 = 21,
  UQR_NUM_FORMATS = 22
};

// Elements and bytes per block (a grouped format: at its default group size).
#define UQR_Q4_0_BLOCK 32
#define UQR_Q4_0_BYTES 18
#define UQR_Q4_1_BLOCK 32
#define UQR_Q4_1_BYTES 20
#define UQR_Q8_0_BLOCK 32
#define UQR_Q8_0_BYTES 34
#define UQR_Q4_K_BLOCK 256
#define UQR_Q4_K_BYTES 144
#define UQR_MLX4_BLOCK 64
#define UQR_MLX4_BYTES 36
#define UQR_VAR_AFFINE_BLOCK 256
#define UQR_VAR_AFFINE_BYTES 160
#define UQR_EXL3_BLOCK 256
#define UQR_EXL3_BYTES 144
#define UQR_TERNARY_BLOCK 32
#define UQR_TERNARY_BYTES 12
#define UQR_Q5_0_BLOCK 32
#define UQR_Q5_0_BYTES 22
#define UQR_Q5_1_BLOCK 32
#define UQR_Q5_1_BYTES 24
#define UQR_Q6_K_BLOCK 256
#define UQR_Q6_K_BYTES 210
#define UQR_Q5_K_BLOCK 256
#define UQR_Q5_K_BYTES 176
#define UQR_IQ4_NL_BLOCK 32
#define UQR_IQ4_NL_BYTES 18
#define UQR_IQ4_XS_BLOCK 256
#define UQR_IQ4_XS_BYTES 136
#define UQR_Q3_K_BLOCK 256
#define UQR_Q3_K_BYTES 110
#define UQR_Q2_K_BLOCK 256
#define UQR_Q2_K_BYTES 84
#define UQR_MXFP4_BLOCK 32
#define UQR_MXFP4_BYTES 17
#define UQR_MLX2_BLOCK 64
#define UQR_MLX2_BYTES 20
#define UQR_MLX3_BLOCK 64
#define UQR_MLX3_BYTES 28
#define UQR_MLX5_BLOCK 64
#define UQR_MLX5_BYTES 44
#define UQR_MLX6_BLOCK 64
#define UQR_MLX6_BYTES 52
#define UQR_MLX8_BLOCK 64
#define UQR_MLX8_BYTES 68

// Elements and bytes of one block of `fmt` (g: a grouped format's group size; 0 if unknown).
UQR_FN constexpr int uqr_block_elems(int fmt, int g) { return fmt == UQR_Q4_0 ? 32 : fmt == UQR_Q4_1 ? 32 : fmt == UQR_Q8_0 ? 32 : fmt == UQR_Q4_K ? 256 : fmt == UQR_MLX4 ? g : fmt == UQR_VAR_AFFINE ? 256 : fmt == UQR_EXL3 ? 256 : fmt == UQR_TERNARY ? 32 : fmt == UQR_Q5_0 ? 32 : fmt == UQR_Q5_1 ? 32 : fmt == UQR_Q6_K ? 256 : fmt == UQR_Q5_K ? 256 : fmt == UQR_IQ4_NL ? 32 : fmt == UQR_IQ4_XS ? 256 : fmt == UQR_Q3_K ? 256 : fmt == UQR_Q2_K ? 256 : fmt == UQR_MXFP4 ? 32 : fmt == UQR_MLX2 ? g : fmt == UQR_MLX3 ? g : fmt == UQR_MLX5 ? g : fmt == UQR_MLX6 ? g : fmt == UQR_MLX8 ? g : 0; }
UQR_FN constexpr int uqr_block_bytes(int fmt, int g) { return fmt == UQR_Q4_0 ? 18 : fmt == UQR_Q4_1 ? 20 : fmt == UQR_Q8_0 ? 34 : fmt == UQR_Q4_K ? 144 : fmt == UQR_MLX4 ? 4 + g * 4 / 8 : fmt == UQR_VAR_AFFINE ? 160 : fmt == UQR_EXL3 ? 144 : fmt == UQR_TERNARY ? 12 : fmt == UQR_Q5_0 ? 22 : fmt == UQR_Q5_1 ? 24 : fmt == UQR_Q6_K ? 210 : fmt == UQR_Q5_K ? 176 : fmt == UQR_IQ4_NL ? 18 : fmt == UQR_IQ4_XS ? 136 : fmt == UQR_Q3_K ? 110 : fmt == UQR_Q2_K ? 84 : fmt == UQR_MXFP4 ? 17 : fmt == UQR_MLX2 ? 4 + g * 2 / 8 : fmt == UQR_MLX3 ? 4 + g * 3 / 8 : fmt == UQR_MLX5 ? 4 + g * 5 / 8 : fmt == UQR_MLX6 ? 4 + g * 6 / 8 : fmt == UQR_MLX8 ? 4 + g * 8 / 8 : 0; }

// X(ENUM, "name") for every format, in id order.
#define UQR_FORMAT_LIST(X) \
  X(UQR_Q4_0, "q4_0") \
  X(UQR_Q4_1, "q4_1") \
  X(UQR_Q8_0, "q8_0") \
  X(UQR_Q4_K, "q4_k") \
  X(UQR_MLX4, "mlx4") \
  X(UQR_VAR_AFFINE, "var_affine") \
  X(UQR_EXL3, "exl3") \
  X(UQR_TERNARY, "ternary") \
  X(UQR_Q5_0, "q5_0") \
  X(UQR_Q5_1, "q5_1") \
  X(UQR_Q6_K, "q6_k") \
  X(UQR_Q5_K, "q5_k") \
  X(UQR_IQ4_NL, "iq4_nl") \
  X(UQR_IQ4_XS, "iq4_xs") \
  X(UQR_Q3_K, "q3_k") \
  X(UQR_Q2_K, "q2_k") \
  X(UQR_MXFP4, "mxfp4") \
  X(UQR_MLX2, "mlx2") \
  X(UQR_MLX3, "mlx3") \
  X(UQR_MLX5, "mlx5") \
  X(UQR_MLX6, "mlx6") \
  X(UQR_MLX8, "mlx8") \

// X(ENUM, "name") for the formats with a fixed block (no group size): the switches that
// instantiate a kernel per format expand this list, so they name only grouped formats.
#define UQR_FIXED_BLOCK_LIST(X) \
  X(UQR_Q4_0, "q4_0") \
  X(UQR_Q4_1, "q4_1") \
  X(UQR_Q8_0, "q8_0") \
  X(UQR_Q4_K, "q4_k") \
  X(UQR_VAR_AFFINE, "var_affine") \
  X(UQR_EXL3, "exl3") \
  X(UQR_TERNARY, "ternary") \
  X(UQR_Q5_0, "q5_0") \
  X(UQR_Q5_1, "q5_1") \
  X(UQR_Q6_K, "q6_k") \
  X(UQR_Q5_K, "q5_k") \
  X(UQR_IQ4_NL, "iq4_nl") \
  X(UQR_IQ4_XS, "iq4_xs") \
  X(UQR_Q3_K, "q3_k") \
  X(UQR_Q2_K, "q2_k") \
  X(UQR_MXFP4, "mxfp4") \

// X(ENUM, G) for every group size G of every grouped format: the switches that instantiate
// a kernel per (format, group size) expand this list.
#define UQR_GROUPED_CASES(X) \
  X(UQR_MLX4, 32) \
  X(UQR_MLX4, 64) \
  X(UQR_MLX4, 128) \
  X(UQR_MLX2, 32) \
  X(UQR_MLX2, 64) \
  X(UQR_MLX2, 128) \
  X(UQR_MLX3, 32) \
  X(UQR_MLX3, 64) \
  X(UQR_MLX3, 128) \
  X(UQR_MLX5, 32) \
  X(UQR_MLX5, 64) \
  X(UQR_MLX5, 128) \
  X(UQR_MLX6, 32) \
  X(UQR_MLX6, 64) \
  X(UQR_MLX6, 128) \
  X(UQR_MLX8, 32) \
  X(UQR_MLX8, 64) \
  X(UQR_MLX8, 128) \

// Whether g is a group size of the grouped format fmt (false for a fixed-block format).
UQR_FN constexpr bool uqr_group_size_ok(int fmt, int g) { return fmt == UQR_MLX4 ? (g == 32 || g == 64 || g == 128) : fmt == UQR_MLX2 ? (g == 32 || g == 64 || g == 128) : fmt == UQR_MLX3 ? (g == 32 || g == 64 || g == 128) : fmt == UQR_MLX5 ? (g == 32 || g == 64 || g == 128) : fmt == UQR_MLX6 ? (g == 32 || g == 64 || g == 128) : fmt == UQR_MLX8 ? (g == 32 || g == 64 || g == 128) : false; }
// Bits per code of a grouped format (0: a fixed-block format).
UQR_FN constexpr int uqr_code_bits(int fmt) { return fmt == UQR_MLX4 ? 4 : fmt == UQR_MLX2 ? 2 : fmt == UQR_MLX3 ? 3 : fmt == UQR_MLX5 ? 5 : fmt == UQR_MLX6 ? 6 : fmt == UQR_MLX8 ? 8 : 0; }

#define UQR_FORMAT_NAMES "'q4_0', 'q4_1', 'q8_0', 'q4_k', 'mlx4', 'var_affine', 'exl3', 'ternary', 'q5_0', 'q5_1', 'q6_k', 'q5_k', 'iq4_nl', 'iq4_xs', 'q3_k', 'q2_k', 'mxfp4', 'mlx2', 'mlx3', 'mlx5', 'mlx6', 'mlx8'"

// Formats with path "vec" on cpu: X(ENUM, "name").
#define UQR_VEC_CPU_LIST(X) \
  X(UQR_TERNARY, "ternary") \

#define UQR_VEC_CPU_NAMES "'ternary'"

// Formats with path "vec" on cuda: X(ENUM, "name").
#define UQR_VEC_CUDA_LIST(X) \
  X(UQR_TERNARY, "ternary") \

#define UQR_VEC_CUDA_NAMES "'ternary'"

// Formats with path "vec" on metal: X(ENUM, "name").
#define UQR_VEC_METAL_LIST(X) \
  X(UQR_TERNARY, "ternary") \

#define UQR_VEC_METAL_NAMES "'ternary'"

// Formats with path "int8" on cpu: X(ENUM, "name").
#define UQR_INT8_CPU_LIST(X) \
  X(UQR_Q4_0, "q4_0") \
  X(UQR_Q4_1, "q4_1") \
  X(UQR_Q8_0, "q8_0") \
  X(UQR_Q4_K, "q4_k") \
  X(UQR_MLX4, "mlx4") \
  X(UQR_VAR_AFFINE, "var_affine") \
  X(UQR_EXL3, "exl3") \
  X(UQR_TERNARY, "ternary") \
  X(UQR_Q5_0, "q5_0") \
  X(UQR_Q5_1, "q5_1") \
  X(UQR_Q6_K, "q6_k") \

#define UQR_INT8_CPU_NAMES "'q4_0', 'q4_1', 'q8_0', 'q4_k', 'mlx4', 'var_affine', 'exl3', 'ternary', 'q5_0', 'q5_1', 'q6_k'"

// Formats with path "int8" on cuda: X(ENUM, "name").
#define UQR_INT8_CUDA_LIST(X) \
  X(UQR_Q4_0, "q4_0") \
  X(UQR_Q4_K, "q4_k") \
  X(UQR_MLX4, "mlx4") \
  X(UQR_VAR_AFFINE, "var_affine") \
  X(UQR_EXL3, "exl3") \
  X(UQR_TERNARY, "ternary") \

#define UQR_INT8_CUDA_NAMES "'q4_0', 'q4_k', 'mlx4', 'var_affine', 'exl3', 'ternary'"

// Formats with path "int8" on metal: X(ENUM, "name").
#define UQR_INT8_METAL_LIST(X) \

#define UQR_INT8_METAL_NAMES ""
