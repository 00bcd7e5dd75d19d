"""Generator config (ml-collections): per-map-size data/hole/wait ratios, validation, projection.

Per-size entries live under `sizes.s<N>` (for example `sizes.s7.hole_ratio`) because
ml-collections' command-line overrides need identifier keys: `--config.env.sizes.s7.data_ratio=0.1`.
"""

from __future__ import annotations

import copy
import decimal
import math
from collections.abc import Iterable, Mapping
from typing import Any

import ml_collections

from mapfjax.checks import did_you_mean, is_finite_real, is_int

PAPER_SIZES = tuple(range(3, 11))  # 3x3 .. 10x10 [paper]
RATIO_FIELDS = ("data_ratio", "hole_ratio", "wait_ratio")
MAX_HOLE_RATIO = 0.5  # [paper] hole density is at most 0.5
MIN_SIZE = 2  # the smallest map (2x2) that `validate`, `project` and the generator all accept
TOP_LEVEL_KEYS = ("num_agents", "sizes", "seed", "max_size", "max_agents", "oracle", "pool")
ORACLE_KEYS = ("max_nodes", "time_limit", "processes")
POOL_KEYS = ("oversample", "max_rounds", "wait_bias")


class ConfigError(ValueError):
    """A bad generator config; the message names the key, the value and what is allowed."""


def size_key(n: int) -> str:
    """Config key of an N x N map size, e.g. 7 -> 's7'."""
    return f"s{int(n)}"


def key_size(key: str) -> int:
    """Inverse of `size_key`; accepts 's7', '7', '7x7' (the engineer may write any of them)."""
    k = str(key).strip().lower()
    if k.startswith("s"):
        k = k[1:]
    if "x" in k:
        a, _, b = k.partition("x")
        if a != b:
            raise ConfigError(f"size key {key!r}: only square sizes NxN are configurable")
        k = a
    if not (k.isascii() and k.isdigit() and len(k) <= 4):
        raise ConfigError(f"size key {key!r} is not a map size; expected e.g. 's7' (7x7)")
    return int(k)


def parse_sizes(text: str) -> tuple[int, ...]:
    """'3-10' or '3,5,7' or '3-5,8' -> sorted map sizes; ConfigError names the bad part."""
    out: set[int] = set()
    for part in str(text).split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ConfigError(f"sizes {text!r}: {part!r} is not N or N-M (e.g. 3-10)") from None
        if a > b:
            raise ConfigError(f"sizes {text!r}: range {part!r} runs backwards")
        out.update(range(a, b + 1))
    return tuple(sorted(out))


def default_config(
    num_agents: int = 2,
    sizes: Iterable[int] = PAPER_SIZES,
    hole_ratio: float = 0.2,
    wait_ratio: float = 0.3,
    seed: int = 0,
) -> ml_collections.ConfigDict:
    """A uniform config over `sizes`: the round-0 default the engineer starts from [ours]."""
    sizes = tuple(sizes)
    per = {
        size_key(n): {
            "data_ratio": 1.0 / len(sizes),
            "hole_ratio": float(hole_ratio),
            "wait_ratio": float(wait_ratio),
        }
        for n in sizes
    }
    return ml_collections.ConfigDict(
        {
            "num_agents": int(num_agents),
            "sizes": per,
            "seed": int(seed),
            # Static padding of every Instance; a larger size than max_size is invalid.
            "max_size": 10,
            "max_agents": 5,
            # CBS labelling budgets per instance; timeouts are discarded and resampled.
            "oracle": {"max_nodes": 20_000, "time_limit": 5.0, "processes": 0},
            # Candidate pool: oversample x the request per round, at most max_rounds rounds;
            # wait_bias = share of candidates drawn with crossing start/goal layouts, which
            # need waits far more often than uniform ones.
            "pool": {"oversample": 2.0, "max_rounds": 20, "wait_bias": 0.5},
        }
    )


def _show(v) -> str:
    """A short repr for messages: an int too long to print is given by its digit count."""
    if is_int(v) and abs(v) >= 10**30:
        return f"an integer of {len(str(abs(v)))} digits"
    return f"{v!r:.60}"


def validate(config: ml_collections.ConfigDict) -> None:
    """Raise ConfigError naming the first bad key, its value and what is allowed."""
    c = config
    unknown = sorted(set(c.keys()) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise ConfigError(
            f"unknown key(s) {unknown}; allowed: {list(TOP_LEVEL_KEYS)}"
            + did_you_mean(unknown, TOP_LEVEL_KEYS)
        )
    for key in TOP_LEVEL_KEYS:
        if key not in c:
            raise ConfigError(f"missing key {key!r}")
    if not is_int(c.num_agents) or not 1 <= c.num_agents <= c.max_agents:
        raise ConfigError(
            f"num_agents = {c.num_agents!r}; allowed: an integer in [1, max_agents={c.max_agents}]"
        )
    if not is_int(c.max_agents) or not 1 <= c.max_agents <= 5:
        raise ConfigError(f"max_agents = {c.max_agents!r}; allowed: an integer in [1, 5]")
    if not is_int(c.max_size) or not MIN_SIZE <= c.max_size <= 40:
        raise ConfigError(f"max_size = {c.max_size!r}; allowed: an integer in [{MIN_SIZE}, 40]")
    if not is_int(c.seed) or c.seed < 0:
        raise ConfigError(f"seed = {c.seed!r}; allowed: an integer >= 0")
    if len(c.sizes) == 0:
        raise ConfigError("sizes is empty; allowed: at least one entry like sizes.s3")
    total = 0.0
    for key, entry in c.sizes.items():
        n = key_size(key)
        if key != size_key(n):
            raise ConfigError(f"sizes.{key}: write the key as {size_key(n)!r}")
        if not MIN_SIZE <= n <= c.max_size:
            raise ConfigError(
                f"sizes.{key}: map size {n} outside [{MIN_SIZE}, max_size={c.max_size}]"
            )
        extra = sorted(set(entry.keys()) - set(RATIO_FIELDS))
        if extra:
            raise ConfigError(
                f"sizes.{key}: unknown key(s) {extra}; allowed: {list(RATIO_FIELDS)}"
                + did_you_mean(extra, RATIO_FIELDS)
            )
        for field in RATIO_FIELDS:
            if field not in entry:
                raise ConfigError(f"sizes.{key}.{field} is missing")
            v = entry[field]
            hi = MAX_HOLE_RATIO if field == "hole_ratio" else 1.0
            if not is_finite_real(v) or not 0.0 <= v <= hi:
                raise ConfigError(f"sizes.{key}.{field} = {v!r}; allowed: a number in [0, {hi}]")
        total += entry.data_ratio
        if c.num_agents * 2 > n * n:
            raise ConfigError(
                f"sizes.{key}: {c.num_agents} agents need {2 * c.num_agents} distinct cells, "
                f"a {n}x{n} map has {n * n}"
            )
    if not math.isclose(total, 1.0, abs_tol=1e-6):
        raise ConfigError(f"sizes.*.data_ratio sums to {total:.6g}; allowed: a sum of 1")
    for group, keys in (("oracle", ORACLE_KEYS), ("pool", POOL_KEYS)):
        extra = sorted(set(c[group].keys()) - set(keys))
        if extra:
            raise ConfigError(
                f"{group}: unknown key(s) {extra}; allowed: {list(keys)}"
                + did_you_mean(extra, keys)
            )
    if not c.pool.oversample >= 1.0:
        raise ConfigError(f"pool.oversample = {c.pool.oversample!r}; allowed: >= 1")
    if not 0.0 <= c.pool.wait_bias <= 1.0:
        raise ConfigError(f"pool.wait_bias = {c.pool.wait_bias!r}; allowed: [0, 1]")


def validate_at(config: ml_collections.ConfigDict, where: str) -> None:
    """`validate` for a generator config that sits inside a larger config at `where` (e.g.
    "sft.env"): the message names the full key, as a --config flag would."""
    try:
        validate(config)
    except ConfigError as e:
        joint = ": " if str(e).startswith(("unknown key", "missing key")) else "."
        raise ConfigError(f"{where}{joint}{e}") from None


def check_hole_ratios(values, key: str) -> None:
    """Hole ratios a generator is asked to spread instances over: each in [0, MAX_HOLE_RATIO]."""
    for h in values:
        if not is_finite_real(h) or not 0.0 <= h <= MAX_HOLE_RATIO:
            allowed = f"numbers in [0, {MAX_HOLE_RATIO}]"
            raise ConfigError(f"{key} = {tuple(values)!r}; allowed: {allowed}")


def flatten(d: Mapping, prefix: str = "") -> dict[str, Any]:
    """Nested mappings / ConfigDicts -> {"a.b.c": leaf}."""
    out = {}
    for k, v in d.items():
        path = f"{prefix}{k}"
        if isinstance(v, Mapping | ml_collections.ConfigDict):
            out.update(flatten(v, path + "."))
        else:
            out[path] = v
    return out


def ratio_key(path: str) -> tuple[int, str] | None:
    """'sizes.s7.hole_ratio' -> (7, 'hole_ratio'); None for a key that is not a per-size ratio.

    The one place a dotted ratio key is split. A size part that is not a map size ('sizes.big.
    hole_ratio') raises ConfigError.
    """
    parts = str(path).split(".")
    if len(parts) != 3 or parts[0] != "sizes" or parts[2] not in RATIO_FIELDS:
        return None
    return key_size(parts[1]), parts[2]


def project(
    proposal: Mapping[str, Any] | ml_collections.ConfigDict,
    current: ml_collections.ConfigDict,
) -> tuple[ml_collections.ConfigDict, list[str]]:
    """Map a proposed config onto the legal space; return it and a list of what changed.

    `proposal` is either a whole config or a flat/nested mapping of the keys to change
    (`{"sizes.s7.hole_ratio": 0.6}` or `{"sizes": {"s7": {...}}}`); anything not proposed
    keeps its current value. Keys that are not per-size ratios are rejected with ConfigError
    (unless a whole config repeats their current value); the rest is `project_edits`.
    """
    validate(current)
    flat = flatten(proposal if isinstance(proposal, Mapping) else proposal.to_dict())
    current_flat = flatten(current)
    edits = []
    for path, value in flat.items():
        parsed = ratio_key(path)
        if parsed is None:
            if path in current_flat and current_flat[path] == value:
                continue  # an unchanged non-ratio key (a whole config was proposed)
            raise ConfigError(
                f"key {path!r} cannot be changed; allowed: sizes.s<N>.<field> with field in "
                f"{list(RATIO_FIELDS)}"
            )
        edits.append((*parsed, value))
    return project_edits(edits, current)


def project_edits(
    edits: Iterable[tuple[int, str, Any]], current: ml_collections.ConfigDict
) -> tuple[ml_collections.ConfigDict, list[str]]:
    """`project` for edits already parsed into (size, field, value) triples, applied in order.

    Rules: hole_ratio is clipped to [0, 0.5], wait_ratio to [0, 1], data_ratio to >= 0 and
    then renormalised to sum 1 (all-zero -> uniform over the sizes; huge values are scaled
    down first, so nothing overflows); sizes outside [MIN_SIZE, max_size] (as in `validate`)
    or too small for the agents, fields that are not ratios and values that are not finite
    numbers (also an int too large for a float) are rejected with ConfigError. Only the task
    distribution may change: seeds, agents and budgets are not the engineer's to set.
    """
    validate(current)
    new = copy.deepcopy(current.to_dict())
    changes: list[str] = []
    for n, field, value in edits:
        sk = size_key(n)
        path = f"sizes.{sk}.{field}"
        if field not in RATIO_FIELDS:
            raise ConfigError(f"key {path!r}: field {field!r}; allowed: {list(RATIO_FIELDS)}")
        if not MIN_SIZE <= n <= current.max_size:
            raise ConfigError(
                f"key {path!r}: map size {n} outside [{MIN_SIZE}, max_size={current.max_size}]"
            )
        if 2 * current.num_agents > n * n:
            raise ConfigError(f"key {path!r}: {n}x{n} is too small for {current.num_agents} agents")
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"key {path!r} = {_show(value)} is not a number") from None
        if not is_finite_real(value):
            raise ConfigError(
                f"key {path!r} = {_show(value)}; allowed: a finite number that fits a float"
            )
        hi = MAX_HOLE_RATIO if field == "hole_ratio" else 1.0 if field == "wait_ratio" else math.inf
        clipped = min(max(float(value), 0.0), hi)
        if clipped != value:
            changes.append(f"{path}: {value!r} clipped to {clipped:g} (range [0, {hi}])")
        entry = new["sizes"].setdefault(
            sk, {"data_ratio": 0.0, "hole_ratio": 0.0, "wait_ratio": 0.0}
        )
        if sk not in current.sizes and field != "data_ratio" and "__new__" not in entry:
            entry["__new__"] = True
        entry[field] = clipped
    for sk, entry in list(new["sizes"].items()):
        if entry.pop("__new__", False):
            changes.append(f"sizes.{sk}: new size added")
    entries = list(new["sizes"].values())
    top = max(e["data_ratio"] for e in entries)
    # Divide by the largest ratio before summing: two ratios of 1e308 must not sum to inf.
    scaled = math.fsum(e["data_ratio"] / top for e in entries) if top > 0 else 0.0
    if top <= 0:
        for e in entries:
            e["data_ratio"] = 1.0 / len(entries)
        changes.append("data_ratio: all zero, reset to uniform")
    elif not math.isclose(scaled * top, 1.0, abs_tol=1e-9):
        for e in entries:
            e["data_ratio"] = e["data_ratio"] / top / scaled
        total = scaled * top
        if not math.isfinite(total):  # say the sum, even where a float cannot hold it
            total = decimal.Decimal(scaled) * decimal.Decimal(top)
        changes.append(f"data_ratio: renormalised from a sum of {total:.4g} to 1")
    out = ml_collections.ConfigDict(new)
    validate(out)
    return out, changes


def requested_counts(config: ml_collections.ConfigDict, n: int) -> dict[int, tuple[int, int]]:
    """Per size: (instances, of which needs-wait) for a request of `n`, by largest remainders."""
    sizes = sorted(key_size(k) for k in config.sizes)
    weights = [config.sizes[size_key(s)].data_ratio for s in sizes]
    counts = _largest_remainder(weights, n)
    return {
        s: (c, round(c * config.sizes[size_key(s)].wait_ratio))
        for s, c in zip(sizes, counts, strict=True)
    }


def _largest_remainder(weights: list[float], n: int) -> list[int]:
    total = sum(weights)
    exact = [w / total * n for w in weights]
    floors = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: exact[i] - floors[i], reverse=True)
    for i in order[: n - sum(floors)]:
        floors[i] += 1
    return floors
