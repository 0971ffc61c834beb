// Sparse MLA decode attention on the CPU: the contract's arithmetic (sparse_attention.h), step by
// step in the kernels' order, so the CUDA checker can hold the GPU to rounding-level tolerance.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "sparse_attention.h"

namespace hisparse {
namespace {

float Bf16(uint16_t v) {
  const uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// float32 -> bfloat16 -> float32, round to nearest even (what __float2bfloat16_rn does; the
// probabilities here are finite and >= 0).
float RoundBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

float Dot(const uint16_t* a, const uint16_t* b) {
  double d = 0;
  for (int64_t i = 0; i < kSparseAttentionWidth; ++i) d += double(Bf16(a[i])) * double(Bf16(b[i]));
  return static_cast<float>(d);
}

}  // namespace

void SparseAttentionCpu(const SparseAttentionShape& shape, float scale, const uint16_t* q,
                        const uint16_t* source, int32_t layer, const int32_t* index, const uint16_t* tail,
                        const uint8_t* tail_valid, float* out) {
  constexpr int64_t W = kSparseAttentionWidth, Dv = kSparseAttentionValueWidth;
  constexpr int64_t C = kSparseAttentionChunks, St = kSparseAttentionStage;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t P = shape.page, k = shape.top_k, N = shape.records, H = shape.heads;
  const int64_t chunk_tokens = k * P / C;
  const bool layer_ok = layer >= 0 && layer < shape.layers;
  if (layer_ok) source += layer * shape.batch * N * P * W;
  std::vector<float> cm(C), cl(C), co(C * Dv), s(St), tail_s(P);
  for (int64_t r = 0; r < shape.batch; ++r) {
    const int32_t* ids = index + r * k;
    for (int64_t h = 0; h < H; ++h) {
      const uint16_t* qh = q + (r * H + h) * W;
      for (int64_t c = 0; c < C; ++c) {
        float m = kNegInf, l = 0.f;
        float* o = &co[c * Dv];
        std::fill(o, o + Dv, 0.f);
        for (int64_t t0 = c * chunk_tokens; t0 < (c + 1) * chunk_tokens; t0 += St) {
          float top = kNegInf;
          for (int64_t j = 0; j < St; ++j) {
            const int64_t id = ids[(t0 + j) / P];
            s[j] = layer_ok && id >= 0 && id < N ? Dot(qh, source + ((r * N + id) * P + (t0 + j) % P) * W) * scale
                                     : kNegInf;
            top = std::max(top, s[j]);
          }
          const float next = std::max(m, top);
          const float alpha = m == kNegInf ? 0.f : std::exp(m - next);
          float sum = 0.f;
          for (int64_t i = 0; i < Dv; ++i) o[i] *= alpha;
          for (int64_t j = 0; j < St; ++j) {
            const float p = RoundBf16(s[j] == kNegInf ? 0.f : std::exp(s[j] - next));
            sum += p;
            if (p == 0.f) continue;
            const int64_t id = ids[(t0 + j) / P];
            const uint16_t* v = source + ((r * N + id) * P + (t0 + j) % P) * W;
            for (int64_t i = 0; i < Dv; ++i) o[i] += p * Bf16(v[i]);
          }
          l = alpha * l + sum;
          m = next;
        }
        cm[c] = m;
        cl[c] = l;
      }
      float big = kNegInf;
      for (int64_t c = 0; c < C; ++c) big = std::max(big, cm[c]);
      for (int64_t t = 0; t < P; ++t) {
        tail_s[t] = tail_valid[r * P + t] ? Dot(qh, tail + (r * P + t) * W) * scale : kNegInf;
        big = std::max(big, tail_s[t]);
      }
      float total = 0.f;
      float* dst = out + (r * H + h) * Dv;
      std::fill(dst, dst + Dv, 0.f);
      for (int64_t c = 0; c < C; ++c) {
        const float w = cm[c] == kNegInf ? 0.f : std::exp(cm[c] - big);
        total = std::fma(w, cl[c], total);
        for (int64_t i = 0; i < Dv; ++i) dst[i] = std::fma(w, co[c * Dv + i], dst[i]);
      }
      for (int64_t t = 0; t < P; ++t) {
        const float p = tail_s[t] == kNegInf ? 0.f : std::exp(tail_s[t] - big);
        total += p;
        const uint16_t* v = tail + (r * P + t) * W;
        for (int64_t i = 0; i < Dv; ++i) dst[i] = std::fma(p, Bf16(v[i]), dst[i]);
      }
      for (int64_t i = 0; i < Dv; ++i) dst[i] = total > 0.f ? dst[i] / total : 0.f;
    }
  }
}

}  // namespace hisparse
