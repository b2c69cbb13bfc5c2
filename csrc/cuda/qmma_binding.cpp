// Torch glue of the small-M tensor-core CUDA kernel: registers the private operator uqr::_qmma_cuda
// (same arguments as uqr::gemm minus `path`) on the CUDA key. Compiled only in CUDA builds
// (setup.py defines UQR_WITH_CUDA); the dispatcher (torch_uqr/triton_kernels/dispatch.py) calls it
// for up to kQmmaMaxRows activation rows of bf16/fp16 x when qmma_fits says the call fits.
#ifdef UQR_WITH_CUDA
#include <ATen/ATen.h>
#include <algorithm>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "qmma_small_m.h"
#include "uqr/check.h"
#include "uqr/gemm_args.h"

namespace uqr {
namespace cuda {
namespace {

at::Tensor qmma_cuda(const at::Tensor& x, const at::Tensor& w, c10::string_view fmt, int64_t N, int64_t K,
                     int64_t group_size, int64_t out_heads, bool in_heads) {
  UQR_CHECK(x.is_cuda(), "uqr::_qmma_cuda: x: expected a CUDA tensor, got ", x.device());
  GemmPlan plan = plan_gemm(x, w, fmt, N, K, group_size, out_heads, in_heads, "auto");
  const int64_t rows = static_cast<int64_t>(plan.p.batch) * plan.p.M;
  const bool half_x = x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
  const char* why = qmma_unsupported(plan.p, static_cast<int>(std::min<int64_t>(rows, 1 << 30)), half_x,
                                     reinterpret_cast<uintptr_t>(plan.x_used.data_ptr()),
                                     reinterpret_cast<uintptr_t>(w.data_ptr()), w.stride(0));
  UQR_CHECK(why == nullptr, "uqr::_qmma_cuda: unsupported call: ", why ? why : "");
  at::Tensor y = allocate_output(plan, x.options());
  if (y.numel() == 0) return y;
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaError_t err = qmma_small_m(plan.x_used.data_ptr(), w.data_ptr<uint8_t>(), w.stride(0), y.data_ptr(),
                                       plan.p, x.scalar_type() == at::kBFloat16, c10::cuda::getCurrentCUDAStream());
  UQR_CHECK(err == cudaSuccess, "uqr::_qmma_cuda: kernel launch failed: ", cudaGetErrorString(err));
  return y;
}

}  // namespace
}  // namespace cuda
}  // namespace uqr

TORCH_LIBRARY_FRAGMENT(uqr, m) {
  m.def("_qmma_cuda(Tensor x, Tensor w, str fmt, int N, int K, int group_size, int out_heads, bool in_heads) -> Tensor");
}

TORCH_LIBRARY_IMPL(uqr, CUDA, m) {
  m.impl("_qmma_cuda", &uqr::cuda::qmma_cuda);
}
#endif  // UQR_WITH_CUDA
