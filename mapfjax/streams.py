"""Named random streams: each random draw of a run comes from one root key, jax.random.key(seed),
split by `fold_in`s of the stream's name and its indices (e.g. the round), never from
arithmetic on integer seeds, so streams cannot collide and a new one changes no other."""

from __future__ import annotations

import zlib

import jax


def key(seed: int, name: str, *indices: int) -> jax.Array:
    """The key of stream `name` at `indices` (each in [0, 2^31)): the root key(seed) folded
    with the CRC-32 of the name (stable across processes, unlike `hash`), then each index."""
    out = jax.random.fold_in(jax.random.key(seed), zlib.crc32(name.encode()) & 0x7FFFFFFF)
    for i in indices:
        out = jax.random.fold_in(out, i)
    return out


def int_seed(key: jax.Array) -> int:
    """An int in [0, 2^31 - 1) drawn from `key`, for a callee that takes an int seed (NumPy's
    default_rng, the problem generator): the same key always gives the same int."""
    return int(jax.random.randint(key, (), 0, 2**31 - 1))
