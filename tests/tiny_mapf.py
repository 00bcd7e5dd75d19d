"""A tiny random MAPF-FrozenLake language model in Hugging Face format, for tests: a Qwen3 of
about 30k parameters with a BPE trained on rendered prompts and answers."""

import pathlib

import jax
import transformers

from mapfjax.env import oracle, text
from mapfjax.env.types import Problem
from mapfjax.models import bpe, hf
from mapfjax.models.qwen3 import Qwen3, Qwen3Config


def _problems():
    grids = [("FFF", "FHF", "FFF"), ("FFFF", "FFHF", "FFFF", "HFFF"), ("FFF", "FFF", "FFF")]
    out = []
    for i, g in enumerate(grids):
        n = len(g)
        out.append(Problem(f"p{i}", g, ((0, 0), (n - 1, n - 1)), ((n - 1, n - 2), (0, 1))))
    return out


def build_tiny_mapf_model(root: pathlib.Path) -> pathlib.Path:
    """Write the model + tokenizer under root/model; returns that directory."""
    probs = _problems()
    answers = [oracle.answer_actions(oracle.solve(p)) for p in probs]
    rendered = [text.render_answer(a) for a in answers]
    texts = bpe.corpus([text.render_prompt(p) for p in probs], rendered) + rendered
    tok_dir = bpe.train_tokenizer(texts * 4, 320, root / "tok")
    tok = transformers.AutoTokenizer.from_pretrained(str(tok_dir))
    cfg = Qwen3Config(
        vocab_size=-(-len(tok) // 64) * 64,
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        rope_theta=1e4,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
    )
    model = Qwen3(cfg, dtype=jax.numpy.float32, param_dtype=jax.numpy.float32)
    out = hf.save_pretrained(model, root / "model")
    tok.save_pretrained(str(out))
    return out
