// uqr::gemm on CPU: argument plan, fp32 staging of x, path choice, output.
#include "gemm_cpu.h"

#include <ATen/Parallel.h>

#include "cpu_simd.h"
#include "kernels.h"
#include "uqr/formats.h"
#include "uqr/gemm_args.h"

namespace uqr::cpu {

OutputWriter::OutputWriter(const at::Tensor& y, const uqr_gemm_params& p)
    : base_(y.data_ptr()), dtype_(y.scalar_type()), p_(p) {}

void OutputWriter::store(int64_t r, int64_t n0, int64_t count, const float* src) const {
  const int64_t b = r / p_.M, m = r % p_.M;
  const int64_t row = b * p_.y_batch_stride + m * p_.y_row_stride;
  int64_t n = n0;
  while (n < n0 + count) {
    // One contiguous run per output head.
    const int64_t h = n / p_.y_head_dim, d = n % p_.y_head_dim;
    const int64_t run = std::min<int64_t>(p_.y_head_dim - d, n0 + count - n);
    const int64_t off = row + h * p_.y_head_stride + d;
    switch (dtype_) {
      case at::kFloat: from_float(src + (n - n0), static_cast<float*>(base_) + off, run); break;
      case at::kHalf: from_float(src + (n - n0), static_cast<c10::Half*>(base_) + off, run); break;
      default: from_float(src + (n - n0), static_cast<c10::BFloat16*>(base_) + off, run); break;
    }
    n += run;
  }
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

namespace {

// Ternary, small M, path "auto": add/subtract (true) or decode+FMA (false). Decode+FMA measured
// ~10 % faster at M = 1..8 on the 2-core AVX-512 dev box (docs/operator.md, "Ternary paths").
constexpr bool kTernaryAutoVec = false;

bool use_fused(const GemmPlan& plan, int64_t R) {
  if (plan.path == GemmPath::kVec) return true;
  return R <= kFusedMaxRows;
}

}  // namespace

at::Tensor gemm(const at::Tensor& x, const at::Tensor& w, c10::string_view fmt, int64_t N, int64_t K,
                int64_t group_size, int64_t out_heads, bool in_heads, c10::string_view path) {
  TORCH_CHECK(x.device().is_cpu(), "uqr::gemm (CPU kernel): x must be on the CPU, got ", x.device());
  GemmPlan plan = plan_gemm(x, w, fmt, N, K, group_size, out_heads, in_heads, path);
  at::Tensor y = allocate_output(plan, x.options());
  const uqr_gemm_params& p = plan.p;
  const int64_t R = static_cast<int64_t>(p.batch) * p.M;
  if (R == 0) return y;
  const uint8_t* wp = w.const_data_ptr<uint8_t>();
  const OutputWriter out(y, p);

  if (plan.path == GemmPath::kInt8) {
    std::vector<float> X(static_cast<size_t>(R * p.K));
    stage_rows(plan.x_used, p, 0, R, X.data());
    gemm_int8(wp, p, X.data(), R, out);
    return y;
  }
  if (use_fused(plan, R)) {
    std::vector<float> X(static_cast<size_t>(R * p.K));
    stage_rows(plan.x_used, p, 0, R, X.data());
    const bool vec = p.fmt == UQR_TERNARY &&
                     (plan.path == GemmPath::kVec || (plan.path == GemmPath::kAuto && kTernaryAutoVec));
    if (vec) gemm_ternary_vec(wp, p, X.data(), R, out);
    else gemm_fused(wp, p, X.data(), R, out);
    return y;
  }
  // Panel path: x is read once through its strides into the packed fp32 layout.
  std::vector<float> xp(static_cast<size_t>((R + kLanes - 1) / kLanes * kLanes * p.K));
  pack_x(plan.x_used, p, R, xp.data());
  gemm_panels(wp, p, xp.data(), R, out);
  return y;
}

}  // namespace uqr::cpu
