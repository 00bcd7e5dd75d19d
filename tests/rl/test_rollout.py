"""Rollouts on a tiny random Qwen3: batch layout, masks, old log-probs against a plain forward
pass, advantages against NumPy, stats, warnings; scoring of known answers; validation."""

import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mapfjax.env import oracle, text, trace
from mapfjax.env.reward import RewardConfig
from mapfjax.models import tokenizer as tok_lib
from mapfjax.models.qwen3 import Qwen3, Qwen3Config
from mapfjax.rl import grpo, rollout
from mapfjax.rl.batch import GroupBatch
from tests.models.test_bpe import random_problems
from tests.rl.test_data import make_tokenizer

G = 4


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def model(tok):
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        rope_theta=1e4,
        max_position_embeddings=512,
    )
    return Qwen3(cfg, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(3))


@pytest.fixture(scope="module")
def problems():
    return random_problems(3, seed=11, sizes=(3, 4))


@pytest.fixture(scope="module", params=[True, False], ids=["shared_prefix", "rows"])
def result(request, model, tok, problems):
    # warn_truncation=0: any truncated row warns (a random model rarely stops in 24 tokens).
    sampling = rollout.SamplingConfig(
        max_new_tokens=24, temperature=1.0, warn_truncation=0.0, shared_prefix=request.param
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batch, stats = rollout.rollout(
            model,
            tok,
            problems,
            G,
            sampling,
            RewardConfig(),
            jax.random.key(0),
            measure_mismatch=True,
        )
    return batch, stats, [str(w.message) for w in caught if w.category is RuntimeWarning]


def as_rows(batch):
    """Per completion row, read straight off either layout's arrays: (prompt ids, completion
    ids incl. padding [T], completion attention mask [T], loss mask [T], old log-probs [T],
    advantage)."""
    out = []
    if isinstance(batch, GroupBatch):
        for j in range(batch.tokens.shape[0]):
            prompt = batch.prompt_tokens[j][batch.prompt_mask[j]].tolist()
            for r in range(batch.tokens.shape[1]):
                out.append((prompt, batch.tokens[j, r], batch.attention_mask[j, r],
                            batch.loss_mask[j, r], batch.old_logprobs[j, r],
                            batch.advantages[j, r]))  # fmt: skip
        return out
    P = batch.prompt_len
    for i in range(batch.tokens.shape[0]):
        row, mask = batch.tokens[i], batch.attention_mask[i]
        out.append((row[:P][mask[:P]].tolist(), row[P:], mask[P:], batch.loss_mask[i],
                    batch.old_logprobs[i], batch.advantages[i]))  # fmt: skip
    return out


def test_batch_layout_and_masks(result, tok, problems):
    batch, stats, _ = result
    ids = tok_lib.special_ids(tok)
    b = len(problems) * G
    T = batch.completion_len
    rows = as_rows(batch)
    assert len(rows) == b
    if isinstance(batch, GroupBatch):
        assert batch.tokens.shape == (len(problems), G, T)
    else:
        assert batch.tokens.shape == (b, batch.prompt_len + T)
    prompts = tok_lib.encode_chat(
        tok, [text.render_prompt(p) for p in problems], enable_thinking=False
    )
    lengths = np.array([r[3].sum() for r in rows])
    # Length-aware: the width is the longest completion's power-of-two bucket, at most 24.
    assert T == min(24, 1 << int(lengths.max() - 1).bit_length())
    for i, (prompt, comp, cmask, loss, _, _) in enumerate(rows):
        assert prompt == prompts[i // G]
        n = int(lengths[i])
        assert loss.tolist() == [True] * n + [False] * (T - n)
        assert cmask[:n].all() and not cmask[n:].any()
        completion = comp[:n].tolist()
        stops = [j for j, t in enumerate(completion) if t in (ids.im_end, ids.pad)]
        # The stop token (end of turn) is the last loss token; a row without one ran out.
        assert stops in ([], [n - 1])
        assert (stops == []) == (n == 24)
    assert stats.truncation_rate == pytest.approx(np.mean(lengths == 24))
    assert stats.response_len_max == lengths.max()


def test_old_logprobs_match_a_plain_forward_pass(result, model):
    batch, stats, _ = result
    for prompt, comp, _, loss, old, _ in as_rows(batch):
        n = int(loss.sum())
        seq = jnp.asarray([prompt + comp[:n].tolist()], jnp.int32)
        logits, _ = model(seq)
        logp = jax.nn.log_softmax(np.asarray(logits[0, len(prompt) - 1 : -1]), axis=-1)
        ref = logp[np.arange(n), comp[:n]]
        np.testing.assert_allclose(old[:n], ref, atol=2e-4)
        assert not old[n:].any()
    assert stats.logprob_mismatch is not None and stats.logprob_mismatch < 2e-4
    assert stats.logprob_gap == 0.0  # no top-k / top-p


def test_stats_and_advantages_are_consistent(result):
    batch, stats, _ = result
    b = len(as_rows(batch))
    assert sum(stats.failures.values()) == b
    assert stats.valid_rate == pytest.approx(stats.failures["none"] / b)
    grouped = np.asarray(batch.advantages).reshape(-1, G)
    np.testing.assert_allclose(grouped.mean(1), 0.0, atol=1e-5)
    assert set(stats.as_dict()) >= {"reward_mean", "truncation_rate", "fail_parse_error"}


def test_score_and_advantages_of_known_answers(problems):
    p = problems[0]
    sol = oracle.solve(p)
    best = text.render_answer(oracle.answer_actions(sol))
    texts = [best, "no answer here", best.replace("Agent 1", "Agent 7"), best]
    verdict, rew = rollout.score([p], 4, texts, RewardConfig(optimal_bonus=0.5))
    np.testing.assert_allclose(rew, [1.5, 0.0, 0.0, 1.5])
    assert verdict.valid.tolist() == [True, False, False, True]
    adv = np.asarray(grpo.group_advantages(rew, 4))
    want = (rew - rew.mean()) / (rew.std() + 1e-6)
    np.testing.assert_allclose(adv, want, rtol=1e-5)


def test_truncation_warns_and_temperature_mismatch_raises(result, model, tok, problems):
    _, stats, caught = result
    assert stats.truncation_rate > 0
    assert len(caught) == 1 and "max_new_tokens=24" in caught[0]
    with pytest.raises(ValueError, match="temperature"):
        rollout.rollout(
            model,
            tok,
            problems[:1],
            2,
            rollout.SamplingConfig(temperature=1.0),
            RewardConfig(),
            jax.random.key(1),
            grpo_cfg=grpo.GRPOConfig(group_size=2, temperature=0.7),
        )


def test_greedy_eval_groups_by_size(model, tok):
    probs = random_problems(6, seed=4, sizes=(3, 5))
    v = rollout.greedy_eval(model, tok, probs, max_new_tokens=8, batch_size=4)
    sizes = sorted({p.height for p in probs})
    assert [c.size for c in v.cells] == sizes
    assert sum(c.n for c in v.cells) == 6
    for c in v.cells:
        assert sum(c.failures.values()) == c.n
        assert 0.0 <= c.optimal_rate <= c.valid_rate <= 1.0
    table = v.table().splitlines()
    assert len(table) == 2 + len(sizes) + 1 and table[-1].startswith("| mean")
    for c in v.cells:  # the cells are the tallies of the per-instance rows
        mine = [r for r in v.rows if r["size"] == c.size]
        assert c.n == len(mine) and c.failures["none"] == sum(r["valid"] for r in mine)
        assert c.response_len_mean == pytest.approx(np.mean([r["response_tokens"] for r in mine]))


def test_greedy_eval_answers_in_length_order_and_returns_rows_in_the_given_order(model, tok):
    """Chunks are formed in order of prompt length (so each pads to its own longest), yet the
    rows come back in the order given, each the same answer as the puzzle asked alone."""
    probs = random_problems(7, seed=6, sizes=(3, 5, 4))
    lengths = [len(p) for p in rollout.encode_prompts(tok, probs)]
    assert lengths != sorted(lengths)  # the sort has something to do
    together = rollout.greedy_eval(model, tok, probs, max_new_tokens=8, batch_size=3, bucket="x8")
    alone = [rollout.greedy_eval(model, tok, [p], max_new_tokens=8, batch_size=1).rows[0]
             for p in probs]  # fmt: skip
    assert [r["id"] for r in together.rows] == [p.id for p in probs]
    assert list(together.rows) == alone


def test_greedy_eval_with_thinking_reports_the_trace(model, tok):
    """A random model writes no readable trace: every row says so, and the report has both
    trace sections (the first wrong line; the answer against the trace's plan)."""
    probs = random_problems(4, seed=5, sizes=(3,))
    v = rollout.greedy_eval(model, tok, probs, max_new_tokens=8, batch_size=4,
                            enable_thinking=True)  # fmt: skip
    for r in v.rows:
        assert r["trace_error"] in trace.ERROR_KINDS
        assert r["trace_plan"] == "no_plan" and r["trace_plan_valid"] is None
    report = rollout.validation_report(v, "t", problems=probs)
    assert "## Reasoning traces: the first wrong line" in report
    assert "| no_plan | 4 | - | 0 |" in report
    assert not any(r["bare_answer"] for r in v.rows) and "without a trace" not in report
    # answers after an empty think block (`sft.answer_only`) are counted
    rows = [r | {"bare_answer": j < 3, "valid": j == 0} for j, r in enumerate(v.rows)]
    report = rollout.validation_report(rollout.Validation(v.cells, tuple(rows)), "t")
    want = "Answers written without a trace (an empty think block): 3 of 4, 1 of them valid."
    assert want in report


def test_greedy_eval_marks_an_answer_after_an_empty_think_block(model, tok, monkeypatch):
    """A response whose think block is empty is a bare answer, with no trace plan; one with a
    trace is not."""
    probs = random_problems(2, seed=5, sizes=(3,))
    bare = "<think>\n\n</think>\n\n<answer>\nAgent 0: UP\nAgent 1: UP\n</answer>"
    texts = [bare, "<think>\nt1\n</think>\n\n<answer>\nAgent 0: UP\nAgent 1: UP\n</answer>"]
    real = rollout.sample

    def fixed(*args, **kwargs):
        out = real(*args, **kwargs)
        return out._replace(texts=texts[: len(out.texts)])

    monkeypatch.setattr(rollout, "sample", fixed)
    v = rollout.greedy_eval(model, tok, probs, max_new_tokens=8, batch_size=2,
                            enable_thinking=True)  # fmt: skip
    (bare_row,) = [r for r in v.rows if r["bare_answer"]]  # the chunk's order is by length
    assert bare_row["trace_plan"] == "no_plan" and bare_row["trace_plan_valid"] is None
    (other,) = [r for r in v.rows if not r["bare_answer"]]
    assert other["trace_plan"] == "differs"  # its trace's (empty) plan is not the answer's


def test_validation_table_numbers():
    fails = dict.fromkeys(("none", "parse_error", "hole"), 0)
    cells = (
        rollout.SizeResult(3, 2, 10, 0.5, 0.3, fails | {"none": 5, "hole": 5}, 20.0),
        rollout.SizeResult(4, 2, 10, 0.25, 0.0, fails | {"parse_error": 10}, 20.0),
    )
    v = rollout.Validation(cells)
    assert v.mean_valid == pytest.approx(0.375) and v.mean_optimal == pytest.approx(0.15)
    table = v.table()
    assert "| 2 | 3x3 | 10 | 50.0 | 30.0 | 0 | 0 | 5 |" in table
    assert "| mean | | | 37.5 | 15.0 |" in table


def _oracle_response(p):
    """The oracle plan's relay trace with a step label `t1` alone after its header (where
    `trace.header_end` cuts), then the answer and the end of turn."""
    plans = oracle.answer_actions(oracle.solve(p))
    header = "\n".join(trace.render_header(p))
    runs = trace.render_relay(p, plans, range(p.num_agents))[len(header) + 1 :]
    return trace.think_block(f"{header}\nt1\n{runs}") + text.render_answer(plans) + "<|im_end|>"


def test_trace_loss_masks_leave_out_exactly_the_header_or_the_trace(tok, problems):
    texts = [_oracle_response(p) for p in problems]
    comps = [tok.encode(t, add_special_tokens=False) for t in texts]
    moves = rollout.trace_loss_masks(tok, comps, texts, "moves")
    answer = rollout.trace_loss_masks(tok, comps, texts, "answer")
    assert rollout.trace_loss_masks(tok, comps, texts, "all") == [[True] * len(c) for c in comps]
    for p, comp, t, *masks in zip(problems, comps, texts, moves, answer, strict=True):
        cuts = []
        for mask in masks:
            assert len(mask) == len(comp) and not all(mask) and any(mask)
            k = mask.index(True)
            assert all(mask[k:]) and not any(mask[:k])  # one leading run of left-out tokens
            cuts.append(k)
        header = "<think>\n" + "\n".join(trace.render_header(p)) + "\n"
        assert tok.decode(comp[: cuts[0]]) == header  # exactly the map and the agents' lines
        assert tok.decode(comp[cuts[0] :]).startswith("t1\n")
        assert tok.decode(comp[: cuts[1]]) == t[: t.index("</think>")]  # the whole trace
        assert tok.decode(comp[cuts[1] :]).startswith("</think>\n\n<answer>")
    # No step line: "moves" trains it whole; a trace that never closes: "answer" trains none.
    for loss, end, want in [("moves", "t1\n", True), ("answer", "</think>", False)]:
        cut = texts[0][: texts[0].index(end)]
        ids = [tok.encode(cut, add_special_tokens=False)]
        assert rollout.trace_loss_masks(tok, ids, [cut], loss) == [[want] * len(ids[0])]
    plain = [tok.encode("Agent 0: UP", add_special_tokens=False)]
    got = rollout.trace_loss_masks(tok, plain, ["Agent 0: UP"], "moves")
    assert got == [[True] * len(plain[0])]
    for loss in ("moves", "answer"):  # tokens that do not decode into the text: trained whole
        got = rollout.trace_loss_masks(tok, comps[:1], ["x" + texts[0]], loss)
        assert got == [[True] * len(comps[0])]
    with pytest.raises(ValueError, match="trace_loss='header'"):
        rollout.SamplingConfig(trace_loss="header")


@pytest.mark.parametrize("trace_loss", rollout.TRACE_LOSSES)
def test_rollout_trace_loss_clears_the_left_out_part_from_the_loss_mask(
    trace_loss, model, tok, problems, monkeypatch
):
    texts = [_oracle_response(p) for p in problems for _ in range(G)]
    comps = [tok.encode(t, add_special_tokens=False) for t in texts]
    T = max(map(len, comps))

    def fake_sample(model, tokenizer, problems_, repeats, cfg, key, mesh=None):
        prompts = rollout.encode_prompts(tokenizer, problems_, cfg.enable_thinking)
        n = len(comps)
        tokens = np.zeros((n, T), np.int32)
        out = types.SimpleNamespace(
            tokens=tokens,
            lengths=np.array(list(map(len, comps))),
            logprobs=np.zeros((n, T), np.float32),
            logprobs_full=np.zeros((n, T), np.float32),
            finished=np.ones(n, bool),
        )
        return rollout.Samples([q for q in prompts for _ in range(repeats)], out, comps, texts)

    monkeypatch.setattr(rollout, "sample", fake_sample)
    sampling = rollout.SamplingConfig(
        max_new_tokens=T, enable_thinking=True, trace_loss=trace_loss, completion_bucket=T
    )
    batch, stats = rollout.rollout(model, tok, problems, G, sampling, RewardConfig(), None)
    assert stats.valid_rate == 1.0  # the oracle's answers
    want = rollout.trace_loss_masks(tok, comps, texts, trace_loss)
    assert (trace_loss == "all") == all(all(m) for m in want)
    for i, row in enumerate(as_rows(batch)):
        assert row[3][: len(comps[i])].tolist() == want[i]
        assert not row[3][len(comps[i]) :].any()
