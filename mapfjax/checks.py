"""Type checks for values users write in configs and files (bool is not a number here)."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable


def is_int(x) -> bool:
    """True for a Python int that is not a bool (True would otherwise pass as 1)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_real(x) -> bool:
    """True for a Python int or float that is not a bool; NaN and infinities count as real."""
    return isinstance(x, int | float) and not isinstance(x, bool)


def is_finite_real(x) -> bool:
    """`is_real` and finite; an int too large for a float (10**400) is not finite here."""
    if not is_real(x):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def did_you_mean(names: Iterable[str], allowed: Iterable[str]) -> str:
    """ "; did you mean 'X'?" for the first of `names` (unknown keys, probably typos) with a
    close match X among `allowed` (difflib's ratio >= 0.6), else "": the end of an error
    message that already lists what is allowed."""
    allowed = [str(a) for a in allowed]
    for name in names:
        close = difflib.get_close_matches(str(name), allowed, n=1)
        if close:
            return f"; did you mean {close[0]!r}?"
    return ""


def require(key: str, value, ok: bool, allowed: str) -> None:
    """Raise ValueError("KEY = VALUE; allowed: ALLOWED") unless `ok`."""
    if not ok:
        raise ValueError(f"{key} = {value!r}; allowed: {allowed}")


def require_int(key: str, value, least: int) -> None:
    """`require` an integer (not a bool) >= least."""
    require(key, value, is_int(value) and value >= least, f"an integer >= {least}")


def require_dtype(key: str, value) -> None:
    """`require` a name JAX reads as a dtype ('float32', 'bfloat16', ...)."""
    import jax.numpy as jnp  # only this check needs JAX

    try:
        jnp.dtype(value)
    except TypeError:
        require(key, value, False, "a dtype name, e.g. 'bfloat16', 'float32'")
