"""GRPO math: group advantages, temperature-scaled token log-probs, clipped surrogate loss.

For a group of G responses to one prompt with rewards r_1..r_G:
    A_i = (r_i - mean(r)) / (std(r, ddof) + eps)        (or r_i - mean(r) if not scale_by_std)
and A_i = 0 exactly when all rewards of the group are equal. For response token t of sequence i:
    logp_t   = log_softmax(logits_t / temperature)[token_t]          (fp32)
    ratio_t  = exp(logp_t - old_logp_t)
    L_t      = -min(ratio_t * A_i, clip(ratio_t, 1 - clip_low, 1 + clip_high) * A_i)
               + kl_coef * (exp(ref_t - logp_t) - (ref_t - logp_t) - 1)        (k3, only if > 0)
and the loss aggregates L_t over the response mask with a registered rule (`AGGREGATIONS`).
Choices: std with ddof=0 (population std) and eps=1e-6 added to the std; the same temperature
divides the logits in the sampler and here, so ratios compare the same distribution; the
end-of-turn token is a response token and is in the loss mask (see `response_mask`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
from jax import lax

from mapfjax.checks import is_int, is_real

Array = jax.Array
AggregationFn = Callable[[Array, Array, "GRPOConfig"], Array]

# name -> fn(per_token_loss f32[B, T], mask bool[B, T], cfg) -> f32[] ; see register_aggregation.
AGGREGATIONS: dict[str, AggregationFn] = {}


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """Hyper-parameters of the GRPO loss (hashable, so it can be a static jit argument).

    group_size: responses sampled per prompt (G); rows of a batch come in consecutive groups.
    clip_low, clip_high: the ratio is clipped to [1 - clip_low, 1 + clip_high] (DAPO's
        decoupled ranges; equal values give the original PPO/GRPO clip).
    kl_coef: weight of the k3 KL penalty to the reference policy. 0 disables it, and then no
        reference log-probs are needed (the trainer should skip the reference forward pass).
    aggregation: name in `AGGREGATIONS` ("token_mean", "seq_mean_token_mean",
        "seq_mean_token_sum_norm").
    scale_by_std: divide centred rewards by the group std (original GRPO); False is Dr. GRPO.
    std_eps: added to the group std before dividing (not under the square root).
    std_ddof: 0 = population std of the G rewards. With it the scaled advantages of any
        non-constant group have mean 0 and mean square std^2 / (std + eps)^2 ~ 1 whatever G is;
        ddof=1 shrinks them on small groups (G=2: +-0.71 instead of +-1). Set 1 to match
        codebases built on torch.std.
    max_response_tokens: Dr. GRPO's constant normaliser (the generation budget). None means
        the static length T of the response arrays, which equals the budget when responses
        are padded to it.
    temperature: sampling temperature; log-probs are computed from logits / temperature.
    """

    group_size: int = 8
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    aggregation: str = "token_mean"
    scale_by_std: bool = True
    std_eps: float = 1e-6
    std_ddof: int = 0
    max_response_tokens: int | None = None
    temperature: float = 1.0

    def validate(self) -> GRPOConfig:
        """Raise ValueError naming the first bad field, its value and what is allowed."""

        def bad(name: str, allowed: str) -> ValueError:
            value = getattr(self, name)
            return ValueError(f"GRPOConfig.{name}={value!r} is invalid: allowed {allowed}")

        if not is_int(self.group_size) or self.group_size < 2:
            raise bad("group_size", "an integer >= 2 (a group needs responses to compare)")
        for name in ("clip_low", "clip_high"):
            if not is_real(getattr(self, name)) or getattr(self, name) <= 0:
                raise bad(name, "a number > 0")
        if self.clip_low >= 1:
            raise bad("clip_low", "a number in (0, 1) so that 1 - clip_low > 0")
        if not is_real(self.kl_coef) or self.kl_coef < 0:
            raise bad("kl_coef", "a number >= 0 (0 disables the KL term)")
        if self.aggregation not in AGGREGATIONS:
            raise bad("aggregation", f"one of {sorted(AGGREGATIONS)}")
        if not isinstance(self.scale_by_std, bool):
            raise bad("scale_by_std", "True or False")
        if not is_real(self.std_eps) or self.std_eps <= 0:
            raise bad("std_eps", "a number > 0 (it keeps constant groups finite)")
        if not is_int(self.std_ddof) or not 0 <= self.std_ddof < self.group_size:
            raise bad("std_ddof", f"0 or 1 (an integer in [0, group_size={self.group_size}))")
        if self.max_response_tokens is not None and (
            not is_int(self.max_response_tokens) or self.max_response_tokens < 1
        ):
            raise bad("max_response_tokens", "None or an integer >= 1")
        if not is_real(self.temperature) or self.temperature <= 0:
            raise bad("temperature", "a number > 0")
        return self


# --------------------------------------------------------------------------- advantages


def group_advantages(
    rewards: Array,
    group_size: int,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    ddof: int = 0,
) -> Array:
    """Group-relative advantages.

    rewards: f32[B * G] (consecutive groups of `group_size`) or f32[B, G].
    Returns f32 of the same shape: r - group mean, divided by (group std + eps) when
    `scale_by_std`. Groups whose rewards are all equal get exactly 0 (never NaN).
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    if not is_int(group_size) or group_size < 1:
        raise ValueError(f"group_size={group_size!r} is invalid: allowed an integer >= 1")
    if rewards.ndim not in (1, 2) or rewards.size % group_size:
        raise ValueError(
            f"rewards of shape {rewards.shape} cannot be split into groups of "
            f"group_size={group_size}: expected [B * {group_size}] or [B, {group_size}]"
        )
    if rewards.ndim == 2 and rewards.shape[1] != group_size:
        raise ValueError(
            f"rewards of shape {rewards.shape}: the last axis must be group_size={group_size}"
        )
    if scale_by_std and not 0 <= ddof < group_size:
        raise ValueError(f"ddof={ddof} is invalid for group_size={group_size}: allowed 0 or 1")
    grouped = rewards.reshape(-1, group_size)  # [B, G]
    centred = grouped - grouped.mean(axis=1, keepdims=True)
    if scale_by_std:
        centred = centred / (grouped.std(axis=1, ddof=ddof, keepdims=True) + eps)
    # The mean of equal floats can be off by one ulp; force constant groups to exactly 0.
    constant = grouped.max(axis=1, keepdims=True) == grouped.min(axis=1, keepdims=True)
    return jnp.where(constant, 0.0, centred).reshape(rewards.shape)


# --------------------------------------------------------------------------- log-probs


def _logp_and_entropy(logits: Array, targets: Array, temperature: float) -> tuple[Array, Array]:
    """f32[..., V], i32[...] -> (log-prob of target, entropy), both f32[...]."""
    z = logits.astype(jnp.float32) / temperature
    lse = jax.nn.logsumexp(z, axis=-1)  # [...]
    picked = jnp.take_along_axis(z, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    probs = jnp.exp(z - lse[..., None])
    # H = -sum p (z - lse) = lse - sum p z
    entropy = lse - jnp.sum(probs * z, axis=-1)
    return picked - lse, entropy


def token_logprobs(logits: Array, targets: Array, temperature: float = 1.0) -> Array:
    """log_softmax(logits / temperature)[targets] in fp32.

    logits: f32/bf16[B, T, V], where logits[:, t] predicts targets[:, t]; targets: i32[B, T].
    Returns f32[B, T]. Use the sampler's temperature, or the importance ratio is wrong.
    """
    return _logp_and_entropy(logits, targets, temperature)[0]


def token_entropy(logits: Array, temperature: float = 1.0) -> Array:
    """Entropy of softmax(logits / temperature) in fp32: f32/bf16[B, T, V] -> f32[B, T]."""
    z = logits.astype(jnp.float32) / temperature
    logp = jax.nn.log_softmax(z, axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def chunked_token_logprobs(
    hidden: Array,
    lm_head_fn: Callable[[Array], Array],
    targets: Array,
    temperature: float = 1.0,
    chunk: int = 256,
) -> tuple[Array, Array]:
    """Token log-probs and entropies without materialising [B, T, V] logits.

    hidden: [B, T, H] final hidden states (hidden[:, t] predicts targets[:, t]);
    lm_head_fn: [B, c, H] -> f32[B, c, V]; targets: i32[B, T].
    Returns (logp f32[B, T], entropy f32[B, T]), equal to `token_logprobs` / `token_entropy` of
    lm_head_fn(hidden). The sequence is cut into chunks of `chunk` positions (the last one
    zero-padded) processed by `lax.map`; each chunk is rematerialised in the backward pass, so
    peak memory holds one [B, chunk, V] block instead of [B, T, V].
    """
    b, t, h = hidden.shape
    chunk = max(1, min(chunk, t))
    n = -(-t // chunk)
    pad = n * chunk - t
    hidden_p = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets_p = jnp.pad(targets.astype(jnp.int32), ((0, 0), (0, pad)))
    hs = hidden_p.reshape(b, n, chunk, h).swapaxes(0, 1)  # [n, B, chunk, H]
    ts = targets_p.reshape(b, n, chunk).swapaxes(0, 1)  # [n, B, chunk]

    @jax.checkpoint
    def one(args):
        hc, tc = args
        return _logp_and_entropy(lm_head_fn(hc), tc, temperature)

    logp, ent = lax.map(one, (hs, ts))  # each [n, B, chunk]

    def unchunk(x):
        return x.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]

    return unchunk(logp), unchunk(ent)


def response_mask(lengths: Array, num_tokens: int) -> Array:
    """bool[B, T]: True for the first lengths[b] positions of each response.

    IMPORTANT: `lengths` must count the end-of-turn token (<|im_end|>) that closed the
    response, so that it is trained on; otherwise the policy never learns to stop. A response
    truncated by the budget has length T and no end-of-turn token. Build masks from lengths,
    never from `tokens != pad` (pad and end-of-turn may share an id).
    lengths: i32[B] in [0, T]; num_tokens: T (static).
    """
    return jnp.arange(num_tokens)[None, :] < jnp.asarray(lengths)[:, None]


def k3_kl(logp: Array, logp_ref: Array) -> Array:
    """Schulman's k3 estimator of KL(pi || pi_ref) per token: exp(d) - d - 1 with d = ref - logp.

    logp, logp_ref: f32[B, T] log-probs of the sampled tokens. Returns f32[B, T], >= 0.
    """
    d = logp_ref - logp
    return jnp.exp(d) - d - 1.0


# --------------------------------------------------------------------------- aggregation


def register_aggregation(name: str) -> Callable[[AggregationFn], AggregationFn]:
    """Decorator adding fn(per_token_loss f32[B, T], mask bool[B, T], cfg) -> f32[] under name."""

    def deco(fn: AggregationFn) -> AggregationFn:
        if name in AGGREGATIONS:
            raise ValueError(f"aggregation {name!r} is already registered")
        AGGREGATIONS[name] = fn
        return fn

    return deco


def masked_sum(x: Array, mask: Array, axis=None) -> Array:
    """Sum of x over positions where mask is True (masked values may be inf/NaN)."""
    return jnp.sum(jnp.where(mask, x, 0.0), axis=axis)


def masked_mean(x: Array, mask: Array, axis=None) -> Array:
    """Mean of x over mask; 0 where the mask is empty (never NaN)."""
    count = jnp.sum(mask, axis=axis)
    return masked_sum(x, mask, axis) / jnp.maximum(count, 1)


def _num_sequences(mask: Array) -> Array:
    # Rows without response tokens (batch padding) are not sequences; floor 1 avoids 0/0.
    return jnp.maximum(jnp.sum(jnp.any(mask, axis=1)), 1)


@register_aggregation("token_mean")
def _token_mean(per_token: Array, mask: Array, cfg: GRPOConfig) -> Array:
    """DAPO: sum of all token losses / number of response tokens in the batch."""
    return masked_mean(per_token, mask)


@register_aggregation("seq_mean_token_mean")
def _seq_mean_token_mean(per_token: Array, mask: Array, cfg: GRPOConfig) -> Array:
    """Original GRPO: mean over non-empty sequences of each sequence's token mean."""
    return jnp.sum(masked_mean(per_token, mask, axis=1)) / _num_sequences(mask)


@register_aggregation("seq_mean_token_sum_norm")
def _seq_mean_token_sum_norm(per_token: Array, mask: Array, cfg: GRPOConfig) -> Array:
    """Dr. GRPO: sum of token losses / (non-empty sequences * max_response_tokens)."""
    budget = cfg.max_response_tokens
    if budget is None:
        budget = mask.shape[1]
    elif mask.shape[1] > budget:
        raise ValueError(
            f"responses have {mask.shape[1]} positions but GRPOConfig.max_response_tokens="
            f"{budget}: allowed a budget >= the response length"
        )
    return masked_sum(per_token, mask) / (_num_sequences(mask) * budget)


# --------------------------------------------------------------------------- loss


def grpo_loss(
    logp: Array,
    old_logp: Array,
    advantages: Array,
    mask: Array,
    cfg: GRPOConfig,
    ref_logp: Array | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Clipped GRPO surrogate (+ optional k3 KL), aggregated by `cfg.aggregation`.

    logp: f32[B, T] current-policy log-probs of the sampled tokens (differentiated);
    old_logp: f32[B, T] log-probs under the sampling policy (treated as constants);
    advantages: f32[B] one per sequence; mask: bool[B, T] response tokens (see
    `response_mask`); ref_logp: f32[B, T] reference log-probs, required iff cfg.kl_coef > 0.
    Values at masked-out positions are ignored, even if inf/NaN.
    Returns (loss f32[], metrics): pg_loss, loss, clip_frac, clip_frac_low, clip_frac_high,
    ratio_mean, ratio_max, approx_kl_old (mean old - new), adv_mean, adv_std (over non-empty
    sequences), num_tokens, and kl (mean k3) when ref_logp is given. All token metrics are
    means over masked tokens.
    """
    cfg.validate()
    if cfg.kl_coef > 0 and ref_logp is None:
        raise ValueError(
            f"GRPOConfig.kl_coef={cfg.kl_coef} > 0 needs ref_logp (reference-policy log-probs); "
            "pass them or set kl_coef=0"
        )
    chex.assert_rank([logp, old_logp, mask, advantages], [2, 2, 2, 1])
    chex.assert_equal_shape([logp, old_logp, mask])
    chex.assert_equal_shape_prefix([logp, advantages], 1)
    mask = mask.astype(bool)
    # Zero masked positions before any exp, so garbage there cannot reach values or gradients.
    logp = jnp.where(mask, logp.astype(jnp.float32), 0.0)
    old_logp = jnp.where(mask, lax.stop_gradient(old_logp).astype(jnp.float32), 0.0)
    adv = lax.stop_gradient(advantages).astype(jnp.float32)[:, None]  # [B, 1]

    ratio = jnp.exp(logp - old_logp)
    clipped = jnp.clip(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    per_token = -jnp.minimum(ratio * adv, clipped * adv)
    aggregate = AGGREGATIONS[cfg.aggregation]
    pg_loss = aggregate(per_token, mask, cfg)

    metrics = {}
    if ref_logp is not None:
        ref = jnp.where(mask, lax.stop_gradient(ref_logp).astype(jnp.float32), 0.0)
        kl = k3_kl(logp, ref)
        metrics["kl"] = masked_mean(lax.stop_gradient(kl), mask)
        if cfg.kl_coef > 0:
            per_token = per_token + cfg.kl_coef * kl
    loss = aggregate(per_token, mask, cfg) if cfg.kl_coef > 0 else pg_loss

    ratio_sg = lax.stop_gradient(ratio)
    # The clipped branch is the active one (zero gradient) exactly in these two regions.
    low = (adv < 0) & (ratio_sg < 1.0 - cfg.clip_low)
    high = (adv > 0) & (ratio_sg > 1.0 + cfg.clip_high)
    seq = jnp.any(mask, axis=1)
    adv_mean = masked_mean(adv[:, 0], seq)
    metrics.update(
        loss=lax.stop_gradient(loss),
        pg_loss=lax.stop_gradient(pg_loss),
        clip_frac_low=masked_mean(low, mask),
        clip_frac_high=masked_mean(high, mask),
        clip_frac=masked_mean(low | high, mask),
        ratio_mean=masked_mean(ratio_sg, mask),
        ratio_max=jnp.max(jnp.where(mask, ratio_sg, 0.0)),  # ratio > 0, so 0 means no tokens
        approx_kl_old=masked_mean(lax.stop_gradient(old_logp - logp), mask),
        adv_mean=adv_mean,
        adv_std=jnp.sqrt(masked_mean((adv[:, 0] - adv_mean) ** 2, seq)),
        num_tokens=jnp.sum(mask).astype(jnp.float32),
    )
    return loss, metrics
