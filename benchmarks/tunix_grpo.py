"""google-tunix's GRPO loss + AdamW step, timed in its own virtualenv (it pins its own jax and
flax) on a random Qwen3 of the shipped tiny model's shape and the same batch shape as
mapfjax's update, which is timed here on that batch too (`bench_grpo.py --tunix`)."""

from __future__ import annotations

import os
import sys
import time

# Runs inside google-tunix's own virtualenv (it pins its own jax/flax): tunix's Qwen3 of the
# same shape, tunix's registered "grpo" policy loss on the same kind of batch, jitted with the
# same AdamW update as ours, so both sides time forward + backward + update of one GRPO step.
_TUNIX_SCRIPT = r"""
import json, sys, time
import jax, jax.numpy as jnp, numpy as np, optax
from flax import nnx
from tunix.models.qwen3 import model as qm
from tunix.rl import algo_core, common
from tunix.rl.grpo.grpo_learner import GRPOConfig

o = json.loads(sys.argv[1])
cfg = qm.ModelConfig(
    num_layers=o["layers"], vocab_size=o["vocab"], embed_dim=o["hidden"],
    hidden_dim=3 * o["hidden"], num_heads=4, head_dim=o["hidden"] // 4, num_kv_heads=2,
    rope_theta=1_000_000, norm_eps=1e-6, use_tied_embedding=o["tied"],
)
model = qm.Qwen3(cfg, rngs=nnx.Rngs(0))
b = {k: jnp.asarray(np.asarray(v)) for k, v in np.load(o["batch"]).items()}
example = common.TrainExample(
    prompt_ids=b["prompt_ids"], prompt_mask=b["prompt_mask"],
    completion_ids=b["completion_ids"], completion_mask=b["completion_mask"],
    advantages=b["advantages"], ref_per_token_logps=None,
    old_per_token_logps=b["old_logps"],
)
algo = GRPOConfig(num_generations=o["group"], beta=0.0, loss_agg_mode="token-mean")
# tunix 0.1.7's loss reads algo_config.temperature, a field its GRPOConfig does not declare.
algo.temperature = 1.0
tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-6))
graphdef, params = nnx.split(model, nnx.Param)
opt_state = tx.init(params)

@jax.jit
def step(params, opt_state, example):
    def loss(p):
        out = algo_core.grpo_loss_fn(
            nnx.merge(graphdef, p), example, algo, pad_id=0, eos_id=o["vocab"] - 1
        )
        return out[0]
    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

t0 = time.perf_counter()
params, opt_state, v = step(params, opt_state, example); float(v)
first = time.perf_counter() - t0
times = []
for _ in range(o["steps"]):
    t0 = time.perf_counter()
    params, opt_state, v = step(params, opt_state, example); float(v)
    times.append(time.perf_counter() - t0)
print(json.dumps({"first_step_s": first, "best_step_s": min(times), "loss": float(v)}))
"""


def _tunix_python(opts) -> str:
    """The python of a virtualenv holding google-tunix, created on first use."""
    import subprocess

    venv = os.path.expanduser(opts.tunix_venv)
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        print(f"creating {venv} with google-tunix (one-off)...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", "google-tunix"], check=True)
    return python


def _run_tunix(opts, shape, batch) -> dict:
    """Times google-tunix's GRPO loss + AdamW step on the same model shape and batch."""
    import json
    import subprocess
    import tempfile

    import numpy as np

    P = batch.prompt_len
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "batch.npz")
        np.savez(
            path,
            prompt_ids=np.where(batch.attention_mask[:, :P], batch.tokens[:, :P], 0),
            prompt_mask=batch.attention_mask[:, :P].astype(np.int32),
            completion_ids=np.where(batch.loss_mask, batch.tokens[:, P:], 0),
            completion_mask=batch.loss_mask.astype(np.int32),
            advantages=batch.advantages,
            old_logps=batch.old_logprobs,
        )
        args = dict(**shape, group=opts.group, tied=True, steps=opts.steps, batch=path)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        out = subprocess.run(
            [_tunix_python(opts), "-c", _TUNIX_SCRIPT, json.dumps(args)],
            capture_output=True,
            text=True,
            env=env,
        )
    if out.returncode:
        raise RuntimeError(f"tunix benchmark failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(opts, ours: dict) -> None:
    """Times mapfjax's update and tunix's on one random batch of the benchmark's shape:
    opts.prompts prompts of the mean measured prompt length x opts.group completions of
    opts.new_tokens tokens (tunix has no shared-prefix layout: each row carries its prompt)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from mapfjax.models.qwen3 import Qwen3, Qwen3Config
    from mapfjax.rl.batch import make_batch
    from mapfjax.rl.grpo import GRPOConfig
    from mapfjax.rl.trainer import OptimConfig, Trainer

    shape = dict(layers=12, vocab=692, hidden=128)
    rng = np.random.default_rng(0)
    prompts, comps = [], []
    for _ in range(opts.prompts):
        prompt = list(rng.integers(1, shape["vocab"], 200))
        for _ in range(opts.group):
            prompts.append(prompt)
            comps.append(list(rng.integers(1, shape["vocab"], rng.integers(8, 32))))
    old = [list(rng.normal(-6.5, 0.1, len(c))) for c in comps]
    adv = rng.normal(size=len(comps))
    batch = make_batch(prompts, comps, 0, "pow2_mid", "pow2", old, adv, group_size=opts.group)
    flat = make_batch(prompts, comps, 0, "pow2_mid", "pow2", old, adv, shared_prefix=False)
    cfg = Qwen3Config(
        vocab_size=shape["vocab"], hidden_size=128, intermediate_size=384, num_layers=12,
        num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=1e4,
    )  # fmt: skip
    trainer = Trainer(
        Qwen3(cfg, dtype=jnp.float32, param_dtype=jnp.float32),
        OptimConfig(lr=1e-6),
        "grpo",
        loss_cfg=GRPOConfig(group_size=opts.group),
    )
    placed = trainer.place_batch(batch)
    trainer.step(placed)
    best = np.inf
    for _ in range(opts.steps):
        t0 = time.perf_counter()
        trainer.step(placed)
        best = min(best, time.perf_counter() - t0)
    jax.clear_caches()
    tunix = _run_tunix(opts, shape, flat)
    print(
        f"update on a random batch ({len(comps)} rows, 200-token prompts, 8-31-token "
        f"completions): mapfjax {best:.2f} s, tunix {tunix['best_step_s']:.2f} s "
        f"(tunix / mapfjax = {tunix['best_step_s'] / best:.2f}x)"
    )
