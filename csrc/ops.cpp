// The uqr operator library: the schema of uqr::gemm (docs/operator.md) and its CPU kernel. The
// CUDA kernel is registered by csrc/cuda/qmma_binding.cpp in CUDA builds (by
// torch_uqr/backends/cuda/register.py in a build without CUDA C++), the MPS kernel by
// csrc/mps/ on macOS, the fake (meta) kernel in torch_uqr/ops.py.
#include <Python.h>
#include <torch/library.h>

#include "cpu/gemm_cpu.h"
#include "uqr/check.h"
#include "uqr/gemm_args.h"

namespace uqr {
// The poisoned-outputs switch (csrc/cpu/gemm_args.cpp).
void set_poison(bool enabled);
bool poison_enabled();

namespace {
Backend backend_from_name(c10::string_view name) {
  if (name == "cpu") return Backend::kCpu;
  if (name == "cuda") return Backend::kCuda;
  UQR_CHECK_ARG(name == "metal", "uqr::_plan: backend: expected 'cpu', 'cuda' or 'metal', got '", std::string(name), "'");
  return Backend::kMetal;
}

// The argument check and stride plan of uqr::gemm for kernels launched outside C++ (Triton on CUDA,
// the Metal emulator): x as the kernels read it, uqr_gemm_params as a list (UQR_PARAM_FIELDS
// order, names from _param_fields) and y's shape.
std::tuple<at::Tensor, std::vector<int64_t>, std::vector<int64_t>> plan_op(
    const at::Tensor& x, const at::Tensor& w, c10::string_view fmt, int64_t N, int64_t K, int64_t group_size,
    int64_t out_heads, bool in_heads, c10::string_view path, c10::string_view backend) {
  GemmPlan plan = plan_gemm(x, w, fmt, N, K, group_size, out_heads, in_heads, path, backend_from_name(backend));
  return {plan.x_used, params_to_list(plan.p), plan.out_shape};
}
}  // namespace
}  // namespace uqr

TORCH_LIBRARY(uqr, m) {
  m.def(
      "gemm(Tensor x, Tensor w, str fmt, int N, int K, int group_size, int out_heads, bool in_heads, "
      "str path) -> Tensor");
  // Test aid: fill every fresh output with NaN (torch_uqr.ops.poison_outputs).
  m.def("_set_poison(bool enabled) -> ()", [](bool enabled) { uqr::set_poison(enabled); });
  m.def("_poison_enabled() -> bool", []() { return uqr::poison_enabled(); });
  m.def("_plan(Tensor x, Tensor w, str fmt, int N, int K, int group_size, int out_heads, bool in_heads, str path, "
        "str backend) -> (Tensor, int[], int[])",
        &uqr::plan_op);
  m.def("_param_fields() -> str[]", []() { return uqr::param_names(); });
}

TORCH_LIBRARY_IMPL(uqr, CPU, m) { m.impl("gemm", &uqr::cpu::gemm); }

// `import torch_uqr._C` runs the static registrations above; the module itself is empty.
static PyModuleDef uqr_module = {PyModuleDef_HEAD_INIT, "_C", "torch-uqr operator library", -1, nullptr};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&uqr_module); }
