// Compiled (not run) for aarch64 by tests/test_aarch64_compile.py: every block decoder, the panel
// decode in all three panel dtypes and a fused decode-and-dot loop, through cpu_simd.h's NEON
// vector type. It needs no ATen, so the host's C++ headers suffice under an aarch64 target.
#include "cpu/block_decode.h"

#if !UQR_CPU_NEON
#error "expected the NEON vector type (UQR_CPU_NEON) under an aarch64 target"
#endif

namespace uqr::cpu {

// One weight row (nblocks blocks) against one activation row: the fused kernel's inner loop.
template <class Dec>
float row_dot(const uint8_t* w, const float* x, int64_t nblocks) {
  vf acc = vzero();
  for (int64_t b = 0; b < nblocks; ++b) {
    vf wv[Dec::kVecs];
    Dec::decode(w + b * Dec::kBytes, wv);
    for (int v = 0; v < Dec::kVecs; ++v) acc = vfma(wv[v], vload(x + b * Dec::kElems + v * kLanes), acc);
  }
  return vsum(acc);
}

template <class Dec>
void instantiate(const uint8_t* w, const uqr_gemm_params& p, float* f, c10::Half* h, c10::BFloat16* bf, float* out) {
  decode_rows<Dec>(w, p, 0, 1, f, p.K);
  decode_rows<Dec>(w, p, 0, 1, h, p.K);
  decode_rows<Dec>(w, p, 0, 1, bf, p.K);
  *out = row_dot<Dec>(w, f, p.K / Dec::kElems);
}

void check_all(const uint8_t* w, const uqr_gemm_params& p, float* f, c10::Half* h, c10::BFloat16* bf, float* out) {
  // Every format of the generated table, so a new format's decoder is compiled here too.
#define UQR_CHECK_FMT(id, name) id,
  for (int fmt : {UQR_FIXED_BLOCK_LIST(UQR_CHECK_FMT) UQR_MLX4})
#undef UQR_CHECK_FMT
    for (int g : {32, 64, 128})
      with_decoder(fmt, g, [&](auto tag) { instantiate<typename decltype(tag)::type>(w, p, f, h, bf, out); });
}

}  // namespace uqr::cpu
