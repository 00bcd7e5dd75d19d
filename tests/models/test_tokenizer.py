"""Tokenizer helpers on a tiny byte-level tokenizer with Qwen3's special tokens."""

import jax
import numpy as np
import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from mapfjax.models import sampler
from mapfjax.models import tokenizer as tok_lib

SPECIALS = [tok_lib.ENDOFTEXT, tok_lib.IM_START, tok_lib.IM_END, tok_lib.THINK, tok_lib.END_THINK]

# A Qwen3-like template (single-turn subset) that honours `enable_thinking`.
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def make_tokenizer(path, *, template=None, pad=tok_lib.ENDOFTEXT):
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=core)
    fast.add_special_tokens({"additional_special_tokens": SPECIALS})
    fast.pad_token = pad
    if template is not None:
        fast.chat_template = template
    fast.save_pretrained(path)
    return tok_lib.load_tokenizer(path)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("plain"))


@pytest.fixture(scope="module")
def templated(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("templated"), template=TEMPLATE)


def test_special_ids_prefer_the_tokenizer(plain):
    ids = tok_lib.special_ids(plain)
    vocab = plain.get_vocab()
    assert ids.im_end == vocab["<|im_end|>"] != tok_lib.IM_END_ID
    assert ids.pad == vocab["<|endoftext|>"] and ids.end_think == vocab["</think>"]
    assert tok_lib.special_ids(_NoSpecials()) == tok_lib.SpecialIds()


class _NoSpecials:
    pad_token_id = None

    def get_vocab(self):
        return {"a": 0}


@pytest.mark.parametrize("thinking", [True, False])
def test_builtin_template_for_tokenizers_without_one(plain, thinking):
    text = tok_lib.chat_text(plain, "Solve it.", enable_thinking=thinking, system="Be brief.")
    want = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nSolve it.<|im_end|>\n"
        "<|im_start|>assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n")
    )
    assert text == want


@pytest.mark.parametrize("thinking", [True, False])
def test_tokenizer_template_gets_enable_thinking(plain, templated, thinking):
    ours = tok_lib.chat_text(templated, "Solve it.", enable_thinking=thinking)
    assert ours.endswith("</think>\n\n") != thinking
    assert ours == tok_lib.chat_text(plain, "Solve it.", enable_thinking=thinking)


def test_encode_chat_recognises_special_tokens(plain):
    ids = tok_lib.special_ids(plain)
    (on,), (off,) = (tok_lib.encode_chat(plain, ["hi"], enable_thinking=t) for t in (True, False))
    assert on[0] == ids.im_start and on.count(ids.im_end) == 1
    assert off[: len(on)] == on and off[len(on)] == ids.think and ids.end_think in off
    assert plain.decode(on) == tok_lib.chat_text(plain, "hi")


def test_pad_batch_left_right_and_buckets():
    lists = [[5, 6, 7], [8], [9, 10]]
    tokens, mask = tok_lib.pad_batch(lists, pad_id=0, side="left")
    np.testing.assert_array_equal(tokens, [[5, 6, 7], [0, 0, 8], [0, 9, 10]])
    np.testing.assert_array_equal(mask, tokens != 0)
    tokens, mask = tok_lib.pad_batch(lists, pad_id=1, side="right", bucket=4)
    assert tokens.dtype == np.int32 and tokens.shape == (3, 4)
    np.testing.assert_array_equal(tokens[1], [8, 1, 1, 1])
    np.testing.assert_array_equal(mask.sum(1), [3, 1, 2])
    assert tok_lib.pad_batch(lists, 0, bucket=[2, 8, 16])[0].shape == (3, 8)
    with pytest.raises(ValueError, match="largest bucket is 2"):
        tok_lib.pad_batch(lists, 0, bucket=[2])
    with pytest.raises(ValueError, match="side='middle'"):
        tok_lib.pad_batch(lists, 0, side="middle")


def test_masks_keep_end_of_turn_when_pad_equals_it(tmp_path):
    tok = make_tokenizer(tmp_path, pad=tok_lib.IM_END)
    ids = tok_lib.special_ids(tok)
    assert ids.pad == ids.im_end
    e = ids.im_end
    completions = np.array([[3, 4, e, e, e], [3, e, e, e, e], [3, 4, 5, 6, 7]], np.int32)
    lengths = jax.jit(tok_lib.completion_lengths, static_argnums=1)(completions, (e,))
    np.testing.assert_array_equal(lengths, [3, 2, 5])
    loss_mask = np.asarray(tok_lib.lengths_to_mask(lengths, 5))
    np.testing.assert_array_equal(loss_mask, [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    assert loss_mask[0, 2] and not (completions != ids.pad)[0, 2]  # the pitfall avoided
    left = np.asarray(jax.jit(tok_lib.lengths_to_mask, static_argnums=(1, 2))(lengths, 5, "left"))
    np.testing.assert_array_equal(left[1], [0, 0, 0, 1, 1])


def test_qwen_ids_are_declared_once_and_the_sampler_uses_them():
    assert tok_lib.STOP_IDS == (tok_lib.IM_END_ID, tok_lib.PAD_ID) == (151645, 151643)
    assert sampler.DEFAULT_STOP_TOKENS == tok_lib.STOP_IDS
    assert sampler.DEFAULT_PAD_ID == tok_lib.PAD_ID
