// A forward of the native kernels outside Python, for CPUs the tests reach only through an
// emulator (ARM64 under qemu): reads a model and calls from the file argv[1] (written by
// tests/native/probe.py), runs each call on one slot, and writes every row's logits to argv[2].
// Built with the kernels of one variant: g++ ... -DVSKIP_ISA_NEON -I<native dir> probe.cpp.
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include "kernels.cpp"

namespace {

struct Reader {
  const char* base;
  size_t at = 0;
  const void* take(size_t bytes) {  // arrays start 64-byte aligned in the file
    at = (at + 63) / 64 * 64;
    const void* p = base + at;
    at += bytes;
    return p;
  }
  int32_t i32() { return *(const int32_t*)take(4); }
  QMat qmat() {
    QMat m;
    m.N = i32(), m.K = i32(), m.offset = i32(), m.nibbles = i32();
    const int has_m = i32();
    m.q = (const uint8_t*)take((size_t)m.N * m.K / (m.nibbles ? 2 : 1));
    m.d = (const uint16_t*)take((size_t)m.N * m.K / 32 * 2);
    m.m = has_m ? (const uint16_t*)take((size_t)m.N * m.K / 32 * 2) : nullptr;
    return m;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return fprintf(stderr, "usage: probe MODEL_AND_CALLS OUT\n"), 2;
  FILE* f = fopen(argv[1], "rb");
  if (!f) return perror(argv[1]), 1;
  fseek(f, 0, SEEK_END);
  const long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* buf = (char*)aligned_alloc(64, (size + 63) / 64 * 64);
  if (fread(buf, 1, size, f) != (size_t)size) return fprintf(stderr, "short read\n"), 1;
  fclose(f);
  Reader r{buf};
  Model M;
  M.n_layers = r.i32(), M.dim = r.i32(), M.n_heads = r.i32(), M.n_kv = r.i32(), M.head_dim = r.i32();
  M.ffn = r.i32(), M.vocab = r.i32(), M.rope_max = r.i32();
  M.eps = *(const float*)r.take(4);
  const int D = M.dim, hd = M.head_dim, NQKV = (M.n_heads + 2 * M.n_kv) * hd;
  std::vector<Layer> layers(M.n_layers);
  for (Layer& L : layers) {
    L.attn_norm = (const float*)r.take(D * 4);
    L.qkv = r.qmat();
    L.qkv_bias = r.i32() ? (const float*)r.take(NQKV * 4) : nullptr;
    L.o = r.qmat();
    L.ffn_norm = (const float*)r.take(D * 4);
    L.gate_up = r.qmat();
    L.down = r.qmat();
  }
  M.layers = layers.data();
  M.final_norm = r.i32() ? (const float*)r.take(D * 4) : nullptr;
  M.embed_f = (const float*)r.take((size_t)M.vocab * D * 4);
  M.embed_q = nullptr, M.embed_d = nullptr;
  QMat head = r.qmat();
  M.head = &head;
  M.rope_cos = (const float*)r.take((size_t)M.rope_max * hd / 2 * 4);
  M.rope_sin = (const float*)r.take((size_t)M.rope_max * hd / 2 * 4);
  const int cap = (M.rope_max + 63) / 64 * 64;
  std::vector<float> kc((size_t)M.n_layers * M.n_kv * cap * hd), vc(kc.size());
  float* kp = kc.data();
  float* vp = vc.data();
  FILE* out = fopen(argv[2], "wb");
  if (!out) return perror(argv[2]), 1;
  const int calls = r.i32();
  for (int c = 0; c < calls; ++c) {
    const int n = r.i32();
    const int64_t* tokens = (const int64_t*)r.take(n * 8);
    const int32_t* pos = (const int32_t*)r.take(n * 4);
    std::vector<int32_t> seen(n), caps(n, cap), rows(n);
    std::vector<float*> ks(n, kp), vs_(n, vp);
    for (int i = 0; i < n; ++i) seen[i] = pos[i] + 1, rows[i] = i;
    std::vector<float> logits((size_t)n * M.vocab);
    std::vector<int32_t> top(n);
    const int rc = vs_forward(&M, n, tokens, nullptr, pos, seen.data(), ks.data(), vs_.data(), caps.data(), n,
                              rows.data(), nullptr, logits.data(), top.data(), 2, 0, nullptr, nullptr);
    if (rc) return fprintf(stderr, "vs_forward: %d\n", rc), 1;
    for (int i = 0; i < n; ++i) {  // the runtime's argmax: the first id at the greatest logit
      const float* z = &logits[(size_t)i * M.vocab];
      int best = 0;
      for (int v = 1; v < M.vocab; ++v) best = z[v] > z[best] ? v : best;
      if (top[i] != best) return fprintf(stderr, "argmax of row %d: %d, not %d\n", i, top[i], best), 1;
    }
    fwrite(logits.data(), 4, logits.size(), out);
  }
  fclose(out);
  printf("%s\n", vs_isa());
  return 0;
}
