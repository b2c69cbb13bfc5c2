// The CPU kernel of uqr::gemm (registered in csrc/ops.cpp).
#pragma once
#include <ATen/ATen.h>
#include <c10/util/string_view.h>

namespace uqr::cpu {

at::Tensor gemm(const at::Tensor& x, const at::Tensor& w, c10::string_view fmt, int64_t N, int64_t K,
                int64_t group_size, int64_t out_heads, bool in_heads, c10::string_view path);

}  // namespace uqr::cpu
