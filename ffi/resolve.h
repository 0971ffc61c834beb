// The RESOLVE contract on raw pointers: no XLA, no nanobind, no CUDA.
//
// Layouts (row-major; "S" is the product of all stream dims, "W" the bytes
// of one record = page_size x record_width x itemsize, a multiple of 8):
//   host_pool   [L, S, R, W] bytes   authoritative records (pinned host), read-only
//   hot         [L, S, B, W] bytes   hot buffer of every layer (device)
//   slot_record [L, S, B]    int32   record held by each slot, -1 = empty
//   lru         [L, S, B]    int32   permutation of slots, least recently used first
//   selection   [S, k]       int32   selected record ids, -1 = padding
//   sealed      [S]          int32   sealed records per stream: valid ids lie in
//                                    [0, min(sealed, R))
// Outputs for the layer resolved:
//   slots       [S, k]       int32   slot holding selection[j], -1 for padding/invalid
//   miss_records[S, k]       int32   records fetched, in miss order, -1 after `misses`
//   miss_slots  [S, k]       int32   slot each miss was written to, -1 after `misses`
//   misses      [S]          int32   number of misses
//   invalid     [S]          int32   ids that were neither -1 nor in range
//   malformed   [S]          int32   1 where the stream's state was malformed, else 0
//
// Rules (docs/contract.md; every implementation is bit-identical):
//  0. an id outside [0, min(sealed, R)) other than -1 is padding, counted in `invalid`.
//  1. H = distinct valid ids. Hit slots: slots whose slot_record is in H.
//  2. Misses: ids of H held by no slot, in order of first appearance.
//  3. Evictable slots: all non-hit slots in current lru order; miss m takes evictable[m].
//  4. New lru = [evictables not taken] + [slots just filled, miss order] + [hit slots, old order].
//  5. hot[slot] = host_pool[record] for each miss; slot_record updated.
//  6. slots[j] = slot holding selection[j].
// A layer index outside [0, L) resolves nothing: the state is left untouched,
// every non-padding id counts as invalid, every slot is -1 and malformed is 0.
//
// Malformed state. The rules need a well-formed stream (of the layer
// resolved): its lru row a permutation of [0, B), its slot_record row values
// in [-1, R) with no record id >= 0 held by two slots. init_hot_cache and
// reset_streams make one and the rules keep it so, but the state is a public
// type, so a stream may come in malformed. Such a stream resolves nothing: its
// hot, slot_record and lru rows are untouched, its slots and miss plan are all
// -1, misses is 0, invalid is counted by rule 0 as usual and malformed is 1.
// Every implementation validates a stream's rows before it indexes anything
// by a value they hold, so no state can make it read or write outside that
// stream's own rows; other streams resolve as usual.
//
// k = 0 (an empty selection) is a call like any other: every rule applies to
// no ids, so each stream has misses 0 and invalid 0, its state is untouched,
// and malformed is computed as above; the [S, k] outputs are empty.
//
// Stream range. A call resolves the streams [begin, begin + count) of the
// flattened stream axis (StreamRange; every stream by default): those
// streams exactly as above. A stream outside the range is neither read nor
// written (its selection, sealed, hot, slot_record and lru rows, and its
// pool rows) and its output rows are what a selection of padding gives:
// slots, miss_records and miss_slots -1, misses, invalid and malformed 0.
// So for a well-formed state a range call equals the whole-batch call whose
// selection is -1 outside the range, bit for bit; outside the range a
// malformed state is not even looked at (malformed 0), inside it is reported
// as above. A layer outside [0, L) counts invalid ids inside the range only.
// count = 0 is valid and touches no stream's state. The handlers refuse
// begin < 0, count < 0 and begin + count > S. A CUDA launch covers only the
// range (overlap groups: each group's call gets the whole grid).
#ifndef HISPARSE_FFI_RESOLVE_H_
#define HISPARSE_FFI_RESOLVE_H_

#include <cstdint>

namespace hisparse {

// Sizes of one RESOLVE call; every field is checked by the FFI handler.
struct ResolveDims {
  int64_t layers;        // L
  int64_t streams;       // S
  int64_t top_k;         // k
  int64_t hot_slots;     // B >= k
  int64_t pool_records;  // R
  int64_t record_bytes;  // W, a positive multiple of 8
};

struct ResolveBuffers {
  const uint8_t* host_pool;  // [L, S, R, W]
  const int32_t* selection;  // [S, k]
  const int32_t* sealed;     // [S]
  uint8_t* hot;              // [L, S, B, W], updated in place
  int32_t* slot_record;      // [L, S, B], updated in place
  int32_t* lru;              // [L, S, B], updated in place
  int32_t* slots;            // [S, k]
  int32_t* miss_records;     // [S, k]
  int32_t* miss_slots;       // [S, k]
  int32_t* misses;           // [S]
  int32_t* invalid;          // [S]
  int32_t* malformed;        // [S]
};

// The streams one call resolves: [begin, begin + count) of the flattened
// stream axis, 0 <= begin, 0 <= count, begin + count <= S (the handlers check).
struct StreamRange {
  int64_t begin;
  int64_t count;
};

// Every stream of a call of `dims`: the range of a call without one.
inline StreamRange AllStreams(const ResolveDims& dims) { return StreamRange{0, dims.streams}; }

// Resolves the streams of `range` of `layer` on the calling thread and fills
// the output rows of the others as padding does. `fetch` = false skips step
// 5's copy of record bytes (benchmarks of the pure resolve cost); everything
// else, slot_record included, is updated as usual.
void ResolveCpu(const ResolveDims& dims, StreamRange range, int64_t layer,
                const ResolveBuffers& io, bool fetch);

}  // namespace hisparse

#endif  // HISPARSE_FFI_RESOLVE_H_
