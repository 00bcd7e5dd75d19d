"""Named random streams: deterministic per (seed, name, indices), distinct otherwise."""

import jax
import numpy as np

from mapfjax import streams


def _bits(key):
    return np.asarray(jax.random.key_data(key)).tolist()


def test_streams_are_deterministic_and_distinct():
    assert _bits(streams.key(3, "train set", 2)) == _bits(streams.key(3, "train set", 2))
    keys = [
        streams.key(3, "train set", 2),
        streams.key(3, "train set", 1),
        streams.key(3, "validation", 2),
        streams.key(4, "train set", 2),
        streams.key(3, "train set"),
    ]
    assert len({str(_bits(k)) for k in keys}) == len(keys)
    seeds = [streams.int_seed(k) for k in keys]
    assert len(set(seeds)) == len(seeds) and all(0 <= s < 2**31 - 1 for s in seeds)
    assert streams.int_seed(streams.key(3, "train set", 2)) == seeds[0]
