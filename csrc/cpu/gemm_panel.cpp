// Large-M path: every weight is decoded exactly once per call, then multiplied against all rows.
//
// The activations are packed once per call into column blocks Xp[mb][k][16] (16 rows of x side
// by side for every k, zero-padded past R). Each thread owns a panel buffer of kPanelRows decoded
// weight rows (fp32, row-major as the decoders produce them; about half a core's L2) and runs the
// register-tiled microkernel over it: 8 weight rows x 32 activation rows, 16 vector
// accumulators, per k one weight scalar broadcast per row and two activation vectors.
// One parallel region over panels, no barrier inside; extra memory: the packed x (the fp32 copy
// of x, documented as part of the bound) plus one panel per thread.
//
// ATen's mm is deliberately not used here: called inside the parallel region, MKL starts its own
// threads and oversubscribes the cores, and called outside it, the per-panel barriers cost more
// than the GEMM on a loaded 2-core box.
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "block_decode.h"
#include "kernels.h"

namespace uqr::cpu {
namespace {

constexpr int kTileRows = 8;  // weight rows per microkernel call (broadcast operands)

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

// c[r][v*16 + i] = sum_k panel[r][k] * xv[v][k][i] for r < 8, v < NV.
template <int NV>
void microkernel(const float* panel, int64_t K, const float* const* xv, float* c) {
  vf acc[kTileRows][NV];
  for (int r = 0; r < kTileRows; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = vzero();
  for (int64_t k = 0; k < K; ++k) {
    vf x[NV];
    for (int v = 0; v < NV; ++v) x[v] = vload(xv[v] + k * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r) {
      const vf wr = vset1(panel[r * K + k]);
      for (int v = 0; v < NV; ++v) acc[r][v] = vfma(wr, x[v], acc[r][v]);
    }
  }
  for (int r = 0; r < kTileRows; ++r)
    for (int v = 0; v < NV; ++v) vstore(c + r * (2 * kLanes) + v * kLanes, acc[r][v]);
}

}  // namespace

void pack_x(const at::Tensor& x, const uqr_gemm_params& p, int64_t R, float* xp) {
  const int64_t blocks = (R + kLanes - 1) / kLanes;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> rows(static_cast<size_t>(kLanes * p.K));
    for (int64_t mb = begin; mb < end; ++mb) {
      const int64_t r0 = mb * kLanes, n = std::min<int64_t>(kLanes, R - r0);
      stage_rows(x, p, r0, n, rows.data());
      std::fill(rows.begin() + n * p.K, rows.end(), 0.f);
      float* dst = xp + mb * p.K * kLanes;
      for (int64_t k = 0; k < p.K; ++k)
        for (int i = 0; i < kLanes; ++i) dst[k * kLanes + i] = rows[i * p.K + k];
    }
  });
}

void gemm_panels(const uint8_t* w, const uqr_gemm_params& p, const float* xp, int64_t R, const OutputWriter& out) {
  const int64_t m_blocks = (R + kLanes - 1) / kLanes;
  const int64_t n_panels = (p.N + kPanelRows - 1) / kPanelRows;
  with_decoder(p.fmt, p.group_size, [&](auto tag) {
    using Dec = typename decltype(tag)::type;
    at::parallel_for(0, n_panels, 1, [&](int64_t begin, int64_t end) {
      // Rows past N stay zero so the last tile of 8 needs no special case.
      std::vector<float> panel(static_cast<size_t>(kPanelRows * p.K), 0.f);
      alignas(64) float c[kTileRows * 2 * kLanes];
      float y_run[kTileRows];
      for (int64_t pi = begin; pi < end; ++pi) {
        const int64_t n0 = pi * kPanelRows, rows = std::min<int64_t>(kPanelRows, p.N - n0);
        decode_panel<Dec>(w, p, n0, rows, panel.data());
        if (rows < kPanelRows) std::fill(panel.begin() + rows * p.K, panel.end(), 0.f);
        for (int64_t mb = 0; mb < m_blocks; mb += 2) {
          const int nv = mb + 1 < m_blocks ? 2 : 1;
          const float* xv[2] = {xp + mb * p.K * kLanes, xp + (mb + nv - 1) * p.K * kLanes};
          for (int64_t t = 0; t < rows; t += kTileRows) {
            if (nv == 2) microkernel<2>(panel.data() + t * p.K, p.K, xv, c);
            else microkernel<1>(panel.data() + t * p.K, p.K, xv, c);
            const int64_t tn = std::min<int64_t>(kTileRows, rows - t);
            const int64_t tm = std::min<int64_t>(nv * kLanes, R - mb * kLanes);
            for (int64_t i = 0; i < tm; ++i) {
              for (int64_t r = 0; r < tn; ++r) y_run[r] = c[r * 2 * kLanes + i];
              out.store(mb * kLanes + i, n0 + t, tn, y_run);
            }
          }
        }
      }
    });
  });
}

}  // namespace uqr::cpu
