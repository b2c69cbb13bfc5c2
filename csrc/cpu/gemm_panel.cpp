// Large-M path: every weight is decoded exactly once per call. The N rows are cut into panels of
// P rows sized to stay in L2 (kPanelBytes); each thread decodes one panel into its own fp32
// buffer and multiplies it against all R activation rows with ATen's mm (MKL sgemm on x86),
// then stores the [R, P] result through the output strides. Extra memory per thread: one panel
// plus a result tile no larger than the panel.
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "block_decode.h"
#include "kernels.h"

namespace uqr::cpu {
namespace {

template <class Dec>
void decode_panel(const uint8_t* w, const uqr_gemm_params& p, int64_t n0, int64_t rows, float* panel) {
  const int64_t nblocks = p.K / Dec::kElems;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = w + (n0 + r) * p.row_bytes;
    float* dst = panel + r * p.K;
    for (int64_t b = 0; b < nblocks; ++b) {
      vf v[Dec::kVecs];
      Dec::decode(row + b * Dec::kBytes, v);
      for (int i = 0; i < Dec::kVecs; ++i) vstore(dst + b * Dec::kElems + i * kLanes, v[i]);
    }
  }
}

int64_t panel_rows(const uqr_gemm_params& p) {
  int64_t P = kPanelBytes / (static_cast<int64_t>(sizeof(float)) * p.K);
  P = std::clamp<int64_t>(P / 16 * 16, kPanelRowsMin, kPanelRowsMax);
  // Leave at least two panels per thread so the work splits evenly.
  const int64_t per_thread = (p.N + 2 * at::get_num_threads() - 1) / (2 * at::get_num_threads());
  P = std::min(P, std::max<int64_t>(16, (per_thread + 15) / 16 * 16));
  return std::min<int64_t>(P, p.N);
}

}  // namespace

void gemm_panels(const uint8_t* w, const uqr_gemm_params& p, const at::Tensor& X, const OutputWriter& out) {
  const int64_t R = X.size(0);
  const int64_t P = panel_rows(p);
  const int64_t n_panels = (p.N + P - 1) / P;
  // The result tile holds at most as many floats as the panel (R is cut into chunks of K rows).
  const int64_t chunk_rows = std::min<int64_t>(R, std::max<int64_t>(p.K, 64));
  with_decoder(p.fmt, p.group_size, [&](auto tag) {
    using Dec = typename decltype(tag)::type;
    at::parallel_for(0, n_panels, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> panel(static_cast<size_t>(P * p.K));
      std::vector<float> tile(static_cast<size_t>(chunk_rows * P));
      const auto f32 = at::TensorOptions().dtype(at::kFloat);
      for (int64_t pi = begin; pi < end; ++pi) {
        const int64_t n0 = pi * P, rows = std::min(P, p.N - n0);
        decode_panel<Dec>(w, p, n0, rows, panel.data());
        const at::Tensor w_t = at::from_blob(panel.data(), {rows, p.K}, f32).t();
        for (int64_t r0 = 0; r0 < R; r0 += chunk_rows) {
          const int64_t mr = std::min(chunk_rows, R - r0);
          at::Tensor c = at::from_blob(tile.data(), {mr, rows}, f32);
          at::mm_out(c, X.narrow(0, r0, mr), w_t);
          for (int64_t r = 0; r < mr; ++r) out.store(r0 + r, n0, rows, tile.data() + r * rows);
        }
      }
    });
  });
}

}  // namespace uqr::cpu
