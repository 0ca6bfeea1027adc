// The native runtime's arithmetic: one forward of a Llama-family transformer over a batch of rows
// (tokens of one or more sequences, each at its own position in its own slot cache), in one call.
//
// Every weight matrix is held in blocks of 32 along its input dimension, as GGUF's Q4_1 and Q8_0
// hold them: an unsigned value per weight (a nibble for Q4_1, a byte for Q8_0), a float16 scale d
// and minimum m per block (w = d * (q - offset) + m; offset 128 for signed int8 blocks).
// Activations are quantized per row in blocks of 32 (a scale per block, as llama.cpp's Q8_1), the
// block products are summed exactly in int32, and the blocks are summed in float32 in one fixed order.
//
// This file is written once for every CPU, over the 16-lane operations of simd.h (one section per
// instruction set, chosen by the VSKIP_ISA_* macro the build defines). Every variant computes the
// same bits for the same rows: simd.h says why, and tests/test_native.py compares them.
//
// Batch invariance, by construction: every number a row produces depends only on that row's input,
// its position and the keys and values its slot holds below it, never on how many other rows share
// the call or where the row sits in it. Each row runs the same instructions in the same order
// whatever the row count (register tiles of rows repeat a row's sequence, they never mix rows), so
// a verification of n positions writes into the cache, and scores, exactly what n one-token steps
// would. tests/test_native.py checks it bit for bit.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "simd.h"

#if defined(VSKIP_ISA_AMX)
#include <sys/syscall.h>
#include <unistd.h>
#endif

extern "C" {

struct QMat {
  const uint8_t* q;   // [N/16][K/4][16][4]: for 16 outputs, 4 consecutive inputs each (VNNI layout);
                      // with nibbles, [N/16][K/8][64]: quads 2i and 2i + 1 in the low and high nibbles
  const uint16_t* d;  // [N/16][K/32][16] block scales (float16)
  const uint16_t* m;  // [N/16][K/32][16] block minimums (float16), or null
  int32_t N, K, offset, nibbles;
};

struct Layer {
  const float* attn_norm;  // [D]
  QMat qkv;                // N = (H + 2 KV) * hd
  const float* qkv_bias;   // [(H + 2 KV) * hd] or null
  QMat o;                  // N = D, K = H * hd
  const float* ffn_norm;   // [D]
  QMat gate_up;            // N = 2 F: gate rows then up rows
  QMat down;               // N = D, K = F
  const float* q_norm;     // [hd] RMS norm of each query head before RoPE (Qwen3), or null
  const float* k_norm;     // [hd] the same of each key head, or null
};

struct Model {
  int32_t n_layers, dim, n_heads, n_kv, head_dim, ffn, vocab, rope_max;
  float eps;
  const Layer* layers;
  const float* final_norm;                        // [D] or null
  const float* embed_f;                           // [V][D] float32 embeddings, or null
  const int8_t* embed_q; const float* embed_d;    // else [V][D] int8 and [V][D/32] scales
  const QMat* head;                               // output head or null
  const float* rope_cos; const float* rope_sin;   // [rope_max][hd/2]
};

}  // extern "C"

namespace vs {

// The sum of 16 lanes in one fixed tree: lane i + lane i + 8, then + 4, + 2, + 1.
inline float hsum(F v) {
  float t[16];
  fstore(t, v);
#ifdef VSKIP_TEST_OTHER_REDUCTION  // a different (equally valid) order, for the test that must see it
  float s = 0.0f;
  for (int i = 0; i < 16; ++i) s += t[i];
  return s;
#else
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) t[i] = t[i] + t[i + w];
  return t[0];
#endif
}

inline float hmax(F v) {  // exact in any order
  float t[16];
  fstore(t, v);
  float m = t[0];
  for (int i = 1; i < 16; ++i) m = t[i] > m ? t[i] : m;
  return m;
}

// e^x for x in float32, |relative error| < 2e-7; a fixed sequence of IEEE operations per lane.
inline F fexp(F x) {
  x = fmin(fmax(x, fset(-87.0f)), fset(88.0f));
  const F n = fround(fmul(x, fset(1.44269504088896341f)));
  F r = ffma(n, fset(-0.693359375f), x);
  r = ffma(n, fset(2.12194440e-4f), r);
  F p = fset(1.0f / 5040);
  p = ffma(p, r, fset(1.0f / 720));
  p = ffma(p, r, fset(1.0f / 120));
  p = ffma(p, r, fset(1.0f / 24));
  p = ffma(p, r, fset(1.0f / 6));
  p = ffma(p, r, fset(0.5f));
  p = ffma(p, r, fset(1.0f));
  p = ffma(p, r, fset(1.0f));
  return fmul(p, fpow2(n));
}

// Quantized activations of up to `rows` rows of K inputs, block-major: block b of row r at
// [b][r], so that the rows of a register tile sit side by side for every block.
struct QAct {
  std::vector<int8_t> q;   // [K/32][rows][32]
  std::vector<float> d;    // [K/32][rows] scales
  std::vector<int32_t> si; // [K/32][rows] sums of the quantized values
  std::vector<float> sf;   // [K/32][rows] d * si, the quantized block sums (for block minimums)
  int rows = 0;
  void resize(int n, int k) {
    rows = n;
    q.resize((size_t)n * k); d.resize((size_t)n * k / 32);
    si.resize((size_t)n * k / 32); sf.resize((size_t)n * k / 32);
  }
};

// Row r of K inputs x, quantized into a.
void quantize(QAct& a, int r, const float* x, int K) {
  for (int b = 0; b < K / 32; ++b) {
    const size_t i = (size_t)b * a.rows + r;
    const F v0 = fload(x + 32 * b), v1 = fload(x + 32 * b + 16);
    const float amax = hmax(fmax(fabs(v0), fabs(v1)));
    const float id = amax > 0 ? 127.0f / amax : 0.0f;
    const int32_t s0 = fquant(fmul(v0, fset(id)), &a.q[i * 32]);
    const int32_t s1 = fquant(fmul(v1, fset(id)), &a.q[i * 32 + 16]);
    a.d[i] = amax / 127.0f;
    a.si[i] = s0 + s1;
    a.sf[i] = a.d[i] * (float)a.si[i];  // the block minimums meet the quantized activations, as the scales do
  }
}

// The weights stream through once a forward; while a tile computes on one block, the lines of a
// block this far ahead are asked for (the next group's lie right after a group's last block).
// Several rows' arithmetic then hides under the stream instead of adding to it. Only timing changes.
constexpr int PREFETCH_BLOCKS = 4;
template <bool NIB>
inline void prefetch_block(const QMat& W, int g, int b) {
  const size_t at = ((size_t)g * (W.K / 32) + b + PREFETCH_BLOCKS) * (NIB ? 256 : 512);
  if (at >= (size_t)(W.N / 16) * (W.K / 32) * (NIB ? 256 : 512)) return;  // past the matrix: nothing to fetch
  for (int c = 0; c < (NIB ? 4 : 8); ++c) __builtin_prefetch(W.q + at + c * 64, 0, 3);
}

// One row's exact block sum s into its accumulator: the float arithmetic of every product path
// (dw, mw: the block's 16 scales and, with MIN, minimums; xd, xf: the row's activation scale and
// scaled sum), written once, so that every path gives a row the same bits.
template <bool MIN>
inline F add_sum(F acc, I s, F dw, F mw, float xd, float xf) {
  acc = ffma(fcvt(s), fmul(dw, fset(xd)), acc);
  if constexpr (MIN) acc = ffma(mw, fset(xf), acc);
  return acc;
}

// R rows times one group of 16 outputs. Each row's sequence of operations is the same for any R
// (the integer block sums are exact, whatever their order), so a row's result never depends on R.
template <int R, bool NIB>
void tile(const QMat& W, int g, const QAct& a, int r0, float* out, int ldo) {
  const int nb = W.K / 32;
  const uint8_t* wq = W.q + (size_t)g * (W.K / 4) * (NIB ? 32 : 64);
  const uint16_t* wd = W.d + (size_t)g * nb * 16;
  const uint16_t* wm = W.m ? W.m + (size_t)g * nb * 16 : nullptr;
  const size_t rows = a.rows;
  const int8_t* xq = a.q.data() + (size_t)r0 * 32;
  const float* xd = a.d.data() + r0;
  const int32_t* xs = a.si.data() + r0;
  const float* xf = a.sf.data() + r0;
  F acc[R];
  for (int r = 0; r < R; ++r) acc[r] = fzero();
  for (int b = 0; b < nb; ++b, xq += rows * 32, xd += rows, xs += rows, xf += rows) {
    prefetch_block<NIB>(W, g, b);
    I s[R];  // the exact sums of (q - offset) x over the block
    if (NIB) dot_nib<R>(wq + (size_t)b * 256, xq, xs, s);
    else dot_q8<R>(wq + (size_t)b * 512, xq, xs, s);
    const F dw = fhalf(wd + b * 16);
    if (wm) {
      const F mw = fhalf(wm + b * 16);
      for (int r = 0; r < R; ++r) acc[r] = add_sum<true>(acc[r], s[r], dw, mw, xd[r], xf[r]);
    } else {
      for (int r = 0; r < R; ++r) acc[r] = add_sum<false>(acc[r], s[r], dw, dw, xd[r], 0.0f);
    }
  }
  for (int r = 0; r < R; ++r) fstore(out + (size_t)(r0 + r) * ldo + g * 16, acc[r]);
}

template <bool NIB, int R = 1>
void tile_n(const QMat& W, int g, const QAct& a, int r0, int n, float* out, int ldo) {
  if constexpr (R < TILE_ROWS) {
    if (n > R) return tile_n<NIB, R + 1>(W, g, a, r0, n, out, ldo);
  }
  tile<R, NIB>(W, g, a, r0, out, ldo);
}

template <bool NIB>
void tiles(const QMat& W, int g, const QAct& a, int M, int R, float* out, int ldo) {
  for (int r0 = 0; r0 < M; r0 += R) tile_n<NIB>(W, g, a, r0, std::min(R, M - r0), out, ldo);
}

#if defined(VSKIP_MX_TILES)  // AMX's tiles, or their stand-in for the tests (simd.h)
// R rows (R <= MX_ROWS) times one group of 16 outputs, the block sums from AMX's tiles four
// blocks at a time (nibbles unpacked to bytes first); then per row exactly tile<R, NIB>'s float
// arithmetic, block by block.
template <int R, bool NIB>
void tile_mx(const QMat& W, int g, const QAct& a, int r0, float* out, int ldo) {
  constexpr int BLOCK = NIB ? 256 : 512;  // bytes of one block of 16 outputs
  const int nb = W.K / 32;
  const uint8_t* wq = W.q + (size_t)g * nb * BLOCK;
  const uint16_t* wd = W.d + (size_t)g * nb * 16;
  const uint16_t* wm = W.m ? W.m + (size_t)g * nb * 16 : nullptr;
  const size_t rows = a.rows;
  const int8_t* xq = a.q.data() + (size_t)r0 * 32;
  const float* xd = a.d.data() + r0;
  const int32_t* xs = a.si.data() + r0;
  const float* xf = a.sf.data() + r0;
  alignas(64) int32_t c[4][16][16];
  alignas(64) uint8_t wb[NIB ? 4 * 512 : 64];
  F acc[R];
  for (int r = 0; r < R; ++r) acc[r] = fzero();
  for (int b = 0; b < nb; b += 4) {
    const int u = std::min(4, nb - b);
    for (int j = 0; j < u; ++j) prefetch_block<NIB>(W, g, b + j);
    const uint8_t* w = wq + (size_t)b * BLOCK;
    if (NIB) {
      mx_unpack_nib(w, u, wb);
      w = wb;
    }
    const int8_t* x = xq + (size_t)b * rows * 32;
    if (u == 4) mx_q8<4>(w, x, rows * 32, c);
    else if (u == 3) mx_q8<3>(w, x, rows * 32, c);
    else if (u == 2) mx_q8<2>(w, x, rows * 32, c);
    else mx_q8<1>(w, x, rows * 32, c);
    for (int j = 0; j < u; ++j) {
      const size_t i = (size_t)(b + j) * rows;
      const F dw = fhalf(wd + (b + j) * 16);
      // the exact sums of (q - offset) x over the block, as dot_q8 and dot_nib give them
      auto sum = [&](int r) { return NIB ? iload(c[j][r]) : iaddc(iload(c[j][r]), -W.offset * xs[i + r]); };
      if (wm) {
        const F mw = fhalf(wm + (b + j) * 16);
        for (int r = 0; r < R; ++r) acc[r] = add_sum<true>(acc[r], sum(r), dw, mw, xd[i + r], xf[i + r]);
      } else {
        for (int r = 0; r < R; ++r) acc[r] = add_sum<false>(acc[r], sum(r), dw, dw, xd[i + r], 0.0f);
      }
    }
  }
  for (int r = 0; r < R; ++r) fstore(out + (size_t)(r0 + r) * ldo + g * 16, acc[r]);
}

template <bool NIB, int R = 1>
void tile_mx_n(const QMat& W, int g, const QAct& a, int r0, int n, float* out, int ldo) {
  if constexpr (R < MX_ROWS) {
    if (n > R) return tile_mx_n<NIB, R + 1>(W, g, a, r0, n, out, ldo);
  }
  tile_mx<R, NIB>(W, g, a, r0, out, ldo);
}

// Calls of fewer rows run on AVX512-VNNI: up to TILE_ROWS rows it computes a group of outputs in
// one pass over its weights, faster than the tiles' fixed cost per block (measured on a Xeon with
// AMX: 6 rows of a 3072 x 576 Q4_1 product 48 us against 59, 9 rows 71 against 68).
constexpr int MX_MIN_ROWS = TILE_ROWS + 1;
#endif

// out[r][n] = sum_k W[n][k] x[r][k] for rows 0..M-1; called inside a parallel region.
void gemm(const QMat& W, const QAct& a, int M, float* out, int ldo) {
  const int G = W.N / 16;
#if defined(VSKIP_MX_TILES)
  if (M >= MX_MIN_ROWS) {
    const int nt = (M + MX_ROWS - 1) / MX_ROWS, R = (M + nt - 1) / nt;  // balanced, as below
    int shaped = 0;  // the rows this thread's tiles are configured for
#pragma omp for schedule(static)
    for (int g = 0; g < G; ++g) {
      for (int r0 = 0; r0 < M; r0 += R) {
        const int rn = std::min(R, M - r0);
        if (rn != shaped) mx_config(shaped = rn);
        if (W.nibbles) tile_mx_n<true>(W, g, a, r0, rn, out, ldo);
        else tile_mx_n<false>(W, g, a, r0, rn, out, ldo);
      }
    }
    if (shaped) mx_done();
    return;
  }
#endif
  const int ntiles = (M + TILE_ROWS - 1) / TILE_ROWS, R = (M + ntiles - 1) / ntiles;  // balanced: 9 rows as 5 + 4
#pragma omp for schedule(static)
  for (int g = 0; g < G; ++g) {
    if (W.nibbles) tiles<true>(W, g, a, M, R, out, ldo);
    else tiles<false>(W, g, a, M, R, out, ldo);
  }
}

void rmsnorm(const float* x, const float* w, float* y, int D, float eps) {
  F acc = fzero();
  for (int i = 0; i < D; i += 16) {
    const F v = fload(x + i);
    acc = ffma(v, v, acc);
  }
  const float inv = 1.0f / sqrtf(hsum(acc) / (float)D + eps);
  for (int i = 0; i < D; i += 16) {
    const F v = fmul(fload(x + i), fset(inv));
    fstore(y + i, w ? fmul(v, fload(w + i)) : v);
  }
}

// HF's rotate-half rotary embedding of one head vector at position p.
void rope(float* x, int hd, const float* cs, const float* sn) {
  const int h = hd / 2;
  for (int i = 0; i < h; ++i) {
    const float a = x[i], b = x[i + h];
    x[i] = a * cs[i] - b * sn[i];
    x[i + h] = b * cs[i] + a * sn[i];
  }
}

// Attention of queries that share one key-value head of one slot: the heads of a row, and the
// rows of one sequence's verification (each up to its own position). K is stored in tiles of 16
// keys, each transposed ([cap/16][hd][16]), V as [cap][hd]. Query i is the vector q[i] over keys
// [0, L[i]) and its output goes to out[i]. Each score is one chain of multiply-adds over the head
// dimension, each output one over its keys in order, whichever queries share the work: so every
// query's bits are those of the query alone. Sharing only orders the work so that each tile of
// keys, once loaded, serves every query before the next (the keys of a long context come from
// memory once per call instead of once per row). Scores of keys at or past a query's L are
// computed from whatever the cache holds there and never used.
constexpr int ATT_QUERIES = 32;  // the most queries one piece of attention holds
#ifndef ATT_SPLIT_ROWS
#define ATT_SPLIT_ROWS 2
#endif
struct Queries {
  const float* q[ATT_QUERIES];
  float* out[ATT_QUERIES];
  int L[ATT_QUERIES];
  int n = 0, Lmax = 0;
};

// The scores of keys j0 .. j0 + 31 for G queries, into s (a row of `stride` floats per query).
template <int G>
void scores(const float* const* q, const float* K, int j0, int hd, float scale, float* s, int stride) {
  F a[G][2];
  for (int g = 0; g < G; ++g) a[g][0] = a[g][1] = fzero();
  const float* t0 = K + (size_t)(j0 / 16) * hd * 16;  // the tiles of keys j0 .. j0 + 15 and the next 16
  const float* t1 = t0 + (size_t)hd * 16;
  for (int d = 0; d < hd; ++d) {
    const F k0 = fload(t0 + d * 16), k1 = fload(t1 + d * 16);
    for (int g = 0; g < G; ++g) {
      const F qd = fset(q[g][d]);
      a[g][0] = ffma(qd, k0, a[g][0]);
      a[g][1] = ffma(qd, k1, a[g][1]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < 2; ++c) fstore(s + g * stride + j0 + 16 * c, fmul(a[g][c], fset(scale)));
}

// Scores [0, L) to probabilities times their sum (returned: 1 / the sum).
float softmax_row(float* sg, int L) {
  F mx = fset(-INFINITY);
  for (int j = 0; j < L; j += 16) mx = fmax(mx, ffirst(fload(sg + j), L - j, fset(-INFINITY)));
  const F top = fset(hmax(mx));
  F sum = fzero();
  for (int j = 0; j < L; j += 16) {
    const F e = ffirst(fexp(fsub(fload(sg + j), top)), L - j, fzero());
    fstore(sg + j, e);
    sum = fadd(sum, e);
  }
  return 1.0f / hsum(sum);
}

// The outputs of G queries: each the sum over its keys of probability times value, in key order.
template <int G>
void values(const Queries& Q, int i0, const float* V, int hd, const float* s, int stride, const float* inv) {
  int lo = Q.L[i0], hi = Q.L[i0];
  for (int g = 1; g < G; ++g) lo = std::min(lo, Q.L[i0 + g]), hi = std::max(hi, Q.L[i0 + g]);
  for (int c0 = 0; c0 < hd; c0 += 64) {  // 4 lane groups of the head dimension at a time
    const int nv = std::min(4, (hd - c0) / 16);
    F acc[G][4];
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < 4; ++c) acc[g][c] = fzero();
    for (int j = 0; j < hi; ++j) {
      const float* vr = V + (size_t)j * hd + c0;
      F v[4];
      for (int c = 0; c < nv; ++c) v[c] = fload(vr + 16 * c);
      for (int g = 0; g < G; ++g) {
        if (j >= lo && j >= Q.L[i0 + g]) continue;  // past this query's keys
        const F p = fset(s[(i0 + g) * stride + j]);
        for (int c = 0; c < nv; ++c) acc[g][c] = ffma(p, v[c], acc[g][c]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < nv; ++c) fstore(Q.out[i0 + g] + c0 + 16 * c, fmul(acc[g][c], fset(inv[i0 + g])));
  }
}

template <int G = 1>
void scores_g(int g, const float* const* q, const float* K, int j0, int hd, float scale, float* s, int stride) {
  if constexpr (G < ATT_HEADS) {
    if (g > G) return scores_g<G + 1>(g, q, K, j0, hd, scale, s, stride);
  }
  scores<G>(q, K, j0, hd, scale, s, stride);
}

template <int G = 1>
void values_g(int g, const Queries& Q, int i0, const float* V, int hd, const float* s, int stride, const float* inv) {
  if constexpr (G < ATT_HEADS) {
    if (g > G) return values_g<G + 1>(g, Q, i0, V, hd, s, stride, inv);
  }
  values<G>(Q, i0, V, hd, s, stride, inv);
}

// `s`: scratch of at least Q.n * (Q.Lmax + 64) floats.
void attend(const Queries& Q, const float* K, const float* V, int hd, float scale, float* s) {
  const int stride = Q.Lmax + 64;
  for (int j0 = 0; j0 < Q.Lmax; j0 += 32)  // j0 + 32 <= capacity (a multiple of 64)
    for (int i = 0; i < Q.n; i += ATT_HEADS) {
      const int g = std::min(ATT_HEADS, Q.n - i);
      if (j0 < *std::max_element(Q.L + i, Q.L + i + g))
        scores_g(g, Q.q + i, K, j0, hd, scale, s + (size_t)i * stride, stride);
    }
  float inv[ATT_QUERIES];
  for (int i = 0; i < Q.n; ++i) inv[i] = softmax_row(s + (size_t)i * stride, Q.L[i]);
  for (int i = 0; i < Q.n; i += ATT_HEADS) values_g(std::min(ATT_HEADS, Q.n - i), Q, i, V, hd, s, stride, inv);
}

void silu_mul(const float* g, const float* u, float* y, int F_) {
  for (int i = 0; i < F_; i += 16) {
    const F gv = fload(g + i);
    const F sg = fdiv(gv, fadd(fset(1.0f), fexp(fsub(fzero(), gv))));
    fstore(y + i, fmul(sg, fload(u + i)));
  }
}

bool formats_ok(const QMat& W) { return W.nibbles ? W.offset == 0 : (W.offset == 128 && !W.m); }

// The greatest of z[0, n) (n a multiple of 16) and the first index where it stands, as
// {value, index}; index -1 where a value is not finite (the caller then decides as numpy would).
// A maximum is exact in any order, so every ISA finds the same one.
constexpr int TOP_PARTS = 8;  // a row's logits searched as this many parts, any thread each
struct Top {
  float value;
  int index;
};
Top top_of(const float* z, int n) {
  constexpr int B = 256;  // the maxima of blocks of B, then the first block that holds the greatest
  float best = -INFINITY;
  int at = -1;
  F bad = fzero();
  for (int b0 = 0; b0 < n; b0 += B) {
    const int m = std::min(B, n - b0);
    F mx = fset(-INFINITY);
    for (int i = 0; i < m; i += 16) {
      const F v = fload(z + b0 + i);
      mx = fmax(mx, v);
      bad = fadd(bad, fsub(v, v));  // 0 for a finite value, NaN for NaN or an infinity
    }
    const float bm = hmax(mx);
    if (bm > best || at < 0) {
      best = bm;
      at = b0;
    }
  }
  if (hsum(bad) != 0.0f) return {NAN, -1};
  for (int i = at;; ++i)
    if (z[i] == best) return {best, i};
}

// A piece of a layer's attention: rows [r0, r1) of one slot (consecutive rows with the same
// caches), query heads [h0, h1) of key-value head k; at most ATT_QUERIES queries.
struct AttWork {
  int r0, r1, k, h0, h1;
};

// The layer's attention as pieces for the threads: each slot's rows in as few pieces as hold them
// (its keys are read once a piece), but at least two pieces a key-value head where the heads
// alone would leave a thread idle (3 key-value heads on 2 threads), when the slot has the rows.
std::vector<AttWork> attention_work(int n, float* const* kc, int KV, int per, int threads) {
  std::vector<AttWork> work;
  const int hstep = std::min(per, ATT_QUERIES), rstep = std::max(1, ATT_QUERIES / hstep);
  for (int r = 0; r < n;) {
    int e = r + 1;
    while (e < n && kc[e] == kc[r]) ++e;
    const int m = e - r;
    int pieces = (m + rstep - 1) / rstep;
    if (threads > 1 && (KV * pieces) % threads && m >= ATT_SPLIT_ROWS) pieces = std::max(pieces, std::min(m, threads));
    const int rows = (m + pieces - 1) / pieces;
    for (int k = 0; k < KV; ++k)
      for (int r0 = r; r0 < e; r0 += rows)
        for (int h0 = 0; h0 < per; h0 += hstep) work.push_back({r0, std::min(e, r0 + rows), k, h0, std::min(per, h0 + hstep)});
    r = e;
  }
  return work;
}

}  // namespace vs

extern "C" {

using namespace vs;

#if defined(VSKIP_ISA_AMX)
// Linux lets a process use AMX's tile data once it asks (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); the Python side asks too, before it chooses this variant.
__attribute__((constructor)) static void vs_ask_for_tiles() { syscall(SYS_arch_prctl, 0x1023, 18); }
#endif

// The instruction set this build was made for (simd.h).
const char* vs_isa() { return vs::ISA; }

// One forward over n rows. Row r: token tokens[r] (or, when embeds is not null and tokens[r] < 0,
// the float vector embeds[r]), at position pos[r], attending to keys [0, kv_len[r]) of the slot
// whose caches start at kc[r] ([layers][kv][cap[r]/16][hd][16]) and vc[r] ([layers][kv][cap[r]][hd]);
// its key and value are written there at pos[r]. For the n_out rows out_rows[], the final-normed
// hidden state goes to hidden (if not null, [n_out][D]) and the head's logits to logits (if not
// null, [n_out][V]). Every row's output of each layer tap_layers[j] (j < n_tap; the last layer's
// final-normed, as transformers' hidden states) goes to tap_out[r][j][D]. Returns 0, or a
// negative code for bad arguments. With logits, argmax (if not null, [n_out]) receives each out
// row's first index at its greatest logit, or -1 where a logit is not finite.
int vs_forward(const Model* mp, int n, const int64_t* tokens, const float* embeds, const int32_t* pos,
               const int32_t* kv_len, float* const* kc, float* const* vc, const int32_t* cap, int n_out,
               const int32_t* out_rows, float* hidden, float* logits, int32_t* argmax, int n_threads, int n_tap,
               const int32_t* tap_layers, float* tap_out) {
  const Model& M = *mp;
  const int D = M.dim, H = M.n_heads, KV = M.n_kv, hd = M.head_dim, F = M.ffn;
  const int NQ = H * hd, NQKV = (H + 2 * KV) * hd;
  if (n <= 0 || hd % 16 || hd > 256 || D % 32 || F % 32 || NQ % 32) return -1;
  int maxL = 0;
  for (int r = 0; r < n; ++r) {
    if (pos[r] < 0 || pos[r] >= cap[r] || pos[r] >= M.rope_max || kv_len[r] < 1 || kv_len[r] > cap[r]) return -2;
    if (!(embeds && tokens[r] < 0) && (tokens[r] < 0 || tokens[r] >= M.vocab || !(M.embed_f || M.embed_q))) return -3;
    maxL = std::max(maxL, kv_len[r]);
  }
  if (logits && !M.head) return -4;
  if (n_tap < 0 || (n_tap && (!tap_layers || !tap_out))) return -6;
  for (int j = 0; j < n_tap; ++j)
    if (tap_layers[j] < 0 || tap_layers[j] >= M.n_layers) return -6;
  for (int l = 0; l < M.n_layers; ++l) {
    const Layer& Ly = M.layers[l];
    if (!formats_ok(Ly.qkv) || !formats_ok(Ly.o) || !formats_ok(Ly.gate_up) || !formats_ok(Ly.down)) return -5;
  }
  if (logits && !formats_ok(*M.head)) return -5;
  const int Kmax = std::max(std::max(D, F), NQ);
  std::vector<float> h((size_t)n * D), x((size_t)n * D), qkv((size_t)n * NQKV), att((size_t)n * NQ),
      gu((size_t)n * 2 * F), act((size_t)n * F);
  QAct a;
  a.resize(n, Kmax);
  const int parts = argmax && logits ? TOP_PARTS : 0;  // each out row's logits searched in parts, in parallel
  const int span = (M.vocab / 16 + TOP_PARTS - 1) / TOP_PARTS * 16;
  std::vector<Top> tops((size_t)n_out * parts);
  const float scale = 1.0f / sqrtf((float)hd);
  const float eps = M.eps;
  const int per = H / KV;
  const std::vector<AttWork> work = attention_work(n, kc, KV, per, n_threads);
#pragma omp parallel num_threads(n_threads)
  {
    const FpEnv fp;
    std::vector<float> s((size_t)ATT_QUERIES * (maxL + 64));
#pragma omp for schedule(static)
    for (int r = 0; r < n; ++r) {
      float* hr = &h[(size_t)r * D];
      if (embeds && tokens[r] < 0) {
        memcpy(hr, embeds + (size_t)r * D, sizeof(float) * D);
      } else if (M.embed_f) {
        memcpy(hr, M.embed_f + (size_t)tokens[r] * D, sizeof(float) * D);
      } else {
        const int8_t* eq = M.embed_q + (size_t)tokens[r] * D;
        const float* ed = M.embed_d + (size_t)tokens[r] * (D / 32);
        for (int i = 0; i < D; ++i) hr[i] = ed[i / 32] * (float)eq[i];
      }
    }
    for (int l = 0; l < M.n_layers; ++l) {
      const Layer& Ly = M.layers[l];
#pragma omp for schedule(static)
      for (int r = 0; r < n; ++r) {
        rmsnorm(&h[(size_t)r * D], Ly.attn_norm, &x[(size_t)r * D], D, eps);
        quantize(a, r, &x[(size_t)r * D], D);
      }
      gemm(Ly.qkv, a, n, qkv.data(), NQKV);
#pragma omp for schedule(static)
      for (int r = 0; r < n; ++r) {
        float* row = &qkv[(size_t)r * NQKV];
        if (Ly.qkv_bias)
          for (int i = 0; i < NQKV; ++i) row[i] += Ly.qkv_bias[i];
        if (Ly.q_norm)
          for (int i = 0; i < H; ++i) rmsnorm(row + i * hd, Ly.q_norm, row + i * hd, hd, eps);
        if (Ly.k_norm)
          for (int i = 0; i < KV; ++i) rmsnorm(row + NQ + i * hd, Ly.k_norm, row + NQ + i * hd, hd, eps);
        const float* cs = M.rope_cos + (size_t)pos[r] * (hd / 2);
        const float* sn = M.rope_sin + (size_t)pos[r] * (hd / 2);
        for (int i = 0; i < H + KV; ++i) rope(row + i * hd, hd, cs, sn);
        const size_t c = (size_t)cap[r];
        for (int k = 0; k < KV; ++k) {
          float* K = kc[r] + ((size_t)l * KV + k) * hd * c;
          float* V = vc[r] + ((size_t)l * KV + k) * c * hd;
          const float* kr = row + NQ + k * hd;
          const float* vr = row + NQ + KV * hd + k * hd;
          float* tile = K + (size_t)(pos[r] / 16) * hd * 16 + pos[r] % 16;
          for (int d = 0; d < hd; ++d) tile[(size_t)d * 16] = kr[d];
          memcpy(V + (size_t)pos[r] * hd, vr, sizeof(float) * hd);
        }
      }
#pragma omp for schedule(static)
      for (size_t w = 0; w < work.size(); ++w) {
        const AttWork& it = work[w];
        Queries Q;
        for (int r = it.r0; r < it.r1; ++r) {
          for (int h = it.h0; h < it.h1; ++h, ++Q.n) {
            Q.q[Q.n] = &qkv[(size_t)r * NQKV + (size_t)(it.k * per + h) * hd];
            Q.out[Q.n] = &att[(size_t)r * NQ + (size_t)(it.k * per + h) * hd];
            Q.L[Q.n] = kv_len[r];
            Q.Lmax = std::max(Q.Lmax, kv_len[r]);
          }
        }
        const size_t c = (size_t)cap[it.r0];
        attend(Q, kc[it.r0] + ((size_t)l * KV + it.k) * hd * c, vc[it.r0] + ((size_t)l * KV + it.k) * c * hd, hd,
               scale, s.data());
      }
#pragma omp for schedule(static)
      for (int r = 0; r < n; ++r) quantize(a, r, &att[(size_t)r * NQ], NQ);
      gemm(Ly.o, a, n, x.data(), D);
#pragma omp for schedule(static)
      for (int r = 0; r < n; ++r) {
        float* hr = &h[(size_t)r * D];
        float* xr = &x[(size_t)r * D];
        for (int i = 0; i < D; ++i) hr[i] += xr[i];
        rmsnorm(hr, Ly.ffn_norm, xr, D, eps);
        quantize(a, r, xr, D);
      }
      gemm(Ly.gate_up, a, n, gu.data(), 2 * F);
#pragma omp for schedule(static)
      for (int r = 0; r < n; ++r) {
        silu_mul(&gu[(size_t)r * 2 * F], &gu[(size_t)r * 2 * F + F], &act[(size_t)r * F], F);
        quantize(a, r, &act[(size_t)r * F], F);
      }
      gemm(Ly.down, a, n, x.data(), D);
#pragma omp for schedule(static)
      for (int r = 0; r < n; ++r) {
        float* hr = &h[(size_t)r * D];
        const float* xr = &x[(size_t)r * D];
        for (int i = 0; i < D; ++i) hr[i] += xr[i];
      }
      for (int j = 0; j < n_tap; ++j) {  // the same for every thread: the constructs below are met alike
        if (tap_layers[j] != l) continue;
        const bool last = l == M.n_layers - 1 && M.final_norm;
#pragma omp for schedule(static)
        for (int r = 0; r < n; ++r) {
          float* t = tap_out + ((size_t)r * n_tap + j) * D;
          if (last) rmsnorm(&h[(size_t)r * D], M.final_norm, t, D, eps);
          else memcpy(t, &h[(size_t)r * D], sizeof(float) * D);
        }
      }
    }
#pragma omp for schedule(static)
    for (int o = 0; o < n_out; ++o) {
      float* y = &x[(size_t)o * D];
      if (M.final_norm) rmsnorm(&h[(size_t)out_rows[o] * D], M.final_norm, y, D, eps);
      else memcpy(y, &h[(size_t)out_rows[o] * D], sizeof(float) * D);
      if (hidden) memcpy(hidden + (size_t)o * D, y, sizeof(float) * D);
      if (logits) quantize(a, o, y, D);
    }
    if (logits) gemm(*M.head, a, n_out, logits, M.vocab);
#pragma omp for schedule(static)
    for (int j = 0; j < n_out * parts; ++j) {
      const int lo = (j % parts) * span, hi = std::min(M.vocab, lo + span);
      Top t = hi > lo ? top_of(logits + (size_t)(j / parts) * M.vocab + lo, hi - lo) : Top{-INFINITY, 0};
      if (t.index >= 0) t.index += lo;
      tops[j] = t;
    }
  }
  for (int o = 0; o < n_out && parts; ++o) {  // the parts in order: the first part at the maximum wins ties
    Top best = tops[(size_t)o * parts];
    for (int p = 1; p < parts && best.index >= 0; ++p) {
      const Top& t = tops[(size_t)o * parts + p];
      if (t.index < 0 || t.value > best.value) best = t;
    }
    argmax[o] = best.index;
  }
  return 0;
}

// out[r] = W x[r] for M rows of floats x [M][K] (a test and benchmark entry to the product alone).
int vs_matmul(const QMat* W, int M, const float* x, float* out, int n_threads) {
  if (W->K % 32 || W->N % 16 || M <= 0 || !formats_ok(*W)) return -1;
  QAct a;
  a.resize(M, W->K);
#pragma omp parallel num_threads(n_threads)
  {
    const FpEnv fp;
#pragma omp for schedule(static)
    for (int r = 0; r < M; ++r) quantize(a, r, x + (size_t)r * W->K, W->K);
    gemm(*W, a, M, out, W->N);
  }
  return 0;
}

}  // extern "C"
