"""SFT data: examples decode to the chat prompt and a valid, optimal oracle answer; batches
are deterministic, resumable and mask exactly the answer + end-of-turn tokens (+ the stated
coordinates when asked)."""

import numpy as np
import pytest

from mapfjax.env import dynamics, io, text, types
from mapfjax.models import bpe
from mapfjax.models import tokenizer as tok_lib
from mapfjax.rl import data
from tests.models.test_bpe import corpus, corpus_and_answers, random_problems


def make_tokenizer(path, n: int = 40, seed: int = 0):
    """A small MAPF BPE tokenizer trained on `n` random labelled problems."""
    problems, answers = corpus_and_answers(n, seed)
    return tok_lib.load_tokenizer(bpe.train_tokenizer(corpus(problems, answers), 800, path))


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def problems():
    return random_problems(24, seed=5, sizes=(3, 4, 5, 6))


def test_examples_decode_to_prompt_and_optimal_answer(tok, problems):
    examples = data.sft_examples(tok, problems)
    assert [e.problem_id for e in examples] == [p.id for p in problems]
    texts = []
    for e, p in zip(examples, problems):
        want = tok_lib.builtin_chat_text(
            [{"role": "user", "content": text.render_prompt(p)}], False
        )
        assert tok.decode(list(e.prompt)) == want
        assert e.completion[-1] == tok_lib.special_ids(tok).im_end
        answer = tok.decode(list(e.completion[:-1]))
        assert answer.startswith("<answer>\n") and answer.endswith("</answer>")
        texts.append(answer)
    # Independent check of the answers: the verifier calls each one valid and optimal.
    verdict = dynamics.verify(
        types.to_instances(problems), text.parse_answers(texts, [p.num_agents for p in problems])
    )
    assert np.all(verdict.valid) and np.all(verdict.optimal)


def test_batches_mask_answer_and_end_of_turn(tok, problems):
    examples = data.sft_examples(tok, problems)
    batch = next(data.sft_batches(examples, 8, tok_lib.special_ids(tok).pad, seed=0))
    b, length = batch.tokens.shape
    P, T = batch.prompt_len, batch.completion_len
    assert b == 8 and length == P + T and P % 64 == 0 and T % 64 == 0
    by_prompt = {e.prompt: e for e in examples}
    for i in range(b):
        row, mask = batch.tokens[i], batch.attention_mask[i]
        prompt = tuple(row[:P][mask[:P]].tolist())
        e = by_prompt[prompt]
        n = len(e.completion)
        assert tuple(row[P : P + n].tolist()) == e.completion
        assert batch.loss_mask[i].tolist() == [True] * n + [False] * (T - n)
        assert batch.tokens[i, P + n - 1] == tok_lib.special_ids(tok).im_end
        assert not mask[P + n :].any()
    assert not batch.advantages.any() and not batch.old_logprobs.any()


def test_a_long_completion_multiple_gives_one_completion_shape(tok, problems):
    # The recipe's `sft.completion_multiple`: an accelerator run compiles one completion length.
    examples = data.sft_examples(tok, problems)
    pad = tok_lib.special_ids(tok).pad
    lengths = {b.completion_len for b in data.sft_batches(examples, 2, pad, seed=0)}
    one = {b.completion_len for b in data.sft_batches(examples, 2, pad, completion_multiple=1152)}
    assert one == {1152} and max(lengths) <= 1152 and all(t % 64 == 0 for t in lengths)


def test_coordinate_targets_spell_starts_and_goals(tok, problems):
    examples = data.sft_examples(tok, problems)
    targets = data.coordinate_targets(tok, examples)
    for e, t, p in zip(examples, targets, problems):
        # The target tokens spell, in order, every agent's start row, col, goal row, col.
        spelled = "".join(tok.decode([e.prompt[j]]).strip(" ,()") for j in t)
        cells = [(*p.starts[a], *p.goals[a]) for a in range(p.num_agents)]
        want = "".join(str(int(v)) for c in cells for v in c)
        assert spelled == want and max(t) < len(e.prompt)
    pad = tok_lib.special_ids(tok).pad
    plain = next(data.sft_batches(examples, 8, pad, seed=0))
    cut = next(data.sft_batches(examples, 8, pad, seed=0, targets=targets))
    by_tokens = {e.prompt + e.completion: (e, t) for e, t in zip(examples, targets)}
    P = cut.prompt_len
    for i in range(8):
        # The same example, tokens and positions as the plain batch's row...
        real = cut.tokens[i][cut.attention_mask[i]].tolist()
        assert real == plain.tokens[i][plain.attention_mask[i]].tolist()
        assert cut.positions[i][cut.attention_mask[i]].tolist() == list(range(len(real)))
        # ...with the loss on the coordinate targets, the answer and the end-of-turn token.
        e, t = by_tokens[tuple(real)]
        before = int(cut.attention_mask[i, :P].sum())
        in_loss = {before + j for j in np.flatnonzero(cut.loss_mask[i])}
        answer = range(len(e.prompt), len(e.prompt) + len(e.completion))
        assert in_loss == set(t) | set(answer)
    with pytest.raises(ValueError, match="targets has 23 entries for 24 examples"):
        next(data.sft_batches(examples, 8, pad, targets=targets[1:]))


def test_batches_are_deterministic_and_resumable(tok, problems):
    examples = data.sft_examples(tok, problems)
    pad = tok_lib.special_ids(tok).pad

    def stream(seed, start=0):
        it = data.sft_batches(examples, 5, pad, seed=seed, epochs=3, start_step=start)
        return [b.tokens for b in it]

    a, b, c = stream(0), stream(0), stream(1)
    assert len(a) == 3 * (len(examples) // 5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, c))
    resumed = stream(0, start=6)
    assert len(resumed) == len(a) - 6
    assert all(np.array_equal(x, y) for x, y in zip(a[6:], resumed))
    # Each epoch is a permutation: every example appears at most once per epoch.
    epoch = [tuple(r.tolist()) for t in a[:4] for r in t]
    assert len(set(epoch)) == len(epoch)


def test_save_load_round_trip_and_errors(tok, problems, tmp_path):
    examples = data.sft_examples(tok, problems[:5])
    path = tmp_path / "sft.jsonl"
    data.save_examples(path, examples)
    assert data.load_examples(path) == examples
    path.write_text(path.read_text() + '{"prompt": [1]}\n')
    with pytest.raises(ValueError, match=r"sft.jsonl:6"):
        data.load_examples(path)
    with pytest.raises(ValueError, match="batch_size=50"):
        next(data.sft_batches(examples, 50, 0))


def test_length_grouping_cuts_padding():
    rng = np.random.default_rng(0)
    lengths = rng.integers(100, 300, size=640)

    def padding(window):
        rows = data.epoch_order(lengths, 16, seed=1, epoch=0, window=window)
        assert sorted(rows.ravel().tolist()) == sorted(set(rows.ravel().tolist()))
        assert rows.shape == (40, 16)
        return np.mean([lengths[r].max() - lengths[r].mean() for r in rows])

    assert padding(16) < 0.5 * padding(1)


def test_cached_builds_once(tmp_path):
    calls = []

    def build():
        calls.append(1)
        return "payload"

    def load(p):
        return p.read_text()

    path = tmp_path / "x.txt"
    first = data.cached(path, build, lambda p, v: p.write_text(v), load)
    second = data.cached(path, build, lambda p, v: p.write_text(v), load)
    assert first == second == "payload" and len(calls) == 1


def test_thinking_examples_are_trace_then_answer(tok, problems):
    """With a trace form, the prompt opens the assistant turn (no empty think block) and the
    completion is the form's trace of the plan it finds, then that plan's answer, then
    <|im_end|>."""
    from mapfjax.env import forms, relay, trace

    examples = data.sft_examples(tok, problems[:6], form="grid_relay")
    ids = tok_lib.special_ids(tok)
    assert [e.problem_id for e in examples] == [p.id for p in problems[:6]]
    for e, p in zip(examples, problems[:6]):
        want = tok_lib.builtin_chat_text([{"role": "user", "content": text.render_prompt(p)}])
        assert tok.decode(list(e.prompt)) == want
        assert e.completion[-1] == ids.im_end
        turn = tok.decode(list(e.completion[:-1]))
        plans, reason = text.parse_answer(turn, p.num_agents)
        assert reason is None and turn.startswith("<think>\nr0: (0, 0) ")
        assert forms.GRID_RELAY.check(p, turn)[1] is None
        assert plans == relay.retry(p)[1] or relay.every_order_fails(p) is not None
        assert (
            turn
            == data.response(p, None, forms.GRID_RELAY)
            == data.response(p, plans, "grid_relay")
        )
        assert trace.thinking_text(turn)


def test_answer_only_examples_keep_the_answer_after_an_empty_think_block(tok):
    """sft_examples(answer_only=share): about that share of the puzzles, chosen by puzzle hash
    (the same puzzles at any share below), give the same answer block after `<think>\\n\\n
    </think>` instead of their trace; the rest are unchanged. Refused without thinking."""
    from mapfjax.env import trace

    problems = random_problems(120, seed=23, sizes=(3, 4, 5))
    form = "grid_relay"
    full = data.sft_examples(tok, problems, form=form)
    half = data.sft_examples(tok, problems, form=form, answer_only=0.5)
    most = data.sft_examples(tok, problems, form=form, answer_only=0.8)
    assert data.sft_examples(tok, problems, form=form, answer_only=0.0) == full
    by_id = {p.id: p for p in problems}

    def bare(examples):
        out = set()
        for e, f in zip(examples, full, strict=True):
            turn, whole = tok.decode(list(e.completion[:-1])), tok.decode(list(f.completion[:-1]))
            p = by_id[e.problem_id]
            assert e.prompt == f.prompt and e.puzzle == f.puzzle == io.puzzle_hash(p)
            assert text.parse_answer(turn, 2) == text.parse_answer(whole, 2)
            if turn != whole:
                assert turn == "<think>\n\n</think>\n\n" + whole[trace.answer_start(whole) + 10 :]
                share = 0.5 if e in half else 0.8
                assert trace.thinking_text(turn) == "" and data.skips_trace(p, share)
                out.add(e.problem_id)
            else:
                assert trace.thinking_text(turn)
        return out

    some, more = bare(half), bare(most)
    assert some < more and 40 <= len(some) <= 80 and 80 <= len(more) <= 110
    assert some == {p.id for p in problems if data.skips_trace(p, 0.5)}
    with pytest.raises(ValueError, match=r"answer_only 0\.5: a share in \[0, 1\], above 0 only"):
        data.sft_examples(tok, problems[:2], answer_only=0.5)
    with pytest.raises(ValueError, match=r"answer_only -0\.1"):
        data.sft_examples(tok, problems[:2], form=form, answer_only=-0.1)


@pytest.mark.slow
def test_sft_on_traces_lowers_the_loss(tok, problems):
    """A micro model fits trace examples: the loss over the whole turn falls by half."""
    import jax.numpy as jnp
    from flax import nnx

    from mapfjax.models.qwen3 import PRESETS, Qwen3
    from mapfjax.rl.trainer import OptimConfig, Trainer

    examples = data.sft_examples(tok, problems[:8], form="grid_relay")
    cfg = PRESETS["tiny"].__class__(
        **{**PRESETS["tiny"].__dict__, "vocab_size": len(tok), "max_position_embeddings": 1024}
    )
    model = Qwen3(cfg, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    tr = Trainer(model, OptimConfig(lr=3e-3, warmup_steps=2, total_steps=30), "sft")
    batches = data.sft_batches(examples, 8, tok_lib.special_ids(tok).pad, seed=0, epochs=30)
    losses = [float(tr.step(b)["loss"]) for b in batches]
    assert len(losses) == 30 and losses[-1] < 0.5 * losses[0], losses


def test_chunks_by_length_cover_every_prompt_once_shortest_first():
    from mapfjax.rl.data import chunks_by_length

    prompts = [[1] * n for n in (5, 2, 9, 2, 7)]
    assert chunks_by_length(prompts, 2) == [[1, 3], [0, 4], [2]]
    assert chunks_by_length([], 3) == []
