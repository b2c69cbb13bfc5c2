// Torch glue of the tensor-core CUDA kernels: registers the private operators uqr::_qmma_cuda and
// uqr::_wgmma_cuda (Hopper; same arguments as uqr::gemm minus `path`) on the CUDA key. Compiled
// only in CUDA builds (setup.py defines UQR_WITH_CUDA); the dispatcher
// (torch_uqr/triton_kernels/dispatch.py) calls them when qmma_fits / wgmma_auto say the call fits.
#ifdef UQR_WITH_CUDA
#include <ATen/ATen.h>
#include <algorithm>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "qmma_int8.h"
#include "qmma_small_m.h"
#include "uqr/check.h"
#include "uqr/gemm_args.h"

namespace uqr {
namespace cuda {
namespace {

using Unsupported = const char* (*)(const uqr_gemm_params&, int, bool, uintptr_t, uintptr_t, int64_t);

// What both ops check before launching: the shared argument plan, then the kernel's own limits
// (`unsupported`, named in the error with `op`).
GemmPlan checked_plan(const char* op, Unsupported unsupported, const at::Tensor& x, const at::Tensor& w,
                      c10::string_view fmt, int64_t N, int64_t K, int64_t group_size, int64_t out_heads,
                      bool in_heads) {
  UQR_CHECK(x.is_cuda(), op, ": x: expected a CUDA tensor, got ", x.device());
  GemmPlan plan = plan_gemm(x, w, fmt, N, K, group_size, out_heads, in_heads, "auto");
  const int64_t rows = static_cast<int64_t>(plan.p.batch) * plan.p.M;
  const bool half_x = x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
  const char* why = unsupported(plan.p, static_cast<int>(std::min<int64_t>(rows, 1 << 30)), half_x,
                                reinterpret_cast<uintptr_t>(plan.x_used.data_ptr()),
                                reinterpret_cast<uintptr_t>(w.data_ptr()), w.stride(0));
  UQR_CHECK(why == nullptr, op, ": unsupported call: ", why ? why : "");
  return plan;
}

// What every op does around its kernel: the checked plan, y, the device guard, and the launch's
// error named with `op`. launch(plan, y, rows, bf16, stream) starts the kernel(s).
template <class Launch>
at::Tensor run_op(const char* op, Unsupported unsupported, const at::Tensor& x, const at::Tensor& w,
                  c10::string_view fmt, int64_t N, int64_t K, int64_t group_size, int64_t out_heads, bool in_heads,
                  Launch&& launch) {
  GemmPlan plan = checked_plan(op, unsupported, x, w, fmt, N, K, group_size, out_heads, in_heads);
  at::Tensor y = allocate_output(plan, x.options());
  if (y.numel() == 0) return y;
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = static_cast<int64_t>(plan.p.batch) * plan.p.M;
  const cudaError_t err =
      launch(plan, y, rows, x.scalar_type() == at::kBFloat16, c10::cuda::getCurrentCUDAStream().stream());
  UQR_CHECK(err == cudaSuccess, op, ": kernel launch failed: ", cudaGetErrorString(err));
  return y;
}

at::Tensor qmma_cuda(const at::Tensor& x, const at::Tensor& w, c10::string_view fmt, int64_t N, int64_t K,
                     int64_t group_size, int64_t out_heads, bool in_heads) {
  return run_op("uqr::_qmma_cuda", qmma_unsupported, x, w, fmt, N, K, group_size, out_heads, in_heads,
                [&](const GemmPlan& plan, at::Tensor& y, int64_t rows, bool bf16, cudaStream_t stream) {
                  const int splits = qmma_splits(plan.p, static_cast<int>(rows));
                  if (splits == 1)
                    return qmma_small_m(plan.x_used.data_ptr(), w.data_ptr<uint8_t>(), w.stride(0), y.data_ptr(),
                                        plan.p, bf16, stream);
                  at::Tensor split_ws = at::empty({splits, rows, N}, x.options().dtype(at::kFloat));
                  return qmma_small_m(plan.x_used.data_ptr(), w.data_ptr<uint8_t>(), w.stride(0), y.data_ptr(),
                                      plan.p, bf16, stream, splits, split_ws.data_ptr<float>());
                });
}

// uqr::_wgmma_cuda: the Hopper kernel (qmma_wgmma.cu), same arguments; x is first rewritten into a
// scratch matrix in the order the kernel reads it.
at::Tensor wgmma_cuda(const at::Tensor& x, const at::Tensor& w, c10::string_view fmt, int64_t N, int64_t K,
                      int64_t group_size, int64_t out_heads, bool in_heads) {
  return run_op("uqr::_wgmma_cuda", wgmma_unsupported, x, w, fmt, N, K, group_size, out_heads, in_heads,
                [&](const GemmPlan& plan, at::Tensor& y, int64_t rows, bool bf16, cudaStream_t stream) {
                  at::Tensor scratch = at::empty({rows, K}, x.options());
                  const int splits = wgmma_splits(plan.p, static_cast<int>(rows));
                  at::Tensor split_ws =
                      splits > 1 ? at::empty({splits, rows, N}, x.options().dtype(at::kFloat)) : at::Tensor();
                  const cudaError_t err = qmma_wgmma(plan.x_used.data_ptr(), scratch.data_ptr(), splits,
                                                     splits > 1 ? split_ws.data_ptr<float>() : nullptr,
                                                     w.data_ptr<uint8_t>(), w.stride(0), y.data_ptr(), plan.p, bf16,
                                                     stream);
                  UQR_CHECK(err != cudaErrorNoKernelImageForDevice,
                            "uqr::_wgmma_cuda: needs an sm_90 GPU and an extension built with sm_90a code "
                            "(UQR_CUDA_ARCHS)");
                  return err;
                });
}

// uqr::_int8_cuda: path "int8" (qmma_int8.cu), same arguments; x is first rounded to int8 codes
// and per-block scales in two scratch tensors.
at::Tensor int8_cuda(const at::Tensor& x, const at::Tensor& w, c10::string_view fmt, int64_t N, int64_t K,
                     int64_t group_size, int64_t out_heads, bool in_heads) {
  return run_op("uqr::_int8_cuda", int8_unsupported, x, w, fmt, N, K, group_size, out_heads, in_heads,
                [&](const GemmPlan& plan, at::Tensor& y, int64_t rows, bool bf16, cudaStream_t stream) {
                  at::Tensor xq = at::empty({rows, K}, x.options().dtype(at::kChar));
                  at::Tensor xm = at::empty({rows, K / 32, 2}, x.options().dtype(at::kInt));
                  return qmma_int8(plan.x_used.data_ptr(), xq.data_ptr<int8_t>(),
                                   reinterpret_cast<int2*>(xm.data_ptr<int32_t>()), w.data_ptr<uint8_t>(),
                                   w.stride(0), y.data_ptr(), plan.p, bf16, stream);
                });
}

}  // namespace
}  // namespace cuda
}  // namespace uqr

TORCH_LIBRARY_FRAGMENT(uqr, m) {
  m.def("_qmma_cuda(Tensor x, Tensor w, str fmt, int N, int K, int group_size, int out_heads, bool in_heads) -> Tensor");
  m.def("_int8_cuda(Tensor x, Tensor w, str fmt, int N, int K, int group_size, int out_heads, bool in_heads) -> Tensor");
  m.def("_wgmma_cuda(Tensor x, Tensor w, str fmt, int N, int K, int group_size, int out_heads, bool in_heads) -> Tensor");
}

TORCH_LIBRARY_IMPL(uqr, CUDA, m) {
  m.impl("_qmma_cuda", &uqr::cuda::qmma_cuda);
  m.impl("_wgmma_cuda", &uqr::cuda::wgmma_cuda);
  m.impl("_int8_cuda", &uqr::cuda::int8_cuda);
}
#endif  // UQR_WITH_CUDA
