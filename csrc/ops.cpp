// The uqr operator library: the schema of uqr::gemm (docs/operator.md) and its CPU kernel. The
// CUDA kernel is registered from Python (torch_uqr/triton_kernels/register.py), the MPS kernel by
// csrc/mps/ on macOS, the fake (meta) kernel in torch_uqr/ops.py.
#include <Python.h>
#include <torch/library.h>

#include "cpu/gemm_cpu.h"

namespace uqr {
// The poisoned-outputs switch (csrc/cpu/gemm_args.cpp).
void set_poison(bool enabled);
bool poison_enabled();
}  // namespace uqr

TORCH_LIBRARY(uqr, m) {
  m.def(
      "gemm(Tensor x, Tensor w, str fmt, int N, int K, int group_size, int out_heads, bool in_heads, "
      "str path) -> Tensor");
  // Test aid: fill every fresh output with NaN (torch_uqr.ops.poison_outputs).
  m.def("_set_poison(bool enabled) -> ()", [](bool enabled) { uqr::set_poison(enabled); });
  m.def("_poison_enabled() -> bool", []() { return uqr::poison_enabled(); });
}

TORCH_LIBRARY_IMPL(uqr, CPU, m) { m.impl("gemm", &uqr::cpu::gemm); }

// `import torch_uqr._C` runs the static registrations above; the module itself is empty.
static PyModuleDef uqr_module = {PyModuleDef_HEAD_INIT, "_C", "torch-uqr operator library", -1, nullptr};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&uqr_module); }
