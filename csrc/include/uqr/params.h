// The one parameter struct every gemm backend (CPU, Metal, CUDA) receives, so a layout is described
// once. x and y are addressed through strides, which is how the direct-head layouts cost no copy:
//   x(b, m, k) = x[b*x_batch_stride + m*x_row_stride + (k / x_head_dim)*x_head_stride + k % x_head_dim]
//   y(b, m, n) = y[b*y_batch_stride + m*y_row_stride + (n / y_head_dim)*y_head_stride + n % y_head_dim]
// Plain [.., M, K] input: x_head_dim = K, x_head_stride = 0 (and likewise for y with N).
// Strides are in elements. The fields are listed once, in UQR_PARAM_FIELDS: the struct, the host's
// conversion to and from an int64 list (gemm_args.h, the Metal emulator) and Python's view of a plan
// (torch_uqr/backends/strides.py, which reads the names from the uqr::_param_fields op) expand it.
#pragma once
#include "platform.h"

#define UQR_PARAM_FIELDS(X)                                                                        \
  X(uqr_i32, fmt)        /* uqr_format (format_table.h) */                                        \
  X(uqr_i32, batch)      /* product of the leading dims of x that do not fold into M */          \
  X(uqr_i32, M)          /* rows per batch */                                                     \
  X(uqr_i32, N)          /* output features */                                                    \
  X(uqr_i32, K)          /* input features */                                                     \
  X(uqr_i32, group_size) /* elements per block (a grouped format's g; the block otherwise) */ \
  X(uqr_i32, block_bytes)                                                                          \
  X(uqr_i32, row_bytes) /* bytes per weight row = (K / group_size) * block_bytes */               \
  X(uqr_i64, x_batch_stride)                                                                       \
  X(uqr_i64, x_row_stride)                                                                         \
  X(uqr_i64, x_head_stride)                                                                        \
  X(uqr_i32, x_head_dim)                                                                           \
  X(uqr_i64, y_batch_stride)                                                                       \
  X(uqr_i64, y_row_stride)                                                                         \
  X(uqr_i64, y_head_stride)                                                                        \
  X(uqr_i32, y_head_dim)

#define UQR_DECLARE_PARAM(type, name) type name;
struct uqr_gemm_params {
  UQR_PARAM_FIELDS(UQR_DECLARE_PARAM)
};
#undef UQR_DECLARE_PARAM

// The x offset splits into a row part and a column part, so a kernel that reads several rows at the
// same columns (the Metal matrix-vector kernel) divides by x_head_dim once per column, not per element.
UQR_FN uqr_i64 uqr_x_row_offset(UQR_PARAMS_SPACE const uqr_gemm_params& p, uqr_i32 b, uqr_i32 m) {
  return b * p.x_batch_stride + m * p.x_row_stride;
}
UQR_FN uqr_i64 uqr_x_col_offset(UQR_PARAMS_SPACE const uqr_gemm_params& p, uqr_i32 k) {
  return (k / p.x_head_dim) * p.x_head_stride + k % p.x_head_dim;
}
UQR_FN uqr_i64 uqr_x_offset(UQR_PARAMS_SPACE const uqr_gemm_params& p, uqr_i32 b, uqr_i32 m, uqr_i32 k) {
  return uqr_x_row_offset(p, b, m) + uqr_x_col_offset(p, k);
}
// Likewise for y: kernels that store many rows of the same columns (the wgmma kernel's epilogue)
// divide by y_head_dim once per column.
UQR_FN uqr_i64 uqr_y_row_offset(UQR_PARAMS_SPACE const uqr_gemm_params& p, uqr_i32 b, uqr_i32 m) {
  return b * p.y_batch_stride + m * p.y_row_stride;
}
UQR_FN uqr_i64 uqr_y_col_offset(UQR_PARAMS_SPACE const uqr_gemm_params& p, uqr_i32 n) {
  return (n / p.y_head_dim) * p.y_head_stride + n % p.y_head_dim;
}
UQR_FN uqr_i64 uqr_y_offset(UQR_PARAMS_SPACE const uqr_gemm_params& p, uqr_i32 b, uqr_i32 m, uqr_i32 n) {
  return uqr_y_row_offset(p, b, m) + uqr_y_col_offset(p, n);
}
