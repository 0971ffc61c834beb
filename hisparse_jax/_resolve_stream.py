"""RESOLVE of one stream in pure JAX, without the record copy: the contract's rules
(docs/contract.md) on one stream's selection and state. resolve.resolve_reference vmaps it over
the streams of a layer and copies the records.

Vectorized with sorts and prefix sums instead of loops, so it runs under jit, vmap and scan on
any backend.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_NOT_SELECTED = jnp.iinfo(jnp.int32).max  # sorts after every valid id
_I32 = jnp.int32


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
    limit = jnp.clip(jnp.minimum(sealed, pool_records), 0)
    valid = (selection >= 0) & (selection < limit)
    invalid = jnp.sum((selection != -1) & ~valid).astype(_I32)
    malformed = is_malformed(slot_record, lru, pool_records)
    if k == 0:  # nothing selected: every rule is a no-op on the state
        empty = jnp.zeros((0,), _I32)
        return dict(slots=empty, miss_records=empty, miss_slots=empty, misses=jnp.zeros((), _I32),
                    invalid=invalid, malformed=malformed.astype(_I32), slot_record=slot_record, lru=lru,
                    fill_slot=empty)
    # A malformed stream is resolved as if its state were empty and well formed
    # (so that nothing below indexes by its values), then every result of it
    # is replaced by "nothing resolved".
    out = _resolve_well_formed(
        selection,
        valid & ~malformed,
        jnp.where(malformed, -1, slot_record),
        jnp.where(malformed, jnp.arange(B, dtype=_I32), lru),
    )
    return dict(
        out,
        invalid=invalid,
        malformed=malformed.astype(_I32),
        slot_record=jnp.where(malformed, slot_record, out["slot_record"]),
        lru=jnp.where(malformed, lru, out["lru"]),
    )


def _resolve_well_formed(selection, valid, slot_record, lru):
    """Rules 1-6 of the contract on a well-formed state and k >= 1: resolve_stream's results
    except invalid and malformed."""
    k, B = selection.shape[0], slot_record.shape[0]
    key = jnp.where(valid, selection, _NOT_SELECTED)

    # Rule 1: distinct valid ids; first occurrence of each.
    first_pos, sorted_key = _first_positions(key)
    is_first = valid & (first_pos == jnp.arange(k))

    # Residency of each selected id (slot_record holds distinct ids >= 0).
    rec_order = jnp.argsort(slot_record)
    sorted_rec = slot_record[rec_order]
    at = jnp.minimum(jnp.searchsorted(sorted_rec, key), B - 1)
    resident = valid & (sorted_rec[at] == key)
    resident_slot = rec_order[at].astype(_I32)

    # Hit slots: slot_record in H.
    hat = jnp.minimum(jnp.searchsorted(sorted_key, slot_record), k - 1)
    slot_is_hit = (slot_record >= 0) & (sorted_key[hat] == slot_record)

    # Rules 2 and 3: misses in order of first appearance; miss m takes the m-th evictable slot.
    is_miss = is_first & ~resident
    evictable_at = ~slot_is_hit[lru]  # per lru position
    miss_records, miss_slots, slot_of_miss, misses = _miss_plan(selection, is_miss, lru, evictable_at)

    # Rule 5 (metadata) and rule 6.
    fill_slot = jnp.where(is_miss, slot_of_miss, B)
    own_slot = jnp.where(resident, resident_slot, slot_of_miss)
    return dict(
        slots=jnp.where(valid, own_slot[first_pos], -1).astype(_I32),
        miss_records=miss_records,
        miss_slots=miss_slots,
        misses=misses,
        slot_record=slot_record.at[fill_slot].set(selection, mode="drop"),
        lru=_new_lru(lru, evictable_at, misses),
        fill_slot=fill_slot,
    )


def _first_positions(key):
    """For each position j, the first position holding the same key (sorted trick)."""
    k = key.shape[0]
    order = jnp.argsort(key, stable=True)  # ties keep position order
    sorted_key = key[order]
    new_group = jnp.concatenate([jnp.ones((1,), bool), sorted_key[1:] != sorted_key[:-1]])
    group_start = jax.lax.cummax(jnp.where(new_group, jnp.arange(k), 0))
    first_sorted = order[group_start]
    first = jnp.zeros((k,), _I32).at[order].set(first_sorted.astype(_I32))
    return first, sorted_key


def _miss_plan(selection, is_miss, lru, evictable_at):
    """Rules 2 and 3: (miss_records [k], miss_slots [k], the slot of each position's miss [k],
    misses []), the evictable slots taken in lru order by the misses in order of first
    appearance."""
    k, B = selection.shape[0], lru.shape[0]
    evict_rank = jnp.cumsum(evictable_at) - 1
    evictable = jnp.full((B,), -1, _I32).at[jnp.where(evictable_at, evict_rank, B)].set(lru, mode="drop")
    miss_rank = jnp.cumsum(is_miss) - 1
    misses = jnp.sum(is_miss).astype(_I32)
    slot_of_miss = evictable[jnp.clip(miss_rank, 0, B - 1)]
    miss_target = jnp.where(is_miss, miss_rank, k)
    miss_records = jnp.full((k,), -1, _I32).at[miss_target].set(selection, mode="drop")
    miss_slots = jnp.full((k,), -1, _I32).at[miss_target].set(slot_of_miss, mode="drop")
    return miss_records, miss_slots, slot_of_miss, misses


def _new_lru(lru, evictable_at, misses):
    """Rule 4: [evictables not taken] + [filled, miss order] + [hits, old order]."""
    B = lru.shape[0]
    evict_rank = jnp.cumsum(evictable_at) - 1
    n_evictable = jnp.sum(evictable_at)
    hit_rank = jnp.cumsum(~evictable_at) - 1
    new_position = jnp.where(
        evictable_at,
        jnp.where(evict_rank >= misses, evict_rank - misses, n_evictable - misses + evict_rank),
        n_evictable + hit_rank,
    )
    return jnp.zeros((B,), _I32).at[new_position].set(lru)
