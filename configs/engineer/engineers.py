"""Engineer settings, one entry of mapfjax.engineer.ENGINEERS per name; get_config("policy").

Functions (generate_fn, score_fn) are injected by the training loop, never configured.
"""

import ml_collections

ENGINEERS = {
    # The round-0 config throughout.
    "fixed": {},
    # Domain randomisation: data ~ Dirichlet(alpha), holes ~ U[0, 0.5], waits ~ U[0, 1].
    "random": {"alpha": 1.0},
    # Reasoning Gym's ladder: valid rate > high -> harder (else less data), < low -> easier.
    "rule": {"low": 0.3, "high": 0.7, "step": 0.05, "shift": 0.25, "min_rows": 1},
    # Sampling for learnability: data ~ p(1-p) with a floor per size; holes push p to target.
    "learnability": {"floor": 0.03, "target": 0.5, "band": 0.15, "hole_step": 0.05, "min_rows": 1},
    # Self-Evolving Curriculum: TD(0) values of mean |A| per size, data = softmax(Q / T).
    "bandit": {"step": 0.5, "temperature": 0.25, "initial": 0.0, "min_rows": 1},
    # [ours] every size's wait_ratio = the share of held-out failures on puzzles that need a wait.
    "wait": {"low": 0.1, "high": 0.9, "min_rows": 20},
    # base_url / model / api_key: empty = $OPENAI_BASE_URL / $OPENAI_MODEL / $OPENAI_API_KEY.
    "api": {
        "base_url": "",
        "model": "",
        "api_key": "",
        "max_retries": 3,
        "backoff": 1.0,
        "timeout": 120.0,
        "temperature": 0.7,
        "max_tokens": 4096,
        "max_edits": 6,
    },
    # policy = the current checkpoint, base = the initial one; same settings.
    "policy": {"mode": "free_then_constrained", "num_samples": 4, "max_edits": 6},
    "base": {"mode": "free_then_constrained", "num_samples": 4, "max_edits": 6},
}


def get_config(arg: str = "policy") -> ml_collections.ConfigDict:
    """Settings of one engineer; `name` selects the registry entry."""
    name = (arg or "policy").strip()
    if name not in ENGINEERS:
        raise ValueError(
            f"configs/engineer/engineers.py: engineer {name!r}; allowed: {sorted(ENGINEERS)}"
        )
    return ml_collections.ConfigDict({"name": name, **ENGINEERS[name]})
