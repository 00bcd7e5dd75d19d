"""The policy engineer's likelihood scores (`policy.make_score_fn`): each continuation's
log-likelihood after the chat prompt, computed with the prompt shared by a batch, equals a
plain full-sequence forward pass of that one continuation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mapfjax.engineer import policy
from mapfjax.models import tokenizer as tok_lib
from mapfjax.models.qwen3 import Qwen3, Qwen3Config
from tests.rl.test_data import make_tokenizer


@pytest.mark.slow
def test_scores_equal_a_plain_forward_pass_per_continuation(tmp_path):
    tok = make_tokenizer(tmp_path)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=1e4,
                      max_position_embeddings=512)  # fmt: skip
    model = Qwen3(cfg, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(4))
    prompt = "Agent 0 needs to go from (1, 3) to (1, 2)"
    conts = ["UP", "Agent 1: LEFT, WAIT", "RIGHT, RIGHT, DOWN", "", "H F G"]  # 5: a part batch
    got = policy.make_score_fn(lambda: model, tok, batch_size=3)(prompt, conts)
    (p,) = tok_lib.encode_chat(tok, [prompt], enable_thinking=False)
    im_end = tok_lib.special_ids(tok).im_end
    for cont, score in zip(conts, got, strict=True):
        c = list(tok(cont, add_special_tokens=False)["input_ids"]) + [im_end]
        ids = jnp.asarray([p + c])
        logits, _ = model(ids)
        logp = jax.nn.log_softmax(logits[0].astype(jnp.float32), axis=-1)
        want = sum(float(logp[len(p) - 1 + i, t]) for i, t in enumerate(c))
        np.testing.assert_allclose(score, want, rtol=1e-5, atol=1e-4)
