"""Per-instance solve time of the exact oracle on uniformly random solvable-looking instances.

    python benchmarks/bench_oracle.py [--n 200] [--time-limit 10] [--seed 0]
    python benchmarks/bench_oracle.py --cells 2x10x0.2 5x6x0.3 --n 100

A cell is AGENTSxSIZExHOLE_RATIO. Instances whose goals are unreachable are redrawn (callers
filter those cheaply); the rest are solved one at a time in this process. Prints, per cell, the
outcome counts (status/method), the share needing a wait, and time statistics in milliseconds.
"""

import argparse
import collections
import random
import statistics
import time

from mapfjax.env import oracle
from mapfjax.env.types import Problem

DEFAULT_CELLS = (
    "2x10x0.2",
    "3x10x0.2",
    "4x10x0.2",
    "5x10x0.2",
    "5x7x0.3",
    "5x6x0.3",
    "5x5x0.3",
)


def random_problem(rng: random.Random, k: int, size: int, hole_ratio: float, pid: str) -> Problem:
    """Holes at round(hole_ratio * size^2) random cells; distinct random starts and goals."""
    while True:
        cells = [(r, c) for r in range(size) for c in range(size)]
        holes = set(rng.sample(cells, round(hole_ratio * size * size)))
        free = [x for x in cells if x not in holes]
        grid = tuple(
            "".join("H" if (r, c) in holes else "F" for c in range(size)) for r in range(size)
        )
        p = Problem(pid, grid, tuple(rng.sample(free, k)), tuple(rng.sample(free, k)))
        try:
            oracle.shortest_path_lengths(p)
            return p
        except ValueError:
            continue


def bench_cell(cell: str, n: int, time_limit: float, seed: int) -> str:
    k, size, hole_ratio = cell.split("x")
    k, size, hole_ratio = int(k), int(size), float(hole_ratio)
    rng = random.Random(f"{seed}-{cell}")
    problems = [random_problem(rng, k, size, hole_ratio, f"{cell}_{i}") for i in range(n)]
    outcomes = collections.Counter()
    times, waits = [], 0
    t0 = time.perf_counter()
    for p in problems:
        sol = oracle.solve(p, time_limit=time_limit)
        outcomes[f"{sol.status}/{sol.method}"] += 1
        times.append(sol.seconds * 1e3)
        if sol.optimal:
            waits += sol.soc > sum(oracle.shortest_path_lengths(p))
    wall = time.perf_counter() - t0
    q = statistics.quantiles(times, n=100, method="inclusive") if len(times) > 1 else times * 99
    return (
        f"| {k} | {size}x{size} | {hole_ratio:.1f} | {n} | {waits / n:.2f} | "
        f"{statistics.mean(times):.1f} | {statistics.median(times):.2f} | {q[89]:.1f} | "
        f"{q[98]:.0f} | {max(times):.0f} | {wall:.1f} | "
        + ", ".join(f"{key} {v}" for key, v in sorted(outcomes.items()))
        + " |"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", nargs="+", default=list(DEFAULT_CELLS))
    ap.add_argument("--n", type=int, default=200, help="instances per cell")
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds per instance")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(
        "| agents | map | holes | n | needs wait | mean ms | median ms | p90 ms | p99 ms | "
        "max ms | total s | outcomes |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    for cell in args.cells:
        print(bench_cell(cell, args.n, args.time_limit, args.seed), flush=True)


if __name__ == "__main__":
    main()
