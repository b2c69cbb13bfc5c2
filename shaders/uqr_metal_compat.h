// What differs between compiling the shaders for a real Apple GPU and for the CPU emulator
// (torch_uqr/metal_emu): how an instantiated kernel gets its host name, and whether bfloat exists.
#pragma once

// Kernels are templates; each instantiation is named so the host picks one by building a string
// (uqr_gemm_<kind>_<format>_<dtype>, see csrc/mps/launch.h). The emulator registers the same
// names in its kernel table instead of emitting Metal entry points.
#if defined(UQR_METAL_EMU)
  #define UQR_CAT2(a, b) a##b
  #define UQR_CAT(a, b) UQR_CAT2(a, b)
  #define UQR_KERNEL_INSTANCE(name, func, ...) \
    static uqr_emu::Registrar UQR_CAT(uqr_emu_kernel_, __COUNTER__)(name, &func<__VA_ARGS__>);
#else
  #define UQR_KERNEL_INSTANCE(name, func, ...) \
    template [[host_name(name)]] [[kernel]] decltype(func<__VA_ARGS__>) func<__VA_ARGS__>;
#endif

// bfloat is a Metal 3.1 type (macOS 14); older compilers get fp16 and fp32 kernels only, and the host
// reports a missing bf16 kernel by name.
#if defined(UQR_METAL_EMU) || (defined(__METAL_VERSION__) && __METAL_VERSION__ >= 310)
  #define UQR_HAS_BFLOAT 1
#else
  #define UQR_HAS_BFLOAT 0
#endif
