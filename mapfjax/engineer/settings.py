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


# Round 0's generator config (loop.start_config): c.env, or a random config drawn from c.seed.
ENV_STARTS = ("config", "random")


def check_config(c: ml_collections.ConfigDict) -> None:
    """Check a whole run config before anything is loaded or written (a bad key found after
    round 0's training would cost the round): raises ValueError naming the key, its value and
    what is allowed."""
    require_int("rounds", c.get("rounds"), 1)
    require_int("seed", c.get("seed"), 0)
    env_config.validate_at(c.env, "env")
    start = c.get("env_start", "config")
    require("env_start", start, start in ENV_STARTS, f"one of {list(ENV_STARTS)}")
    w = c.get("env_start_max_wait", 1.0)
    ok = is_real(w) and 0 < w <= 1
    require("env_start_max_wait", w, ok, "a number in (0, 1]: round 0's waits ~ U[0, it]")
    require_dtype("model.dtype", c.model.dtype)
    hf.ModelOptions.from_config(c.model)
    grpo = driver.GRPOSettings.from_config(c)
    driver.optim_config(c, grpo.steps, c.rounds).validate()
    ValidationSettings.from_config(c)
    EngineerSettings.from_config(c.engineer)
    try:  # a size that cannot take effect (mesh.tp=3 on one device) is refused, not ignored
        parallel.make_mesh(c.mesh.to_dict())
    except (ValueError, TypeError) as e:
        n = jax.device_count()
        raise ValueError(
            f"mesh = {c.mesh.to_dict()}: {e}; allowed: --config.mesh.data/fsdp/tp sizes whose "
            f"product is the {n} device(s) here (one of them may be -1)"
        ) from None
