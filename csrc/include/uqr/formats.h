// Block layouts and decoders of every torch-uqr weight format: the C-family definition of the
// byte layouts in docs/formats.md, included by the CPU kernels, the Metal shaders (and so the emulator)
// and any CUDA C++. The Python reference decoders in torch_uqr/formats/ are the other half of the
// contract; the tests hold the two equal.
//
// Decoder interface, the same for every format: uqr_decode8_<fmt>(block, chunk, out) writes the 8
// elements [8*chunk, 8*chunk + 8) of one block into out[0..7]. Eight is the widest unit every format
// can produce without reading another chunk's bits, and small enough to be one GPU thread's share
// of a tile. Blocks of the same format differ only in their bytes, so a decoder needs nothing but
// the block pointer (an MLX-family group size only bounds `chunk`).
#pragma once
#include "platform.h"

// Format ids, block sizes, names and capability lists: generated from torch_uqr/formats/table.py.
#include "format_table.h"


// Byte offsets of the fields, named so the decoders and the validators read the same layout.
#define UQR_VAR_AFFINE_SCALES 4
#define UQR_VAR_AFFINE_BIASES 12
#define UQR_VAR_AFFINE_MODES 20
#define UQR_VAR_AFFINE_PAD 28
#define UQR_VAR_AFFINE_QS 32
#define UQR_EXL3_SCALES 4
#define UQR_EXL3_RESIDUALS 12
#define UQR_EXL3_CODEBOOK 20
#define UQR_EXL3_PAD 36
#define UQR_EXL3_QS 48
#define UQR_Q5_0_QH 2
#define UQR_Q5_0_QS 6
#define UQR_Q5_1_QH 4
#define UQR_Q5_1_QS 8
#define UQR_Q6_K_QH 128
#define UQR_Q6_K_SCALES 192
#define UQR_Q6_K_D 208
#define UQR_Q5_K_QH 16
#define UQR_Q5_K_QS 48

// q4_0: y[j] = ((qs[j] & 15) - 8) d, y[j+16] = ((qs[j] >> 4) - 8) d.
UQR_FN void uqr_decode8_q4_0(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  float d = uqr_load_half(blk);
  const UQR_GLOBAL uqr_u8* qs = blk + 2 + 8 * (chunk & 1);
  int shift = (chunk >> 1) * 4;  // chunks 0,1: low nibbles; 2,3: high nibbles
  for (int i = 0; i < 8; ++i) out[i] = (float)((int)((qs[i] >> shift) & 15) - 8) * d;
}

// q4_1: y[j] = (qs[j] & 15) d + m, y[j+16] = (qs[j] >> 4) d + m.
UQR_FN void uqr_decode8_q4_1(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  float d = uqr_load_half(blk), m = uqr_load_half(blk + 2);
  const UQR_GLOBAL uqr_u8* qs = blk + 4 + 8 * (chunk & 1);
  int shift = (chunk >> 1) * 4;
  for (int i = 0; i < 8; ++i) out[i] = (float)((qs[i] >> shift) & 15) * d + m;
}

// q8_0: y[j] = qs[j] d, qs signed.
UQR_FN void uqr_decode8_q8_0(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  float d = uqr_load_half(blk);
  const UQR_GLOBAL uqr_u8* qs = blk + 2 + 8 * chunk;
  for (int i = 0; i < 8; ++i) out[i] = (float)((int)qs[i] - ((qs[i] & 0x80) ? 256 : 0)) * d;
}

// q4_k sub-block j's 6-bit scale and min, packed into scales[12] as ggml packs them.
UQR_FN void uqr_q4_k_scale_min(const UQR_GLOBAL uqr_u8* scales, int j, UQR_THREAD int& sc, UQR_THREAD int& mn) {
  if (j < 4) {
    sc = scales[j] & 63;
    mn = scales[j + 4] & 63;
  } else {
    sc = (scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4);
    mn = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

// The same scales four sub-blocks at a time: w0, w1, w2 are scales[0..3], [4..7], [8..11] as
// little-endian words; byte i of sc / mn is sub-block 4 * upper + i's scale / min. Word-wide so a
// GPU thread unpacks a half super-block in a handful of ops instead of byte loads per sub-block.
UQR_FN void uqr_q4_k_scale_min_words(uqr_u32 w0, uqr_u32 w1, uqr_u32 w2, bool upper, UQR_THREAD uqr_u32& sc,
                                     UQR_THREAD uqr_u32& mn) {
  if (!upper) {
    sc = w0 & 0x3F3F3F3Fu;
    mn = w1 & 0x3F3F3F3Fu;
  } else {  // low 4 bits from scales[8..11], top 2 from bits 6-7 of scales[0..3] / [4..7]
    sc = (w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u);
    mn = ((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u);
  }
}

// q4_k: 8 sub-blocks of 32; y = d sc_j q - dmin m_j. qs[32c..32c+31] hold sub-block 2c in the low
// nibbles and 2c+1 in the high nibbles. Chunk = 8 elements, so chunk / 4 is the sub-block.
// q5_k is the same block with its qs at qs_off and bit 4 of sub-block j's element i in bit j of
// qh[i] (qh_off; 0: none, q4_k).
UQR_FN void uqr_k_quant_decode8(const UQR_GLOBAL uqr_u8* blk, int chunk, int qs_off, int qh_off,
                                UQR_THREAD float* out) {
  float d = uqr_load_half(blk), dmin = uqr_load_half(blk + 2);
  int j = chunk >> 2;
  int sc, mn;
  uqr_q4_k_scale_min(blk + 4, j, sc, mn);
  float scale = d * (float)sc, offset = dmin * (float)mn;
  const UQR_GLOBAL uqr_u8* qs = blk + qs_off + 32 * (j >> 1) + 8 * (chunk & 3);
  const UQR_GLOBAL uqr_u8* qh = blk + qh_off + 8 * (chunk & 3);
  int shift = (j & 1) * 4;
  for (int i = 0; i < 8; ++i) {
    int q = (int)((qs[i] >> shift) & 15);
    if (qh_off) q |= (int)(((qh[i] >> j) & 1) << 4);
    out[i] = scale * (float)q - offset;
  }
}

UQR_FN void uqr_decode8_q4_k(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  uqr_k_quant_decode8(blk, chunk, 16, 0, out);
}

// mlx4: element i of the group is bits [4i, 4i+4): byte i/2, low nibble for even i. y = scale q + bias.
UQR_FN void uqr_decode8_mlx4(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  float scale = uqr_load_half(blk), bias = uqr_load_half(blk + 2);
  const UQR_GLOBAL uqr_u8* qs = blk + 4 + 4 * chunk;
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = (float)(qs[i] & 15) * scale + bias;
    out[2 * i + 1] = (float)(qs[i] >> 4) * scale + bias;
  }
}

// The rest of the MLX affine family (mlxB, B = 2, 3, 5, 6, 8; docs/formats.md, "MLX affine
// family"): element i of the group is bits [B i, B i + B) of the LSB-first bitstream after the two
// halves, the byte order of MLX's little-endian uint32 words. y = scale q + bias. A chunk's 8 codes
// are exactly the B bytes from byte B chunk, so every code lies in at most two bytes of its own
// chunk and no read leaves the block.
UQR_FN void uqr_decode8_mlx_bits(const UQR_GLOBAL uqr_u8* blk, int chunk, int bits, UQR_THREAD float* out) {
  float scale = uqr_load_half(blk), bias = uqr_load_half(blk + 2);
  const UQR_GLOBAL uqr_u8* qs = blk + 4 + bits * chunk;
  const uqr_u32 mask = (1u << bits) - 1u;
  for (int i = 0; i < 8; ++i) {
    const int bit = i * bits, byte = bit >> 3, shift = bit & 7;
    uqr_u32 q = (uqr_u32)qs[byte] >> shift;
    if (shift + bits > 8) q |= (uqr_u32)qs[byte + 1] << (8 - shift);
    out[i] = (float)(q & mask) * scale + bias;
  }
}
UQR_FN void uqr_decode8_mlx2(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  uqr_decode8_mlx_bits(blk, chunk, 2, out);
}
UQR_FN void uqr_decode8_mlx3(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  uqr_decode8_mlx_bits(blk, chunk, 3, out);
}
UQR_FN void uqr_decode8_mlx5(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  uqr_decode8_mlx_bits(blk, chunk, 5, out);
}
UQR_FN void uqr_decode8_mlx6(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  uqr_decode8_mlx_bits(blk, chunk, 6, out);
}
UQR_FN void uqr_decode8_mlx8(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  uqr_decode8_mlx_bits(blk, chunk, 8, out);
}

// var_affine: sub-block j (elements 32j..32j+31) holds 32 codes of B_j = modes[j] & 7 bits at bit
// offset 32 (B_0 + ... + B_{j-1}). y = d s_j q + bias b_j. Validation (depths in {3,4,5}, budget,
// zero reserved bits) happens once on the host, but the kernels may still be handed bytes that
// never passed it (the raw operator, a tensor changed after validation), so the decoders are
// memory-safe by construction: the depth is read as modes[j] & 7 clamped to [3, 5] and the
// sub-block's first byte is clamped to 128 - 4 B_j, so its 4 B_j bytes lie inside qs whatever the
// modes hold. Both are identities on valid blocks (docs/formats.md, "Invalid bytes"); every backend
// clamps alike.
// A chunk's 8 codes fill exactly B_j whole bytes starting on a byte boundary (sub-blocks start at
// multiples of 32 bits, chunks 8 B_j bits apart), so they are gathered once into one integer and
// split with shifts, with no per-code test for a straddled byte (SASS of csrc/cuda/dequant.cu: 42
// -> 17 instructions per weight). uqr_var_affine_bits8 returns that integer (code i at bits
// [i B_j, (i+1) B_j)) and B_j, for the float decoder and the integer reader alike.
UQR_FN uqr_u32 uqr_var_affine_depth(uqr_u8 mode) {
  uqr_u32 b = (uqr_u32)(mode & 7);
  return b < 3u ? 3u : (b > 5u ? 5u : b);
}

// Byte offset in qs of sub-block j's codes given the (clamped) depths before it: their 4 B bytes
// each, clamped so that the sub-block's own 4 b bytes end inside the 128-byte payload.
UQR_FN uqr_u32 uqr_var_affine_start(uqr_u32 bytes_before, uqr_u32 b) {
  uqr_u32 last = 128u - 4u * b;
  return bytes_before < last ? bytes_before : last;
}

UQR_FN uqr_u64 uqr_var_affine_bits8(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD uqr_u32& b) {
  int j = chunk >> 2;
  const UQR_GLOBAL uqr_u8* modes = blk + UQR_VAR_AFFINE_MODES;
  uqr_u32 start = 0;  // bytes of the codes of sub-blocks 0..j-1: 32 codes x B bits = 4 B bytes
  for (int t = 0; t < 7; ++t)  // fixed trip count: unrolled, predicated, no loop on the GPU
    if (t < j) start += 4u * uqr_var_affine_depth(modes[t]);
  b = uqr_var_affine_depth(modes[j]);
  start = uqr_var_affine_start(start, b);
  const UQR_GLOBAL uqr_u8* qs = blk + UQR_VAR_AFFINE_QS + start + (uqr_u32)(chunk & 3) * b;
  uqr_u64 bits = 0;
  for (uqr_u32 k = 0; k < 5; ++k)  // B_j <= 5 bytes, all inside the sub-block's 4 B_j bytes
    if (k < b) bits |= (uqr_u64)qs[k] << (8 * k);
  return bits;
}

UQR_FN void uqr_decode8_var_affine(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  float d = uqr_load_half(blk), bias = uqr_load_half(blk + 2);
  int j = chunk >> 2;
  uqr_u32 b;
  uqr_u64 bits = uqr_var_affine_bits8(blk, chunk, b);
  float scale = d * (float)blk[UQR_VAR_AFFINE_SCALES + j];
  float shift = bias * (float)blk[UQR_VAR_AFFINE_BIASES + j];
  uqr_u32 mask = (1u << b) - 1u;
  for (int i = 0; i < 8; ++i) out[i] = scale * (float)((uqr_u32)(bits >> ((uqr_u32)i * b)) & mask) + shift;
}

// The chunk's 8 codes q as integers, for kernels that multiply them in integer arithmetic (the
// CPU's path int8), through the decoder's own bit reader.
UQR_FN void uqr_codes8_var_affine(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD uqr_u8* codes) {
  uqr_u32 b;
  uqr_u64 bits = uqr_var_affine_bits8(blk, chunk, b);
  uqr_u32 mask = (1u << b) - 1u;
  for (int i = 0; i < 8; ++i) codes[i] = (uqr_u8)((uqr_u32)(bits >> ((uqr_u32)i * b)) & mask);
}

// exl3: y_i = d (s_j P[k_i] + r_j R[k_i]) + bias with 3-bit k_i at bit 3i; P = codebook[0..7],
// R = codebook[8..15] (int8). The bracket is an exact integer, so only d* and +bias round (each on
// its own: uqr_mul_rn keeps nvcc from fusing them). uqr_exl3_bits8: a chunk's 8 indices as one
// integer (k_i at bit 3i), shared with the integer kernels (CPU path int8).
UQR_FN uqr_u32 uqr_exl3_bits8(const UQR_GLOBAL uqr_u8* blk, int chunk) {
  const UQR_GLOBAL uqr_u8* qs = blk + UQR_EXL3_QS;
  // 8 elements x 3 bits = 24 bits = 3 whole bytes, so a chunk starts on a byte boundary.
  return (uqr_u32)qs[3 * chunk] | ((uqr_u32)qs[3 * chunk + 1] << 8) | ((uqr_u32)qs[3 * chunk + 2] << 16);
}

UQR_FN void uqr_decode8_exl3(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  float d = uqr_load_half(blk), bias = uqr_load_half(blk + 2);
  int j = chunk >> 2;
  int s = blk[UQR_EXL3_SCALES + j], r = blk[UQR_EXL3_RESIDUALS + j];
  const UQR_GLOBAL uqr_u8* cb = blk + UQR_EXL3_CODEBOOK;
  uqr_u32 bits = uqr_exl3_bits8(blk, chunk);
  for (int i = 0; i < 8; ++i) {
    int k = (int)((bits >> (3 * i)) & 7u);
    int p = (int)(uqr_i8)cb[k], q = (int)(uqr_i8)cb[8 + k];  // signed loads
    out[i] = uqr_mul_rn(d, (float)(s * p + r * q)) + bias;
  }
}

// ternary trit of a 2-bit code: t = code - 1 for codes 0, 1, 2. Code 3 is invalid (the host
// rejects it) and decodes as 0 on every path and backend (docs/formats.md, "Invalid bytes"): a code
// with its low bit set is a zero trit, so the sign bit alone decides the others.
UQR_FN int uqr_ternary_code_trit(int code) { return (code & 1) ? 0 : code - 1; }

// The same on 16 codes at once for integer kernels that multiply codes c as (c - 1): code 3 becomes
// code 1 (a zero trit), codes 0-2 are unchanged (the high bit of every pair whose low bit is set
// is cleared).
UQR_FN uqr_u32 uqr_ternary_canonical_codes(uqr_u32 w) { return w & ~((w & 0x55555555u) << 1); }

// ternary code of element i (0..31): 2 bits at bit 2i of the 8 code bytes.
UQR_FN int uqr_ternary_trit(const UQR_GLOBAL uqr_u8* blk, int i) {
  return uqr_ternary_code_trit((int)((blk[4 + (i >> 2)] >> (2 * (i & 3))) & 3));
}

// ternary: y = d t.
UQR_FN void uqr_decode8_ternary(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  float d = uqr_load_half(blk);
  for (int i = 0; i < 8; ++i) out[i] = (float)uqr_ternary_trit(blk, 8 * chunk + i) * d;
}

// q5_0 / q5_1: 5-bit codes, the low 4 bits as q4_0's nibbles (qs[j]: element j low, j+16 high),
// bit 4 of element e in bit e of the 32-bit little-endian qh, so chunk c's 8 high bits are qh
// byte c. q5_0: y = (q - 16) d; q5_1: y = q d + m.
UQR_FN int uqr_q5_code(const UQR_GLOBAL uqr_u8* qh, const UQR_GLOBAL uqr_u8* qs, int chunk, int i) {
  return (int)((qs[8 * (chunk & 1) + i] >> ((chunk >> 1) * 4)) & 15) | (int)(((qh[chunk] >> i) & 1) << 4);
}

UQR_FN void uqr_decode8_q5_0(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  float d = uqr_load_half(blk);
  for (int i = 0; i < 8; ++i)
    out[i] = (float)(uqr_q5_code(blk + UQR_Q5_0_QH, blk + UQR_Q5_0_QS, chunk, i) - 16) * d;
}

UQR_FN void uqr_decode8_q5_1(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  float d = uqr_load_half(blk), m = uqr_load_half(blk + 2);
  for (int i = 0; i < 8; ++i) out[i] = (float)uqr_q5_code(blk + UQR_Q5_1_QH, blk + UQR_Q5_1_QS, chunk, i) * d + m;
}

// q6_k: 16 sub-blocks of 16 with int8 scales; y = (d scales[e / 16]) (q - 32), 6-bit q. Half h
// (elements 128h..) has ql[64h..64h+63] and qh[32h..32h+31]: element 128h + e takes its low 4
// bits from ql[64h + e % 64] (high nibble for e >= 64) and its top 2 from bits 2 (e / 32) of
// qh[32h + e % 32]. A chunk (8 elements) lies in one sub-block, one nibble and one 2-bit pair.
UQR_FN void uqr_decode8_q6_k(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  int h = chunk >> 4, e = 8 * (chunk & 15);
  const UQR_GLOBAL uqr_u8* ql = blk + 64 * h + (e & 63);
  const UQR_GLOBAL uqr_u8* qh = blk + UQR_Q6_K_QH + 32 * h + (e & 31);
  int lo_shift = (e >> 6) * 4, hi_shift = 2 * (e >> 5);
  float scale = uqr_load_half(blk + UQR_Q6_K_D) * (float)(int)(uqr_i8)blk[UQR_Q6_K_SCALES + (chunk >> 1)];
  for (int i = 0; i < 8; ++i) {
    int q = (int)((ql[i] >> lo_shift) & 15) | (int)(((qh[i] >> hi_shift) & 3) << 4);
    out[i] = scale * (float)(q - 32);
  }
}

// q5_k: q4_k's block with 5-bit codes (uqr_k_quant_decode8).
UQR_FN void uqr_decode8_q5_k(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  uqr_k_quant_decode8(blk, chunk, UQR_Q5_K_QS, UQR_Q5_K_QH, out);
}

// ---- GGUF iq4_nl, iq4_xs, q3_k, q2_k, mxfp4 ----------------------------------------------------
// Byte offsets of the fields of the 256-weight GGUF blocks below.
#define UQR_IQ4_XS_SCALES_H 2
#define UQR_IQ4_XS_SCALES_L 4
#define UQR_IQ4_XS_QS 8
#define UQR_Q3_K_QS 32
#define UQR_Q3_K_SCALES 96
#define UQR_Q3_K_D 108
#define UQR_Q2_K_QS 16
#define UQR_Q2_K_D 80
#define UQR_Q2_K_DMIN 82

// Entry q (0..15) of a table of 16 signed bytes held as four little-endian words (w0: entries 0-3).
// Constants in registers rather than a table in memory: the same code serves C++, CUDA and Metal,
// and a 4-bit q cannot index outside it.
UQR_FN int uqr_lut16_i8(uqr_u32 w0, uqr_u32 w1, uqr_u32 w2, uqr_u32 w3, uqr_u32 q) {
  uqr_u32 w = (q & 8u) ? ((q & 4u) ? w3 : w2) : ((q & 4u) ? w1 : w0);
  return (int)(uqr_i8)(uqr_u8)((w >> (8u * (q & 3u))) & 0xFFu);
}
// ggml's iq4_nl levels {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}.
#define UQR_IQ4_WORDS 0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u
// mxfp4's E2M1 values doubled: {0, 1, 2, 3, 4, 6, 8, 12} and their negatives (code bit 3 = sign).
#define UQR_MXFP4_WORDS 0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu
UQR_FN int uqr_iq4_level(uqr_u32 q) { return uqr_lut16_i8(UQR_IQ4_WORDS, q); }
UQR_FN int uqr_mxfp4_level(uqr_u32 q) { return uqr_lut16_i8(UQR_MXFP4_WORDS, q); }

// iq4_nl: q4_0's nibble layout, y = d V[q] (exact: 11-bit d times a 7-bit level).
UQR_FN void uqr_decode8_iq4_nl(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  float d = uqr_load_half(blk);
  const UQR_GLOBAL uqr_u8* qs = blk + 2 + 8 * (chunk & 1);
  int shift = (chunk >> 1) * 4;
  for (int i = 0; i < 8; ++i) out[i] = (float)uqr_iq4_level((uqr_u32)(qs[i] >> shift) & 15u) * d;
}

// iq4_xs sub-block j's 6-bit scale: low 4 bits from nibble j % 2 of scales_l[j / 2], high 2 bits
// from bits 2j, 2j + 1 of the u16 scales_h.
UQR_FN int uqr_iq4_xs_scale(const UQR_GLOBAL uqr_u8* blk, int j) {
  uqr_u32 lo = ((uqr_u32)blk[UQR_IQ4_XS_SCALES_L + (j >> 1)] >> (4 * (j & 1))) & 15u;
  uqr_u32 hi = ((uqr_u32)uqr_load_u16(blk + UQR_IQ4_XS_SCALES_H) >> (2 * j)) & 3u;
  return (int)(lo | (hi << 4));
}

// iq4_xs: sub-block j = chunk / 4 is 16 bytes of qs (element i low nibble of byte i, i + 16 high);
// y = (d (ls_j - 32)) V[q], exact (11 + 6 + 7 significant bits).
UQR_FN void uqr_decode8_iq4_xs(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  int j = chunk >> 2;
  float dl = uqr_load_half(blk) * (float)(uqr_iq4_xs_scale(blk, j) - 32);
  const UQR_GLOBAL uqr_u8* qs = blk + UQR_IQ4_XS_QS + 16 * j + 8 * (chunk & 1);
  int shift = ((chunk >> 1) & 1) * 4;
  for (int i = 0; i < 8; ++i) out[i] = (float)uqr_iq4_level((uqr_u32)(qs[i] >> shift) & 15u) * dl;
}

// q3_k / q2_k element e = 128h + 32s + l keeps its 2 low code bits at bits 2s of qs[32h + l]. A chunk
// (8 elements, one 16-element sub-block half) has one h, one s and l = 8 (chunk & 3) + i.
UQR_FN int uqr_k_quarter_byte(int chunk) { return 32 * (chunk >> 4) + 8 * (chunk & 3); }
UQR_FN int uqr_k_quarter_shift(int chunk) { return 2 * ((chunk >> 2) & 3); }

// q3_k 16-element sub-block j's 6-bit scale (stored + 32): low 4 bits nibble j / 8 of scales[j % 8],
// high 2 bits bits 2 (j / 4) of scales[8 + j % 4].
UQR_FN int uqr_q3_k_scale(const UQR_GLOBAL uqr_u8* blk, int j) {
  const UQR_GLOBAL uqr_u8* s = blk + UQR_Q3_K_SCALES;
  uqr_u32 lo = ((uqr_u32)s[j & 7] >> (4 * (j >> 3))) & 15u;
  uqr_u32 hi = ((uqr_u32)s[8 + (j & 3)] >> (2 * (j >> 2))) & 3u;
  return (int)(lo | (hi << 4));
}

// q3_k: code q = low 2 bits | (bit e / 32 of hmask[e % 32]) << 2; y = (d (sc_j - 32)) (q - 4), exact.
UQR_FN void uqr_decode8_q3_k(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  float dl = uqr_load_half(blk + UQR_Q3_K_D) * (float)(uqr_q3_k_scale(blk, chunk >> 1) - 32);
  const UQR_GLOBAL uqr_u8* qs = blk + UQR_Q3_K_QS + uqr_k_quarter_byte(chunk);
  const UQR_GLOBAL uqr_u8* hm = blk + 8 * (chunk & 3);
  int shift = uqr_k_quarter_shift(chunk), hbit = chunk >> 2;
  for (int i = 0; i < 8; ++i) {
    int q = (int)((qs[i] >> shift) & 3) | (int)(((hm[i] >> hbit) & 1) << 2);
    out[i] = (float)(q - 4) * dl;
  }
}

// q2_k: scales[j] = 4-bit scale | 4-bit min << 4 of 16-element sub-block j; y = (d sc) q - dmin m.
// Both products are exact, so only the difference rounds (an FMA gives the same bits).
UQR_FN void uqr_decode8_q2_k(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  uqr_u32 sc = blk[chunk >> 1];
  float dl = uqr_load_half(blk + UQR_Q2_K_D) * (float)(sc & 15u);
  float ml = uqr_load_half(blk + UQR_Q2_K_DMIN) * (float)(sc >> 4);
  const UQR_GLOBAL uqr_u8* qs = blk + UQR_Q2_K_QS + uqr_k_quarter_byte(chunk);
  int shift = uqr_k_quarter_shift(chunk);
  for (int i = 0; i < 8; ++i) out[i] = dl * (float)((qs[i] >> shift) & 3) - ml;
}

// mxfp4's E8M0 scale halved, 2^(e - 128), from its bits (ggml: e < 2 gives an fp32 subnormal).
UQR_FN float uqr_e8m0_half(uqr_u32 e) {
  uqr_u32 bits = e < 2u ? (0x00200000u << e) : ((e - 1u) << 23);
#if defined(__METAL_VERSION__) || defined(UQR_METAL)
  return as_type<float>(bits);
#elif defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// mxfp4: q4_0's nibble layout after the 1-byte exponent; y = 2^(e-128) F[q] (exact unless it
// overflows to inf for e >= 254).
UQR_FN void uqr_decode8_mxfp4(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  float d = uqr_e8m0_half(blk[0]);
  const UQR_GLOBAL uqr_u8* qs = blk + 1 + 8 * (chunk & 1);
  int shift = (chunk >> 1) * 4;
  for (int i = 0; i < 8; ++i) out[i] = (float)uqr_mxfp4_level((uqr_u32)(qs[i] >> shift) & 15u) * d;
}

// One switch for code that is generic over the format (the CPU panel decoder, the emulator's
// loaders); hot loops instantiate per format instead so the switch is resolved at compile time.
UQR_FN void uqr_decode8(int fmt, const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  switch (fmt) {
    case UQR_Q4_0: uqr_decode8_q4_0(blk, chunk, out); break;
    case UQR_Q4_1: uqr_decode8_q4_1(blk, chunk, out); break;
    case UQR_Q8_0: uqr_decode8_q8_0(blk, chunk, out); break;
    case UQR_Q4_K: uqr_decode8_q4_k(blk, chunk, out); break;
    case UQR_MLX4: uqr_decode8_mlx4(blk, chunk, out); break;
    case UQR_VAR_AFFINE: uqr_decode8_var_affine(blk, chunk, out); break;
    case UQR_EXL3: uqr_decode8_exl3(blk, chunk, out); break;
    case UQR_Q5_0: uqr_decode8_q5_0(blk, chunk, out); break;
    case UQR_Q5_1: uqr_decode8_q5_1(blk, chunk, out); break;
    case UQR_Q6_K: uqr_decode8_q6_k(blk, chunk, out); break;
    case UQR_Q5_K: uqr_decode8_q5_k(blk, chunk, out); break;
    case UQR_IQ4_NL: uqr_decode8_iq4_nl(blk, chunk, out); break;
    case UQR_IQ4_XS: uqr_decode8_iq4_xs(blk, chunk, out); break;
    case UQR_Q3_K: uqr_decode8_q3_k(blk, chunk, out); break;
    case UQR_Q2_K: uqr_decode8_q2_k(blk, chunk, out); break;
    case UQR_MXFP4: uqr_decode8_mxfp4(blk, chunk, out); break;
    case UQR_MLX2: uqr_decode8_mlx2(blk, chunk, out); break;
    case UQR_MLX3: uqr_decode8_mlx3(blk, chunk, out); break;
    case UQR_MLX5: uqr_decode8_mlx5(blk, chunk, out); break;
    case UQR_MLX6: uqr_decode8_mlx6(blk, chunk, out); break;
    case UQR_MLX8: uqr_decode8_mlx8(blk, chunk, out); break;
    default: uqr_decode8_ternary(blk, chunk, out); break;
  }
}

#if !defined(__METAL_VERSION__) && !defined(UQR_METAL)
// Compile-time format selection for C++17 hosts (the CPU kernels, the CUDA C++ kernels): hot loops
// are instantiated per format, so the switch above disappears from them. Metal (C++14, no
// `if constexpr`) instantiates its kernels per format through the shader's own templates.
template <int FMT>
UQR_FN void uqr_decode8_fmt(const UQR_GLOBAL uqr_u8* blk, int chunk, UQR_THREAD float* out) {
  if constexpr (FMT == UQR_Q4_0) uqr_decode8_q4_0(blk, chunk, out);
  else if constexpr (FMT == UQR_Q4_1) uqr_decode8_q4_1(blk, chunk, out);
  else if constexpr (FMT == UQR_Q8_0) uqr_decode8_q8_0(blk, chunk, out);
  else if constexpr (FMT == UQR_Q4_K) uqr_decode8_q4_k(blk, chunk, out);
  else if constexpr (FMT == UQR_MLX4) uqr_decode8_mlx4(blk, chunk, out);
  else if constexpr (FMT == UQR_VAR_AFFINE) uqr_decode8_var_affine(blk, chunk, out);
  else if constexpr (FMT == UQR_EXL3) uqr_decode8_exl3(blk, chunk, out);
  else if constexpr (FMT == UQR_Q5_0) uqr_decode8_q5_0(blk, chunk, out);
  else if constexpr (FMT == UQR_Q5_1) uqr_decode8_q5_1(blk, chunk, out);
  else if constexpr (FMT == UQR_Q6_K) uqr_decode8_q6_k(blk, chunk, out);
  else if constexpr (FMT == UQR_Q5_K) uqr_decode8_q5_k(blk, chunk, out);
  else if constexpr (FMT == UQR_IQ4_NL) uqr_decode8_iq4_nl(blk, chunk, out);
  else if constexpr (FMT == UQR_IQ4_XS) uqr_decode8_iq4_xs(blk, chunk, out);
  else if constexpr (FMT == UQR_Q3_K) uqr_decode8_q3_k(blk, chunk, out);
  else if constexpr (FMT == UQR_Q2_K) uqr_decode8_q2_k(blk, chunk, out);
  else if constexpr (FMT == UQR_MXFP4) uqr_decode8_mxfp4(blk, chunk, out);
  else if constexpr (FMT == UQR_MLX2) uqr_decode8_mlx2(blk, chunk, out);
  else if constexpr (FMT == UQR_MLX3) uqr_decode8_mlx3(blk, chunk, out);
  else if constexpr (FMT == UQR_MLX5) uqr_decode8_mlx5(blk, chunk, out);
  else if constexpr (FMT == UQR_MLX6) uqr_decode8_mlx6(blk, chunk, out);
  else if constexpr (FMT == UQR_MLX8) uqr_decode8_mlx8(blk, chunk, out);
  else uqr_decode8_ternary(blk, chunk, out);
}
#endif
