"""Engineer context variants V1..V6 (docs/paper.md section 4), read cumulatively [ours]: V1 F;
V2 +G; V3 +H with the round-0 default; V4 H without it; V5 +S; V6 +T bookkeeping (the paper's
setting). V6_wait [ours]: V6 whose F also splits the validation by whether a puzzle needs a wait.
Use: --config=configs/engineer/variants.py:V6 --config.modules.T.detail=full (or V6_full_T)."""

import os

import ml_collections

# realpath: loaded as configs/engineer/variants.py or through its link mapfjax/presets/variants.py,
# the guideline path is the same (run configs compare it); in a wheel it is the packaged copy.
GUIDELINE = os.path.join(os.path.dirname(os.path.realpath(__file__)), "guideline.md")


def modules(
    g: bool = False,
    h: bool = False,
    include_default: bool = False,
    s: bool = False,
    t: bool = False,
    detail: str = "bookkeeping",
    wait_split: bool = False,
) -> ml_collections.ConfigDict:
    """A modules config; F (the failure breakdown) is on in every variant. F's wait_split key
    is written only when set, so the paper's variants' configs are as they were."""
    return ml_collections.ConfigDict(
        {
            "F": {"enabled": True, **({"wait_split": True} if wait_split else {})},
            "G": {"enabled": g, "path": GUIDELINE, "text": ""},
            # max_rounds = 0: show every earlier round.
            "H": {"enabled": h, "include_default": include_default, "max_rounds": 0},
            "S": {"enabled": s},
            "T": {"enabled": t, "detail": detail},
        }
    )


VARIANTS = {
    "V1": dict(),
    "V2": dict(g=True),
    "V3": dict(g=True, h=True, include_default=True),
    "V4": dict(g=True, h=True),
    "V5": dict(g=True, h=True, s=True),
    "V6": dict(g=True, h=True, s=True, t=True),
    "V6_full_T": dict(g=True, h=True, s=True, t=True, detail="full"),
    "V6_wait": dict(g=True, h=True, s=True, t=True, wait_split=True),
}


def get_config(arg: str = "V6") -> ml_collections.ConfigDict:
    """The engineer's context config for one variant name (a key of VARIANTS)."""
    name = (arg or "V6").strip()
    if name not in VARIANTS:
        raise ValueError(
            f"configs/engineer/variants.py: variant {name!r}; allowed: {sorted(VARIANTS)}"
        )
    return ml_collections.ConfigDict({"variant": name, "modules": modules(**VARIANTS[name])})
