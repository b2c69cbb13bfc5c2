// Host-side argument checking and layout planning for uqr::gemm, shared by every host backend
// (CPU here; the MPS glue may call it too). Not part of the Metal-compatible subset: C++ and ATen.
// This is the one implementation of the rules (docs/operator.md states them): the Triton kernels and
// the Metal emulator get their strides from it through the uqr::_plan op.
#pragma once
#include <ATen/ATen.h>
#include <c10/util/string_view.h>

#include <string>
#include <vector>

#include "params.h"

namespace uqr {

enum class GemmPath { kAuto, kMma, kVec, kInt8 };
// Whose kernels will run the call: the optional paths ("vec", "int8") exist per backend.
enum class Backend { kCpu, kCuda, kMetal };

struct GemmPlan {
  uqr_gemm_params p;            // strides of x_used and of a fresh contiguous y of out_shape
  at::Tensor x_used;            // x itself, or x.contiguous() when its layout has no stride form
  std::vector<int64_t> out_shape;
  GemmPath path;
};

// Format name -> uqr_format; TORCH_CHECK failure naming `fmt` otherwise.
int format_from_name(c10::string_view fmt);
// Elements per block of a format (a grouped format: its group size).
int block_elems(int fmt, int64_t group_size);
int block_bytes(int fmt, int64_t group_size);
// group_size valid for fmt (a grouped format: one of its table group sizes; others 0 or their block); TORCH_CHECK naming `op`.
void check_group_size(const char* op, int fmt, c10::string_view fmt_name, int64_t group_size);

// Validates every argument (dtype, device, shapes, fmt/group_size/path for `backend`) and computes
// the strides.
GemmPlan plan_gemm(const at::Tensor& x, const at::Tensor& w, c10::string_view fmt, int64_t N,
                   int64_t K, int64_t group_size, int64_t out_heads, bool in_heads,
                   c10::string_view path, Backend backend);

// uqr_gemm_params as an int64 list in UQR_PARAM_FIELDS order, and the field names (uqr::_plan).
std::vector<int64_t> params_to_list(const uqr_gemm_params& p);
std::vector<std::string> param_names();

// The output tensor: torch.empty, or NaN-filled while poisoning is on (uqr::_set_poison; tests catch
// unwritten elements).
at::Tensor allocate_output(const GemmPlan& plan, const at::TensorOptions& options);

}  // namespace uqr
