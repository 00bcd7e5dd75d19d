"""Throughput of the jitted verifier vs the plain-Python simulator, and of the generator.

    python benchmarks/bench_env.py [--batch 4096] [--agents 5] [--steps 32] [--size 10]

Verifies the same plans (B x 5 agents x 32 steps on 10x10) with both and prints the ratio, for
uniformly random action codes (most fail at once) and for legal random walks (plans run long
and fail through conflicts, like real answers); then labelled 2-agent instances per second.
"""

import argparse
import time

import jax
import numpy as np

from mapfjax.env import config, dynamics, generator, simulate, types


def random_problems(rng, b, k, size):
    out = []
    for i in range(b):
        cells = rng.permutation(size * size)
        holes = set(cells[2 * k : 2 * k + size * size // 10].tolist())
        grid = tuple(
            "".join("H" if r * size + c in holes else "F" for c in range(size)) for r in range(size)
        )
        starts = tuple(divmod(int(c), size) for c in cells[:k])
        goals = tuple(divmod(int(c), size) for c in cells[k : 2 * k])
        out.append(types.Problem(f"b{i}", grid, starts, goals))
    return out


def make_plans(rng, probs, steps, walks):
    """int32 [B, K, T]: random codes, or per-agent random walks that stay on frozen cells."""
    k = probs[0].num_agents
    if not walks:
        return rng.integers(0, 5, (len(probs), k, steps)).astype(np.int32)
    out = np.zeros((len(probs), k, steps), np.int32)
    d = types.ACTION_DELTAS
    for b, p in enumerate(probs):
        for i in range(k):
            r, c = p.starts[i]
            for t in range(steps):
                legal = [
                    a
                    for a in range(5)
                    if 0 <= r + d[a][0] < p.height
                    and 0 <= c + d[a][1] < p.width
                    and p.grid[r + d[a][0]][c + d[a][1]] == "F"
                ]
                a = legal[rng.integers(len(legal))]
                out[b, i, t] = a
                r, c = r + d[a][0], c + d[a][1]
    return out


def bench_verify(kind, probs, inst, plans, rounds=7, calls=10):
    """Plans/s of both verifiers; rounds alternate the two so that load from other processes
    hits both alike, and the medians over rounds are compared."""
    rows = dynamics.verdict_rows(dynamics.verify(inst, plans))  # also compiles
    mix: dict = {}
    for r in rows:
        mix[r["failure"] or "valid"] = mix.get(r["failure"] or "valid", 0) + 1
    m = min(len(probs), 1024)
    lists = plans[:m].tolist()
    jit_rates, py_rates = [], []
    for _ in range(rounds):
        for _ in range(calls):
            t0 = time.perf_counter()
            jax.block_until_ready(dynamics.verify(inst, plans))
            jit_rates.append(len(probs) / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for p, pl in zip(probs[:m], lists, strict=True):
            simulate.simulate(p, pl)
        py_rates.append(m / (time.perf_counter() - t0))
    jit_rate, py_rate = np.median(jit_rates), np.median(py_rates)
    b, k, t = plans.shape
    print(f"verify, {kind}: batch {b}, {k} agents, {t} steps, outcomes {dict(sorted(mix.items()))}")
    print(f"  jitted verify    : {jit_rate:12,.0f} plans/s (median; best {max(jit_rates):,.0f})")
    print(f"  plain-Python sim : {py_rate:12,.0f} plans/s (median; best {max(py_rates):,.0f})")
    print(f"  ratio            : {jit_rate / py_rate:12.1f}x (of the medians)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--agents", type=int, default=5)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--size", type=int, default=10)
    ap.add_argument("--generate", type=int, default=4000)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    probs = random_problems(rng, a.batch, a.agents, a.size)
    inst = jax.device_put(types.to_instances(probs))
    for kind in ("random codes", "legal walks"):
        plans = make_plans(rng, probs, a.steps, walks=kind == "legal walks")
        bench_verify(kind, probs, inst, plans)
    cfg = config.default_config()
    generator.generate(jax.random.key(1), cfg, 64)  # compile
    t0 = time.perf_counter()
    out = generator.generate(jax.random.key(0), cfg, a.generate)
    dt = time.perf_counter() - t0
    print(
        f"generate: {a.generate} labelled 2-agent instances (3x3..10x10) in {dt:.1f} s "
        f"= {a.generate / dt:,.0f} inst/s"
    )
    print(out.report.table())


if __name__ == "__main__":
    main()
