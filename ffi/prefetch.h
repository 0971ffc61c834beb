// Prefetch: RESOLVE with its record copy taken off the compute stream, so that
// the copy overlaps whatever the program computes before the records are read.
// This header is the contract; it has no code and no framework types.
//
// Two custom calls, used in pairs that share a `prefetch_slot` (an int64
// attribute, >= 0, fixed at trace time; one slot per layer of a program):
//
//   hisparse_resolve_prefetch: RESOLVE's operands, results and attributes
//     (resolve.h, resolve_checks.h BindResolveOperands) and `prefetch_slot`.
//     Decides exactly as RESOLVE does (the same slots, misses, invalid,
//     malformed, slot_record and lru) on the calling stream. With fetch, the
//     copy of the missed records into hot is enqueued on the device's prefetch
//     stream, after the decision, and may still be running when the call's
//     results are handed on: hot[layer]'s missed slots are undefined until the
//     join of the same slot.
//
//   hisparse_prefetch_join(hot, misses, miss_records, miss_slots, layer, after)
//       -> (hot, misses), attribute prefetch_slot.
//     Returns hot and misses (aliased to its operands 0 and 1) once the copy
//     the last hisparse_resolve_prefetch of its slot enqueued is done. The
//     other operands are the ones that copy reads (held alive until the join);
//     `after` is any array, read by no one: the join runs after it is
//     computed, so the copy overlaps everything computed before `after`.
//
// After the join, hot is bit-identical to RESOLVE's (rule 5 of resolve.h): a
// prefetch changes when records arrive, never which records or where.
//
// Ordering. The prefetch stream runs its copies in the order they were
// enqueued, and a join waits for the last copy enqueued under its slot on that
// device, which is this one's or a later one: never too early. Between a
// resolve_prefetch and its join the caller must not read or write hot[layer]
// (the join takes hot as an operand and returns it, so a program that reads
// hot[layer] only from the join's result does not), and the pool rows the copy
// reads must not change (RESOLVE only reads sealed records).
//
// CPU: resolve_prefetch copies in place, as RESOLVE does; the join returns its
// operands. The same program runs on both, with the same bits.
//
// CUDA: neither call is command-buffer compatible (a copy forked onto another
// stream cannot be joined inside the captured graph of one call); XLA runs
// them between its graphs.
#ifndef HISPARSE_FFI_PREFETCH_H_
#define HISPARSE_FFI_PREFETCH_H_
#endif  // HISPARSE_FFI_PREFETCH_H_
