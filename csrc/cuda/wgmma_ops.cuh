// Hopper's warpgroup MMA (wgmma, sm_90a) with the A operand in registers and B in shared memory,
// for the weights-in-registers kernel qmma_wgmma.cu. A warp's A registers of wgmma.m64nNk16 have
// mma.sync.m16n8k16's A layout (warp i of the warpgroup owns rows 16 i .. 16 i + 15), so the
// per-format decoders of qmma_traits.cuh feed it unchanged.
//
// The accumulators are written asynchronously: between a wgmma and the wait_group that retires it
// nothing may touch them, and reads after the wait go through fence_operands so the compiler
// cannot hoist them above it.
#pragma once
#include <stdint.h>

#include <type_traits>

namespace uqr {
namespace cuda {
namespace wg {

struct Bf16Tag {};
struct F16Tag {};

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared memory written by cp.async (generic proxy) must be fenced before wgmma reads it (async proxy).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Descriptor of a K-major tile in shared memory with the 128-byte swizzle: rows of 64 16-bit
// elements (128 bytes), 8-row groups 1024 bytes apart; the tile starts 1024-byte aligned. Moving
// along K inside the 128-byte row is a plain add to the start address (16-byte units).
__device__ __forceinline__ uint64_t smem_desc_sw128(const void* p) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  uint64_t d = (addr & 0x3FFFFu) >> 4;        // start address
  d |= static_cast<uint64_t>(1) << 16;        // leading byte offset: unused with this swizzle
  d |= static_cast<uint64_t>(1024 >> 4) << 32;  // stride byte offset: next 8-row group
  d |= static_cast<uint64_t>(1) << 62;        // 128-byte swizzle
  return d;
}

// D[64 x N] += A[64 x 16] (registers) * B[16 x N] (K-major in shared memory, descriptor), fp32 D.
// The operand lists are spelled once as macros; bf16 and fp16 differ only in the type suffix.
#define UQR_WGMMA_D32 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

#define UQR_WGMMA_D64 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

#define UQR_WGMMA_REGS32 \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"

#define UQR_WGMMA_REGS64 \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"

#define UQR_WGMMA_IN "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
// scale-d is a predicate operand: set it from the last input (always 1, D accumulates).
#define UQR_WGMMA_OPEN(SCALE) "{\n.reg .pred p;\nsetp.ne.b32 p, %" #SCALE ", 0;\n"

template <class Tag>
__device__ __forceinline__ void mma_m64n64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t desc, Tag) {
  if constexpr (std::is_same<Tag, Bf16Tag>::value)
    asm volatile(UQR_WGMMA_OPEN(37) "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" UQR_WGMMA_REGS32
                 "}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n" : UQR_WGMMA_D32 : UQR_WGMMA_IN);
  else
    asm volatile(UQR_WGMMA_OPEN(37) "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" UQR_WGMMA_REGS32
                 "}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n" : UQR_WGMMA_D32 : UQR_WGMMA_IN);
}

template <class Tag>
__device__ __forceinline__ void mma_m64n128k16(float (&d)[64], const uint32_t (&a)[4], uint64_t desc, Tag) {
  if constexpr (std::is_same<Tag, Bf16Tag>::value)
    asm volatile(UQR_WGMMA_OPEN(69) "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" UQR_WGMMA_REGS64
                 "}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n" : UQR_WGMMA_D64 : UQR_WGMMA_IN);
  else
    asm volatile(UQR_WGMMA_OPEN(69) "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" UQR_WGMMA_REGS64
                 "}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n" : UQR_WGMMA_D64 : UQR_WGMMA_IN);
}

#undef UQR_WGMMA_D32
#undef UQR_WGMMA_D64
#undef UQR_WGMMA_REGS32
#undef UQR_WGMMA_REGS64
#undef UQR_WGMMA_IN
#undef UQR_WGMMA_OPEN

}  // namespace wg
}  // namespace cuda
}  // namespace uqr
