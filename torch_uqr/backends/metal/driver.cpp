// Host side of the emulator, compiled in the same translation unit after the shader source and
// csrc/mps/launch.h (so it sees the kernel table and the launch planner). It spells none of Metal's
// address-space words, which are macros by now. Two entry points: uqr_emu_gemm for the Python
// runner (ctypes), and main() for the sanitizer builds, which run as their own process.

// The shim's simdgroup (barriers, matrix lanes) must be the width the kernels and launch.h assume.
static_assert(uqr_emu::kSimdWidth == UQR_SIMD_WIDTH, "metal-emu: shim simdgroup width differs from uqr_limits.h");

// The params arrive as the int64 list uqr::_plan returns (UQR_PARAM_FIELDS order), so no caller
// re-declares the struct's layout.
static const char* params_from_list(const long long* values, int n, uqr_gemm_params* p) {
#define UQR_COUNT_PARAM(type, name) +1
  if (n != 0 UQR_PARAM_FIELDS(UQR_COUNT_PARAM)) return "metal-emu: params: wrong number of fields";
#undef UQR_COUNT_PARAM
  int i = 0;
#define UQR_READ_PARAM(type, name)                                              \
  if ((long long)(type)values[i] != values[i]) return "metal-emu: params: " #name " does not fit its field"; \
  p->name = (type)values[i++];
  UQR_PARAM_FIELDS(UQR_READ_PARAM)
#undef UQR_READ_PARAM
  return nullptr;
}

extern "C" int uqr_emu_gemm(const void* x, const void* w, void* y, const long long* params, int n_params,
                            int dtype, int path, char* err, int err_len) {
  auto fail = [&](const char* msg) {
    std::snprintf(err, (size_t)err_len, "%s", msg);
    return 1;
  };
  uqr_gemm_params params_struct;
  const uqr_gemm_params* p = &params_struct;
  if (const char* msg = params_from_list(params, n_params, &params_struct)) return fail(msg);
  uqr_launch plan;
  if (const char* msg = uqr_plan_launch(*p, dtype, path, plan)) return fail(msg);
  auto it = uqr_emu::registry().find(plan.name);
  if (it == uqr_emu::registry().end()) {
    std::string msg = std::string("metal-emu: kernel ") + plan.name + " is not in the shader library";
    return fail(msg.c_str());
  }
  if (plan.grid[0] == 0 || plan.grid[1] == 0 || plan.grid[2] == 0) return 0;
  // A launch a real GPU would refuse (or run with the wrong simdgroup split) must not pass here:
  // the emulator would happily allocate any length and any thread count.
  if (!UQR_TG_MEMORY_OK(plan.threadgroup_bytes)) {
    std::snprintf(err, (size_t)err_len, "metal-emu: kernel %s asks for %u bytes of threadgroup memory; "
                  "Metal allows at most %d, in multiples of %d", plan.name, plan.threadgroup_bytes,
                  UQR_MAX_THREADGROUP_MEMORY, UQR_THREADGROUP_MEMORY_ALIGN);
    return 1;
  }
  if (!UQR_THREADS_OK(plan.threads)) {
    std::snprintf(err, (size_t)err_len, "metal-emu: kernel %s asks for %u threads per threadgroup; "
                  "expected whole simdgroups of %d, at most %d", plan.name, plan.threads, UQR_SIMD_WIDTH,
                  UQR_MAX_THREADS_PER_THREADGROUP);
    return 1;
  }
  void* buffers[4] = {const_cast<void*>(x), const_cast<void*>(w), y, const_cast<uqr_gemm_params*>(p)};
  uqr_emu::dispatch(it->second, buffers, uint3{plan.grid[0], plan.grid[1], plan.grid[2]}, plan.threads,
                    plan.threadgroup_bytes);
  return 0;
}

extern "C" const char* uqr_emu_kernel_name(const long long* params, int n_params, int dtype, int path) {
  static char name[sizeof(uqr_launch::name)];
  uqr_gemm_params p;
  uqr_launch plan;
  if (params_from_list(params, n_params, &p) || uqr_plan_launch(p, dtype, path, plan)) return "";
  std::snprintf(name, sizeof name, "%s", plan.name);
  return name;
}

#ifdef UQR_EMU_MAIN
// Request file: int32 field count, the int64 params list, int32 dtype, int32 path, int64 x/w/y byte
// counts, then the bytes.
// Each buffer gets an allocation of exactly its size, so AddressSanitizer flags any kernel access
// past the data it was given. y (poisoned by the caller) is written back to the output file.
static unsigned char* read_exact(std::FILE* f, long long n) {
  unsigned char* buf = new unsigned char[n > 0 ? n : 1];
  if (n > 0 && std::fread(buf, 1, (size_t)n, f) != (size_t)n) {
    std::fprintf(stderr, "metal-emu: short request file\n");
    std::exit(2);
  }
  return buf;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s REQUEST OUTPUT\n", argv[0]);
    return 2;
  }
  std::FILE* in = std::fopen(argv[1], "rb");
  if (!in) return 2;
  int n_params = 0;
  long long params[64];
  int header[2];
  long long sizes[3];
  if (std::fread(&n_params, sizeof n_params, 1, in) != 1 || n_params < 0 || n_params > 64 ||
      std::fread(params, sizeof params[0], (size_t)n_params, in) != (size_t)n_params ||
      std::fread(header, sizeof header, 1, in) != 1 || std::fread(sizes, sizeof sizes, 1, in) != 1)
    return 2;
  unsigned char* x = read_exact(in, sizes[0]);
  unsigned char* w = read_exact(in, sizes[1]);
  unsigned char* y = read_exact(in, sizes[2]);
  std::fclose(in);
  char err[256] = {0};
  if (uqr_emu_gemm(x, w, y, params, n_params, header[0], header[1], err, sizeof err)) {
    std::fprintf(stderr, "%s\n", err);
    return 3;
  }
  std::FILE* out = std::fopen(argv[2], "wb");
  if (!out || std::fwrite(y, 1, (size_t)sizes[2], out) != (size_t)sizes[2]) return 2;
  std::fclose(out);
  delete[] x;
  delete[] w;
  delete[] y;
  return 0;
}
#endif
