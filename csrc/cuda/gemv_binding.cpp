// Torch glue of the small-M CUDA kernel: registers the private operator uqr::_gemv_cuda (same
// arguments as uqr::gemm minus `path`) on the CUDA key. Compiled only in CUDA builds
// (setup.py defines UQR_WITH_CUDA); the Triton dispatcher (torch_uqr/triton_kernels/dispatch.py)
// calls it for up to kGemvMaxRows activation rows when the extension has it.
#ifdef UQR_WITH_CUDA
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "gemv_small_m.h"
#include "uqr/gemm_args.h"

namespace uqr {
namespace cuda {
namespace {

GemvDtype dtype_code(at::ScalarType st) {
  if (st == at::kFloat) return kGemvFloat32;
  if (st == at::kHalf) return kGemvFloat16;
  return kGemvBFloat16;  // plan_gemm has already rejected anything else
}

at::Tensor gemv_cuda(const at::Tensor& x, const at::Tensor& w, c10::string_view fmt, int64_t N, int64_t K,
                     int64_t group_size, int64_t out_heads, bool in_heads) {
  TORCH_CHECK(x.is_cuda(), "uqr::_gemv_cuda: x: expected a CUDA tensor, got ", x.device());
  GemmPlan plan = plan_gemm(x, w, fmt, N, K, group_size, out_heads, in_heads, "auto");
  const int64_t rows = static_cast<int64_t>(plan.p.batch) * plan.p.M;
  TORCH_CHECK(rows <= kGemvMaxRows, "uqr::_gemv_cuda: x: expected at most ", kGemvMaxRows,
              " activation rows (batch * M), got ", rows);
  at::Tensor y = allocate_output(plan, x.options());
  if (y.numel() == 0) return y;
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaError_t err = gemv_small_m(plan.x_used.data_ptr(), w.data_ptr<uint8_t>(), w.stride(0), y.data_ptr(),
                                       plan.p, dtype_code(x.scalar_type()), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "uqr::_gemv_cuda: kernel launch failed: ", cudaGetErrorString(err));
  return y;
}

}  // namespace
}  // namespace cuda
}  // namespace uqr

TORCH_LIBRARY_FRAGMENT(uqr, m) {
  m.def("_gemv_cuda(Tensor x, Tensor w, str fmt, int N, int K, int group_size, int out_heads, bool in_heads) -> Tensor");
}

TORCH_LIBRARY_IMPL(uqr, CUDA, m) { m.impl("_gemv_cuda", &uqr::cuda::gemv_cuda); }
#endif  // UQR_WITH_CUDA
