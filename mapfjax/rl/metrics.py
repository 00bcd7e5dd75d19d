"""Per-step metrics: JSONL (one object a line, appended atomically), TensorBoard and wandb when
installed and enabled, and a tqdm progress bar."""

from __future__ import annotations

import gzip
import json
import pathlib
import warnings
from collections.abc import Mapping
from typing import NamedTuple

from mapfjax import files

# Metric keys shown on the progress bar when present.
BAR_KEYS = ("loss", "reward_mean", "valid_rate", "entropy", "grad_norm", "lr")
# Keys holding the fraction of completions cut by the token budget (rollout / trainer names).
TRUNCATION_KEYS = ("truncation_rate", "full_length_frac")


def _tensorboard_writer(logdir: pathlib.Path):
    """A SummaryWriter from tensorboardX or flax.metrics.tensorboard, or None if neither
    imports (neither is a dependency of this package)."""
    try:
        from tensorboardX import SummaryWriter

        return SummaryWriter(str(logdir))
    except ImportError:
        pass
    try:
        from flax.metrics import tensorboard

        return tensorboard.SummaryWriter(str(logdir))
    except ImportError:
        return None


def _scalar(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class MetricsLogger:
    """Writes `log(step, metrics)` calls to logdir/metrics.jsonl and, when available, to
    TensorBoard (logdir/tb) and wandb; shows a tqdm bar over `total_steps`.

    tensorboard: "auto" (use it if tensorboardX or flax's writer imports), True (require it) or
    False. wandb: None/False, or a dict of `wandb.init` keyword arguments (project, name,
    config, ...); ignored with a warning when wandb is not installed. warn_truncation: warn
    when a truncation-rate metric exceeds this fraction (a too-short generation budget
    silently zeroes rewards). desc: the bar's label (e.g. "round 1 GRPO").
    """

    def __init__(
        self,
        logdir,
        total_steps: int | None = None,
        *,
        tensorboard: bool | str = "auto",
        wandb: Mapping | None = None,
        progress: bool = True,
        warn_truncation: float = 0.5,
        initial_step: int = 0,
        desc: str | None = None,
    ):
        self.logdir = pathlib.Path(logdir).expanduser()
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.path = self.logdir / "metrics.jsonl"
        if self.path.is_file():  # a crash mid-append: the next step must not join the fragment
            files.drop_torn_tail(self.path, "that step is logged again when it is retrained")
        self.warn_truncation = warn_truncation
        self.tb = None
        if tensorboard:
            self.tb = _tensorboard_writer(self.logdir / "tb")
            if self.tb is None and tensorboard is True:
                raise ImportError(
                    "MetricsLogger(tensorboard=True) needs `pip install tensorboardX` "
                    "(or tensorflow for flax.metrics.tensorboard); use tensorboard='auto'"
                )
        self.wandb = None
        if wandb:
            try:
                import wandb as wandb_lib
            except ImportError:
                warnings.warn(
                    "wandb logging requested but wandb is not installed; skipped", stacklevel=2
                )
            else:
                self.wandb = wandb_lib.init(**dict(wandb))
        self.bar = None
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total_steps, initial=initial_step, dynamic_ncols=True,
                            desc=desc, unit="update")  # fmt: skip
        self._last_step = initial_step

    def log(self, step: int, metrics: Mapping, **extra) -> dict:
        """Records the metrics of one step; returns the JSON object written."""
        record = {"step": int(step), **{k: _jsonable(v) for k, v in {**metrics, **extra}.items()}}
        line = json.dumps(record, allow_nan=True, sort_keys=False) + "\n"
        files.append_lines(self.path, [line])
        scalars = {k: s for k, v in record.items() if k != "step" and (s := _scalar(v)) is not None}
        if self.tb is not None:
            # flax's writer names it `scalar`, tensorboardX `add_scalar`.
            write = getattr(self.tb, "add_scalar", None) or self.tb.scalar
            for k, v in scalars.items():
                write(k, v, int(step))
        if self.wandb is not None:
            self.wandb.log(scalars, step=int(step))
        for k in TRUNCATION_KEYS:
            if k in scalars and scalars[k] > self.warn_truncation:
                warnings.warn(
                    f"step {step}: {k}={scalars[k]:.2f} > {self.warn_truncation}: most "
                    "completions hit the token budget; raise max_new_tokens or rewards stay 0",
                    stacklevel=2,
                )
        if self.bar is not None:
            self.bar.update(max(0, int(step) - self._last_step))
            shown = {k: f"{scalars[k]:.4g}" for k in BAR_KEYS if k in scalars}
            self.bar.set_postfix(shown, refresh=False)
        self._last_step = int(step)
        return record

    def close(self):
        """Flushes and closes every sink."""
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
        if self.bar is not None:
            self.bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _jsonable(value):
    if isinstance(value, str | bool | int | type(None)):
        return value
    scalar = _scalar(value)
    if scalar is not None:
        return scalar
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)


def read_metrics(path) -> list[dict]:
    """Reads a metrics JSONL file (gzip-compressed when its name ends in .gz, as in the small
    copies kept under results/). A last line torn by a crash mid-append is skipped with a
    warning; any other malformed line raises ValueError naming the file, the line and what to
    delete."""
    path = pathlib.Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    torn = files.torn_tail(data)
    if torn is not None:
        files.warn_torn(path, data, torn, "skipped (that step's metrics are lost)")
        data = data[:torn]
    records = []
    for lineno, line in enumerate(data.decode("utf-8", errors="replace").split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{path}:{lineno}: not a JSON object ({e.msg}); delete that line (one step's "
                "metrics) and rerun"
            ) from None
        if not isinstance(record, dict) or "step" not in record:
            raise ValueError(
                f"{path}:{lineno}: expected an object with a 'step' key; delete that line (one "
                "step's metrics) and rerun"
            )
        records.append(record)
    return records


class GroupOutcome(NamedTuple):
    """One sampled group of a GRPO step, as logged in metrics.jsonl under "groups": the map
    size, how many of its samples were valid, the sum of |advantage| over them, and whether
    its rewards differed (a group with equal rewards carries no gradient)."""

    size: int
    valid: int
    abs_advantage: float
    mixed: bool

    def to_record(self) -> dict:
        return {"size": self.size, "valid": self.valid,
                "abs_advantage": self.abs_advantage, "mixed": self.mixed}  # fmt: skip

    @classmethod
    def from_record(cls, x) -> GroupOutcome:
        """From a logged record: a dict with the field names, or the positional list of runs
        logged before the names (committed results keep them)."""
        if isinstance(x, Mapping):
            return cls(int(x["size"]), int(x["valid"]), float(x["abs_advantage"]), bool(x["mixed"]))
        size, valid, abs_advantage, mixed = x
        return cls(int(size), int(valid), float(abs_advantage), bool(mixed))


def group_outcomes(row: Mapping) -> list[GroupOutcome]:
    """The groups of one logged step (none for a row without them)."""
    return [GroupOutcome.from_record(x) for x in row.get("groups", [])]


def update_flops(config, params: int, prompts: int, group: int, prompt_len: int,
                 completion_len: int) -> float:  # fmt: skip
    """Model FLOPs of one GRPO update (its utilisation's numerator): 6 x matmul parameters x
    tokens (each prompt run once per group, each completion once) plus attention's score and
    value products (x 3 for the backward) over the causal half of each square. config: the
    model's Qwen3Config; params: its parameter count (the embedding table counts as a matmul
    only when tied, as the output layer)."""
    p, t = prompt_len, completion_len
    tokens = prompts * p + prompts * group * t
    embed = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
    pairs = prompts * p * p / 2 + prompts * group * (t * p + t * t / 2)
    attn = 3 * 4 * config.num_layers * config.num_heads * config.head_dim * pairs
    return 6 * (params - embed) * tokens + attn
