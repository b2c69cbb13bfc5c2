// Pieces the CUDA C++ kernels share: cp.async wrappers, programmatic dependent launch, and the
// (cached) SM count.
#pragma once
#include <cuda_runtime.h>

#include <utility>

namespace uqr {
namespace cuda {

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
// As cp_async16, but with `valid` false it reads nothing and fills the 16 bytes with zeros.
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, bool valid) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Programmatic dependent launch (Hopper). A kernel started by launch_ex() may begin while the
// stream's previous kernel is still running; pdl_wait() returns once that kernel has finished and
// its writes are visible, so every kernel launched that way calls it before it reads or writes
// anything another kernel touches (weights excepted where the previous kernel is known to have
// waited itself: the int8 main kernel behind its pre-pass). A kernel that hands its output to a
// second kernel of the same call (the x pre-passes) lets that one launch at once with
// pdl_allow_dependents(); a call's last kernel does not, so the next call launches as its CTAs
// exit. Measured in one build: the last kernel letting the next call launch at its start
// or after its main loop cost up to 4 us at one row (4096 x 14336 mlx4 23.6 / 22.7 us against
// 19.4 at the exit), the next call's CTAs crowding into the slots free at that moment; launching
// at the exit saved 1.3-2.2 us against no dependent launch (wgmma, 128 rows: q4_0 45.4 / 44.5 ->
// 43.2). Both are no-ops on sm_80 and without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// A global load of data the previous kernel may have written (x, a pre-pass's codes), for kernels
// that pdl_wait(). Not __ldg: ld.global.nc declares the data read-only for the kernel's whole life,
// so ptxas may schedule it above griddepcontrol.wait - it did for the ternary int8 kernel, which then
// read the previous call's x whenever the pre-pass was still running (21 of 80 calls wrong under a
// second process's load, none with the dependent launch off). ld.global.ca caches in L1 as .nc does.
// tests/test_cuda_build.py checks that no kernel with the wait keeps an ld.global.nc.
template <class V>
__device__ __forceinline__ V ld_after_wait(const V* p) {
  return __ldca(p);
}

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent when `pdl` (the
// launch plan's choice: on for sm_90 devices by default, torch_uqr/triton_kernels/dispatch.py).
template <typename... KArgs, typename... Args>
cudaError_t launch_ex(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                      Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// Multiprocessors of the current device, asked once (the attribute query is not free per call).
inline int sm_count() {
  static int sms = 0;
  if (!sms) {
    int dev = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) sms = 132;
  }
  return sms;
}

}  // namespace cuda
}  // namespace uqr
