"""The engineer prompt: role, task, allowed keys and ranges, the context, and the answer schema."""

from __future__ import annotations

import ml_collections

from mapfjax.engineer.proposal import MAX_EDITS, Edit, format_diff
from mapfjax.env.config import MAX_HOLE_RATIO, key_size

ROLE = (
    "You are the environment engineer of a reinforcement-learning run. A language model is "
    "being trained with GRPO to solve MAPF-FrozenLake puzzles (several agents move on an NxN "
    "frozen lake with holes and must reach their goals without collisions). After every round "
    "you choose the distribution of the next round's training puzzles."
)


def allowed_keys_text(current: ml_collections.ConfigDict, max_edits: int = MAX_EDITS) -> str:
    """The rules of the diff, generated from the environment config's limits."""
    sizes = sorted(current.sizes, key=key_size)
    low = max(3, min(n for n in range(3, current.max_size + 1) if n * n >= 2 * current.num_agents))
    return "\n".join(
        [
            f"- Keys: `sizes.s<N>.<field>`; current sizes: {', '.join(sizes)}; "
            f"N may be any map size from {low} to {current.max_size}.",
            "- `data_ratio` >= 0: share of the round's puzzles at that size. Values you set "
            "are kept; the sizes you do not mention are scaled so that all shares sum to 1. "
            "You may move the data wholesale: all data_ratio lines together count as one edit.",
            f"- `hole_ratio` in [0, {MAX_HOLE_RATIO}]: share of the map's cells that are holes.",
            "- `wait_ratio` in [0, 1]: share of that size's puzzles in which some agent must "
            "wait (the agents' shortest paths conflict).",
            f"- Values must be plain numbers. At most {max_edits} edits (each hole_ratio or "
            "wait_ratio line is one): small local edits. "
            "Out-of-range values are clipped. Only the puzzle distribution can change: not the "
            "reward, the validation set or the number of agents.",
        ]
    )


def build_prompt(
    context: str, current: ml_collections.ConfigDict, max_edits: int = MAX_EDITS
) -> str:
    """The whole engineer prompt around a context from `build_context`."""
    example = format_diff(
        (Edit(6, "data_ratio", 0.15), Edit(6, "wait_ratio", 0.4)),
        "6x6 has a learnable valid rate, so give it more data and a few more waits.",
    )
    return "\n\n".join(
        [
            ROLE,
            "# Task\nPropose the next round's generator config as a diff against the current "
            "config: only the keys you change. Base every edit on the evidence below.",
            "# Allowed keys\n" + allowed_keys_text(current, max_edits),
            "# Context\n" + context.strip(),
            "# Answer format\nReply with one fenced yaml block of `key: value` lines, then "
            "one line starting with `Summary:` that explains your choice in one paragraph "
            "(you will read it next round). Example:\n\n" + example,
        ]
    )
