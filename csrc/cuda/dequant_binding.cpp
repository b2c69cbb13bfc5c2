// Torch glue of the decode-to-dense kernel (dequant.cu): registers the private operator
// uqr::_dequant_cuda on the CUDA key. It writes into a caller-given `out` so the scratch path can
// reuse a buffer and the tests can hand it NaN-filled. Compiled only in CUDA builds (setup.py
// defines UQR_WITH_CUDA); torch_uqr/triton_kernels/dequant.py (dequantize_cuda) calls it.
#ifdef UQR_WITH_CUDA
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <string>

#include "dequant.h"
#include "uqr/check.h"
#include "uqr/formats.h"
#include "uqr/gemm_args.h"

namespace uqr {
namespace cuda {
namespace {

DenseType dense_type(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return DenseType::kBF16;
    case at::kHalf: return DenseType::kF16;
    case at::kFloat: return DenseType::kF32;
    default: UQR_CHECK_ARG(false, "uqr::_dequant_cuda: out: expected bfloat16, float16 or float32, got ", t);
  }
}

void dequant_cuda_op(const at::Tensor& w, c10::string_view fmt_name, int64_t N, int64_t K, int64_t group_size,
                     const at::Tensor& out) {
  const int fmt = format_from_name(fmt_name);
  const std::string name(fmt_name);
  check_group_size("uqr::_dequant_cuda", fmt, fmt_name, group_size);
  const int elems = block_elems(fmt, group_size);
  UQR_CHECK_ARG(N >= 1 && N <= INT32_MAX, "uqr::_dequant_cuda: N: expected 1..2^31-1, got ", N);
  UQR_CHECK_ARG(K >= 1 && K % elems == 0 && K <= dequant_max_k(), "uqr::_dequant_cuda: K: expected a positive multiple of ",
            name, "'s block of ", elems, " up to ", dequant_max_k(), ", got ", K);
  const int64_t row_bytes = K / elems * block_bytes(fmt, group_size);
  UQR_CHECK_ARG(w.is_cuda(), "uqr::_dequant_cuda: w: expected a CUDA tensor, got ", w.device());
  UQR_CHECK_ARG(w.scalar_type() == at::kByte && w.dim() == 2 && w.size(0) == N && w.size(1) == row_bytes,
            "uqr::_dequant_cuda: w: expected uint8 [", N, ", ", row_bytes, "] for ", name, " with K=", K, ", got ",
            w.scalar_type(), " ", w.sizes());
  UQR_CHECK_ARG(w.stride(1) == 1 && (N == 1 || w.stride(0) >= row_bytes),
            "uqr::_dequant_cuda: w: expected unit stride along bytes and non-overlapping rows, got strides ",
            w.strides());
  const DenseType type = dense_type(out.scalar_type());
  UQR_CHECK_ARG(out.device() == w.device(), "uqr::_dequant_cuda: out: expected on w's device ", w.device(), ", got ",
            out.device());
  UQR_CHECK_ARG(out.dim() == 2 && out.size(0) == N && out.size(1) == K && out.is_contiguous(),
            "uqr::_dequant_cuda: out: expected a contiguous [", N, ", ", K, "] tensor, got ", out.sizes(),
            " strides ", out.strides());
  UQR_CHECK_ARG(reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0,
            "uqr::_dequant_cuda: out: expected a 16-byte aligned data pointer (its rows are written 16 bytes at a time)");
  const c10::cuda::CUDAGuard guard(w.device());
  const cudaError_t err = dequant_cuda(w.data_ptr<uint8_t>(), w.stride(0), fmt, static_cast<int>(group_size), N, K,
                                       out.data_ptr(), type, c10::cuda::getCurrentCUDAStream());
  UQR_CHECK(err == cudaSuccess, "uqr::_dequant_cuda: kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace
}  // namespace cuda
}  // namespace uqr

TORCH_LIBRARY_FRAGMENT(uqr, m) {
  m.def("_dequant_cuda(Tensor w, str fmt, int N, int K, int group_size, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(uqr, CUDA, m) {
  m.impl("_dequant_cuda", &uqr::cuda::dequant_cuda_op);
}
#endif  // UQR_WITH_CUDA
