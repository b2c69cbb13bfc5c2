// Argument checks and stride planning for uqr::gemm (see csrc/include/uqr/gemm_args.h).
#include "uqr/gemm_args.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "uqr/check.h"
#include "uqr/formats.h"

namespace uqr {
namespace {

struct FormatName {
  const char* name;
  int fmt;
};

#define UQR_NAME_ENTRY(id, name) {name, id},
#define UQR_ID_ENTRY(id, name) id,
constexpr FormatName kFormats[] = {UQR_FORMAT_LIST(UQR_NAME_ENTRY)};
// The formats with the optional paths, per backend (format_table.h, from the format table). Metal
// has no int8 path: its list is empty, so a sentinel id keeps the array non-empty.
constexpr int kVecCpu[] = {UQR_VEC_CPU_LIST(UQR_ID_ENTRY)};
constexpr int kVecCuda[] = {UQR_VEC_CUDA_LIST(UQR_ID_ENTRY)};
constexpr int kVecMetal[] = {UQR_VEC_METAL_LIST(UQR_ID_ENTRY)};
constexpr int kInt8Cpu[] = {UQR_INT8_CPU_LIST(UQR_ID_ENTRY)};
constexpr int kInt8Cuda[] = {UQR_INT8_CUDA_LIST(UQR_ID_ENTRY)};
constexpr int kInt8Metal[] = {UQR_INT8_METAL_LIST(UQR_ID_ENTRY) -1};
#undef UQR_NAME_ENTRY
#undef UQR_ID_ENTRY

template <size_t n>
bool contains(const int (&ids)[n], int fmt) {
  for (int id : ids)
    if (id == fmt) return true;
  return false;
}

// Stride that walks the flattened leading dims, or -1 if they do not collapse to one stride.
int64_t leading_dims_stride(at::IntArrayRef sizes, at::IntArrayRef strides) {
  int64_t outer_stride = -1, last = 0;
  bool first = true;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 1) continue;  // a size-1 dim's stride carries no information
    if (!first && outer_stride != strides[i] * sizes[i]) return -1;
    outer_stride = strides[i];
    last = strides[i];
    first = false;
  }
  return last;
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::kCpu: return "cpu";
    case Backend::kCuda: return "cuda";
    default: return "metal";
  }
}

// Whether `backend` has the optional path `gp` for fmt; the error lists the formats that have it.
void check_path_formats(GemmPath gp, int fmt, c10::string_view fmt_name, Backend backend) {
  if (gp == GemmPath::kVec) {
    const bool ok = backend == Backend::kCpu ? contains(kVecCpu, fmt)
                    : backend == Backend::kCuda ? contains(kVecCuda, fmt) : contains(kVecMetal, fmt);
    const char* names = backend == Backend::kCpu ? UQR_VEC_CPU_NAMES
                        : backend == Backend::kCuda ? UQR_VEC_CUDA_NAMES : UQR_VEC_METAL_NAMES;
    UQR_CHECK_ARG(ok, "uqr::gemm: path='vec' (add/subtract) on the ", backend_name(backend),
                  " backend supports fmt ", names, ", not '", std::string(fmt_name), "'");
  } else if (gp == GemmPath::kInt8) {
    const bool ok = backend == Backend::kCpu ? contains(kInt8Cpu, fmt)
                    : backend == Backend::kCuda ? contains(kInt8Cuda, fmt) : contains(kInt8Metal, fmt);
    const char* names = backend == Backend::kCpu ? UQR_INT8_CPU_NAMES
                        : backend == Backend::kCuda ? UQR_INT8_CUDA_NAMES : UQR_INT8_METAL_NAMES;
    UQR_CHECK_ARG(*names, "uqr::gemm: path='int8' (int8 activations) has no kernels on the ",
                  backend_name(backend), " backend (the Metal shaders do not have it)");
    UQR_CHECK_ARG(ok, "uqr::gemm: path='int8' (int8 activations) on the ", backend_name(backend),
                  " backend supports fmt ", names, ", not '", std::string(fmt_name), "'");
  }
}

}  // namespace

int format_from_name(c10::string_view fmt) {
  for (const auto& f : kFormats)
    if (fmt == f.name) return f.fmt;
  UQR_CHECK_ARG(false, "uqr::gemm: fmt: unknown format '", std::string(fmt), "'; expected one of " UQR_FORMAT_NAMES);
  return -1;
}

int block_elems(int fmt, int64_t group_size) { return uqr_block_elems(fmt, static_cast<int>(group_size)); }

int block_bytes(int fmt, int64_t group_size) { return uqr_block_bytes(fmt, static_cast<int>(group_size)); }

void check_group_size(const char* op, int fmt, c10::string_view fmt_name, int64_t group_size) {
  if (uqr_code_bits(fmt)) {
    if (group_size > 0 && group_size <= INT32_MAX && uqr_group_size_ok(fmt, static_cast<int>(group_size))) return;
    std::vector<int> sizes;  // the format's group sizes, from the table, for the message
    for (int g = 1; g <= 4096; g *= 2)
      if (uqr_group_size_ok(fmt, g)) sizes.push_back(g);
    std::string text;
    for (size_t i = 0; i < sizes.size(); ++i)
      text += (i == 0 ? "" : i + 1 == sizes.size() ? " or " : ", ") + std::to_string(sizes[i]);
    UQR_CHECK_ARG(false, op, ": group_size: ", std::string(fmt_name), " needs ", text, ", got ", group_size);
  } else {
    UQR_CHECK_ARG(group_size == 0 || group_size == block_elems(fmt, 0), op, ": group_size: ", std::string(fmt_name),
              " has a fixed block, pass 0 (got ", group_size, ")");
  }
}

GemmPlan plan_gemm(const at::Tensor& x_in, const at::Tensor& w, c10::string_view fmt_name,
                   int64_t N, int64_t K, int64_t group_size, int64_t out_heads, bool in_heads,
                   c10::string_view path, Backend backend) {
  const int fmt = format_from_name(fmt_name);
  const auto st = x_in.scalar_type();
  UQR_CHECK_ARG(st == at::kHalf || st == at::kBFloat16 || st == at::kFloat,
            "uqr::gemm: x: expected dtype float16, bfloat16 or float32, got ", st);
  UQR_CHECK_ARG(w.scalar_type() == at::kByte, "uqr::gemm: w: expected dtype uint8 (packed blocks), got ",
            w.scalar_type());
  UQR_CHECK_ARG(x_in.device() == w.device(), "uqr::gemm: x is on ", x_in.device(),
            " but the weights w are on ", w.device());
  UQR_CHECK_ARG(N > 0 && K > 0, "uqr::gemm: N and K must be positive, got N=", N, ", K=", K);
  UQR_CHECK_ARG(N < std::numeric_limits<int32_t>::max() && K < std::numeric_limits<int32_t>::max(),
            "uqr::gemm: N and K must fit in int32");
  check_group_size("uqr::gemm", fmt, fmt_name, group_size);
  const int blk = block_elems(fmt, group_size), bb = block_bytes(fmt, group_size);
  UQR_CHECK_ARG(K % blk == 0, "uqr::gemm: K=", K, " is not a multiple of ", std::string(fmt_name),
            "'s block of ", blk, " elements");
  const int64_t row_bytes = (K / blk) * bb;
  UQR_CHECK_ARG(w.dim() == 2 && w.size(0) == N && w.size(1) == row_bytes, "uqr::gemm: w: expected uint8 [",
            N, ", ", row_bytes, "] for ", std::string(fmt_name), " with N=", N, ", K=", K, ", got ",
            w.sizes());
  UQR_CHECK_ARG(w.is_contiguous(), "uqr::gemm: w: the packed rows must be contiguous");
  // CUDA kernels read the blocks' fp16 fields as aligned halves.
  UQR_CHECK_ARG(backend != Backend::kCuda || reinterpret_cast<uintptr_t>(w.data_ptr()) % 2 == 0,
                "uqr::gemm: w: the packed rows must start at an even address on CUDA");
  UQR_CHECK_ARG(out_heads >= 0, "uqr::gemm: out_heads must be >= 0, got ", out_heads);
  UQR_CHECK_ARG(out_heads == 0 || N % out_heads == 0, "uqr::gemm: out_heads=", out_heads,
            " does not divide N=", N);

  GemmPath gp;
  if (path == "auto") gp = GemmPath::kAuto;
  else if (path == "mma") gp = GemmPath::kMma;
  else if (path == "vec") gp = GemmPath::kVec;
  else if (path == "int8") gp = GemmPath::kInt8;
  else UQR_CHECK_ARG(false, "uqr::gemm: path: expected 'auto', 'mma', 'vec' or 'int8', got '", std::string(path), "'");
  check_path_formats(gp, fmt, fmt_name, backend);

  const int64_t rank = x_in.dim();
  if (in_heads) {
    UQR_CHECK_ARG(rank >= 3, "uqr::gemm: x: in_heads=True expects x of shape [..., H, M, D] (at least 3 dims), got ",
              x_in.sizes());
    UQR_CHECK_ARG(x_in.size(-3) * x_in.size(-1) == K, "uqr::gemm: x: in_heads=True needs H*D == K, got H=",
              x_in.size(-3), ", D=", x_in.size(-1), " but K=", K);
  } else {
    UQR_CHECK_ARG(rank >= 1, "uqr::gemm: x: expected at least 1 dim [..., K], got a 0-dim tensor");
    UQR_CHECK_ARG(x_in.size(-1) == K, "uqr::gemm: x: last dim is ", x_in.size(-1), " but the weights have K=", K);
    UQR_CHECK_ARG(out_heads == 0 || rank >= 2, "uqr::gemm: x: out_heads=", out_heads,
              " needs x with an M dim ([..., M, K]), got ", x_in.sizes());
  }

  const int64_t n_lead = in_heads ? rank - 3 : std::max<int64_t>(rank - 2, 0);
  at::Tensor x = x_in;
  int64_t batch_stride = leading_dims_stride(x.sizes().slice(0, n_lead), x.strides().slice(0, n_lead));
  if (x.stride(-1) != 1 || batch_stride < 0) {
    x = x.contiguous();  // the documented copy: only for layouts the stride set cannot express
    batch_stride = leading_dims_stride(x.sizes().slice(0, n_lead), x.strides().slice(0, n_lead));
  }
  int64_t batch = 1;
  for (int64_t i = 0; i < n_lead; ++i) batch *= x.size(i);

  int64_t M, x_row, x_head, x_hd;
  if (in_heads) {
    M = x.size(-2); x_row = x.stride(-2); x_head = x.stride(-3); x_hd = x.size(-1);
  } else if (rank == 1) {
    M = 1; x_row = K; x_head = 0; x_hd = K;
  } else {
    M = x.size(-2); x_row = x.stride(-2); x_head = 0; x_hd = K;
  }

  GemmPlan plan;
  std::vector<int64_t> lead(x.sizes().begin(), x.sizes().begin() + n_lead);
  int64_t y_row, y_head, y_hd, y_batch;
  plan.out_shape = lead;
  if (out_heads > 0) {
    const int64_t D = N / out_heads;
    y_row = D; y_head = M * D; y_hd = D; y_batch = N * M;
    plan.out_shape.insert(plan.out_shape.end(), {out_heads, M, D});
  } else {
    y_row = N; y_head = 0; y_hd = N; y_batch = M * N;
    if (rank == 1) plan.out_shape.push_back(N);
    else plan.out_shape.insert(plan.out_shape.end(), {M, N});
  }
  // Consecutive batches that continue each other's rows in x and y become one tall matrix.
  if (batch > 1 && M * y_row == y_batch && batch_stride == M * x_row) {
    M *= batch;
    batch = 1;
  }
  UQR_CHECK_ARG(M * batch < std::numeric_limits<int32_t>::max(), "uqr::gemm: x has too many rows");

  uqr_gemm_params& p = plan.p;
  std::memset(&p, 0, sizeof p);
  p.fmt = fmt;
  p.batch = static_cast<int32_t>(batch);
  p.M = static_cast<int32_t>(M);
  p.N = static_cast<int32_t>(N);
  p.K = static_cast<int32_t>(K);
  p.group_size = blk;
  p.block_bytes = bb;
  p.row_bytes = static_cast<int32_t>(row_bytes);
  p.x_batch_stride = batch_stride;
  p.x_row_stride = x_row;
  p.x_head_stride = x_head;
  p.x_head_dim = static_cast<int32_t>(x_hd);
  p.y_batch_stride = y_batch;
  p.y_row_stride = y_row;
  p.y_head_stride = y_head;
  p.y_head_dim = static_cast<int32_t>(y_hd);
  plan.x_used = x;
  plan.path = gp;
  return plan;
}

std::vector<int64_t> params_to_list(const uqr_gemm_params& p) {
  std::vector<int64_t> out;
#define UQR_PUSH_PARAM(type, name) out.push_back(static_cast<int64_t>(p.name));
  UQR_PARAM_FIELDS(UQR_PUSH_PARAM)
#undef UQR_PUSH_PARAM
  return out;
}

std::vector<std::string> param_names() {
  return {
#define UQR_PARAM_NAME(type, name) #name,
      UQR_PARAM_FIELDS(UQR_PARAM_NAME)
#undef UQR_PARAM_NAME
  };
}

// Poisoned outputs (a test aid): while on, every fresh output is filled with NaN before the kernel
// writes it, so an element a kernel skips shows. Process-wide, switched by uqr::_set_poison
// (csrc/ops.cpp; torch_uqr.ops.poison_outputs from Python).
namespace {
std::atomic<bool> g_poison{false};
}  // namespace

void set_poison(bool enabled) { g_poison.store(enabled, std::memory_order_relaxed); }

bool poison_enabled() { return g_poison.load(std::memory_order_relaxed); }

at::Tensor allocate_output(const GemmPlan& plan, const at::TensorOptions& options) {
  if (poison_enabled()) return at::full(plan.out_shape, std::numeric_limits<float>::quiet_NaN(), options);
  return at::empty(plan.out_shape, options);
}

}  // namespace uqr
