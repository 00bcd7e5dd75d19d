"""The closed loop's config checked before anything runs: one frozen settings object per
section it owns (`validation`, `engineer`), built once from the ConfigDict with its defaults
and checks, and `check_config` for the whole run config."""

from __future__ import annotations

import dataclasses

import jax
import ml_collections

from mapfjax import parallel
from mapfjax.checks import is_finite_real, is_int, is_real, require, require_dtype, require_int
from mapfjax.engineer import context as ctx_lib
from mapfjax.engineer import engineers as eng_lib
from mapfjax.env import benchmark
from mapfjax.env import config as env_config
from mapfjax.models import hf
from mapfjax.presets import variants
from mapfjax.rl import driver


def _refuse_unknown(section: str, cfg: ml_collections.ConfigDict, cls) -> None:
    keys = [f.name for f in dataclasses.fields(cls) if f.init and f.name != "max_size"]
    unknown = sorted(set(cfg.keys()) - set(keys))
    require(f"{section}: unknown key(s)", unknown, not unknown, str(keys))


@dataclasses.dataclass(frozen=True)
class ValidationSettings:
    """The held-out validation set and how it is answered (config section `validation`).

    per_size puzzles per map size of `num_agents` agents, spread over `hole_ratios` when
    given (else `hole_ratio`), drawn with `seed`, then as many again from each of
    `extra_seeds` (ids prefixed `x<seed>_`, puzzles already drawn left out: the `seed` draw
    stays the set's first part); answered greedily and with `samples`
    samples at temperature 1 (0: greedy only), `max_new_tokens` each, `batch_size` rows per
    sampler call, prompts padded by the length rule `bucket` (`sampler.BUCKETS`; speed only).
    max_size: env.max_size, the largest map a size may ask for (not a key of the section).
    """

    max_size: int
    num_agents: int | None = None
    sizes: tuple[int, ...] | None = None
    per_size: int | None = None
    hole_ratio: float | None = None
    hole_ratios: tuple[float, ...] = ()
    wait_ratio: float | None = None
    samples: int = 0
    seed: int = 0
    extra_seeds: tuple[int, ...] = ()
    max_new_tokens: int | None = None
    batch_size: int | None = None
    bucket: str = "pow2_mid"

    @classmethod
    def from_config(cls, c: ml_collections.ConfigDict) -> ValidationSettings:
        """From a run config's `validation` section (checked against its env.max_size)."""
        _refuse_unknown("validation", c.validation, cls)
        return cls(max_size=c.env.max_size, **c.validation.to_dict())

    def __post_init__(self):
        agents, sizes, lo = self.num_agents, self.sizes, env_config.MIN_SIZE
        require("validation.num_agents", agents, is_int(agents) and 1 <= agents <= 5, "1 to 5")
        ok = isinstance(sizes, tuple | list) and len(sizes) > 0
        allowed = f"a non-empty tuple of map sizes in [{lo}, {self.max_size}]"
        require("validation.sizes", sizes, ok, allowed)
        for n in sizes:
            ok = is_int(n) and lo <= n <= self.max_size and n * n >= 2 * agents
            require(
                "validation.sizes", sizes, ok,
                f"map sizes in [{lo}, env.max_size={self.max_size}] with room for {agents} "
                "starts and goals",
            )  # fmt: skip
        require_int("validation.per_size", self.per_size, 1)
        env_config.check_hole_ratios((self.hole_ratio,), "validation.hole_ratio")
        env_config.check_hole_ratios(self.hole_ratios, "validation.hole_ratios")
        wait = self.wait_ratio
        require("validation.wait_ratio", wait, is_finite_real(wait) and 0 <= wait <= 1, "[0, 1]")
        for key, least in (("samples", 0), ("seed", 0), ("max_new_tokens", 1), ("batch_size", 1)):
            require_int(f"validation.{key}", getattr(self, key), least)
        extra = self.extra_seeds
        ok = isinstance(extra, tuple | list) and all(is_int(x) and x >= 0 for x in extra)
        ok = ok and len({self.seed, *extra}) == len(extra) + 1
        require("validation.extra_seeds", extra, ok, "distinct integers >= 0, none equal to seed")
        driver.require_bucket("validation.bucket", self.bucket)

    def generator_config(self) -> ml_collections.ConfigDict:
        """The generator config the held-out set is drawn from (before `hole_ratios`)."""
        return env_config.default_config(
            self.num_agents, tuple(self.sizes), self.hole_ratio, self.wait_ratio
        )


@dataclasses.dataclass(frozen=True)
class EngineerSettings:
    """The engineer of a run (config section `engineer`): `settings` (its name and options,
    see `engineers.make_engineer`), the context `modules`, the `variant` they make (a label
    checked against them; None or "custom" for hand-set modules), and for the policy and
    base engineers the sampling budget and temperature of a free-form proposal."""

    settings: ml_collections.ConfigDict
    modules: ml_collections.ConfigDict
    variant: str | None = None
    max_new_tokens: int = 1
    temperature: float = 0.0

    @classmethod
    def from_config(cls, e: ml_collections.ConfigDict) -> EngineerSettings:
        """From a run config's `engineer` section."""
        _refuse_unknown("engineer", e, cls)
        optional = {k: e[k] for k in ("variant", "max_new_tokens", "temperature") if k in e}
        return cls(settings=e.settings, modules=e.modules, **optional)

    @property
    def name(self) -> str:
        return self.settings.name

    def __post_init__(self):
        eng_lib.make_engineer(self.settings)  # name, keys and values (functions come later)
        ctx_lib.check_modules(self.modules)
        tokens, temp = self.max_new_tokens, self.temperature
        require_int("engineer.max_new_tokens", tokens, 1)
        require("engineer.temperature", temp, is_finite_real(temp) and temp >= 0, "a number >= 0")
        self._check_variant()

    def _check_variant(self) -> None:
        name = self.variant
        if name is None or name == "custom":
            return
        allowed = f"one of {sorted(variants.VARIANTS)}, or 'custom' for hand-set modules"
        require("engineer.variant", name, name in variants.VARIANTS, allowed)
        want = ctx_lib.check_modules(variants.get_config(name).modules)
        have = ctx_lib.check_modules(self.modules)
        fixes = [
            f"--config.engineer.modules.{m}.{opt}={want.get(m, {}).get(opt, False)}"
            for m in ctx_lib.MODULES
            # what a variant decides (T's detail is free)
            for opt in ("enabled", "include_default", "wait_split")
            if want.get(m, {}).get(opt, False) != have.get(m, {}).get(opt, False)
        ]
        if fixes:
            raise ValueError(
                f"engineer.variant = {name!r} but engineer.modules are not {name}'s (the variant "
                f"is only a label): add {' '.join(fixes)}, or set engineer.variant=custom"
            )


@dataclasses.dataclass(frozen=True)
class BenchmarkSettings:
    """The final benchmark of a run (optional config section `benchmark`): after the last
    round the starting model and the final model answer the same benchmark greedily
    (`mapfjax.env.benchmark`: `per_cell` puzzles for each agent count of `agents` on each
    size of `sizes` at least as large, in each wait-ratio subset of `wait_ratios`, holes at
    `hole_ratio`, drawn from `seed`), `max_new_tokens` each, `batch_size` prompts per sampler
    call padded by the length rule `bucket`. Unset (None): no benchmark. The paper's:
    3, 4 and 5 agents on 3x3-10x10, subsets 0.25 / 0.50 / 0.75, 50 per cell."""

    agents: tuple[int, ...] = benchmark.PAPER_AGENTS
    sizes: tuple[int, ...] = env_config.PAPER_SIZES
    wait_ratios: tuple[float, ...] = benchmark.PAPER_WAIT_RATIOS
    per_cell: int = benchmark.PER_CELL
    hole_ratio: float = 0.1
    seed: int = 0
    max_new_tokens: int = 512
    batch_size: int = 64
    bucket: str = "pow2_mid"

    @classmethod
    def from_config(cls, c: ml_collections.ConfigDict) -> BenchmarkSettings | None:
        """From a run config's optional `benchmark` section (None when it has none)."""
        section = c.get("benchmark")
        if not section:
            return None
        _refuse_unknown("benchmark", section, cls)
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in section.to_dict().items()}
        return cls(**values)

    def __post_init__(self):
        lo, hi = env_config.MIN_SIZE, env_config.PAPER_SIZES[-1]
        for key, ok, allowed in (
            ("agents", lambda k: is_int(k) and 1 <= k <= 5, "agent counts in [1, 5]"),
            ("sizes", lambda n: is_int(n) and lo <= n <= hi, f"map sizes in [{lo}, {hi}]"),
            ("wait_ratios", lambda w: is_finite_real(w) and 0 <= w <= 1, "numbers in [0, 1]"),
        ):
            values = getattr(self, key)
            good = isinstance(values, tuple) and len(values) > 0 and all(map(ok, values))
            good = good and len(set(values)) == len(values)
            require(f"benchmark.{key}", values, good, f"a non-empty tuple of distinct {allowed}")
        require("benchmark.sizes", self.sizes, bool(self.spec().cells()),
                "at least one size with room for the smallest agent count")  # fmt: skip
        require_int("benchmark.per_cell", self.per_cell, 1)
        env_config.check_hole_ratios((self.hole_ratio,), "benchmark.hole_ratio")
        for key, least in (("seed", 0), ("max_new_tokens", 1), ("batch_size", 1)):
            require_int(f"benchmark.{key}", getattr(self, key), least)
        driver.require_bucket("benchmark.bucket", self.bucket)

    def spec(self) -> benchmark.BenchmarkSpec:
        """What `benchmark.build` builds (the oracle's budgets are the builder's own)."""
        return benchmark.BenchmarkSpec(
            agents=self.agents, sizes=self.sizes, wait_ratios=self.wait_ratios,
            per_cell=self.per_cell, hole_ratio=self.hole_ratio, seed=self.seed,
        )  # fmt: skip


# Round 0's generator config (loop.start_config): c.env, or a random config drawn from c.seed.
ENV_STARTS = ("config", "random")


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """The starting checkpoint (config section `model`): its directory, the compute dtype and
    how it computes (`hf.ModelOptions`: attention_impl)."""

    path: str
    dtype: str
    options: hf.ModelOptions

    @classmethod
    def from_config(cls, m: ml_collections.ConfigDict) -> ModelSettings:
        require_dtype("model.dtype", m.dtype)
        return cls(path=str(m.path), dtype=str(m.dtype), options=hf.ModelOptions.from_config(m))


@dataclasses.dataclass(frozen=True)
class TrainingFacts:
    """What the T context module says of a round's training (`records.training_info`): the
    epochs, updates, peak learning rate, group size, iterations per batch, temperature and the
    loss options the config sets (its `grpo` section, in order)."""

    epochs: int
    steps: int
    lr: float
    group_size: int
    num_iterations: int
    temperature: float
    loss_options: tuple[tuple[str, object], ...]

    def as_dict(self, n: int) -> dict:
        return {
            "round": n,
            "epoch": self.epochs,
            "steps": self.steps,
            "lr": self.lr,
            "group_size": self.group_size,
            "num_iterations": self.num_iterations,
            "temperature": self.temperature,
            **dict(self.loss_options),
        }


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """A closed-loop run's config, checked once and typed (`loop.run` builds it and passes it
    down instead of the ConfigDict): the seed and rounds; round 0's generator config (`env`,
    drawn at random over its sizes with env_start "random", waits ~ U[0, env_start_max_wait]);
    the puzzles a round trains on (`instances`); the starting model; the mesh; the GRPO phase of
    a round (and what an experiment's `phase_hooks` change in it), its optimiser over all
    rounds, the held-out validation, the engineer and the optional final benchmark."""

    seed: int
    rounds: int
    export_every_round: bool
    env: ml_collections.FrozenConfigDict
    env_start: str
    env_start_max_wait: float
    instances: int
    model: ModelSettings
    mesh: tuple[tuple[str, int], ...]
    grpo: driver.GRPOSettings
    optim: driver.OptimConfig
    validation: ValidationSettings
    engineer: EngineerSettings
    training: TrainingFacts
    hooks: driver.PhaseHooks = driver.PhaseHooks()
    benchmark: BenchmarkSettings | None = None

    @classmethod
    def from_config(cls, c: ml_collections.ConfigDict) -> RunSettings:
        """Check a whole run config before anything is loaded or written (a bad key found
        after round 0's training would cost the round): raises ValueError naming the key, its
        value and what is allowed."""
        require_int("rounds", c.get("rounds"), 1)
        require_int("seed", c.get("seed"), 0)
        env_config.validate_at(c.env, "env")
        start = c.get("env_start", "config")
        require("env_start", start, start in ENV_STARTS, f"one of {list(ENV_STARTS)}")
        w = c.get("env_start_max_wait", 1.0)
        ok = is_real(w) and 0 < w <= 1
        require("env_start_max_wait", w, ok, "a number in (0, 1]: round 0's waits ~ U[0, it]")
        model = ModelSettings.from_config(c.model)
        grpo = driver.GRPOSettings.from_config(c)
        hooks = driver.PhaseHooks.from_config(c)
        optim = driver.optim_config(c, grpo.steps, c.rounds)
        optim.validate()
        validation = ValidationSettings.from_config(c)
        engineer = EngineerSettings.from_config(c.engineer)
        bench = BenchmarkSettings.from_config(c)
        mesh = c.mesh.to_dict()
        try:  # a size that cannot take effect (mesh.tp=3 on one device) is refused, not ignored
            parallel.make_mesh(mesh)
        except (ValueError, TypeError) as e:
            n = jax.device_count()
            raise ValueError(
                f"mesh = {mesh}: {e}; allowed: --config.mesh.data/fsdp/tp sizes whose "
                f"product is the {n} device(s) here (one of them may be -1)"
            ) from None
        t = c.train
        training = TrainingFacts(
            epochs=t.get("epochs", 1),
            steps=grpo.steps,
            lr=c.optim.lr,
            group_size=t.group_size,
            num_iterations=t.get("num_iterations", 1),
            temperature=t.temperature,
            loss_options=tuple(c.grpo.to_dict().items()),
        )
        return cls(
            seed=int(c.seed),
            rounds=int(c.rounds),
            export_every_round=bool(c.get("export_every_round", False)),
            env=ml_collections.FrozenConfigDict(c.env),
            env_start=start,
            env_start_max_wait=float(w),
            instances=int(t.get("instances", grpo.steps * grpo.problems_per_step)),
            model=model,
            mesh=tuple(mesh.items()),
            grpo=grpo,
            optim=optim,
            validation=validation,
            engineer=engineer,
            training=training,
            hooks=hooks,
            benchmark=bench,
        )

    def env_config(self) -> ml_collections.ConfigDict:
        """A mutable copy of round 0's base generator config."""
        return ml_collections.ConfigDict(self.env.as_configdict())


def check_config(c: ml_collections.ConfigDict) -> RunSettings:
    """`RunSettings.from_config`: the run config checked, as the typed settings."""
    return RunSettings.from_config(c)
