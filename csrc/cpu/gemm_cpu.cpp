// uqr::gemm on CPU: argument plan, fp32 staging of x, path choice, output.
#include "gemm_cpu.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_simd.h"
#include "kernels.h"
#include "uqr/check.h"
#include "uqr/formats.h"
#include "uqr/gemm_args.h"

namespace uqr::cpu {

OutputWriter::OutputWriter(const at::Tensor& y, const uqr_gemm_params& p)
    : base_(y.data_ptr()), dtype_(y.scalar_type()), p_(p) {}

template <class F>
void OutputWriter::for_runs(int64_t r, int64_t n0, int64_t count, F&& f) const {
  const int64_t b = r / p_.M, m = r % p_.M;
  const int64_t row = b * p_.y_batch_stride + m * p_.y_row_stride;
  int64_t n = n0;
  while (n < n0 + count) {
    // One contiguous run per output head.
    const int64_t h = n / p_.y_head_dim, d = n % p_.y_head_dim;
    const int64_t run = std::min<int64_t>(p_.y_head_dim - d, n0 + count - n);
    f(row + h * p_.y_head_stride + d, n - n0, run);
    n += run;
  }
}

void OutputWriter::store(int64_t r, int64_t n0, int64_t count, const float* src) const {
  for_runs(r, n0, count, [&](int64_t off, int64_t s, int64_t run) {
    switch (dtype_) {
      case at::kFloat: from_float(src + s, static_cast<float*>(base_) + off, run); break;
      case at::kHalf: from_float(src + s, static_cast<c10::Half*>(base_) + off, run); break;
      default: from_float(src + s, static_cast<c10::BFloat16*>(base_) + off, run); break;
    }
  });
}

void OutputWriter::store(int64_t r, int64_t n0, int64_t count, const c10::Half* src) const {
  TORCH_INTERNAL_ASSERT(dtype_ == at::kHalf);
  for_runs(r, n0, count, [&](int64_t off, int64_t s, int64_t run) {
    std::memcpy(static_cast<c10::Half*>(base_) + off, src + s, run * sizeof(c10::Half));
  });
}

void OutputWriter::store(int64_t r, int64_t n0, int64_t count, const c10::BFloat16* src) const {
  TORCH_INTERNAL_ASSERT(dtype_ == at::kBFloat16);
  for_runs(r, n0, count, [&](int64_t off, int64_t s, int64_t run) {
    std::memcpy(static_cast<c10::BFloat16*>(base_) + off, src + s, run * sizeof(c10::BFloat16));
  });
}

void stage_rows(const at::Tensor& x, const uqr_gemm_params& p, int64_t r0, int64_t rows, float* dst) {
  const int64_t heads = p.K / p.x_head_dim;
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = r0 + i, b = r / p.M, m = r % p.M;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t off = b * p.x_batch_stride + m * p.x_row_stride + h * p.x_head_stride;
        float* out = dst + i * p.K + h * p.x_head_dim;
        switch (x.scalar_type()) {
          case at::kFloat: to_float(x.const_data_ptr<float>() + off, out, p.x_head_dim); break;
          case at::kHalf: to_float(x.const_data_ptr<c10::Half>() + off, out, p.x_head_dim); break;
          default: to_float(x.const_data_ptr<c10::BFloat16>() + off, out, p.x_head_dim); break;
        }
      }
    }
  });
}

std::vector<uint8_t> take_nonfinite_rows(float* X, int64_t R, int64_t K) {
  std::vector<uint8_t> flags;
  for (int64_t r = 0; r < R; ++r) {
    float* x = X + r * K;
    // All-ones exponent = NaN or Inf; an integer OR-reduction, so the scan vectorizes.
    uint32_t bad = 0;
    for (int64_t k = 0; k < K; ++k) {
      uint32_t bits;
      std::memcpy(&bits, x + k, 4);
      bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
    if (!bad) continue;
    if (flags.empty()) flags.assign(static_cast<size_t>(R), 0);
    flags[static_cast<size_t>(r)] = 1;
    for (int64_t k = 0; k < K; ++k)
      if (!std::isfinite(x[k])) x[k] = 0.f;
  }
  return flags;
}

namespace {

// Ternary, small M, path "auto": add/subtract (true) or decode+FMA (false). Decode+FMA measured
// ~10 % faster at M = 1..8 on the 2-core AVX-512 dev box (docs/operator.md, "Ternary paths").
constexpr bool kTernaryAutoVec = false;

// Half x at larger M: decode to x's dtype and multiply with ATen's mm (gemm_half.cpp) instead of
// the fp32 panel GEMM. bf16 runs on AMX and wins from M = 9 on. fp16 has no AMX on this CPU
// generation: oneDNN's fp16 GEMM only beats our fp32 panel GEMM for tall x, so fp16 switches at
// kHalfFp16MinRows (measurements in docs/perf/cpu-sapphire-rapids.md).
constexpr int64_t kHalfFp16MinRows = 256;
// fp32 x without AVX-512: the panel microkernel is tiled for 32 zmm registers (16 accumulators of
// 16 lanes), so with 16 ymm (AVX2) or 32 q registers (NEON) larger M goes to the library's fp32
// GEMM on decoded panels instead. Below kFp32LibraryMinRows the fused kernel (in passes of
// kFusedMaxRows rows) is faster: the library path writes and re-reads every decoded weight as
// fp32 (Zen 2, one thread, CPU ms: M = 16 fused 17, library 26; M = 31 fused 38-64, library
// 31-44 at M = 32; docs/perf/history.md).
constexpr bool kFp32Library = !UQR_CPU_AVX512;
constexpr int64_t kFp32LibraryMinRows = 24;

bool use_library(const GemmPlan& plan, int64_t R) {
  if (plan.path == GemmPath::kVec) return false;
  const auto st = plan.x_used.scalar_type();
  return st == at::kBFloat16 || (st == at::kHalf && R >= kHalfFp16MinRows) || (st == at::kFloat && kFp32Library);
}

bool use_fused(const GemmPlan& plan, int64_t R) {
  if (plan.path == GemmPath::kVec) return true;
  if (kFp32Library && plan.x_used.scalar_type() == at::kFloat) return R < kFp32LibraryMinRows;
  return R <= kFusedMaxRows;
}

}  // namespace

at::Tensor gemm(const at::Tensor& x, const at::Tensor& w, c10::string_view fmt, int64_t N, int64_t K,
                int64_t group_size, int64_t out_heads, bool in_heads, c10::string_view path) {
  UQR_CHECK_ARG(x.device().is_cpu(), "uqr::gemm (CPU kernel): x must be on the CPU, got ", x.device());
  GemmPlan plan = plan_gemm(x, w, fmt, N, K, group_size, out_heads, in_heads, path, Backend::kCpu);
  at::Tensor y = allocate_output(plan, x.options());
  const uqr_gemm_params& p = plan.p;
  const int64_t R = static_cast<int64_t>(p.batch) * p.M;
  if (R == 0) return y;
  const uint8_t* wp = w.const_data_ptr<uint8_t>();
  const OutputWriter out(y, p);

  // The small-M kernels take all R rows of x as fp32 [R, K].
  auto staged = [&] {
    std::vector<float> X(static_cast<size_t>(R * p.K));
    stage_rows(plan.x_used, p, 0, R, X.data());
    return X;
  };
  if (plan.path == GemmPath::kInt8) {
    std::vector<float> X = staged();
    const std::vector<uint8_t> nan_rows = take_nonfinite_rows(X.data(), R, p.K);
    gemm_int8(wp, p, X.data(), R, out, nan_rows.empty() ? nullptr : nan_rows.data());
    return y;
  }
  if (use_fused(plan, R)) {
    std::vector<float> X = staged();
    const bool vec = p.fmt == UQR_TERNARY &&
                     (plan.path == GemmPath::kVec || (plan.path == GemmPath::kAuto && kTernaryAutoVec));
    if (vec) {
      const std::vector<uint8_t> nan_rows = take_nonfinite_rows(X.data(), R, p.K);
      gemm_ternary_vec(wp, p, X.data(), R, out, nan_rows.empty() ? nullptr : nan_rows.data());
    } else {
      gemm_fused(wp, p, X.data(), R, out);
    }
    return y;
  }
  if (use_library(plan, R)) {
    gemm_library(wp, p, plan.x_used, R, y, out);
    return y;
  }
  // Panel path: x is read once through its strides into the packed fp32 layout.
  std::vector<float> xp(static_cast<size_t>((R + kLanes - 1) / kLanes * kLanes * p.K));
  pack_x(plan.x_used, p, R, xp.data());
  gemm_panels(wp, p, xp.data(), R, out);
  return y;
}

}  // namespace uqr::cpu
