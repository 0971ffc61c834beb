// TOP-K on the CPU: the contract of topk.h, one row after another. Radix
// selection of the k-th largest key digit by digit (the unsealed ids enter
// every histogram as one count, never as data), then one pass in id order
// that emits the selected ids already ascending.
#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "topk.h"

namespace hisparse {
namespace {

// The k-th largest key of a row (rule 2's T) and how many ids of key T the
// selection takes (t), from the sealed keys plus `unsealed` ids of key
// kTopkUnsealedKey. Requires 1 <= k <= keys.size() + unsealed.
struct Threshold {
  uint32_t key;
  int64_t ties;
};

Threshold SelectThreshold(const std::vector<uint32_t>& keys, int64_t sealed, int64_t unsealed,
                          int64_t k) {
  uint32_t prefix = 0;
  int64_t remaining = k;  // ids still to take at or below the prefix's bucket
  std::array<int64_t, kTopkBins> hist;
  for (int level = 0; level < kTopkDigits; ++level) {
    hist.fill(0);
    for (int64_t i = 0; i < sealed; ++i) {
      if (TopkPrefixMatches(keys[i], prefix, level)) ++hist[TopkDigit(keys[i], level)];
    }
    if (TopkPrefixMatches(kTopkUnsealedKey, prefix, level))
      hist[TopkDigit(kTopkUnsealedKey, level)] += unsealed;
    // The bucket holding the remaining-th largest key: every bucket above it
    // is taken whole.
    int bin = kTopkBins - 1;
    int64_t above = 0;
    while (above + hist[bin] < remaining) above += hist[bin--];
    prefix |= static_cast<uint32_t>(bin) << TopkDigitShift(level);
    remaining -= above;
  }
  return {prefix, remaining};
}

}  // namespace

void TopkCpu(const TopkDims& dims, const TopkBuffers& io) {
  const int64_t R = dims.records, k = dims.top_k;
  if (k <= 0) return;
  std::vector<uint32_t> keys(static_cast<size_t>(R));
  for (int64_t s = 0; s < dims.rows; ++s) {
    const int64_t n = std::clamp<int64_t>(io.sealed[s], 0, R);
    const float* row = io.scores + s * R;
    for (int64_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &row[i], sizeof(bits));
      keys[i] = TopkOrderedKey(bits);
    }
    const Threshold t = SelectThreshold(keys, n, R - n, k);
    int32_t* out = io.selected + s * k;
    int64_t count = 0, ties = t.ties;
    for (int64_t i = 0; i < n; ++i) {
      if (keys[i] > t.key) {
        out[count++] = static_cast<int32_t>(i);
      } else if (keys[i] == t.key && ties > 0) {
        out[count++] = static_cast<int32_t>(i);
        --ties;
      }
    }
    std::fill(out + count, out + k, -1);
  }
}

}  // namespace hisparse
