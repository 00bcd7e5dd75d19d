"""Random inputs of one decode step's attention, shared by the decode-kernel tests."""

import jax
import jax.numpy as jnp


def decode_inputs(b, g, kh, h, d, p, w, pads, padding="left", seed=0):
    """q [B, G, K, H, D], prefix (kp, vp [B, K, P, D], valid [B, P]) with pads[b] invalid
    slots in group b: on the left ("left"), on the right ("right") or at random places
    ("scattered"); own (k, v [B, G, K, W, D])."""
    key = jax.random.key(seed)
    keys = jax.random.split(key, 5)
    q = jax.random.normal(keys[0], (b, g, kh, h, d))
    kp = jax.random.normal(keys[1], (b, kh, p, d))
    vp = jax.random.normal(keys[2], (b, kh, p, d))
    k = jax.random.normal(keys[3], (b, g, kh, w, d))
    v = jax.random.normal(keys[4], (b, g, kh, w, d))
    pads = jnp.asarray(pads)[:, None]
    if padding == "scattered":
        draws = jax.random.split(jax.random.fold_in(key, 5), b)
        slots = jax.vmap(lambda key: jax.random.permutation(key, p))(draws)
    elif padding in ("left", "right"):
        slots = jnp.arange(p)[None]
    else:
        raise ValueError(f"padding={padding!r}; allowed: left, right, scattered")
    valid = slots < p - pads if padding == "right" else slots >= pads
    return q, (kp, vp, valid), (k, v)
