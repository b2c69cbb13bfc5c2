// Larger M through a library GEMM: decode a panel of weight rows into x's dtype, then one ATen mm
// per panel. For bf16, oneDNN runs it on the AMX tiles, which is ~4x the fp32 FMA rate of our own
// panel GEMM (docs/perf/cpu-sapphire-rapids.md), so the decode is what remains of the quantized cost. fp32 x takes
// this path on CPUs without AVX-512, where the library's (MKL / oneDNN) fp32 GEMM beats the
// panel microkernel, which is tiled for 32 zmm registers.
//
// Numerics: each decoded weight is rounded once to x's dtype (bf16: 8 significant bits; fp32:
// exact), products are accumulated in fp32 inside the library, y is rounded to x's dtype. MLX
// dequantizes to the activation dtype the same way; the error stays well inside the tests' 1e-2
// bound for half outputs (whose own rounding is 2^-9 for bf16).
//
// Structure: panels of kLibraryPanelRows rows are decoded by all threads (at::parallel_for), then
// one mm per panel uses all threads. Panel sizes of 256 .. 4096 rows were measured at M = 16,
// 128, 512 (K = N = 4096, bf16): 512 .. 2048 were within noise of each other, the whole matrix at
// once (4096) up to 2x slower. Per-thread panels with a single-threaded mm inside the parallel
// region were not tried: the fp32 path's experience (gemm_panel.cpp) is that a library GEMM
// called there oversubscribes the cores. Extra memory: one panel (kLibraryPanelRows x K elements
// of x's dtype, 8 MiB for halves at K = 4096) plus the gathered x when x is head-strided.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "block_decode.h"
#include "kernels.h"

namespace uqr::cpu {
namespace {

template <class T>
void run(const uint8_t* w, const uqr_gemm_params& p, const at::Tensor& x, int64_t R, const at::Tensor& y,
         const OutputWriter& out) {
  const at::Tensor xm = x_matrix(x, p, R);
  // fp32 panels are kept to a quarter of the rows, so a panel (4 MiB at K = 4096) stays in the
  // last-level cache between its decode and the GEMM that reads it.
  const int64_t prows = std::min<int64_t>(std::is_same_v<T, float> ? kLibraryPanelRows / 4 : kLibraryPanelRows, p.N);
  at::Tensor panel = at::empty({prows, p.K}, x.options());
  // Plain y ([R, N] rows, one stride): mm writes into its column slice directly.
  const bool plain_y = p.batch == 1 && p.y_head_dim == p.N && p.y_row_stride == p.N;
  const at::Tensor y2 = plain_y ? y.view({R, p.N}) : at::Tensor();
  at::Tensor c;  // [R, rows] results of one panel when y needs the strided writer
  with_decoder(p.fmt, p.group_size, [&](auto tag) {
    using Dec = typename decltype(tag)::type;
    for (int64_t n0 = 0; n0 < p.N; n0 += prows) {
      const int64_t rows = std::min<int64_t>(prows, p.N - n0);
      T* pp = panel.template data_ptr<T>();
      at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
        decode_rows<Dec>(w, p, n0 + begin, end - begin, pp + begin * p.K, p.K);
      });
      const at::Tensor wt = panel.narrow(0, 0, rows).t();
      if (plain_y) {
        at::Tensor ys = y2.narrow(1, n0, rows);
        at::mm_out(ys, xm, wt);
        continue;
      }
      c = at::mm(xm, wt);
      const T* cp = c.template const_data_ptr<T>();
      at::parallel_for(0, R, 16, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) out.store(r, n0, rows, cp + r * rows);
      });
    }
  });
}

}  // namespace

// The view case covers plain x and batches the planner collapsed into one row stride.
at::Tensor x_matrix(const at::Tensor& x, const uqr_gemm_params& p, int64_t R) {
  if (p.batch == 1 && p.x_head_dim == p.K)
    return x.as_strided({R, p.K}, {p.x_row_stride, 1}, x.storage_offset());
  at::Tensor xm = at::empty({R, p.K}, x.options());
  const int64_t heads = p.K / p.x_head_dim, es = x.element_size();
  const char* src = static_cast<const char*>(x.const_data_ptr());
  char* dst = static_cast<char*>(xm.data_ptr());
  at::parallel_for(0, R, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / p.M, m = r % p.M;
      for (int64_t h = 0; h < heads; ++h)
        std::memcpy(dst + (r * p.K + h * p.x_head_dim) * es,
                    src + (b * p.x_batch_stride + m * p.x_row_stride + h * p.x_head_stride) * es,
                    p.x_head_dim * es);
    }
  });
  return xm;
}

void gemm_library(const uint8_t* w, const uqr_gemm_params& p, const at::Tensor& x, int64_t R, const at::Tensor& y,
                  const OutputWriter& out) {
  switch (x.scalar_type()) {
    case at::kBFloat16: run<c10::BFloat16>(w, p, x, R, y, out); break;
    case at::kHalf: run<c10::Half>(w, p, x, R, y, out); break;
    default: run<float>(w, p, x, R, y, out); break;
  }
}

}  // namespace uqr::cpu
