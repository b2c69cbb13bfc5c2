// Large-M path: every weight is decoded exactly once per call, then multiplied against all rows.
//
// The activations are packed once per call into column blocks Xp[mb][k][16] (16 rows of x side
// by side for every k, zero-padded past R). Each thread owns a panel buffer of kPanelRows decoded
// weight rows (fp32, row-major as the decoders produce them; about half a core's L2) and runs the
// register-tiled microkernel over it: 8 weight rows x 32 activation rows, 16 vector
// accumulators, per k one weight scalar broadcast per row and two activation vectors. K is
// walked in chunks of kKChunk so the activation slice stays in L1 while all tiles of the panel
// use it (without this the kernel was bound by L2 bandwidth).
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

constexpr int kTileRows = 8;     // weight rows per microkernel call (broadcast operands)
constexpr int64_t kKChunk = 128;  // K per pass: x slice 32 x 128 fp32 = 16 KiB, well inside L1 (48 KiB)
// Panel rows are kPanelPad floats longer than K: with K a multiple of 1024 the rows would all map
// to the same L1 sets (4 KiB aliasing) and evict the x slice; 512 bytes shifts each row to
// other sets.
constexpr int64_t kPanelPad = 128;

// c[r][v*16 + i] (+)= sum_{k < kc} panel[r*ld + k] * xv[v][k*16 + i] for r < 8, v < NV; c has
// row stride 32. `accumulate` continues the sums of a previous K chunk.
template <int NV>
void microkernel(const float* panel, int64_t ld, int64_t kc, const float* const* xv, float* c, bool accumulate) {
  vf acc[kTileRows][NV];
  for (int r = 0; r < kTileRows; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = accumulate ? vload(c + r * (2 * kLanes) + v * kLanes) : vzero();
  for (int64_t k = 0; k < kc; ++k) {
    vf x[NV];
    for (int v = 0; v < NV; ++v) x[v] = vload(xv[v] + k * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < kTileRows; ++r) {
      const vf wr = vset1(panel[r * ld + k]);
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
      const int64_t ld = p.K + kPanelPad;
      std::vector<float> panel(static_cast<size_t>(kPanelRows * ld), 0.f);
      // Results of the whole panel for one pair of x blocks: kPanelRows x 32 floats (8 KiB).
      std::vector<float> c(static_cast<size_t>(kPanelRows * 2 * kLanes));
      float y_run[kPanelRows];
      for (int64_t pi = begin; pi < end; ++pi) {
        const int64_t n0 = pi * kPanelRows, rows = std::min<int64_t>(kPanelRows, p.N - n0);
        decode_rows<Dec>(w, p, n0, rows, panel.data(), ld);
        if (rows < kPanelRows) std::fill(panel.begin() + rows * ld, panel.end(), 0.f);
        const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
        for (int64_t mb = 0; mb < m_blocks; mb += 2) {
          const int nv = mb + 1 < m_blocks ? 2 : 1;
          const float* xb[2] = {xp + mb * p.K * kLanes, xp + (mb + nv - 1) * p.K * kLanes};
          // K in chunks so the x slice (32 rows x kKChunk) stays in L1 across the panel's tiles.
          for (int64_t k0 = 0; k0 < p.K; k0 += kKChunk) {
            const int64_t kc = std::min<int64_t>(kKChunk, p.K - k0);
            const float* xv[2] = {xb[0] + k0 * kLanes, xb[1] + k0 * kLanes};
            for (int64_t t = 0; t < tiles; ++t) {
              const float* pt = panel.data() + t * kTileRows * ld + k0;
              float* ct = c.data() + t * kTileRows * 2 * kLanes;
              if (nv == 2) microkernel<2>(pt, ld, kc, xv, ct, k0 > 0);
              else microkernel<1>(pt, ld, kc, xv, ct, k0 > 0);
            }
          }
          const int64_t tm = std::min<int64_t>(nv * kLanes, R - mb * kLanes);
          for (int64_t i = 0; i < tm; ++i) {
            for (int64_t r = 0; r < rows; ++r) y_run[r] = c[r * 2 * kLanes + i];
            out.store(mb * kLanes + i, n0, rows, y_run);
          }
        }
      }
    });
  });
}

}  // namespace uqr::cpu
