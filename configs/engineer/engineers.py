"""Engineer settings, one entry of mapfjax.engineer.ENGINEERS per name; get_config("policy").

Functions (generate_fn, score_fn) are injected by the training loop, never configured.
"""

import ml_collections

ENGINEERS = {
    "fixed": {},
    "random": {"num_edits": 1, "steps": (0.05, 0.1)},
    "rule": {"low": 0.3, "high": 0.8, "step": 0.05, "shift": 0.25, "min_rows": 1},
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
