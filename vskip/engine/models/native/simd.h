// The vector operations the native forward (kernels.cpp) is written in, one section per instruction
// set. A new ISA is a new section here defining the same names; nothing else changes.
//
//   F          16 float32 lanes          I        16 int32 lanes (the sums of 16 outputs)
//   fzero fset fload fstore fadd fsub fmul fdiv ffma(a, b, c) = a * b + c rounded once
//   fmax fmin fabs fround (to nearest, ties to even) fpow2(n) = 2^n for integral n in [-126, 127]
//   ffirst(v, n, fill)   lanes >= n replaced by fill        fhalf(p)  16 float16 values widened
//   fcvt(I)              int32 -> float32                   fquant(v, q)  v rounded to nearest-even
//                                                           int8 (|v| <= 127) into q[16], their sum
//   dot_nib<R>, dot_q8<R>   the exact int32 sums of one block of 32 inputs for 16 outputs, R rows
//   FpEnv                IEEE defaults (round to nearest, no flush of subnormals) for a scope
//   TILE_ROWS, ATT_HEADS how many rows a product tile and heads an attention pass keep in registers
//
// Why every ISA gives the same bits: each float operation above is one IEEE operation per lane
// (multiply, add, divide, square root and the fused multiply-add are correctly rounded on every
// CPU), lane i of a result depends only on lane i of the operands, the kernels build with
// -ffp-contract=off, and horizontal reductions (hsum in kernels.cpp) use one explicit tree. The
// integer sums are exact, so their order is free. Register blocking (TILE_ROWS, ATT_HEADS) only
// chooses which rows or heads share a pass; each row and head runs the same sequence either way.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(VSKIP_ISA_AMX)  // AVX512-VNNI's section, with AMX's tiles for the products of several rows
#define VSKIP_ISA_AVX512VNNI
#endif

#if defined(VSKIP_ISA_AVX512VNNI) || defined(VSKIP_ISA_AVXVNNI) || defined(VSKIP_ISA_AVX2)
#include <immintrin.h>
#elif defined(VSKIP_ISA_NEON) || defined(VSKIP_ISA_NEON_DOTPROD)
#include <arm_neon.h>
#endif
#include <cmath>
#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>  // the MXCSR, for FpEnv
#endif

namespace vs {

inline int32_t quad(const int8_t* p) {  // 4 consecutive int8 as one int32 (to broadcast)
  int32_t v;
  memcpy(&v, p, 4);
  return v;
}

#if defined(VSKIP_ISA_AVX512VNNI)
// ---- x86-64 with AVX512F/BW/VL and AVX512-VNNI: one zmm register per lane group --------------
#if defined(VSKIP_ISA_AMX)
constexpr const char* ISA = "amx";
#else
constexpr const char* ISA = "avx512vnni";
#endif
constexpr int TILE_ROWS = 8, ATT_HEADS = 4;
using F = __m512;
using I = __m512i;
inline F fzero() { return _mm512_setzero_ps(); }
inline F fset(float x) { return _mm512_set1_ps(x); }
inline F fload(const float* p) { return _mm512_loadu_ps(p); }
inline void fstore(float* p, F v) { _mm512_storeu_ps(p, v); }
inline F fadd(F a, F b) { return _mm512_add_ps(a, b); }
inline F fsub(F a, F b) { return _mm512_sub_ps(a, b); }
inline F fmul(F a, F b) { return _mm512_mul_ps(a, b); }
inline F fdiv(F a, F b) { return _mm512_div_ps(a, b); }
inline F ffma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
inline F fmax(F a, F b) { return _mm512_max_ps(a, b); }
inline F fmin(F a, F b) { return _mm512_min_ps(a, b); }
inline F fabs(F a) { return _mm512_abs_ps(a); }
inline F fround(F a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline F fpow2(F n) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
inline F ffirst(F v, int n, F fill) {
  return n >= 16 ? v : _mm512_mask_mov_ps(fill, (__mmask16)((1u << (n < 0 ? 0 : n)) - 1u), v);
}
inline F fhalf(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
inline F fcvt(I a) { return _mm512_cvtepi32_ps(a); }
inline int32_t fquant(F v, int8_t* q) {
  const __m512i i = _mm512_cvtps_epi32(v);
  _mm_storeu_si128((__m128i*)q, _mm512_cvtepi32_epi8(i));
  return _mm512_reduce_add_epi32(i);
}
inline I izero() { return _mm512_setzero_si512(); }
inline I iaddc(I a, int32_t c) { return _mm512_add_epi32(a, _mm512_set1_epi32(c)); }

// w: 4 x 64 bytes, quads 2k and 2k + 1 of 16 outputs in the low and high nibbles; x: R rows of 32 int8, 32 apart.
template <int R>
inline void dot_nib(const uint8_t* w, const int8_t* x, const int32_t*, I* s) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int r = 0; r < R; ++r) s[r] = izero();
  for (int k = 0; k < 4; ++k) {
    const __m512i v = _mm512_loadu_si512(w + k * 64);
    const __m512i w0 = _mm512_and_si512(v, low), w1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    for (int r = 0; r < R; ++r) {
      s[r] = _mm512_dpbusd_epi32(s[r], w0, _mm512_set1_epi32(quad(x + r * 32 + k * 8)));
      s[r] = _mm512_dpbusd_epi32(s[r], w1, _mm512_set1_epi32(quad(x + r * 32 + k * 8 + 4)));
    }
  }
}
// w: 8 x 64 bytes of unsigned values u = q + 128; the sums are of q (xs: the rows' sums of x).
template <int R>
inline void dot_q8(const uint8_t* w, const int8_t* x, const int32_t* xs, I* s) {
  for (int r = 0; r < R; ++r) s[r] = izero();
  for (int k = 0; k < 8; ++k) {
    const __m512i v = _mm512_loadu_si512(w + k * 64);
    for (int r = 0; r < R; ++r) s[r] = _mm512_dpbusd_epi32(s[r], v, _mm512_set1_epi32(quad(x + r * 32 + k * 4)));
  }
  for (int r = 0; r < R; ++r) s[r] = iaddc(s[r], -128 * xs[r]);
}

#if defined(VSKIP_ISA_AMX)
// ---- AMX (Intel Sapphire Rapids and later): the block sums of up to 16 rows at once -----------
// A tile product gives the int32 sums of a block of 32 inputs for up to 16 rows and 16 outputs
// in one instruction; they are the same integers dot_q8 gives (exact), and the float arithmetic
// that follows is the same per row, so the bits are avx512vnni's.
//   MX_ROWS            the rows a tile holds
//   mx_config(R)       tiles 0-3: the sums of 4 blocks (R x 16 int32); 4, 5: R rows of a block of
//                      activations (32 int8 each); 6, 7: a block of 16 outputs' weights (8 x 64
//                      unsigned bytes, the VNNI layout as stored). Per thread; zeroes the tiles.
//   mx_q8<U>(w, x, xs, c)  U (1..4) blocks: weights at w + 512 j, the activations of block j at
//                      x + xs j (rows 32 bytes apart); c[j][r][o] = sum of u x (u = q + 128)
//   mx_unpack_nib(w, u, out)  u nibble blocks as the bytes a tile of weights takes (out: 512 u)
//   mx_done()          the tiles given back (their state is then not saved at a context switch)
//   iload(p)           16 int32
#define VSKIP_MX_TILES
constexpr int MX_ROWS = 16;
struct alignas(64) MxConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
inline void mx_config(int R) {
  MxConfig c{};
  c.palette = 1;
  for (int t = 0; t < 4; ++t) c.rows[t] = (uint8_t)R, c.colsb[t] = 64;
  for (int t = 4; t < 6; ++t) c.rows[t] = (uint8_t)R, c.colsb[t] = 32;
  for (int t = 6; t < 8; ++t) c.rows[t] = 8, c.colsb[t] = 64;
  _tile_loadconfig(&c);
}
template <int U>
inline void mx_q8(const uint8_t* w, const int8_t* x, size_t xs, int32_t (*c)[16][16]) {
  _tile_zero(0); _tile_loadd(4, x, 32); _tile_loadd(6, w, 64); _tile_dpbsud(0, 4, 6);
  if constexpr (U > 1) { _tile_zero(1); _tile_loadd(5, x + xs, 32); _tile_loadd(7, w + 512, 64); _tile_dpbsud(1, 5, 7); }
  if constexpr (U > 2) { _tile_zero(2); _tile_loadd(4, x + 2 * xs, 32); _tile_loadd(6, w + 1024, 64); _tile_dpbsud(2, 4, 6); }
  if constexpr (U > 3) { _tile_zero(3); _tile_loadd(5, x + 3 * xs, 32); _tile_loadd(7, w + 1536, 64); _tile_dpbsud(3, 5, 7); }
  _tile_stored(0, c[0], 64);
  if constexpr (U > 1) _tile_stored(1, c[1], 64);
  if constexpr (U > 2) _tile_stored(2, c[2], 64);
  if constexpr (U > 3) _tile_stored(3, c[3], 64);
}
// Nibble blocks (4 x 64 bytes, quads 2k and 2k + 1 in chunk k's low and high nibbles) as the
// 8 x 64 bytes of values 0..15 a tile of weights takes, u blocks from w into out.
inline void mx_unpack_nib(const uint8_t* w, int u, uint8_t* out) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int k = 0; k < 4 * u; ++k) {
    const __m512i v = _mm512_loadu_si512(w + k * 64);
    _mm512_store_si512(out + k * 128, _mm512_and_si512(v, low));
    _mm512_store_si512(out + k * 128 + 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
  }
}
inline void mx_done() { _tile_release(); }
inline I iload(const int32_t* p) { return _mm512_loadu_si512(p); }
#endif

#elif defined(VSKIP_ISA_AVXVNNI) || defined(VSKIP_ISA_AVX2)
// ---- x86-64 with AVX2, FMA and F16C (x86-64-v3), and AVX-VNNI where named: two ymm registers ----
#if defined(VSKIP_ISA_AVXVNNI)
constexpr const char* ISA = "avxvnni";
#else
constexpr const char* ISA = "avx2";
#endif
constexpr int TILE_ROWS = 4, ATT_HEADS = 2;
struct F { __m256 a, b; };  // lanes 0-7, 8-15
struct I { __m256i a, b; };
inline F fzero() { return F{_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline F fset(float x) { return F{_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline F fload(const float* p) { return F{_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void fstore(float* p, F v) { _mm256_storeu_ps(p, v.a); _mm256_storeu_ps(p + 8, v.b); }
inline F fadd(F x, F y) { return F{_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)}; }
inline F fsub(F x, F y) { return F{_mm256_sub_ps(x.a, y.a), _mm256_sub_ps(x.b, y.b)}; }
inline F fmul(F x, F y) { return F{_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; }
inline F fdiv(F x, F y) { return F{_mm256_div_ps(x.a, y.a), _mm256_div_ps(x.b, y.b)}; }
inline F ffma(F x, F y, F z) { return F{_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)}; }
inline F fmax(F x, F y) { return F{_mm256_max_ps(x.a, y.a), _mm256_max_ps(x.b, y.b)}; }
inline F fmin(F x, F y) { return F{_mm256_min_ps(x.a, y.a), _mm256_min_ps(x.b, y.b)}; }
inline F fabs(F x) {
  const __m256 m = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  return F{_mm256_and_ps(x.a, m), _mm256_and_ps(x.b, m)};
}
inline F fround(F x) {
  return F{_mm256_round_ps(x.a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
           _mm256_round_ps(x.b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
inline __m256 pow2_8(__m256 n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
inline F fpow2(F n) { return F{pow2_8(n.a), pow2_8(n.b)}; }
inline F ffirst(F v, int n, F fill) {
  if (n >= 16) return v;
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), nn = _mm256_set1_epi32(n);
  const __m256 ka = _mm256_castsi256_ps(_mm256_cmpgt_epi32(nn, idx));
  const __m256 kb = _mm256_castsi256_ps(_mm256_cmpgt_epi32(nn, _mm256_add_epi32(idx, _mm256_set1_epi32(8))));
  return F{_mm256_blendv_ps(fill.a, v.a, ka), _mm256_blendv_ps(fill.b, v.b, kb)};
}
inline F fhalf(const uint16_t* p) {
  return F{_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 8)))};
}
inline F fcvt(I x) { return F{_mm256_cvtepi32_ps(x.a), _mm256_cvtepi32_ps(x.b)}; }
inline int32_t fquant(F v, int8_t* q) {
  const __m256i ia = _mm256_cvtps_epi32(v.a), ib = _mm256_cvtps_epi32(v.b);
  const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(ia, ib), 0xD8);  // 16 int16 in order
  const __m128i w8 = _mm_packs_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
  _mm_storeu_si128((__m128i*)q, w8);
  __m256i t = _mm256_add_epi32(ia, ib);
  __m128i u = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
  u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0x4E));
  u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0xB1));
  return _mm_cvtsi128_si32(u);
}
inline I izero() { return I{_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline I iaddc(I x, int32_t c) {
  const __m256i cv = _mm256_set1_epi32(c);
  return I{_mm256_add_epi32(x.a, cv), _mm256_add_epi32(x.b, cv)};
}

#if defined(VSKIP_ISA_AVXVNNI)
inline __m256i dp(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
template <int R>
inline void dot_nib(const uint8_t* w, const int8_t* x, const int32_t*, I* s) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int r = 0; r < R; ++r) s[r] = izero();
  for (int k = 0; k < 4; ++k) {
    const __m256i va = _mm256_loadu_si256((const __m256i*)(w + k * 64));
    const __m256i vb = _mm256_loadu_si256((const __m256i*)(w + k * 64 + 32));
    const __m256i a0 = _mm256_and_si256(va, low), a1 = _mm256_and_si256(_mm256_srli_epi16(va, 4), low);
    const __m256i b0 = _mm256_and_si256(vb, low), b1 = _mm256_and_si256(_mm256_srli_epi16(vb, 4), low);
    for (int r = 0; r < R; ++r) {
      const __m256i x0 = _mm256_set1_epi32(quad(x + r * 32 + k * 8)), x1 = _mm256_set1_epi32(quad(x + r * 32 + k * 8 + 4));
      s[r].a = dp(dp(s[r].a, a0, x0), a1, x1);
      s[r].b = dp(dp(s[r].b, b0, x0), b1, x1);
    }
  }
}
template <int R>
inline void dot_q8(const uint8_t* w, const int8_t* x, const int32_t* xs, I* s) {
  for (int r = 0; r < R; ++r) s[r] = izero();
  for (int k = 0; k < 8; ++k) {
    const __m256i va = _mm256_loadu_si256((const __m256i*)(w + k * 64));
    const __m256i vb = _mm256_loadu_si256((const __m256i*)(w + k * 64 + 32));
    for (int r = 0; r < R; ++r) {
      const __m256i xv = _mm256_set1_epi32(quad(x + r * 32 + k * 4));
      s[r].a = dp(s[r].a, va, xv);
      s[r].b = dp(s[r].b, vb, xv);
    }
  }
  for (int r = 0; r < R; ++r) s[r] = iaddc(s[r], -128 * xs[r]);
}
#else
// No VNNI: maddubs multiplies unsigned by signed bytes into int16 pair sums. A nibble times an
// int8 pair sums to at most 2 * 15 * 127 = 3810, so the 8 quads of a block sum in int16 (30480)
// before one widening; a Q8 value is taken signed (u ^ 0x80 = q) as |q| times x with q's sign
// (pairs up to 2 * 128 * 127 = 32512), so no sum ever saturates.
template <int R>
inline void dot_nib(const uint8_t* w, const int8_t* x, const int32_t*, I* s) {
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256i ta[R], tb[R];
  for (int r = 0; r < R; ++r) ta[r] = tb[r] = _mm256_setzero_si256();
  for (int k = 0; k < 4; ++k) {
    const __m256i va = _mm256_loadu_si256((const __m256i*)(w + k * 64));
    const __m256i vb = _mm256_loadu_si256((const __m256i*)(w + k * 64 + 32));
    const __m256i a0 = _mm256_and_si256(va, low), a1 = _mm256_and_si256(_mm256_srli_epi16(va, 4), low);
    const __m256i b0 = _mm256_and_si256(vb, low), b1 = _mm256_and_si256(_mm256_srli_epi16(vb, 4), low);
    for (int r = 0; r < R; ++r) {
      const __m256i x0 = _mm256_set1_epi32(quad(x + r * 32 + k * 8)), x1 = _mm256_set1_epi32(quad(x + r * 32 + k * 8 + 4));
      ta[r] = _mm256_add_epi16(ta[r], _mm256_add_epi16(_mm256_maddubs_epi16(a0, x0), _mm256_maddubs_epi16(a1, x1)));
      tb[r] = _mm256_add_epi16(tb[r], _mm256_add_epi16(_mm256_maddubs_epi16(b0, x0), _mm256_maddubs_epi16(b1, x1)));
    }
  }
  for (int r = 0; r < R; ++r) s[r] = I{_mm256_madd_epi16(ta[r], ones), _mm256_madd_epi16(tb[r], ones)};
}
template <int R>
inline void dot_q8(const uint8_t* w, const int8_t* x, const int32_t*, I* s) {
  const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r) s[r] = izero();
  for (int k = 0; k < 8; ++k) {
    const __m256i qa = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(w + k * 64)), flip);
    const __m256i qb = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(w + k * 64 + 32)), flip);
    const __m256i aa = _mm256_abs_epi8(qa), ab = _mm256_abs_epi8(qb);
    for (int r = 0; r < R; ++r) {
      const __m256i xv = _mm256_set1_epi32(quad(x + r * 32 + k * 4));
      s[r].a = _mm256_add_epi32(s[r].a, _mm256_madd_epi16(_mm256_maddubs_epi16(aa, _mm256_sign_epi8(xv, qa)), ones));
      s[r].b = _mm256_add_epi32(s[r].b, _mm256_madd_epi16(_mm256_maddubs_epi16(ab, _mm256_sign_epi8(xv, qb)), ones));
    }
  }
}
#endif

#elif defined(VSKIP_ISA_NEON) || defined(VSKIP_ISA_NEON_DOTPROD)
// ---- ARM64 (AArch64 Advanced SIMD; with the dot-product extension where named): 4 q registers ----
#if defined(VSKIP_ISA_NEON_DOTPROD)
constexpr const char* ISA = "neon-dotprod";
#else
constexpr const char* ISA = "neon";
#endif
constexpr int TILE_ROWS = 3, ATT_HEADS = 2;
struct F { float32x4_t v[4]; };
struct I { int32x4_t v[4]; };
#define VS_MAP(op) F o; for (int i = 0; i < 4; ++i) o.v[i] = op; return o
inline F fzero() { VS_MAP(vdupq_n_f32(0.0f)); }
inline F fset(float x) { VS_MAP(vdupq_n_f32(x)); }
inline F fload(const float* p) { VS_MAP(vld1q_f32(p + 4 * i)); }
inline void fstore(float* p, F a) { for (int i = 0; i < 4; ++i) vst1q_f32(p + 4 * i, a.v[i]); }
inline F fadd(F a, F b) { VS_MAP(vaddq_f32(a.v[i], b.v[i])); }
inline F fsub(F a, F b) { VS_MAP(vsubq_f32(a.v[i], b.v[i])); }
inline F fmul(F a, F b) { VS_MAP(vmulq_f32(a.v[i], b.v[i])); }
inline F fdiv(F a, F b) { VS_MAP(vdivq_f32(a.v[i], b.v[i])); }
inline F ffma(F a, F b, F c) { VS_MAP(vfmaq_f32(c.v[i], a.v[i], b.v[i])); }
inline F fmax(F a, F b) { VS_MAP(vmaxq_f32(a.v[i], b.v[i])); }
inline F fmin(F a, F b) { VS_MAP(vminq_f32(a.v[i], b.v[i])); }
inline F fabs(F a) { VS_MAP(vabsq_f32(a.v[i])); }
inline F fround(F a) { VS_MAP(vrndnq_f32(a.v[i])); }
inline F fpow2(F n) {
  VS_MAP(vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n.v[i]), vdupq_n_s32(127)), 23)));
}
inline F ffirst(F v, int n, F fill) {
  if (n >= 16) return v;
  const int32_t base[4] = {0, 1, 2, 3};
  const int32x4_t idx = vld1q_s32(base), nn = vdupq_n_s32(n);
  VS_MAP(vbslq_f32(vcltq_s32(vaddq_s32(idx, vdupq_n_s32(4 * i)), nn), v.v[i], fill.v[i]));
}
inline F fhalf(const uint16_t* p) { VS_MAP(vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * i)))); }
inline F fcvt(I a) { VS_MAP(vcvtq_f32_s32(a.v[i])); }
#undef VS_MAP
inline int32_t fquant(F v, int8_t* q) {
  int32x4_t i[4];
  for (int c = 0; c < 4; ++c) i[c] = vcvtnq_s32_f32(v.v[c]);  // to nearest, ties to even
  const int16x8_t lo = vcombine_s16(vmovn_s32(i[0]), vmovn_s32(i[1])), hi = vcombine_s16(vmovn_s32(i[2]), vmovn_s32(i[3]));
  vst1q_s8(q, vcombine_s8(vmovn_s16(lo), vmovn_s16(hi)));
  return vaddvq_s32(vaddq_s32(vaddq_s32(i[0], i[1]), vaddq_s32(i[2], i[3])));
}
inline I izero() { I o; for (int i = 0; i < 4; ++i) o.v[i] = vdupq_n_s32(0); return o; }
inline I iaddc(I a, int32_t c) { for (int i = 0; i < 4; ++i) a.v[i] = vaddq_s32(a.v[i], vdupq_n_s32(c)); return a; }

// acc + the 4 outputs' sums of 4 signed products each (w: 4 outputs x 4 inputs, x: one quad, repeated).
inline int32x4_t dot4(int32x4_t acc, int8x16_t w, int8x16_t x) {
#if defined(VSKIP_ISA_NEON_DOTPROD)
  return vdotq_s32(acc, w, x);
#else
  const int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x)));  // |w x| <= 128 * 127
  const int32x4_t hi = vpaddlq_s16(vmull_high_s8(w, x));
  return vaddq_s32(acc, vpaddq_s32(lo, hi));
#endif
}
template <int R>
inline void dot_nib(const uint8_t* w, const int8_t* x, const int32_t*, I* s) {
  const uint8x16_t low = vdupq_n_u8(0x0F);
  for (int r = 0; r < R; ++r) s[r] = izero();
  for (int k = 0; k < 4; ++k) {
    int8x16_t w0[4], w1[4];
    for (int c = 0; c < 4; ++c) {
      const uint8x16_t v = vld1q_u8(w + k * 64 + 16 * c);
      w0[c] = vreinterpretq_s8_u8(vandq_u8(v, low));
      w1[c] = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
    }
    for (int r = 0; r < R; ++r) {
      const int8x16_t x0 = vreinterpretq_s8_s32(vdupq_n_s32(quad(x + r * 32 + k * 8)));
      const int8x16_t x1 = vreinterpretq_s8_s32(vdupq_n_s32(quad(x + r * 32 + k * 8 + 4)));
      for (int c = 0; c < 4; ++c) s[r].v[c] = dot4(dot4(s[r].v[c], w0[c], x0), w1[c], x1);
    }
  }
}
template <int R>
inline void dot_q8(const uint8_t* w, const int8_t* x, const int32_t*, I* s) {
  const uint8x16_t flip = vdupq_n_u8(0x80);
  for (int r = 0; r < R; ++r) s[r] = izero();
  for (int k = 0; k < 8; ++k) {
    int8x16_t q[4];
    for (int c = 0; c < 4; ++c) q[c] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(w + k * 64 + 16 * c), flip));
    for (int r = 0; r < R; ++r) {
      const int8x16_t xv = vreinterpretq_s8_s32(vdupq_n_s32(quad(x + r * 32 + k * 4)));
      for (int c = 0; c < 4; ++c) s[r].v[c] = dot4(s[r].v[c], q[c], xv);
    }
  }
}

#else
// ---- portable: plain C++17, one lane at a time (any compiler, any CPU) ------------------------
constexpr const char* ISA = "portable";
constexpr int TILE_ROWS = 4, ATT_HEADS = 4;
struct F { float v[16]; };
struct I { int32_t v[16]; };
#define VS_MAP(expr) F o; for (int i = 0; i < 16; ++i) o.v[i] = (expr); return o
inline F fzero() { VS_MAP(0.0f); }
inline F fset(float x) { VS_MAP(x); }
inline F fload(const float* p) { F o; memcpy(o.v, p, sizeof o.v); return o; }
inline void fstore(float* p, F a) { memcpy(p, a.v, sizeof a.v); }
inline F fadd(F a, F b) { VS_MAP(a.v[i] + b.v[i]); }
inline F fsub(F a, F b) { VS_MAP(a.v[i] - b.v[i]); }
inline F fmul(F a, F b) { VS_MAP(a.v[i] * b.v[i]); }
inline F fdiv(F a, F b) { VS_MAP(a.v[i] / b.v[i]); }
inline F ffma(F a, F b, F c) { VS_MAP(std::fma(a.v[i], b.v[i], c.v[i])); }
inline F fmax(F a, F b) { VS_MAP(a.v[i] > b.v[i] ? a.v[i] : b.v[i]); }
inline F fmin(F a, F b) { VS_MAP(a.v[i] < b.v[i] ? a.v[i] : b.v[i]); }
inline F fabs(F a) { VS_MAP(std::fabs(a.v[i])); }
inline F fround(F a) { VS_MAP(std::nearbyint(a.v[i])); }  // the default mode: to nearest, ties to even
inline F fpow2(F n) {
  F o;
  for (int i = 0; i < 16; ++i) {
    const uint32_t bits = (uint32_t)((int32_t)std::nearbyint(n.v[i]) + 127) << 23;
    memcpy(&o.v[i], &bits, 4);
  }
  return o;
}
inline F ffirst(F v, int n, F fill) { VS_MAP(i < n ? v.v[i] : fill.v[i]); }
inline float half_to_float(uint16_t h) {  // exact for every finite float16 (subnormals too, as FpEnv keeps them)
  const uint32_t bits = (uint32_t)(h & 0x7FFF) << 13;  // exponent and mantissa in float32's places
  float f;
  memcpy(&f, &bits, 4);
  f *= 5.192296858534828e33f;  // 2^112: float16's exponent bias (15) to float32's (127)
  return (h & 0x8000) ? -f : f;
}
inline F fhalf(const uint16_t* p) { VS_MAP(half_to_float(p[i])); }
inline F fcvt(I a) { VS_MAP((float)a.v[i]); }
#undef VS_MAP
inline int32_t fquant(F v, int8_t* q) {
  int32_t s = 0;
  for (int i = 0; i < 16; ++i) {
    const int32_t n = (int32_t)std::nearbyint(v.v[i]);
    q[i] = (int8_t)n;
    s += n;
  }
  return s;
}
inline I izero() { I o{}; return o; }
inline I iaddc(I a, int32_t c) { for (int i = 0; i < 16; ++i) a.v[i] += c; return a; }
// Written so that a compiler vectorizes it over the 16 outputs (a quad's 4 inputs as 4 terms).
template <int R>
inline void dot_nib(const uint8_t* w, const int8_t* x, const int32_t*, I* s) {
  for (int r = 0; r < R; ++r) {
    int32_t acc[16] = {};
    const int8_t* xr = x + r * 32;
    for (int k = 0; k < 4; ++k) {
      const uint8_t* wk = w + k * 64;
      const int32_t a0 = xr[k * 8], a1 = xr[k * 8 + 1], a2 = xr[k * 8 + 2], a3 = xr[k * 8 + 3];
      const int32_t b0 = xr[k * 8 + 4], b1 = xr[k * 8 + 5], b2 = xr[k * 8 + 6], b3 = xr[k * 8 + 7];
      for (int o = 0; o < 16; ++o) {
        const uint8_t* q = wk + o * 4;
        acc[o] += (q[0] & 15) * a0 + (q[1] & 15) * a1 + (q[2] & 15) * a2 + (q[3] & 15) * a3 +
                  (q[0] >> 4) * b0 + (q[1] >> 4) * b1 + (q[2] >> 4) * b2 + (q[3] >> 4) * b3;
      }
    }
    memcpy(s[r].v, acc, sizeof acc);
  }
}
template <int R>
inline void dot_q8(const uint8_t* w, const int8_t* x, const int32_t*, I* s) {
  for (int r = 0; r < R; ++r) {
    int32_t acc[16] = {};
    const int8_t* xr = x + r * 32;
    for (int k = 0; k < 8; ++k) {
      const uint8_t* wk = w + k * 64;
      const int32_t a0 = xr[k * 4], a1 = xr[k * 4 + 1], a2 = xr[k * 4 + 2], a3 = xr[k * 4 + 3];
      for (int o = 0; o < 16; ++o) {
        const uint8_t* q = wk + o * 4;
        acc[o] += ((int32_t)q[0] - 128) * a0 + ((int32_t)q[1] - 128) * a1 + ((int32_t)q[2] - 128) * a2 +
                  ((int32_t)q[3] - 128) * a3;
      }
    }
    memcpy(s[r].v, acc, sizeof acc);
  }
}

#if defined(VSKIP_TEST_MX)
// AMX's tile operations (the AMX section's mx_* names) one sum at a time, for the tests: built into
// the portable variant with -DVSKIP_TEST_MX, the tiled product path of kernels.cpp (tile_mx) runs,
// and is compared bit for bit, on any CPU.
#define VSKIP_MX_TILES
constexpr int MX_ROWS = 16;
inline thread_local int mx_rows = 0;
inline void mx_config(int R) { mx_rows = R; }
template <int U>
inline void mx_q8(const uint8_t* w, const int8_t* x, size_t xs, int32_t (*c)[16][16]) {
  for (int j = 0; j < U; ++j)
    for (int r = 0; r < mx_rows; ++r)
      for (int o = 0; o < 16; ++o) {
        int32_t sum = 0;
        for (int k = 0; k < 32; ++k) sum += (int32_t)x[j * xs + r * 32 + k] * (int32_t)w[j * 512 + k / 4 * 64 + o * 4 + k % 4];
#if defined(VSKIP_TEST_MX_WRONG)  // a tile one off in one sum: the test that must see it
        if (r == 0 && o == 0) sum += 1;
#endif
        c[j][r][o] = sum;
      }
}
inline void mx_unpack_nib(const uint8_t* w, int u, uint8_t* out) {
  for (int k = 0; k < 4 * u; ++k)
    for (int i = 0; i < 64; ++i) out[k * 128 + i] = w[k * 64 + i] & 15, out[k * 128 + 64 + i] = w[k * 64 + i] >> 4;
}
inline void mx_done() { mx_rows = 0; }
inline I iload(const int32_t* p) { I o; memcpy(o.v, p, sizeof o.v); return o; }
#endif
#endif

// IEEE defaults for the scope of a forward, on the thread that runs it: round to nearest, and
// subnormals kept (a library built with fast-math may have turned on flush-to-zero).
struct FpEnv {
#if defined(__x86_64__) || defined(_M_X64)
  unsigned saved;
  FpEnv() : saved(_mm_getcsr()) { _mm_setcsr(0x1F80); }
  ~FpEnv() { _mm_setcsr(saved); }
#elif defined(__aarch64__)
  uint64_t saved;
  FpEnv() {
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(saved));
    const uint64_t v = saved & ~((uint64_t)1 << 24 | (uint64_t)3 << 22 | (uint64_t)1 << 19);  // FZ, RMode, FZ16
    __asm__ __volatile__("msr fpcr, %0" : : "r"(v));
  }
  ~FpEnv() { __asm__ __volatile__("msr fpcr, %0" : : "r"(saved)); }
#endif
};

}  // namespace vs
