// Launch geometry of the Metal gemm kernels: which kernel (by host name), the grid, the threadgroup
// size and the threadgroup memory length. Plain C++ with no system headers, shared by the
// Objective-C++ glue (gemm_mps.mm) and the CPU emulator (torch_uqr/metal_emu), so the emulator runs
// exactly the dispatch a Mac would.
#pragma once
#include "uqr/formats.h"
#include "uqr/params.h"
#include "../../shaders/uqr_tiles.h"
#include "../../shaders/uqr_limits.h"

enum uqr_dtype { UQR_DTYPE_F16 = 0, UQR_DTYPE_BF16 = 1, UQR_DTYPE_F32 = 2 };
enum uqr_path { UQR_PATH_AUTO = 0, UQR_PATH_MMA = 1, UQR_PATH_VEC = 2 };

struct uqr_launch {
  char name[48];             // host name, e.g. "uqr_gemm_mma_q4_k_f16"
  uqr_u32 grid[3];           // threadgroups along x (N tiles), y (M tiles), z (batch)
  uqr_u32 threads;           // threads per threadgroup (1-D)
  uqr_u32 threadgroup_bytes; // length of threadgroup memory argument 0
};

inline const char* uqr_format_name(int fmt) {
#define UQR_NAME_CASE(id, name) \
  if (fmt == id) return name;
  UQR_FORMAT_LIST(UQR_NAME_CASE)
#undef UQR_NAME_CASE
  return nullptr;
}

inline const char* uqr_dtype_name(int dtype) {
  return dtype == UQR_DTYPE_F16 ? "f16" : dtype == UQR_DTYPE_BF16 ? "bf16" : dtype == UQR_DTYPE_F32 ? "f32" : nullptr;
}

inline uqr_u32 uqr_ceil_div(uqr_i64 a, uqr_i64 b) { return (uqr_u32)((a + b - 1) / b); }

// Appends src to dst (capacity cap, always terminated); launch.h avoids <cstring> on purpose.
inline void uqr_append(char* dst, const char* src, int cap) {
  int n = 0;
  while (n < cap - 1 && dst[n]) ++n;
  for (int i = 0; src[i] && n < cap - 1; ++i) dst[n++] = src[i];
  dst[n] = 0;
}

// Kernel choice: path "mma" -> prefill kernel; "vec" (ternary only) -> the matrix-vector kernel,
// whose ternary instance adds and subtracts, at any M; "auto" -> matrix-vector for M <= UQR_MV_MAX_M,
// prefill otherwise. Returns nullptr, or a message saying which argument is wrong.
inline const char* uqr_plan_launch(const uqr_gemm_params& p, int dtype, int path, uqr_launch& out) {
  const char* fname = uqr_format_name(p.fmt);
  const char* dname = uqr_dtype_name(dtype);
  if (!fname) return "fmt: unknown format id";
  if (!dname) return "x: dtype must be float16, bfloat16 or float32";
  if (path != UQR_PATH_AUTO && path != UQR_PATH_MMA && path != UQR_PATH_VEC)
    return "path: expected 'auto', 'mma' or 'vec'";
  if (path == UQR_PATH_VEC && p.fmt != UQR_TERNARY) return "path: 'vec' is only valid for fmt='ternary'";
  if (p.K % UQR_MMA_BK != 0 || p.group_size % 8 != 0 || p.K % p.group_size != 0)
    return "K: must be a multiple of the block size (and of 32)";
  const bool mv = path == UQR_PATH_VEC || (path == UQR_PATH_AUTO && p.M <= UQR_MV_MAX_M);

  out.name[0] = 0;
  uqr_append(out.name, mv ? "uqr_gemm_mv_" : "uqr_gemm_mma_", sizeof out.name);
  uqr_append(out.name, fname, sizeof out.name);
  uqr_append(out.name, "_", sizeof out.name);
  uqr_append(out.name, dname, sizeof out.name);
  if (mv) {
    out.grid[0] = uqr_ceil_div(p.N, UQR_MV_ROWS * UQR_MV_SG);
    out.grid[1] = uqr_ceil_div(p.M, UQR_MV_M);
    out.threads = UQR_MV_THREADS;
    out.threadgroup_bytes = UQR_MV_TG_BYTES;
  } else {
    const uqr_u32 stage_elem = dtype == UQR_DTYPE_F16 ? 2 : 4;  // half staging for fp16 only
    const uqr_u32 staged = UQR_MMA_STAGED_BYTES(stage_elem);
    const uqr_u32 out_tile = UQR_MMA_OUT_TILE_BYTES;
    out.grid[0] = uqr_ceil_div(p.N, UQR_MMA_BN);
    out.grid[1] = uqr_ceil_div(p.M, UQR_MMA_BM);
    out.threads = UQR_MMA_THREADS;
    out.threadgroup_bytes = staged > out_tile ? staged : out_tile;
  }
  out.grid[2] = (uqr_u32)p.batch;
  return nullptr;
}
