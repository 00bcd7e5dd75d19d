"""The MAPF BPE tokenizer: HF loading, round trips, special ids, regular grid/digit/action
tokens, compression of the fixed text, and the chat template."""

import pathlib
import re

import jax.numpy as jnp
import numpy as np
import pytest
import transformers

import mapfjax
from mapfjax.env import oracle, text
from mapfjax.env.types import Problem
from mapfjax.models import bpe, hf
from mapfjax.models import tokenizer as tok_lib


def random_problems(n: int, seed: int, sizes=(3, 4, 5), hole_ratio=0.2) -> list[Problem]:
    """`n` labelled 2-agent problems drawn with NumPy (no generator compile), oracle-solved."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        s = int(rng.choice(sizes))
        holes = rng.random((s, s)) < hole_ratio
        free = np.argwhere(~holes)
        if len(free) < 4:
            continue
        cells = [tuple(int(v) for v in free[i]) for i in rng.choice(len(free), 4, replace=False)]
        grid = tuple("".join("H" if h else "F" for h in row) for row in holes)
        p = Problem(f"p{len(out)}", grid, tuple(cells[:2]), tuple(cells[2:]))
        labelled, sol = oracle.label(p)
        if sol.optimal:
            out.append(labelled)
    return out


def corpus_and_answers(n: int = 60, seed: int = 0):
    problems = random_problems(n, seed, sizes=(3, 4, 5, 6, 8))
    answers = [oracle.answer_actions(oracle.solve(p)) for p in problems]
    return problems, answers


def corpus(problems, answers) -> list[str]:
    """`bpe.corpus` of the problems' rendered prompts and answers."""
    prompts = [text.render_prompt(p) for p in problems]
    return bpe.corpus(prompts, [text.render_answer(a) for a in answers])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    problems, answers = corpus_and_answers()
    out = bpe.train_tokenizer(corpus(problems, answers), 1024, tmp_path_factory.mktemp("bpe"))
    return out, problems, answers


def test_loads_with_transformers_and_our_loader(trained):
    out, _, _ = trained
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    auto = transformers.AutoTokenizer.from_pretrained(str(out))
    ours = tok_lib.load_tokenizer(out)
    assert auto.get_vocab() == ours.get_vocab()
    assert 261 < len(ours) <= 1024


def test_special_token_ids(trained):
    tok = tok_lib.load_tokenizer(trained[0])
    ids = tok_lib.special_ids(tok)
    assert (ids.pad, ids.im_start, ids.im_end, ids.think, ids.end_think) == (0, 1, 2, 3, 4)
    assert tok.pad_token_id == 0 and tok.eos_token_id == 2
    for i, s in enumerate(bpe.SPECIAL_TOKENS):
        assert tok(f"x{s}y", add_special_tokens=False)["input_ids"].count(i) == 1


def test_round_trip_prompts_answers_and_unseen_text(trained):
    out, problems, answers = trained
    tok = tok_lib.load_tokenizer(out)
    unseen = random_problems(5, seed=99, sizes=(7, 9, 10))
    texts = [text.render_prompt(p) for p in problems + unseen]
    texts += [text.render_answer(a) for a in answers]
    texts += ["Ünïcode ✓ and tabs\t and  double  spaces", "Agent 12: STAY, up,LEFT"]
    for t in texts:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == t


def test_grid_cells_digits_and_actions_are_single_regular_tokens(trained):
    out, problems, answers = trained
    tok = tok_lib.load_tokenizer(out)
    for p in problems[:10]:
        prompt = text.render_prompt(p)
        pieces = tok.convert_ids_to_tokens(tok(prompt, add_special_tokens=False)["input_ids"])
        decoded = [tok.convert_tokens_to_string([x]) for x in pieces]
        for tokn in decoded:
            if any(ch.isdigit() for ch in tokn):
                assert re.fullmatch(r"\d", tokn), tokn
        # Every grid row: one token per cell, each a symbol with at most one leading space.
        lines = prompt.split("\n")
        rows = lines[3 : 3 + p.height] + [" ".join(bpe.GRID_SYMBOLS)]  # + agents 2..4
        for row in rows:
            row_ids = tok(row, add_special_tokens=False)["input_ids"]
            cells = [tok.decode([i]) for i in row_ids]
            assert [c.strip() for c in cells] == row.split(" ")
    for a in answers[:10]:
        ids = tok(text.render_answer(a), add_special_tokens=False)["input_ids"]
        n_actions = sum(len(plan) for plan in a)
        action_tokens = [t for t in (tok.decode([i]) for i in ids) if t.strip(", ") in bpe.ACTIONS]
        assert len(action_tokens) == n_actions
    for a in bpe.ACTIONS:
        for prefix in (" ", ", "):
            assert len(tok(prefix + a, add_special_tokens=False)["input_ids"]) == 1


def test_fixed_text_compresses(trained):
    tok = tok_lib.load_tokenizer(trained[0])
    rules = "\n".join(text.RULES)
    n = len(tok(rules, add_special_tokens=False)["input_ids"])
    pieces = tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str(rules)
    # Between its split points (digits, newlines, action words) the rule text is merged into
    # (nearly) one token per piece.
    assert n <= 1.2 * len(pieces) and n < len(rules) / 5, (n, len(pieces), len(rules))


@pytest.mark.parametrize("thinking", [True, False])
def test_chat_template_matches_builtin(trained, thinking):
    tok = tok_lib.load_tokenizer(trained[0])
    prompt = text.render_prompt(trained[1][0])
    got = tok_lib.chat_text(tok, prompt, enable_thinking=thinking)
    want = tok_lib.builtin_chat_text([{"role": "user", "content": prompt}], thinking)
    assert got == want
    assert got.endswith("<think>\n\n</think>\n\n") != thinking
    ids = tok_lib.encode_chat(tok, [prompt], enable_thinking=thinking)[0]
    assert ids[0] == 1 and tok.decode(ids) == want


def test_bad_vocab_size():
    with pytest.raises(ValueError, match=r"vocab_size = 200; allowed: an integer >= 262"):
        bpe.build_tokenizer(["abc"], 200)


@pytest.mark.slow
def test_shipped_tiny_model_loads_and_matches_transformers():
    import torch  # slow to import (seconds); only this comparison needs it

    path = pathlib.Path(mapfjax.__file__).parent / "assets" / "tiny"
    assert (path / "VALIDATION.md").is_file()
    assert sum(f.stat().st_size for f in path.iterdir()) < 20 * 2**20
    tok = tok_lib.load_tokenizer(path)
    ids = tok_lib.encode_chat(
        tok, [text.render_prompt(random_problems(1, 3)[0])], enable_thinking=False
    )
    assert tok.decode(ids[0]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ours = hf.from_pretrained(path, dtype=jnp.float32)
    assert ours.config.vocab_size == len(tok)
    logits = np.asarray(ours(jnp.asarray(ids))[0][0])
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    assert ref_model.generation_config.eos_token_id == tok_lib.special_ids(tok).im_end
    # One thread, as tests/models/hf_fixtures.py says: with two, PyTorch's rotary cos/sin is
    # now and then 1.5e-4 off for the later positions and this comparison fails by 3e-3.
    torch.set_num_threads(1)
    with torch.no_grad():
        ref = ref_model(torch.tensor(ids)).logits[0].numpy()
    np.testing.assert_allclose(logits, ref, atol=2e-4, rtol=1e-4)


def test_coordinate_tokenizer_makes_every_cell_one_token(tmp_path):
    """A tokenizer for reasoning traces: every " (r, c)" of a 10x10 map is one token, in the
    prompt's agent lines and in the trace, and trace turns decode back to their text."""
    from mapfjax.env import forms

    problems, answers = corpus_and_answers(30, seed=4)
    pairs = [
        (text.render_prompt(p), forms.GRID_RELAY.response(p, a)) for p, a in zip(problems, answers)
    ]
    prompts, turns = [q for q, t in pairs if t], [t for _, t in pairs if t]
    assert len(turns) >= 28
    out = bpe.save_tokenizer(
        tmp_path, bpe.build_tokenizer(bpe.corpus(prompts, turns, True), 1024, coordinates=True)
    )
    tok = tok_lib.load_tokenizer(out)
    for c in bpe.COORDINATES:
        assert len(tok(c, add_special_tokens=False)["input_ids"]) == 1, c
    for prompt, turn in zip(prompts[:10], turns[:10]):
        for s in (prompt, turn):
            ids = tok(s, add_special_tokens=False)["input_ids"]
            assert tok.decode(ids) == s
        n_cells = len(re.findall(r" \(\d, \d\)", turn))
        ids = tok(turn, add_special_tokens=False)["input_ids"]
        cell_tokens = [i for i in ids if re.fullmatch(r" \(\d, \d\)", tok.decode([i]))]
        assert len(cell_tokens) == n_cells > 0
    with pytest.raises(RuntimeError, match="raise vocab_size"):
        bpe.build_tokenizer(bpe.corpus(prompts, turns, True), 300, coordinates=True)
