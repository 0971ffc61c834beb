"""RESOLVE in pure JAX: the jit-able reference of the contract (docs/contract.md).

Vectorized with sorts and prefix sums instead of loops, so it runs under jit,
vmap and scan on any backend. It reads the host pool by moving it to device
memory first (XLA gathers cannot read pinned_host operands), so it copies the
whole pool on every call: a reference and a fallback, not a fast path.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_NOT_SELECTED = jnp.iinfo(jnp.int32).max  # sorts after every valid id
_BITS = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def _bits(x):
    """Records as unsigned ints of their width: XLA may canonicalize float NaNs
    (e.g. bf16 through f32 on CPU) in selects and scatters; bits move exactly."""
    return jax.lax.bitcast_convert_type(x, _BITS[x.dtype.itemsize])


def _first_positions(key):
    """For each position j, the first position holding the same key (sorted trick)."""
    k = key.shape[0]
    order = jnp.argsort(key, stable=True)  # ties keep position order
    sorted_key = key[order]
    new_group = jnp.concatenate([jnp.ones((1,), bool), sorted_key[1:] != sorted_key[:-1]])
    group_start = jax.lax.cummax(jnp.where(new_group, jnp.arange(k), 0))
    first_sorted = order[group_start]
    first = jnp.zeros((k,), jnp.int32).at[order].set(first_sorted.astype(jnp.int32))
    return first, sorted_key


def is_malformed(slot_record, lru, pool_records):
    """[] bool: lru [B] is not a permutation of [0, B), or slot_record [B] holds a
    value outside [-1, R) or one record id >= 0 in two slots."""
    B = slot_record.shape[0]
    not_permutation = jnp.any(jnp.sort(lru) != jnp.arange(B, dtype=lru.dtype))
    out_of_range = jnp.any((slot_record < -1) | (slot_record >= pool_records))
    held = jnp.sort(slot_record)
    repeated = jnp.any((held[1:] == held[:-1]) & (held[1:] >= 0))
    return not_permutation | out_of_range | repeated


def resolve_stream(selection, sealed, slot_record, lru, pool_records):
    """The contract for one stream, without the record copy.

    Args:
      selection: [k] int32 record ids, -1 = padding.
      sealed: [] int32 sealed records; valid ids lie in [0, min(sealed, R)).
      slot_record: [B] int32, -1 = empty.
      lru: [B] int32 permutation, least recently used first.
      pool_records: R (static).

    Returns:
      dict of slots [k], miss_records [k], miss_slots [k], misses [], invalid [],
      malformed [] int32, slot_record [B], lru [B], and fill_slot [k] (the slot
      position j's record is copied into, B where nothing is copied). A
      malformed state (is_malformed) resolves nothing: slot_record and lru come
      back as they were, every slot and miss is -1, nothing is copied.
    """
    k, B = selection.shape[0], slot_record.shape[0]
    i32 = jnp.int32
    limit = jnp.clip(jnp.minimum(sealed, pool_records), 0)
    valid = (selection >= 0) & (selection < limit)
    invalid = jnp.sum((selection != -1) & ~valid).astype(i32)
    malformed = is_malformed(slot_record, lru, pool_records)
    if k == 0:  # nothing selected: every rule is a no-op on the state
        empty = jnp.zeros((0,), i32)
        return dict(
            slots=empty,
            miss_records=empty,
            miss_slots=empty,
            misses=jnp.zeros((), i32),
            invalid=invalid,
            malformed=malformed.astype(i32),
            slot_record=slot_record,
            lru=lru,
            fill_slot=empty,
        )
    # A malformed stream is resolved as if its state were empty and well formed
    # (so that nothing below indexes by its values), then every result of it
    # is replaced by "nothing resolved".
    slot_record_in, lru_in = slot_record, lru
    slot_record = jnp.where(malformed, -1, slot_record)
    lru = jnp.where(malformed, jnp.arange(B, dtype=i32), lru)
    valid = valid & ~malformed
    key = jnp.where(valid, selection, _NOT_SELECTED)

    # Rule 1: distinct valid ids; first occurrence of each.
    first_pos, sorted_key = _first_positions(key)
    is_first = valid & (first_pos == jnp.arange(k))

    # Residency of each selected id (slot_record holds distinct ids >= 0).
    rec_order = jnp.argsort(slot_record)
    sorted_rec = slot_record[rec_order]
    at = jnp.minimum(jnp.searchsorted(sorted_rec, key), B - 1)
    resident = valid & (sorted_rec[at] == key)
    resident_slot = rec_order[at].astype(i32)

    # Hit slots: slot_record in H.
    hat = jnp.minimum(jnp.searchsorted(sorted_key, slot_record), k - 1)
    slot_is_hit = (slot_record >= 0) & (sorted_key[hat] == slot_record)

    # Rule 3: evictable slots in lru order.
    evictable_at = ~slot_is_hit[lru]  # per lru position
    evict_rank = jnp.cumsum(evictable_at) - 1
    n_evictable = jnp.sum(evictable_at)
    evictable = jnp.full((B,), -1, i32).at[jnp.where(evictable_at, evict_rank, B)].set(
        lru, mode="drop"
    )

    # Rule 2: misses in order of first appearance; miss m takes evictable[m].
    is_miss = is_first & ~resident
    miss_rank = jnp.cumsum(is_miss) - 1
    misses = jnp.sum(is_miss).astype(i32)
    slot_of_miss = evictable[jnp.clip(miss_rank, 0, B - 1)]
    miss_target = jnp.where(is_miss, miss_rank, k)
    miss_records = jnp.full((k,), -1, i32).at[miss_target].set(selection, mode="drop")
    miss_slots = jnp.full((k,), -1, i32).at[miss_target].set(slot_of_miss, mode="drop")

    # Rule 4: [evictables not taken] + [filled, miss order] + [hits, old order].
    hit_rank = jnp.cumsum(~evictable_at) - 1
    new_position = jnp.where(
        evictable_at,
        jnp.where(evict_rank >= misses, evict_rank - misses, n_evictable - misses + evict_rank),
        n_evictable + hit_rank,
    )
    new_lru = jnp.zeros((B,), i32).at[new_position].set(lru)

    # Rule 5 (metadata) and rule 6.
    fill_slot = jnp.where(is_miss, slot_of_miss, B)
    new_slot_record = slot_record.at[fill_slot].set(selection, mode="drop")
    own_slot = jnp.where(resident, resident_slot, slot_of_miss)
    slots = jnp.where(valid, own_slot[first_pos], -1).astype(i32)
    return dict(
        slots=slots,
        miss_records=miss_records,
        miss_slots=miss_slots,
        misses=misses,
        invalid=invalid,
        malformed=malformed.astype(i32),
        slot_record=jnp.where(malformed, slot_record_in, new_slot_record),
        lru=jnp.where(malformed, lru_in, new_lru),
        fill_slot=fill_slot,
    )


def resolve_reference(hot, slot_record, lru, host_pool, selection, sealed, layer, *, fetch=True):
    """RESOLVE on every stream of one layer; same operands and results as the FFI call.

    Shapes: hot [L, *S, B, *rec], slot_record/lru [L, *S, B], host_pool
    [L, *S, R, *rec], selection [*S, k], sealed [*S], layer [] int32.
    Returns (slots, miss_records, miss_slots, misses, invalid, malformed, hot,
    slot_record, lru); see ffi/resolve.h for the malformed-state and k = 0 rules.
    """
    num_layers = host_pool.shape[0]
    stream_shape = selection.shape[:-1]
    k = selection.shape[-1]
    B = slot_record.shape[-1]
    R = host_pool.shape[1 + len(stream_shape)]
    rec = host_pool.shape[2 + len(stream_shape) :]
    n = 1
    for d in stream_shape:
        n *= d
    layer = jnp.asarray(layer, jnp.int32)
    layer_ok = (layer >= 0) & (layer < num_layers)
    at = jnp.clip(layer, 0, num_layers - 1)

    flat_sel = selection.reshape(n, k)
    flat_sealed = jnp.asarray(sealed, jnp.int32).reshape(n)
    layer_rec = slot_record[at].reshape(n, B)
    layer_lru = lru[at].reshape(n, B)
    out = jax.vmap(resolve_stream, in_axes=(0, 0, 0, 0, None))(
        flat_sel, flat_sealed, layer_rec, layer_lru, R
    )

    hot_dtype, hot = hot.dtype, _bits(hot)
    layer_hot = hot[at].reshape(n, B, *rec)
    if fetch:
        pool = _bits(jax.device_put(host_pool, jax.memory.Space.Device))[at].reshape(n, R, *rec)
        rows = jax.vmap(lambda p, s: p[jnp.clip(s, 0, R - 1)])(pool, flat_sel)
        layer_hot = jax.vmap(lambda h, f, r: h.at[f].set(r, mode="drop"))(
            layer_hot, out["fill_slot"], rows
        )

    def put(full, new_layer):
        updated = full.at[at].set(new_layer.reshape(full.shape[1:]))
        return jnp.where(layer_ok, updated, full)

    never = jnp.full((n, k), -1, jnp.int32)
    slots = jnp.where(layer_ok, out["slots"], never)
    miss_records = jnp.where(layer_ok, out["miss_records"], never)
    miss_slots = jnp.where(layer_ok, out["miss_slots"], never)
    misses = jnp.where(layer_ok, out["misses"], 0)
    invalid = jnp.where(layer_ok, out["invalid"], jnp.sum(flat_sel != -1, axis=1, dtype=jnp.int32))
    malformed = jnp.where(layer_ok, out["malformed"], 0)
    return (
        slots.reshape(*stream_shape, k),
        miss_records.reshape(*stream_shape, k),
        miss_slots.reshape(*stream_shape, k),
        misses.reshape(stream_shape),
        invalid.reshape(stream_shape),
        malformed.reshape(stream_shape),
        jax.lax.bitcast_convert_type(put(hot, layer_hot), hot_dtype),
        put(slot_record, out["slot_record"]),
        put(lru, out["lru"]),
    )


def pool_write_reference(host_pool, records, start, count):
    """host_pool[l, s, start[s] + i] = records[l, s, i] for i < count[s], in pure JAX.

    Rows landing outside [0, R) are not written. Works on a device copy of the
    pool and moves the result back to host memory.
    """
    stream_shape = start.shape
    ns = len(stream_shape)
    L, R = host_pool.shape[0], host_pool.shape[1 + ns]
    n = records.shape[1 + ns]
    rec = host_pool.shape[2 + ns :]
    S = 1
    for d in stream_shape:
        S *= d
    pool = _bits(jax.device_put(host_pool, jax.memory.Space.Device)).reshape(L, S, R, *rec)
    rows = _bits(records).reshape(L, S, n, *rec)
    i = jnp.arange(n)
    target = start.reshape(S, 1) + i  # [S, n]
    keep = (i < jnp.clip(count.reshape(S, 1), 0, n)) & (target >= 0) & (target < R)
    target = jnp.where(keep, target, R)  # R is dropped
    pool = jax.vmap(lambda p, r: jax.vmap(lambda pp, rr, tt: pp.at[tt].set(rr, mode="drop"))(p, r, target))(
        pool, rows
    )
    pool = jax.lax.bitcast_convert_type(pool.reshape(host_pool.shape), host_pool.dtype)
    return jax.device_put(pool, jax.memory.Space.Host)
