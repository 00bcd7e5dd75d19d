"""The go / no-go gate for a starting policy (`projects/go_no_go/go_no_go.py`): does GRPO from
it raise held-out greedy valid, and does what it trains on matter?

Read from two run directories of `launch/train.py` that start from the same policy and are
validated on the same held-out puzzles: one trained on the held-out distribution ("matched"),
one on a mismatched one (e.g. 3x3 maps only). The criteria (all must hold):

- the starting policy parses on at least `min_parse` of the held-out puzzles (a gain is then
  solving, not format);
- the matched run's last validation beats the start by at least `min_gain` (paired, same
  puzzles), with the 95 % interval above 0;
- the matched and mismatched runs differ, paired, with an interval that excludes 0.

A reference model validated on the same puzzles (a third run directory's start, e.g. the
shipped model's) is reported beside them, not gated.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from mapfjax import stats
from mapfjax.env.score import DEFAULT_REWARD
from mapfjax.eval.report import (
    mixed_groups,
    paired_change,
    training_curves,
    valid_by_id,
    validation_rows,
    window_shares,
)
from mapfjax.eval.report import start_rows as start_of
from mapfjax.rl.driver import drawn_per_step

PARSE_ERROR = "parse_error"


@dataclasses.dataclass(frozen=True)
class Criterion:
    name: str
    measured: str  # the figure, with its 95 % interval
    required: str
    passed: bool


def _parse_rate(rows: list[dict]) -> stats.Estimate:
    """Share of validation rows whose answer parsed."""
    return stats.proportion([r.get("failure") != PARSE_ERROR for r in rows])


def start_and_end(workdir: pathlib.Path) -> tuple[list[dict], list[dict]]:
    """The validation rows of a run's start and of its last finished round; ValueError when it
    has no finished round."""
    found = validation_rows(workdir)
    start = start_of(found, workdir)
    if len(found) < 2:
        raise ValueError(f"{workdir}: no finished round with a validation.json")
    return start, found[-1][1]


def grpo_minutes(curve) -> float:
    """The logged wall time of a run's GRPO updates (`training_curves`), in minutes."""
    return sum(r.get("seconds", 0.0) for _, r in curve) / 60


def evaluate(
    matched,
    mismatched,
    reference=None,
    min_gain: float = 0.05,
    min_parse: float = 0.95,
    budget_minutes: float | None = None,
) -> tuple[list[Criterion], list[list[str]], list[str]]:
    """(the criteria, table rows [model, greedy valid %, vs start], notes) for the two runs
    (and a reference run directory whose *start* validation is the reference model).
    budget_minutes: the matched arm's logged GRPO time (every round's `seconds`) must not
    pass it, a criterion after the gain's (None: not gated, as the gate's first verdicts). Raises
    ValueError, naming the directories, when the runs start from different policies or were
    validated on different puzzles. mismatched None: that arm was not run (`go_no_go.py
    --mismatched_when gain` after a matched arm that misses the first two criteria); its
    criterion then fails as "not run"."""
    matched = pathlib.Path(matched)
    start_rows, end_rows = start_and_end(matched)
    base, end = valid_by_id(start_rows), valid_by_id(end_rows)
    if set(end) != set(base):
        raise ValueError(f"{matched} was validated on other puzzles than {matched}/start")
    other_end = None
    if mismatched is not None:
        mismatched = pathlib.Path(mismatched)
        other_start_rows, other_end_rows = start_and_end(mismatched)
        other_start, other_end = valid_by_id(other_start_rows), valid_by_id(other_end_rows)
        if set(other_start) != set(base) or set(other_end) != set(base):
            raise ValueError(f"{mismatched} was validated on other puzzles than {matched}/start")
        if other_start != base:
            raise ValueError(f"{matched} and {mismatched} do not start from the same policy")
    parsed = _parse_rate(start_rows)
    gain = paired_change(end, base)
    apart = None if other_end is None else paired_change(end, other_end)
    pct = lambda x: f"{100 * x:g} %"
    criteria = [
        Criterion(
            "starting policy parses", stats.interval_text(parsed), f">= {pct(min_parse)}",
            parsed.value >= min_parse,
        ),
        Criterion(
            "matched GRPO vs start (paired, points)", stats.interval_text(gain, signed=True),
            f">= +{100 * min_gain:g}, interval above 0", gain.value >= min_gain and gain.low > 0,
        ),
    ]  # fmt: skip
    if budget_minutes is not None:
        minutes = grpo_minutes(training_curves(matched))
        criteria.append(
            Criterion(
                "matched GRPO wall time (minutes)", f"{minutes:.1f}",
                f"<= {budget_minutes:g}", minutes <= budget_minutes,
            )
        )  # fmt: skip
    criteria += [
        Criterion(
            "matched vs mismatched (paired, points)",
            "not run" if apart is None else stats.interval_text(apart, signed=True),
            "interval excludes 0", apart is not None and (apart.low > 0 or apart.high < 0),
        ),
    ]  # fmt: skip
    notes: list[str] = []
    rate = lambda by_id: stats.interval_text(stats.proportion(list(by_id.values())))
    vs_start = lambda by_id: stats.interval_text(paired_change(by_id, base), signed=True)
    rows = [
        ["start", rate(base), "-"],
        [f"GRPO, matched ({matched.name})", rate(end), vs_start(end)],
    ]
    if other_end is not None:
        rows.append([f"GRPO, mismatched ({mismatched.name})", rate(other_end), vs_start(other_end)])
    else:
        notes.append("The mismatched arm was not run: the matched arm misses the gate before it.")
    if reference is not None:
        ref = valid_by_id(start_of(validation_rows(pathlib.Path(reference)), reference))
        if set(ref) != set(base):
            raise ValueError(
                f"{reference}/start was validated on other puzzles than {matched} (a run on a "
                "fresh held-out draw has no reference: leave it out)"
            )
        rows.append([f"reference ({pathlib.Path(reference).name} start)", rate(ref), vs_start(ref)])
        vs_ref = stats.interval_text(paired_change(end, ref), signed=True)
        notes.append(f"Matched GRPO against the reference, paired: {vs_ref} points (not gated).")
    return criteria, rows, notes


def markdown(criteria: list[Criterion], rows: list[list[str]], notes: list[str], n: int) -> str:
    """The verdict: GO when every criterion holds, then the criteria and the rates table."""
    go = all(c.passed for c in criteria)
    lines = [f"**{'GO' if go else 'NO-GO'}** ({n} held-out puzzles, greedy; 95 % intervals)", ""]
    lines.append(
        stats.markdown_table(
            ["criterion", "measured", "required", "holds"],
            [[c.name, c.measured, c.required, "yes" if c.passed else "no"] for c in criteria],
        )
    )
    lines += ["", stats.markdown_table(["model", "greedy valid %", "vs start (points)"], rows)]
    lines += ["", *notes] if notes else []
    return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True)
class Arm:
    """One GRPO arm of a gate run (`<results>/<name>/<arm>`), measured on its held-out set."""

    name: str  # e.g. "trace_grid6000_kl0.1/matched"
    policy: str  # the starting policy's directory name
    settings: str  # what differs between arms: lr, KL, reward, trace_loss, training wait ratio
    updates: int  # GRPO updates logged
    minutes: float  # their wall time
    start: stats.Estimate  # greedy valid of the starting policy
    end: stats.Estimate  # after the last round
    change: stats.Estimate  # end - start, paired
    parses: stats.Estimate  # share of the start's answers that parse
    # of the sampled groups whose rewards differ, the share with every sample valid (only the
    # optimal bonus sets them apart; `report.reward_signal`); None when no group was logged
    bonus_only: float | None = None
    held_out: int = 0  # which held-out set (numbered by first use in name order) it ran on
    draw: int | None = None  # that set's validation seed: its name that new arms do not change
    # mean@G of the training rollouts (each sampled group's valid share; fresh puzzles each
    # update) over the first and the last w updates, w as in the arm's report.md
    # (`report.window_shares`): (first, last, w); None when no group outcome was logged
    rollouts: tuple[float, float, int] | None = None


def _policy_name(path: str) -> str:
    """A starting policy's directory name, with its parent's when the name alone says nothing
    (a recipe's default `export`)."""
    p = pathlib.Path(path)
    return f"{p.parent.name}/{p.name}" if p.name == "export" else p.name


def _settings(config: dict) -> str:
    grpo, train = config.get("grpo", {}), config.get("train", {})
    # What an arm changed in its phases: `phase_hooks` (hooks.py), train keys in older records.
    hooks = {**train, **config.get("phase_hooks", {})}
    sizes = config.get("env", {}).get("sizes", {})
    used = {k: v for k, v in sizes.items() if v.get("data_ratio", 1.0) > 0}
    waits = sorted({v.get("wait_ratio") for v in used.values()})
    lr = config.get("optim", {}).get("lr")
    parts = {"rft": ["RFT"], "placebo": ["placebo"]}.get(train.get("objective"), [])
    parts += ["placebo"] if hooks.get("placebo") and not parts else []
    if not isinstance(lr, (int, float)):
        parts += ["lr ?"]
    else:  # Adam's 1e-4 as such; the momentum optimiser's 0.93 in two digits
        parts += [f"lr {lr:.0e}".replace("e-0", "e-") if lr < 0.01 else f"lr {lr:.2g}"]
    optimizer = config.get("optim", {}).get("optimizer", "adamw")  # older records: adamw
    parts += [f"{optimizer} optimiser"] if optimizer != "adamw" else []
    rank = config.get("optim", {}).get("lora_rank", 0)
    parts += [f"LoRA rank {rank}, alpha {config['optim'].get('lora_alpha', 32):g}"] if rank else []
    parts += [f"KL {grpo['kl_coef']:g}"] if grpo.get("kl_coef") else []
    temperature = train.get("temperature", 1.0)
    parts += [f"temperature {temperature:g}"] if temperature != 1.0 else []
    top_p = train.get("top_p", 1.0)
    parts += [f"top_p {top_p:g}"] if top_p != 1.0 else []
    parts += [f"screen {hooks['screen']:g}"] if hooks.get("screen") else []
    parts += ["greedy member"] if hooks.get("greedy_member") else []
    groups = train.get("problems_per_step", 8)
    parts += [f"{groups} groups per update"] if groups != 8 else []
    steps, drawn = train.get("steps"), drawn_per_step(train.get("oversample", 1.0), groups)
    parts += ["each puzzle once"] if steps and train.get("instances", 0) >= steps * drawn else []
    default = DEFAULT_REWARD.optimal_bonus  # older records have no reward block
    bonus = config.get("reward", {}).get("optimal_bonus", default)
    parts += [f"optimal bonus {bonus:g}"] if bonus != default else []
    parts += [f"seed {config['seed']}"] if config.get("seed", 0) else []
    parts += [f"trains {train.get('trace_loss', 'all')}"]
    parts += [f"wait ratio {'/'.join(f'{w:g}' for w in waits)}"] if waits else []
    ns = sorted(int(k[1:]) for k in used)
    if ns:
        lo, hi = ns[0], ns[-1]
        parts.append(f"{lo}x{lo} only" if lo == hi else f"{lo}x{lo}-{hi}x{hi}")
    return ", ".join(parts)


def arms(results) -> list[Arm]:
    """Every finished arm under `results` (directories `<name>/<arm>` holding run_config.json,
    start/ and a finished round), sorted by name. Arms validated on different puzzles (another
    validation seed, or other puzzle ids) get different `held_out` numbers, in order of first
    use: their changes are comparable within a set only. Raises ValueError when none is found."""
    results = pathlib.Path(results)
    out, sets = [], {}  # (validation seed, puzzle ids) -> the set's number
    for config_path in sorted(results.glob("*/*/run_config.json")):
        workdir = config_path.parent
        found = validation_rows(workdir)
        if len(found) < 2:
            continue  # stopped before its first round finished
        start_rows = start_of(found, workdir)
        start, end = valid_by_id(start_rows), valid_by_id(found[-1][1])
        try:
            config = json.loads(config_path.read_text())
        except ValueError as e:
            raise ValueError(f"{config_path}: not readable as JSON ({e})") from None
        seed = config.get("validation", {}).get("seed")
        held_out = sets.setdefault((seed, frozenset(start)), len(sets))
        curve = training_curves(workdir)
        group_size = config.get("train", {}).get("group_size", 8)
        _, mixed, every, _ = mixed_groups(curve, group_size)
        out.append(
            Arm(
                name=f"{workdir.parent.name}/{workdir.name}",
                policy=_policy_name(config.get("model", {}).get("path", "?")),
                settings=_settings(config),
                updates=len(curve),
                minutes=grpo_minutes(curve),
                start=stats.proportion(list(start.values())),
                end=stats.proportion(list(end.values())),
                change=paired_change(end, start),
                parses=_parse_rate(start_rows),
                bonus_only=every / mixed if mixed else None,
                held_out=held_out,
                draw=seed,
                rollouts=_rollouts(curve, group_size),
            )
        )
    if not out:
        raise ValueError(f"{results}: no finished arm (<name>/<arm>/run_config.json, start, round)")
    return out


def _rollouts(curve, group_size: int) -> tuple[float, float, int] | None:
    w, first, last = window_shares(curve, group_size)  # both empty for an empty curve
    if not first or not last:
        return None
    return sum(first) / len(first), sum(last) / len(last), w


def _draw_name(arm: Arm) -> list[str]:
    """['draw <validation seed>'], the name of the arm's held-out set; [] when its config has
    no validation seed."""
    return [] if arm.draw is None else [f"draw {arm.draw}"]


def _rollouts_text(rollouts) -> str:
    if rollouts is None:
        return "-"
    first, last, w = rollouts
    return f"{100 * first:.1f} -> {100 * last:.1f} (w={w})"


def arms_markdown(found: list[Arm], min_gain: float = 0.05, budget_minutes: float = 30.0) -> str:
    """The arms as one table per held-out set: start, settings, start and end rates, the
    paired change, the training rollouts' sampled valid share over the first and the last
    updates (`Arm.rollouts`), the share of the gradient's groups that every sample solved (told
    apart by the bonus alone), and the gate's two criteria apart: the gain, and the updates'
    wall time within the budget."""
    header = ["arm", "start", "settings", "updates", "start parses %", "start valid %"]
    header += ["end valid %"]
    header += ["change (points, paired)", "training rollouts mean@G %, first -> last w updates"]
    header += ["groups apart only by the optimal bonus %"]
    header += [f"gain >= {100 * min_gain:g}, interval > 0", f"updates <= {budget_minutes:g} min"]
    sets = sorted({a.held_out for a in found})
    blocks = []
    for k in sets:
        arms_k = [a for a in found if a.held_out == k]
        rows = [
            [
                a.name, a.policy, a.settings, f"{a.updates} ({a.minutes:.1f} min)",
                stats.interval_text(a.parses),
                stats.interval_text(a.start), stats.interval_text(a.end),
                stats.interval_text(a.change, signed=True),
                _rollouts_text(a.rollouts),
                "-" if a.bonus_only is None else f"{100 * a.bonus_only:.0f}",
                "yes" if a.change.value >= min_gain and a.change.low > 0 else "no",
                "yes" if a.minutes <= budget_minutes else "no",
            ]
            for a in arms_k
        ]  # fmt: skip
        n, draw = arms_k[0].start.n, _draw_name(arms_k[0])
        if len(sets) == 1:
            title = ", ".join([f"Greedy valid on the same {n} held-out puzzles", *draw])
            title += ", 95 % intervals."
        else:
            what = ", ".join([*draw, f"{n} puzzles", f"first used by `{arms_k[0].name}`"])
            title = (
                f"Held-out set {k + 1} ({what}): greedy valid, 95 % intervals; changes are "
                "paired within the set, not across sets."
            )
        blocks.append(f"{title}\n\n" + stats.markdown_table(header, rows) + "\n")
    return "\n".join(blocks)


def pooled_change(workdirs, needs_wait: bool | None = None) -> stats.Estimate:
    """The paired change of greedy valid from start to last round over several arms' puzzles
    together (`workdirs`: run directories, each with its own held-out puzzles): every puzzle of
    every arm is one pair, so the interval is that of the pooled pairs. A puzzle id that comes
    twice (two arms on one draw) counts twice; its two pairs are not independent, so pool arms
    on different draws. needs_wait: only the puzzles that need a wait (True) or need none
    (False), by the start's `needs_wait` labels. Raises ValueError when an arm's start and end
    cover other puzzles, or a start row has no label and one is asked for."""
    ends, starts = [], []
    for workdir in workdirs:
        start_rows, end_rows = start_and_end(pathlib.Path(workdir))
        start, end = valid_by_id(start_rows), valid_by_id(end_rows)
        if set(start) != set(end):
            raise ValueError(f"{workdir}: the start and the last round cover other puzzles")
        if needs_wait is not None:
            labels = {r["id"]: r.get("needs_wait") for r in start_rows}
            if None in labels.values():
                raise ValueError(f"{workdir}: a start row has no needs_wait label")
            start = {i: v for i, v in start.items() if labels[i] == needs_wait}
        ids = sorted(start)
        ends += [end[i] for i in ids]
        starts += [start[i] for i in ids]
    if not ends:
        raise ValueError("nothing to pool: no arm given, or no puzzle of the kind asked for")
    return stats.paired_proportion_difference(ends, starts)


def truncated_ids(*row_lists) -> list[str]:
    """The puzzle ids whose answer ran out of the token budget in any of these validation
    rows (`truncated`), sorted."""
    return sorted({r["id"] for rows in row_lists for r in rows if r.get("truncated")})


def with_redone(rows, redone: dict[str, bool]) -> dict[str, bool]:
    """id -> greedy valid from validation `rows`, with the puzzles answered again (`redone`:
    id -> valid, e.g. at a larger budget) replaced. Raises ValueError for a redone id the rows
    do not hold."""
    out = valid_by_id(rows)
    unknown = sorted(set(redone) - set(out))
    if unknown:
        raise ValueError(f"answered again but not in the validation rows: {unknown[:5]}")
    return {**out, **redone}


def parse_pools(specs, results) -> list[tuple[str, list[pathlib.Path]]]:
    """`NAME=ARM,ARM,...` strings (ARM: `<name>/<arm>` under `results`, as arms.md names them)
    -> (NAME, run directories); each directory must exist. Raises ValueError naming the bad
    spec or arm."""
    out = []
    for spec in specs:
        name, sep, arms_text = spec.partition("=")
        names = [a.strip() for a in arms_text.split(",") if a.strip()]
        if not sep or not name.strip() or not names:
            raise ValueError(f"pool {spec!r}: expected NAME=ARM,ARM,... (ARM as in arms.md)")
        dirs = [pathlib.Path(results) / a for a in names]
        for a, d in zip(names, dirs, strict=True):
            if not (d / "run_config.json").is_file():
                raise ValueError(f"pool {name.strip()!r}: arm {a!r} has no {d}/run_config.json")
        out.append((name.strip(), dirs))
    return out


def pooled_markdown(pools: list[tuple[str, list[pathlib.Path]]]) -> str:
    """One row per arm of every pool, then the pool's pooled change (`pooled_change`): on all
    its puzzles, on those that need a wait and on those that need none."""
    rows = []

    def cells(dirs) -> list[str]:
        out = []
        for kind in (None, True, False):
            e = pooled_change(dirs, kind)
            out += [str(e.n), stats.interval_text(e, True)]
        return out

    for name, dirs in pools:
        rows += [[name, f"{d.parent.name}/{d.name}", *cells([d])] for d in dirs]
        pooled = [f"**{c}**" if k % 2 else c for k, c in enumerate(cells(dirs))]
        arms = f"{len(dirs)} arm" + ("s" if len(dirs) > 1 else "")
        rows.append([f"**{name}, pooled**", arms, *pooled])
    header = ["pool", "arm", "pairs", "change (points, paired, 95 %)"]
    header += ["needs a wait: pairs", "change", "needs none: pairs", "change"]
    title = "Greedy valid, last round against the start, each puzzle of each arm one pair."
    return f"{title}\n\n" + stats.markdown_table(header, rows) + "\n"


def plot_arms(found: list[Arm], path, min_gain: float = 0.05) -> None:
    """A forest plot of the arms' paired changes with their intervals, the gate's bar and 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mapfjax.eval.report import save_png

    ys = list(range(len(found)))[::-1]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(found) + 1.4))
    for y, a in zip(ys, found, strict=True):
        color = "tab:green" if a.change.low > 0 else "tab:red" if a.change.high < 0 else "tab:gray"
        lo, hi = 100 * (a.change.value - a.change.low), 100 * (a.change.high - a.change.value)
        ax.errorbar(100 * a.change.value, y, xerr=[[lo], [hi]], fmt="o", color=color, capsize=3)
    ax.axvline(0, color="black", lw=0.8)
    gate_label = f"gate: +{100 * min_gain:g} points"
    ax.axvline(100 * min_gain, color="tab:green", ls="--", lw=0.8, label=gate_label)
    several = len({a.held_out for a in found}) > 1  # then each label names its held-out set

    def label(a: Arm) -> str:
        what = f"{a.policy}: {a.settings}, {a.updates} updates"
        name = ", ".join([f"set {a.held_out + 1}", *_draw_name(a)])
        return f"[{name}] {what}" if several else what

    labels = [label(a) for a in found]
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_xlabel("held-out greedy valid,\nafter GRPO minus start\n(points, paired, 95 %)")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_ylim(-0.8, len(found) - 0.2)
    fig.tight_layout()
    save_png(fig, pathlib.Path(path))
