// Decode-to-dense kernel: packed weight rows -> dense [N, K] bf16 / fp16 / fp32, the first half
// of the large-M scratch path (the second is cuBLAS). It is a streaming copy that writes ~3.5x
// (bf16) the bytes it reads, so what matters is that every byte moves once in wide, coalesced
// transactions and that decode stays cheaper than the memory time:
//   - a CTA owns one tile of one weight row (kTileElems elements); its packed bytes, which start
//     at any address (18-byte q4_0 blocks, arbitrary row strides), are staged into shared memory
//     with 16-byte loads, byte loads only for the partial 16-byte granules at the two edges;
//   - each thread then decodes whole 8-element chunks with the shared decoders of
//     uqr/formats.h (the one definition of every layout) and writes each chunk with 16-byte
//     stores, consecutive threads on consecutive chunks (a thread decoding a whole var_affine
//     sub-block to read its header once measured slower, 76 vs 53 us on the H200: its four
//     16-byte stores per lane leave each warp store 64 bytes apart).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dequant.h"
#include "uqr/formats.h"

namespace uqr {
namespace cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxTilesPerRow = 65535;  // grid.y

// 8-element chunks per thread per tile: 4, so K = 4096 is one CTA a row (decode alone, 14336 x
// 4096 -> bf16, us, two rounds of two): 2 chunks q4_0 43.2-44.7, q4_k 49.2-52.4, mlx4 43.0-43.6;
// 4 chunks 41.3-42.8, 47.2-50.1, 42.0-42.3; 8 (half the threads idle at K = 4096) the same as 4.
constexpr int kChunksPerThread = 4;
constexpr int kTileElems = kThreads * kChunksPerThread * 8;

// 8 decoded floats -> 16 bytes of T (32 for fp32), rounded to nearest even like torch's casts.
template <typename T>
__device__ __forceinline__ void store8(T* dst, const float* v);
template <>
__device__ __forceinline__ void store8<__nv_bfloat16>(__nv_bfloat16* dst, const float* v) {
  __nv_bfloat162 h[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(h);
}
template <>
__device__ __forceinline__ void store8<__half>(__half* dst, const float* v) {
  __half2 h[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(h);
}
template <>
__device__ __forceinline__ void store8<float>(float* dst, const float* v) {
  reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// Copies the tile's `span - lead` packed bytes (starting `lead` bytes past the 16-byte aligned
// `base`) to stage[lead, span): whole granules with one 16-byte read-only load each, the two edge
// granules byte by byte so nothing outside the weight is read.
__device__ __forceinline__ void stage_bytes(uint8_t* stage, const uint8_t* base, int lead, int span) {
  const int granules = (span + 15) >> 4;
  for (int g = threadIdx.x; g < granules; g += kThreads) {
    const int lo = g * 16;
    if (lo >= lead && lo + 16 <= span) {
      *reinterpret_cast<uint4*>(stage + lo) = __ldg(reinterpret_cast<const uint4*>(base + lo));
    } else {
      for (int i = max(lo, lead); i < min(lo + 16, span); ++i) stage[i] = base[i];
    }
  }
}

template <int FMT, int GROUP, typename T>
__global__ void __launch_bounds__(kThreads) dequant_kernel(const uint8_t* __restrict__ w, int64_t w_row_stride,
                                                           T* __restrict__ out, int K) {
  constexpr int kElems = uqr_block_elems(FMT, GROUP), kBytes = uqr_block_bytes(FMT, GROUP);
  constexpr int kChunks = kElems / 8;  // chunks per block
  static_assert(kTileElems % kElems == 0, "a tile holds whole blocks");
  constexpr int kTileBytes = kTileElems / kElems * kBytes;
  __shared__ __align__(16) uint8_t stage[kTileBytes + 16];

  const int64_t row = blockIdx.x;
  const int k0 = blockIdx.y * kTileElems;
  const int blocks = min(kTileElems, K - k0) / kElems;
  const uint8_t* src = w + row * w_row_stride + static_cast<int64_t>(k0 / kElems) * kBytes;
  const int lead = static_cast<int>(reinterpret_cast<uintptr_t>(src) & 15);
  stage_bytes(stage, src - lead, lead, lead + blocks * kBytes);
  __syncthreads();

  T* dst = out + row * K + k0;
  const uint8_t* tile = stage + lead;
#pragma unroll
  for (int i = 0; i < kChunksPerThread; ++i) {
    const int c = threadIdx.x + i * kThreads;
    if (c < blocks * kChunks) {
      float v[8];
      uqr_decode8_fmt<FMT>(tile + (c / kChunks) * kBytes, c % kChunks, v);
      store8<T>(dst + 8 * c, v);
    }
  }
}

template <int FMT, int GROUP, typename T>
cudaError_t launch(const uint8_t* w, int64_t w_row_stride, int64_t N, int64_t K, void* out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(N), static_cast<unsigned>((K + kTileElems - 1) / kTileElems));
  dequant_kernel<FMT, GROUP, T><<<grid, kThreads, 0, stream>>>(w, w_row_stride, static_cast<T*>(out),
                                                               static_cast<int>(K));
  return cudaGetLastError();
}

template <int FMT, int GROUP>
cudaError_t launch_type(const uint8_t* w, int64_t w_row_stride, int64_t N, int64_t K, void* out, DenseType type,
                        cudaStream_t stream) {
  switch (type) {
    case DenseType::kBF16: return launch<FMT, GROUP, __nv_bfloat16>(w, w_row_stride, N, K, out, stream);
    case DenseType::kF16: return launch<FMT, GROUP, __half>(w, w_row_stride, N, K, out, stream);
    default: return launch<FMT, GROUP, float>(w, w_row_stride, N, K, out, stream);
  }
}

}  // namespace

int64_t dequant_max_k() { return static_cast<int64_t>(kMaxTilesPerRow) * kTileElems; }

cudaError_t dequant_cuda(const uint8_t* w, int64_t w_row_stride, int fmt, int group_size, int64_t N, int64_t K,
                         void* out, DenseType type, cudaStream_t stream) {
  if (N < 1 || N > INT32_MAX || K < 1 || K > dequant_max_k() || reinterpret_cast<uintptr_t>(out) % 16)
    return cudaErrorInvalidValue;
  if (uqr_code_bits(fmt) && !uqr_group_size_ok(fmt, group_size)) return cudaErrorInvalidValue;
  if (K % uqr_block_elems(fmt, group_size)) return cudaErrorInvalidValue;
#define UQR_DEQUANT_GROUPED_CASE(id, G) \
  if (fmt == id && group_size == G) return launch_type<id, G>(w, w_row_stride, N, K, out, type, stream);
  UQR_GROUPED_CASES(UQR_DEQUANT_GROUPED_CASE)
#undef UQR_DEQUANT_GROUPED_CASE
  switch (fmt) {
#define UQR_DEQUANT_CASE(id, name) \
  case id: return launch_type<id, 0>(w, w_row_stride, N, K, out, type, stream);
    UQR_FIXED_BLOCK_LIST(UQR_DEQUANT_CASE)
#undef UQR_DEQUANT_CASE
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace cuda
}  // namespace uqr
