// RESOLVE on the CPU: the contract of resolve.h, one stream
// at a time, in O(k + B) per stream with open-addressing tables of the
// selected ids and of the records the slots hold.
#include <algorithm>
#include <cstring>
#include <vector>

#include "resolve.h"

namespace hisparse {
namespace {

// Open-addressing set of up to `max_ids` distinct ids >= 0 (the valid ids of
// one selection, or the records of one slot_record row), remembering a slot
// per id. Capacity is a power of two >= 2 x max_ids, so probes stay short.
class IdTable {
 public:
  explicit IdTable(int64_t max_ids) {
    int64_t capacity = 16;
    while (capacity < 2 * max_ids) capacity *= 2;
    keys_.assign(capacity, kEmpty);
    slot_.assign(capacity, -1);
    mask_ = capacity - 1;
  }
  void Clear() {
    std::fill(keys_.begin(), keys_.end(), kEmpty);
    std::fill(slot_.begin(), slot_.end(), -1);
  }
  // Inserts `id`; returns true when it was not there yet.
  bool Insert(int32_t id) {
    int64_t i = Hash(id);
    while (keys_[i] != kEmpty) {
      if (keys_[i] == id) return false;
      i = (i + 1) & mask_;
    }
    keys_[i] = id;
    return true;
  }
  // Index of `id` in the table, or -1 when absent.
  int64_t Find(int32_t id) const {
    int64_t i = Hash(id);
    while (keys_[i] != kEmpty) {
      if (keys_[i] == id) return i;
      i = (i + 1) & mask_;
    }
    return -1;
  }
  int32_t& SlotAt(int64_t index) { return slot_[index]; }

 private:
  static constexpr int32_t kEmpty = -1;  // valid ids are >= 0
  int64_t Hash(int32_t id) const {
    return static_cast<int64_t>((static_cast<uint32_t>(id) * 2654435761u)) & mask_;
  }
  std::vector<int32_t> keys_;
  std::vector<int32_t> slot_;
  int64_t mask_;
};

struct StreamScratch {
  explicit StreamScratch(const ResolveDims& d)
      : ids(d.top_k), held(d.hot_slots), in_lru(d.hot_slots), first_seen(d.top_k),
        is_hit(d.hot_slots), evictable(d.hot_slots), new_lru(d.hot_slots) {}
  IdTable ids;                      // distinct valid ids of the selection
  IdTable held;                     // records of slot_record (the malformed-state check)
  std::vector<uint8_t> in_lru;      // [B] slot seen in lru (the malformed-state check)
  std::vector<int32_t> first_seen;  // distinct valid ids, first appearance order
  std::vector<uint8_t> is_hit;      // [B]
  std::vector<int32_t> evictable;   // non-hit slots in lru order
  std::vector<int32_t> new_lru;     // [B]
};

// True when the stream's rows satisfy what the rules assume (resolve.h,
// "Malformed state"): lru a permutation of [0, B), slot records in [-1, R),
// no record >= 0 twice. Indexes nothing by a state value before range-checking it.
bool WellFormed(const ResolveDims& d, const int32_t* slot_record, const int32_t* lru,
                StreamScratch& s) {
  const int64_t B = d.hot_slots;
  std::fill(s.in_lru.begin(), s.in_lru.end(), 0);
  for (int64_t i = 0; i < B; ++i) {
    const int32_t slot = lru[i];
    if (slot < 0 || slot >= B || s.in_lru[slot]) return false;
    s.in_lru[slot] = 1;
  }
  s.held.Clear();
  for (int64_t b = 0; b < B; ++b) {
    const int32_t rec = slot_record[b];
    if (rec < -1 || rec >= d.pool_records) return false;
    if (rec >= 0 && !s.held.Insert(rec)) return false;
  }
  return true;
}

// Rule 0 alone, for a stream that resolves nothing: ids other than -1 outside
// [0, limit) are counted, every output is -1.
void ResolveNothing(int64_t k, int64_t limit, const int32_t* selection, int32_t* slots,
                    int32_t* miss_records, int32_t* miss_slots, int32_t* misses_out,
                    int32_t* invalid_out) {
  int32_t invalid = 0;
  for (int64_t j = 0; j < k; ++j) {
    const int32_t id = selection[j];
    invalid += id != -1 && (id < 0 || id >= limit);
    slots[j] = miss_records[j] = miss_slots[j] = -1;
  }
  *misses_out = 0;
  *invalid_out = invalid;
}

void ResolveStream(const ResolveDims& d, int64_t sealed, const int32_t* selection,
                   const uint8_t* pool, uint8_t* hot, int32_t* slot_record, int32_t* lru,
                   int32_t* slots, int32_t* miss_records, int32_t* miss_slots,
                   int32_t* misses_out, int32_t* invalid_out, int32_t* malformed_out, bool fetch,
                   StreamScratch& s) {
  const int64_t k = d.top_k, B = d.hot_slots, W = d.record_bytes;
  const int64_t limit = std::max<int64_t>(0, std::min<int64_t>(sealed, d.pool_records));
  const bool well_formed = WellFormed(d, slot_record, lru, s);
  *malformed_out = well_formed ? 0 : 1;
  if (!well_formed) {
    ResolveNothing(k, limit, selection, slots, miss_records, miss_slots, misses_out, invalid_out);
    return;
  }

  // Rule 0 and 1: distinct valid ids in order of first appearance.
  s.ids.Clear();
  int32_t invalid = 0;
  int64_t distinct = 0;
  for (int64_t j = 0; j < k; ++j) {
    const int32_t id = selection[j];
    if (id == -1) continue;
    if (id < 0 || id >= limit) {
      ++invalid;
      continue;
    }
    if (s.ids.Insert(id)) s.first_seen[distinct++] = id;
  }

  // Hit slots, then the evictable ones in lru order.
  for (int64_t b = 0; b < B; ++b) {
    const int32_t rec = slot_record[b];
    const int64_t at = rec >= 0 ? s.ids.Find(rec) : -1;
    s.is_hit[b] = at >= 0;
    if (at >= 0) s.ids.SlotAt(at) = static_cast<int32_t>(b);
  }
  int64_t evictables = 0;
  for (int64_t i = 0; i < B; ++i) {
    if (!s.is_hit[lru[i]]) s.evictable[evictables++] = lru[i];
  }

  // Rule 2 and 3: miss m takes evictable[m].
  int64_t misses = 0;
  for (int64_t i = 0; i < distinct; ++i) {
    const int32_t id = s.first_seen[i];
    int32_t& slot = s.ids.SlotAt(s.ids.Find(id));
    if (slot >= 0) continue;
    slot = s.evictable[misses];
    miss_records[misses] = id;
    miss_slots[misses] = slot;
    ++misses;
  }
  for (int64_t m = misses; m < k; ++m) miss_records[m] = miss_slots[m] = -1;

  // Rule 4: [evictables not taken] + [filled, miss order] + [hits, old order].
  int64_t out = 0;
  for (int64_t e = misses; e < evictables; ++e) s.new_lru[out++] = s.evictable[e];
  for (int64_t m = 0; m < misses; ++m) s.new_lru[out++] = s.evictable[m];
  for (int64_t i = 0; i < B; ++i) {
    if (s.is_hit[lru[i]]) s.new_lru[out++] = lru[i];
  }
  std::copy(s.new_lru.begin(), s.new_lru.end(), lru);

  // Rule 5: fetch and record what each filled slot now holds.
  for (int64_t m = 0; m < misses; ++m) {
    const int32_t slot = miss_slots[m];
    slot_record[slot] = miss_records[m];
    if (fetch) std::memcpy(hot + slot * W, pool + int64_t{miss_records[m]} * W, W);
  }

  // Rule 6.
  for (int64_t j = 0; j < k; ++j) {
    const int32_t id = selection[j];
    slots[j] = (id >= 0 && id < limit) ? s.ids.SlotAt(s.ids.Find(id)) : -1;
  }
  *misses_out = static_cast<int32_t>(misses);
  *invalid_out = invalid;
}

}  // namespace

void ResolveCpu(const ResolveDims& d, StreamRange range, int64_t layer, const ResolveBuffers& io,
                bool fetch) {
  const int64_t k = d.top_k, B = d.hot_slots, R = d.pool_records, W = d.record_bytes;
  const int64_t end = range.begin + range.count;
  // Streams outside the range: what a selection of padding gives, read from nothing.
  for (int64_t s = 0; s < d.streams; ++s) {
    if (s >= range.begin && s < end) continue;
    std::fill(io.slots + s * k, io.slots + (s + 1) * k, -1);
    std::fill(io.miss_records + s * k, io.miss_records + (s + 1) * k, -1);
    std::fill(io.miss_slots + s * k, io.miss_slots + (s + 1) * k, -1);
    io.misses[s] = io.invalid[s] = io.malformed[s] = 0;
  }
  if (layer < 0 || layer >= d.layers) {
    for (int64_t s = range.begin; s < end; ++s) {
      // limit 0: every id other than -1 is invalid.
      ResolveNothing(k, 0, io.selection + s * k, io.slots + s * k, io.miss_records + s * k,
                     io.miss_slots + s * k, io.misses + s, io.invalid + s);
      io.malformed[s] = 0;
    }
    return;
  }
  StreamScratch scratch(d);
  for (int64_t s = range.begin; s < end; ++s) {
    const int64_t ls = layer * d.streams + s;
    ResolveStream(d, io.sealed[s], io.selection + s * k, io.host_pool + ls * R * W,
                  io.hot + ls * B * W, io.slot_record + ls * B, io.lru + ls * B,
                  io.slots + s * k, io.miss_records + s * k, io.miss_slots + s * k,
                  io.misses + s, io.invalid + s, io.malformed + s, fetch, scratch);
  }
}

}  // namespace hisparse
