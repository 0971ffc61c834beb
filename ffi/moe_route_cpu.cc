// MoE ROUTE on the CPU: the contract of moe_route.h, one token after
// another. The choice is a partial sort by (key descending, id ascending),
// the grouping a counting sort of the pairs by local expert (stable: pairs
// enter their expert's run in pair order).
//
// Rule 2's float operations stay single float32 operations: no multiply feeds
// an add (nothing to contract into an FMA), and each intermediate is stored
// through a volatile float, so a target that evaluates float expressions in a
// wider type (FLT_EVAL_METHOD != 0) still rounds every step to float32.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "moe_route.h"
#include "topk.h"  // TopkOrderedKey: the same total order of floats as TOP-K

namespace hisparse {
namespace {

uint32_t KeyOf(float score) {
  uint32_t bits;
  std::memcpy(&bits, &score, sizeof(bits));
  return TopkOrderedKey(bits);
}

}  // namespace

void MoeRouteCpu(const MoeRouteDims& dims, const MoeRouteBuffers& io) {
  const int64_t T = dims.tokens, N = dims.scores, k = dims.top_k, E = dims.experts;
  std::fill(io.group_sizes, io.group_sizes + E, 0);
  if (T <= 0) return;
  std::vector<uint32_t> keys(static_cast<size_t>(N));
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (int64_t t = 0; t < T; ++t) {
    const float* row = io.scores + t * N;
    for (int64_t i = 0; i < N; ++i) keys[i] = KeyOf(row[i]);
    std::iota(ids.begin(), ids.end(), 0);
    // Rule 1: the first k of the strict order (key descending, id ascending).
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
      return keys[a] != keys[b] ? keys[a] > keys[b] : a < b;
    });
    int32_t* chosen = io.chosen + t * k;
    float* weights = io.weights + t * k;
    for (int64_t j = 0; j < k; ++j) chosen[j] = ids[j];
    // Rule 2, left to right.
    volatile float sum = row[chosen[0]];
    for (int64_t j = 1; j < k; ++j) sum = sum + row[chosen[j]];
    volatile float reciprocal = 1.0f / sum;
    for (int64_t j = 0; j < k; ++j) {
      volatile float ratio = row[chosen[j]] * reciprocal;
      float weight = ratio * dims.scaling;
      if (std::isnan(weight)) std::memcpy(&weight, &kMoeRouteNanBits, sizeof(weight));
      weights[j] = weight;
    }
    for (int64_t j = 0; j < k; ++j) ++io.group_sizes[chosen[j] % E];
  }
  // Rule 3: each expert's run starts after the runs of the lower experts;
  // pairs fill their run in pair order.
  std::vector<int64_t> next(static_cast<size_t>(E));
  int64_t start = 0;
  for (int64_t e = 0; e < E; ++e) {
    next[e] = start;
    start += io.group_sizes[e];
  }
  for (int64_t p = 0; p < T * k; ++p) {
    const int64_t place = next[io.chosen[p] % E]++;
    io.inverse[p] = static_cast<int32_t>(place);
    io.order[place] = static_cast<int32_t>(p);
  }
}

}  // namespace hisparse
