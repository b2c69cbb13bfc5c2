// Small-M CUDA kernel (batch * M <= 8 activation rows): streams the packed weights once, decoding
// with the shared block decoders of formats.h.
//
// Why this shape: at M <= 8 the product is pure weight streaming, so what matters is bytes in
// flight per SM. The Triton kernels could only prove 2-byte alignment of 18/34-byte GGUF blocks and
// issued 2-byte loads without pipelining (bench/NOTES.md). Here every warp copies its weight rows
// into its own shared-memory ring with 16-byte cp.async (kStages segments of up to 1 KB in flight
// per warp) and decodes whole blocks from shared memory while later segments arrive. x is staged
// once per CTA as fp32 (a K-tile of it when M * K floats would not fit) and shared by all warps.
//
// Work split: a CTA owns kWarps * R weight rows (warp w: rows w, w + kWarps, ...); a warp walks
// (K-tile, its row, segment) items, so all warps reach the x-restaging barriers together. Lanes
// split a segment's 8-element chunks, keep fp32 partial sums per (row, activation row) and reduce
// with shuffles once at the end: no atomics, no split-K, y written once through the stride params.
//
// Status: correct on the H200 but measured slower than the Triton kernels (bench/NOTES.md v8), so
// dispatch keeps it off (configs.CUDA_GEMV_ENABLED); the batched x staging came after that run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gemv_small_m.h"
#include "uqr/formats.h"

namespace uqr {
namespace cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kStages = 4;
constexpr int kStageBytes = 1024;  // ring slot; a segment is the most whole blocks that fit
constexpr int kRowsMax = 4;        // weight rows per warp (accumulators kept in registers)
constexpr int kXBudgetBytes = 64 * 1024;

struct GemvArgs {
  uqr_gemm_params p;
  const void* x;
  void* y;
  const uint8_t* w;
  int64_t w_row_stride;
  int dtype;
  int rows;        // activation rows batch * M (<= MT)
  int rows_per_warp;
  int kt;          // K-tile in elements (a multiple of seg_blocks * group_size unless == K)
  int seg_blocks;  // blocks per ring slot
  int aligned16;   // rows and segments 16-byte aligned: cp.async; else byte copies
};

template <int FMT>
__device__ __forceinline__ void decode8(const uint8_t* blk, int chunk, float* out) { uqr_decode8_fmt<FMT>(blk, chunk, out); }

// Fixed-block formats give the compiler constant chunk arithmetic; mlx4's group is a launch value.
template <int FMT>
__device__ __forceinline__ int chunks_per_block(const uqr_gemm_params& p) {
  if constexpr (FMT == UQR_Q4_K || FMT == UQR_VAR_AFFINE || FMT == UQR_EXL3) return 32;
  else if constexpr (FMT == UQR_MLX4) return p.group_size >> 3;
  else return 4;
}

template <int FMT>
__device__ __forceinline__ int block_bytes(const uqr_gemm_params& p) {
  if constexpr (FMT == UQR_Q4_0) return UQR_Q4_0_BYTES;
  else if constexpr (FMT == UQR_Q4_1) return UQR_Q4_1_BYTES;
  else if constexpr (FMT == UQR_Q8_0) return UQR_Q8_0_BYTES;
  else if constexpr (FMT == UQR_Q4_K) return UQR_Q4_K_BYTES;
  else if constexpr (FMT == UQR_VAR_AFFINE) return UQR_VAR_AFFINE_BYTES;
  else if constexpr (FMT == UQR_EXL3) return UQR_EXL3_BYTES;
  else if constexpr (FMT == UQR_TERNARY) return UQR_TERNARY_BYTES;
  else return p.block_bytes;
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ float load_x(const void* x, int dtype, int64_t off) {
  if (dtype == kGemvFloat32) return static_cast<const float*>(x)[off];
  if (dtype == kGemvFloat16) return __half2float(static_cast<const __half*>(x)[off]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(x)[off]);
}

__device__ __forceinline__ void store_y(void* y, int dtype, int64_t off, float v) {
  if (dtype == kGemvFloat32) static_cast<float*>(y)[off] = v;
  else if (dtype == kGemvFloat16) static_cast<__half*>(y)[off] = __float2half_rn(v);
  else static_cast<__nv_bfloat16*>(y)[off] = __float2bfloat16_rn(v);
}

// x[:, k0:k0+len] -> xs as fp32 (rows past a.rows zero). All loads of a batch are issued before
// any store: the v8 loop waited for one L2 load per trip while the whole CTA sat at the barrier.
template <int MT>
__device__ __forceinline__ void stage_x(const GemvArgs& a, float* xs, int k0, int len) {
  constexpr int kBatch = 4;
  const uqr_gemm_params& p = a.p;
  const int total = MT * len;
  for (int base = threadIdx.x; base < total; base += kBatch * blockDim.x) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int idx = base + u * blockDim.x;
      const int t = idx / len, k = idx - t * len;
      v[u] = 0.f;
      if (idx < total && t < a.rows) {
        const int b = t / p.M, m = t - b * p.M;
        v[u] = load_x(a.x, a.dtype, uqr_x_offset(p, b, m, k0 + k));
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int idx = base + u * blockDim.x;
      const int t = idx / len, k = idx - t * len;
      if (idx < total) xs[t * a.kt + k] = v[u];
    }
  }
}

// Where work item i of a warp lies: K-tile, which of the warp's rows, segment within the tile.
struct Item {
  int tile, r, seg, nblk;
};

template <int FMT>
__device__ __forceinline__ Item locate(const GemvArgs& a, int i, int tile_blocks, int segs_full, int last_blocks,
                                       int segs_last, int ntiles) {
  const int per_full = a.rows_per_warp * segs_full;
  Item it;
  it.tile = i / per_full;
  int rem = i - it.tile * per_full;
  int segs = segs_full, blocks = tile_blocks;
  if (it.tile >= ntiles - 1) {  // the last tile may be shorter
    it.tile = ntiles - 1;
    rem = i - (ntiles - 1) * per_full;
    segs = segs_last;
    blocks = last_blocks;
  }
  it.r = rem / segs;
  it.seg = rem - it.r * segs;
  it.nblk = min(a.seg_blocks, blocks - it.seg * a.seg_blocks);
  return it;
}

template <int FMT, int MT>
__global__ void __launch_bounds__(kWarps * 32) gemv_small_m_kernel(const GemvArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const uqr_gemm_params& p = a.p;
  float* xs = reinterpret_cast<float*>(smem);  // [MT][kt]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  unsigned char* ring = smem + static_cast<size_t>(MT) * a.kt * sizeof(float) + warp * kStages * kStageBytes;

  const int be = p.group_size, bb = block_bytes<FMT>(p), cpb = chunks_per_block<FMT>(p);
  const int kt_blocks = a.kt / be;
  const int ntiles = (p.K + a.kt - 1) / a.kt;
  const int last_blocks = p.K / be - (ntiles - 1) * kt_blocks;
  const int segs_full = (kt_blocks + a.seg_blocks - 1) / a.seg_blocks;
  const int segs_last = (last_blocks + a.seg_blocks - 1) / a.seg_blocks;
  const int n_items = a.rows_per_warp * ((ntiles - 1) * segs_full + segs_last);
  const int row0 = blockIdx.x * kWarps * a.rows_per_warp + warp;

  auto issue = [&](int i) {
    if (i >= n_items) return;
    const Item it = locate<FMT>(a, i, kt_blocks, segs_full, last_blocks, segs_last, ntiles);
    const int row = row0 + it.r * kWarps;
    if (row >= p.N) return;
    const uint8_t* src = a.w + row * a.w_row_stride +
                         (static_cast<int64_t>(it.tile) * kt_blocks + it.seg * a.seg_blocks) * bb;
    unsigned char* dst = ring + (i % kStages) * kStageBytes;
    const int len = it.nblk * bb;
    if (a.aligned16) {
      for (int off = lane * 16; off < len; off += 32 * 16) cp_async16(dst + off, src + off);
    } else {
      for (int off = lane; off < len; off += 32) dst[off] = __ldg(src + off);
    }
  };

  float acc[kRowsMax][MT];
#pragma unroll
  for (int r = 0; r < kRowsMax; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    issue(s);
    cp_async_commit();
  }
  int staged_tile = -1;
  for (int i = 0; i < n_items; ++i) {
    issue(i + kStages - 1);
    cp_async_commit();  // empty groups keep the count uniform, so wait<kStages-1> means "item i landed"
    const Item it = locate<FMT>(a, i, kt_blocks, segs_full, last_blocks, segs_last, ntiles);
    if (it.tile != staged_tile) {
      // Every warp has the same items, so all of them arrive here at the same i.
      __syncthreads();
      stage_x<MT>(a, xs, it.tile * a.kt, min(a.kt, p.K - it.tile * a.kt));
      __syncthreads();
      staged_tile = it.tile;
    }
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const int row = row0 + it.r * kWarps;
    if (row < p.N) {
      const unsigned char* buf = ring + (i % kStages) * kStageBytes;
      const int kbase = it.seg * a.seg_blocks * be;  // tile-relative
      float part[MT];
#pragma unroll
      for (int m = 0; m < MT; ++m) part[m] = 0.f;
      const int n_chunks = it.nblk * cpb;
      for (int c = lane; c < n_chunks; c += 32) {
        const int blk = c / cpb, ch = c - blk * cpb;
        float v[8];
        decode8<FMT>(buf + blk * bb, ch, v);
        const int k = kbase + blk * be + ch * 8;
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const float4 x0 = *reinterpret_cast<const float4*>(xs + m * a.kt + k);
          const float4 x1 = *reinterpret_cast<const float4*>(xs + m * a.kt + k + 4);
          part[m] += v[0] * x0.x + v[1] * x0.y + v[2] * x0.z + v[3] * x0.w + v[4] * x1.x + v[5] * x1.y +
                     v[6] * x1.z + v[7] * x1.w;
        }
      }
      // Registers cannot be indexed by a runtime row, so select it with an unrolled compare.
#pragma unroll
      for (int r = 0; r < kRowsMax; ++r)
        if (r == it.r)
#pragma unroll
          for (int m = 0; m < MT; ++m) acc[r][m] += part[m];
    }
    __syncwarp();  // the slot is refilled by the next iteration's issue
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < kRowsMax; ++r) {
    const int row = row0 + r * kWarps;
    if (r >= a.rows_per_warp || row >= p.N) break;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == m && m < a.rows) {
        const int b = m / p.M, mm = m - b * p.M;
        store_y(a.y, a.dtype, uqr_y_offset(p, b, mm, row), v);
      }
    }
  }
}

int gcd(int u, int v) { return v ? gcd(v, u % v) : u; }

int sm_count() {
  static int sms = 0;
  if (!sms) {
    int dev = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) sms = 132;
  }
  return sms;
}

template <int FMT, int MT>
cudaError_t launch(GemvArgs& a, cudaStream_t stream) {
  const uqr_gemm_params& p = a.p;
  // Segment: whole blocks, a multiple of 16 bytes (so every segment start stays 16-byte aligned).
  const int unit = 16 / gcd(16, p.block_bytes);
  a.seg_blocks = kStageBytes / (unit * p.block_bytes) * unit;
  if (a.seg_blocks == 0) return cudaErrorInvalidValue;  // no format has blocks over 1 KB
  const int fit = kXBudgetBytes / (MT * static_cast<int>(sizeof(float)));
  if (p.K > fit && a.seg_blocks * p.group_size > fit) {
    // x is K-tiled and a tile must hold whole segments: shrink the segment (still >= 16 bytes).
    a.seg_blocks = fit / p.group_size / unit * unit;
    if (a.seg_blocks == 0) return cudaErrorInvalidValue;
  }
  const int seg_elems = a.seg_blocks * p.group_size;
  a.kt = p.K <= fit ? p.K : fit / seg_elems * seg_elems;
  const int sms = sm_count();
  // Largest rows-per-warp that still leaves two CTAs per SM: fewer CTAs restage x less often.
  a.rows_per_warp = 1;
  for (int r = kRowsMax; r > 1; r >>= 1) {
    if ((p.N + kWarps * r - 1) / (kWarps * r) >= 2 * sms) {
      a.rows_per_warp = r;
      break;
    }
  }
  const int grid = (p.N + kWarps * a.rows_per_warp - 1) / (kWarps * a.rows_per_warp);
  const size_t smem = static_cast<size_t>(MT) * a.kt * sizeof(float) + kWarps * kStages * kStageBytes;
  auto kernel = gemv_small_m_kernel<FMT, MT>;
  // Once per instantiation, for the largest request it can make (so no call, e.g. one being
  // captured into a CUDA graph, has to change function attributes).
  static const cudaError_t attr = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kXBudgetBytes + kWarps * kStages * kStageBytes);
  if (attr != cudaSuccess) return attr;
  kernel<<<grid, kWarps * 32, smem, stream>>>(a);
  return cudaGetLastError();
}

template <int FMT>
cudaError_t launch_rows(GemvArgs& a, cudaStream_t stream) {
  if (a.rows <= 1) return launch<FMT, 1>(a, stream);
  if (a.rows <= 2) return launch<FMT, 2>(a, stream);
  if (a.rows <= 4) return launch<FMT, 4>(a, stream);
  return launch<FMT, 8>(a, stream);
}

}  // namespace

cudaError_t gemv_small_m(const void* x, const uint8_t* w, int64_t w_row_stride, void* y,
                         const uqr_gemm_params& p, GemvDtype dtype, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(p.batch) * p.M;
  if (rows < 1 || rows > kGemvMaxRows || p.N <= 0 || p.K <= 0 || p.group_size % 8 || p.K % p.group_size)
    return cudaErrorInvalidValue;
  GemvArgs a{};
  a.p = p;
  a.x = x;
  a.y = y;
  a.w = w;
  a.w_row_stride = w_row_stride;
  a.dtype = dtype;
  a.rows = static_cast<int>(rows);
  a.aligned16 = reinterpret_cast<uintptr_t>(w) % 16 == 0 && w_row_stride % 16 == 0 && p.row_bytes % 16 == 0;
  switch (p.fmt) {
    case UQR_Q4_0: return launch_rows<UQR_Q4_0>(a, stream);
    case UQR_Q4_1: return launch_rows<UQR_Q4_1>(a, stream);
    case UQR_Q8_0: return launch_rows<UQR_Q8_0>(a, stream);
    case UQR_Q4_K: return launch_rows<UQR_Q4_K>(a, stream);
    case UQR_MLX4: return launch_rows<UQR_MLX4>(a, stream);
    case UQR_VAR_AFFINE: return launch_rows<UQR_VAR_AFFINE>(a, stream);
    case UQR_EXL3: return launch_rows<UQR_EXL3>(a, stream);
    case UQR_TERNARY: return launch_rows<UQR_TERNARY>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace cuda
}  // namespace uqr
