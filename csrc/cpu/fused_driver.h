// The small-M kernels' shared outer loop (gemm_fused.cpp, gemm_int8.cpp).
#pragma once
#include <ATen/Parallel.h>

#include <algorithm>

#include "kernels.h"

namespace uqr::cpu {

// Parallel over weight rows; inside each unit, all R activation rows in passes of
// kFusedMaxRows, results collected in a small tile and stored through the output strides.
// rows_fn(rows, r0, n0, n1, res, ld_res) fills res[m * ld_res + (n - n0)] for rows r0 + m.
template <class RowsFn>
void fused_driver(int64_t N, int64_t R, const OutputWriter& out, RowsFn rows_fn) {
  at::parallel_for(0, N, kFusedGrainRows, [&](int64_t begin, int64_t end) {
    float tile[kFusedMaxRows * kFusedGrainRows];
    for (int64_t n0 = begin; n0 < end; n0 += kFusedGrainRows) {
      const int64_t n1 = std::min(end, n0 + kFusedGrainRows);
      for (int64_t r0 = 0; r0 < R; r0 += kFusedMaxRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kFusedMaxRows, R - r0));
        rows_fn(rows, r0, n0, n1, tile, kFusedGrainRows);
        for (int m = 0; m < rows; ++m) out.store(r0 + m, n0, n1 - n0, tile + m * kFusedGrainRows);
      }
    }
  });
}

}  // namespace uqr::cpu
