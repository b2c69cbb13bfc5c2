// Torch glue of the CUDA kernels: the CUDA kernel of uqr::gemm itself, the private operators
// uqr::_qmma_cuda, uqr::_wgmma_cuda (Hopper) and uqr::_int8_cuda on the CUDA key (uqr::gemm's
// arguments minus `path`, then the launch plan), and uqr::_cuda_residency (the kernels' residency,
// which the plan needs). Compiled only in CUDA builds (setup.py defines UQR_WITH_CUDA).
//
// The router (torch_uqr/backends/cuda/dispatch.py, route()) decides every launch choice; this file
// caches its answer per call shape (uqr::gemm below), checks the call and the plan, and launches.
#ifdef UQR_WITH_CUDA
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>
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

// What every op checks before launching: the shared argument plan, then the kernel's own limits
// (`unsupported`: nullptr or why not, named in the error with `op`).
template <class Unsupported>
GemmPlan checked_plan(const char* op, Unsupported&& unsupported, const at::Tensor& x, const at::Tensor& w,
                      c10::string_view fmt, int64_t N, int64_t K, int64_t group_size, int64_t out_heads,
                      bool in_heads) {
  UQR_CHECK(x.is_cuda(), op, ": x: expected a CUDA tensor, got ", x.device());
  GemmPlan plan = plan_gemm(x, w, fmt, N, K, group_size, out_heads, in_heads, "auto", Backend::kCuda);
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
template <class Unsupported, class Launch>
at::Tensor run_op(const char* op, Unsupported&& unsupported, const at::Tensor& x, const at::Tensor& w,
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

int to_int(int64_t v, const char* what) {
  UQR_CHECK(v >= INT32_MIN && v <= INT32_MAX, what, ": out of range: ", v);
  return static_cast<int>(v);
}

// uqr::_qmma_cuda: the tensor-core kernels (qmma_small_m.cu, qmma_mid_m.cu) with the launch plan the
// Python router made (QmmaPlan's fields, in order, after uqr::gemm's arguments less `path`).
at::Tensor qmma_cuda(const at::Tensor& x, const at::Tensor& w, c10::string_view fmt, int64_t N, int64_t K,
                     int64_t group_size, int64_t out_heads, bool in_heads, bool mid, int64_t warps, int64_t mid_cols,
                     int64_t splits, int64_t streamk_ctas, bool wide_regs, bool smem_cap, bool pdl) {
  const QmmaPlan qp{mid, to_int(warps, "warps"), to_int(mid_cols, "mid_cols"), to_int(splits, "splits"),
                    to_int(streamk_ctas, "streamk_ctas"), wide_regs, smem_cap, pdl};
  auto unsupported = [&](const uqr_gemm_params& p, int rows, bool half_x, uintptr_t xa, uintptr_t wa,
                         int64_t ws) -> const char* {
    if (const char* why = qmma_unsupported(p, rows, half_x, xa, wa, ws, qp.mid)) return why;
    return qmma_plan_invalid(p, rows, qp);
  };
  return run_op("uqr::_qmma_cuda", unsupported, x, w, fmt, N, K, group_size, out_heads, in_heads,
                [&](const GemmPlan& plan, at::Tensor& y, int64_t rows, bool bf16, cudaStream_t stream) {
                  if (!qp.mid || qp.splits == 1)
                    return qmma_small_m(plan.x_used.data_ptr(), w.data_ptr<uint8_t>(), w.stride(0), y.data_ptr(),
                                        plan.p, bf16, stream, qp);
                  at::Tensor split_ws = at::empty({qp.splits, rows, N}, x.options().dtype(at::kFloat));
                  return qmma_small_m(plan.x_used.data_ptr(), w.data_ptr<uint8_t>(), w.stride(0), y.data_ptr(),
                                      plan.p, bf16, stream, qp, split_ws.data_ptr<float>());
                });
}

// uqr::_wgmma_cuda: the Hopper kernel (qmma_wgmma.cu) with the router's plan (WgmmaPlan's fields);
// x is first rewritten into a scratch matrix in the order the kernel reads it.
at::Tensor wgmma_cuda(const at::Tensor& x, const at::Tensor& w, c10::string_view fmt, int64_t N, int64_t K,
                      int64_t group_size, int64_t out_heads, bool in_heads, int64_t bm, int64_t ctas, int64_t splits,
                      bool pdl) {
  const WgmmaPlan wp{to_int(bm, "bm"), to_int(ctas, "ctas"), to_int(splits, "splits"), pdl};
  auto unsupported = [&](const uqr_gemm_params& p, int rows, bool half_x, uintptr_t xa, uintptr_t wa,
                         int64_t ws) -> const char* {
    if (const char* why = wgmma_unsupported(p, rows, half_x, xa, wa, ws)) return why;
    return wgmma_plan_invalid(p, wp);
  };
  return run_op("uqr::_wgmma_cuda", unsupported, x, w, fmt, N, K, group_size, out_heads, in_heads,
                [&](const GemmPlan& plan, at::Tensor& y, int64_t rows, bool bf16, cudaStream_t stream) {
                  at::Tensor scratch = at::empty({rows, K}, x.options());
                  at::Tensor split_ws =
                      wp.splits > 1 ? at::empty({wp.splits, rows, N}, x.options().dtype(at::kFloat)) : at::Tensor();
                  const cudaError_t err = qmma_wgmma(plan.x_used.data_ptr(), scratch.data_ptr(),
                                                     wp.splits > 1 ? split_ws.data_ptr<float>() : nullptr,
                                                     w.data_ptr<uint8_t>(), w.stride(0), y.data_ptr(), plan.p, bf16,
                                                     stream, wp);
                  UQR_CHECK(err != cudaErrorNoKernelImageForDevice,
                            "uqr::_wgmma_cuda: needs an sm_90 GPU and an extension built with sm_90a code "
                            "(UQR_CUDA_ARCHS)");
                  return err;
                });
}

// uqr::_int8_cuda: path "int8" (qmma_int8.cu) with the router's plan (Int8Plan's fields); x is
// first rounded to int8 codes and per-block scales in two scratch tensors.
at::Tensor int8_cuda(const at::Tensor& x, const at::Tensor& w, c10::string_view fmt, int64_t N, int64_t K,
                     int64_t group_size, int64_t out_heads, bool in_heads, int64_t variant, int64_t warps,
                     bool smem_cap, bool pdl) {
  const Int8Plan ip{to_int(variant, "variant"), to_int(warps, "warps"), smem_cap, pdl};
  auto unsupported = [&](const uqr_gemm_params& p, int rows, bool half_x, uintptr_t xa, uintptr_t wa,
                         int64_t ws) -> const char* {
    if (const char* why = int8_unsupported(p, rows, half_x, xa, wa, ws)) return why;
    return int8_plan_invalid(p, rows, ip);
  };
  return run_op("uqr::_int8_cuda", unsupported, x, w, fmt, N, K, group_size, out_heads, in_heads,
                [&](const GemmPlan& plan, at::Tensor& y, int64_t rows, bool bf16, cudaStream_t stream) {
                  at::Tensor xq = at::empty({rows, K}, x.options().dtype(at::kChar));
                  at::Tensor xm = at::empty({rows, K / 32, 2}, x.options().dtype(at::kInt));
                  return qmma_int8(plan.x_used.data_ptr(), xq.data_ptr<int8_t>(),
                                   reinterpret_cast<int2*>(xm.data_ptr<int32_t>()), w.data_ptr<uint8_t>(),
                                   w.stride(0), y.data_ptr(), plan.p, bf16, stream, ip);
                });
}

// uqr::_cuda_residency: resident CTAs an SM of a kernel build on `device`, the device property the
// router's plan needs for its warps and splits (dispatch.py caches it per device and build):
// "small_m" and "int8" (`variant`: Int8Variant) give 4 counts, at 1, 2, 4 and 8 K-splitting warps;
// "mid_split" (the mid-M kernel's 16-row split-K build) one; "wgmma" 3 (WgmmaPlan builds, below).
std::vector<int64_t> cuda_residency(c10::string_view kernel, c10::string_view fmt_name, int64_t group_size, bool bf16,
                                    int64_t rows, int64_t variant, at::Device device) {
  const int fmt = format_from_name(fmt_name);
  check_group_size("uqr::_cuda_residency", fmt, fmt_name, group_size);
  UQR_CHECK(device.is_cuda(), "uqr::_cuda_residency: device: expected a CUDA device, got ", device);
  UQR_CHECK(rows >= 1 && rows <= kQmmaMaxRows, "uqr::_cuda_residency: rows: expected 1..16, got ", rows);
  uqr_gemm_params p{};
  p.fmt = fmt;
  p.group_size = block_elems(fmt, group_size);
  p.block_bytes = block_bytes(fmt, group_size);
  const c10::cuda::CUDAGuard guard(device);
  int per_sm[4] = {0, 0, 0, 0};
  cudaError_t err = cudaSuccess;
  std::vector<int64_t> out;
  if (kernel == "small_m") {
    err = qmma_small_m_residency(p, bf16, static_cast<int>(rows), per_sm);
    out.assign(per_sm, per_sm + 4);
  } else if (kernel == "int8") {
    UQR_CHECK(int8_plan_invalid(p, static_cast<int>(rows), Int8Plan{to_int(variant, "variant"), 1}) == nullptr,
              "uqr::_cuda_residency: no int8 kernel variant ", variant, " for ", std::string(fmt_name), " at ", rows,
              " rows");
    err = int8_residency(p, bf16, static_cast<int>(rows), static_cast<int>(variant), per_sm);
    out.assign(per_sm, per_sm + 4);
  } else if (kernel == "mid_split") {
    int fit = 1;
    err = qmma_mid_m_split_fit(p, fit);
    out.assign(1, fit);
  } else if (kernel == "wgmma") {
    // The Hopper kernel's tile builds (BM 128 one CTA, BM 64 one CTA, BM 64 two CTAs): their CTAs an
    // SM, 0 where the format's stage does not fit that build's shared memory. A K of many stages
    // keeps the splits check out of the answer.
    p.K = 1 << 20;
    const WgmmaPlan builds[3] = {{128, 1, 1, false}, {64, 1, 1, false}, {64, 2, 1, false}};
    for (const WgmmaPlan& b : builds) out.push_back(wgmma_plan_invalid(p, b) == nullptr ? b.ctas : 0);
  } else {
    UQR_CHECK(false, "uqr::_cuda_residency: kernel: expected 'small_m', 'int8', 'mid_split' or 'wgmma', got ",
              std::string(kernel));
  }
  UQR_CHECK(err == cudaSuccess, "uqr::_cuda_residency: ", cudaGetErrorString(err));
  return out;
}

// --- uqr::gemm on CUDA ------------------------------------------------------------------------
// The router is Python (it also launches the Triton kernels), but its decision depends only on the
// call's shapes, strides, dtypes, alignment, device and the tuning in force. So the decision is
// asked once per such key through uqr::_cuda_route and cached here: a repeated call (every decode
// step, every layer of a model) goes from the dispatcher to its CUDA C++ kernel without Python.
// Calls routed to the kernels launched from Python go to uqr::_gemm_triton.

enum RouteKind : int64_t { kRouteTriton = 0, kRouteQmma = 1, kRouteWgmma = 2, kRouteInt8 = 3 };

struct Route {
  int64_t kind = kRouteTriton;
  std::vector<int64_t> plan;  // the op's plan arguments, in order (dispatch.py: QmmaPlan.args() ...)
};

// The tuning in force on this thread (torch_uqr.backends.cuda.tuning.override sets it through
// uqr::_cuda_set_tuning_key): part of the key, so an override never reuses another tuning's plan.
thread_local int64_t t_tuning_key = 0;

constexpr size_t kMaxCachedRoutes = 1 << 14;  // distinct call shapes; a full cache starts over

std::string route_key(const at::Tensor& x, const at::Tensor& w, c10::string_view fmt, int64_t N, int64_t K,
                      int64_t group_size, int64_t out_heads, bool in_heads, c10::string_view path) {
  std::string key;
  key.reserve(256);
  auto put = [&key](int64_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
  auto put_tensor = [&](const at::Tensor& t) {
    put(t.get_device());
    put(static_cast<int64_t>(t.scalar_type()));
    put(t.dim());
    for (int64_t s : t.sizes()) put(s);
    for (int64_t s : t.strides()) put(s);
    put(static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16));  // the kernels' alignment rules
  };
  put_tensor(x);
  put_tensor(w);
  for (int64_t v : {N, K, group_size, out_heads, static_cast<int64_t>(in_heads), t_tuning_key}) put(v);
  key.append(fmt.data(), fmt.size());
  key.push_back('\0');
  key.append(path.data(), path.size());
  return key;
}

const c10::OperatorHandle& python_op(const char* name) {
  const c10::OperatorHandle& op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
  UQR_CHECK(op.hasKernelForDispatchKey(c10::DispatchKey::CUDA), name,
            " has no CUDA kernel: `import torch_uqr` registers it (torch_uqr/backends/cuda/register.py; it needs "
            "triton)");
  return op;
}

Route cached_route(const at::Tensor& x, const at::Tensor& w, c10::string_view fmt, int64_t N, int64_t K,
                   int64_t group_size, int64_t out_heads, bool in_heads, c10::string_view path) {
  static std::mutex mu;
  static std::unordered_map<std::string, Route> cache;
  std::string key = route_key(x, w, fmt, N, K, group_size, out_heads, in_heads, path);
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  // A new key: the contract is checked here, so a bad call fails from C++ with the argument named
  // before any Python runs (a cached key passed the same check on the same shapes).
  plan_gemm(x, w, fmt, N, K, group_size, out_heads, in_heads, path, Backend::kCuda);
  static const auto op = python_op("uqr::_cuda_route")
                             .typed<std::vector<int64_t>(const at::Tensor&, const at::Tensor&, c10::string_view,
                                                         int64_t, int64_t, int64_t, int64_t, bool, c10::string_view)>();
  const std::vector<int64_t> codes = op.redispatch(c10::DispatchKeySet(c10::DispatchKey::CUDA), x, w, fmt, N, K,
                                                   group_size, out_heads, in_heads, path);
  static const size_t kPlanArgs[] = {0, 8, 4, 4};  // plan fields of each RouteKind
  UQR_CHECK(!codes.empty() && codes[0] >= kRouteTriton && codes[0] <= kRouteInt8 &&
                codes.size() == 1 + kPlanArgs[codes[0]],
            "uqr::gemm: uqr::_cuda_route gave a malformed route (", codes.size(), " values)");
  Route r{codes[0], std::vector<int64_t>(codes.begin() + 1, codes.end())};
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() >= kMaxCachedRoutes) cache.clear();
  cache.emplace(std::move(key), r);
  return r;
}

at::Tensor gemm_cuda(const at::Tensor& x, const at::Tensor& w, c10::string_view fmt, int64_t N, int64_t K,
                     int64_t group_size, int64_t out_heads, bool in_heads, c10::string_view path) {
  const Route r = cached_route(x, w, fmt, N, K, group_size, out_heads, in_heads, path);
  const std::vector<int64_t>& a = r.plan;
  switch (r.kind) {
    case kRouteQmma:
      return qmma_cuda(x, w, fmt, N, K, group_size, out_heads, in_heads, a[0] != 0, a[1], a[2], a[3], a[4], a[5] != 0,
                       a[6] != 0, a[7] != 0);
    case kRouteWgmma:
      return wgmma_cuda(x, w, fmt, N, K, group_size, out_heads, in_heads, a[0], a[1], a[2], a[3] != 0);
    case kRouteInt8:
      return int8_cuda(x, w, fmt, N, K, group_size, out_heads, in_heads, a[0], a[1], a[2] != 0, a[3] != 0);
    default: {
      static const auto op = python_op("uqr::_gemm_triton")
                                 .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view, int64_t,
                                                   int64_t, int64_t, int64_t, bool, c10::string_view)>();
      return op.redispatch(c10::DispatchKeySet(c10::DispatchKey::CUDA), x, w, fmt, N, K, group_size, out_heads,
                           in_heads, path);
    }
  }
}

}  // namespace
}  // namespace cuda
}  // namespace uqr

TORCH_LIBRARY_FRAGMENT(uqr, m) {
  m.def("_qmma_cuda(Tensor x, Tensor w, str fmt, int N, int K, int group_size, int out_heads, bool in_heads, "
        "bool mid, int warps, int mid_cols, int splits, int streamk_ctas, bool wide_regs, bool smem_cap, bool pdl) "
        "-> Tensor");
  m.def("_int8_cuda(Tensor x, Tensor w, str fmt, int N, int K, int group_size, int out_heads, bool in_heads, "
        "int variant, int warps, bool smem_cap, bool pdl) -> Tensor");
  m.def("_wgmma_cuda(Tensor x, Tensor w, str fmt, int N, int K, int group_size, int out_heads, bool in_heads, "
        "int bm, int ctas, int splits, bool pdl) -> Tensor");
  m.def("_cuda_residency(str kernel, str fmt, int group_size, bool bf16, int rows, int variant, Device device) -> int[]",
        &uqr::cuda::cuda_residency);
  // Implemented in Python (torch_uqr/backends/cuda/register.py); uqr::gemm's CUDA kernel calls them.
  m.def("_cuda_route(Tensor x, Tensor w, str fmt, int N, int K, int group_size, int out_heads, bool in_heads, "
        "str path) -> int[]");
  m.def("_gemm_triton(Tensor x, Tensor w, str fmt, int N, int K, int group_size, int out_heads, bool in_heads, "
        "str path) -> Tensor");
  m.def("_cuda_set_tuning_key(int key) -> ()", [](int64_t key) { uqr::cuda::t_tuning_key = key; });
}

TORCH_LIBRARY_IMPL(uqr, CUDA, m) {
  m.impl("gemm", &uqr::cuda::gemm_cuda);
  m.impl("_qmma_cuda", &uqr::cuda::qmma_cuda);
  m.impl("_wgmma_cuda", &uqr::cuda::wgmma_cuda);
  m.impl("_int8_cuda", &uqr::cuda::int8_cuda);
}
#endif  // UQR_WITH_CUDA
