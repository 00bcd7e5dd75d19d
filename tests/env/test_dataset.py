"""The dataset for other trainers and the pure-Python scorer, against the jitted verifier."""

import importlib.util
import inspect
import json
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mapfjax.configfile import ROOT
from mapfjax.env import answer, dataset, dynamics, reward, score, simulate, text, types
from mapfjax.env.config import ConfigError, default_config
from tests.env.test_dynamics import problem_and_plan
from tests.env.test_text import MESSY_VALID, PARSE_ERRORS, tag_soup

# Every term of the reward counts, so a disagreement in any verdict field changes the number.
SHAPED = score.RewardConfig(
    valid_reward=1.0, optimal_bonus=0.5, invalid_reward=-0.25, format_penalty=0.5, agent_credit=0.3
)


@pytest.fixture(scope="module")
def small():
    return dataset.MapfDataset(default_config(num_agents=2, sizes=range(3, 7), seed=3), 12)


def problem_of(meta: dict) -> types.Problem:
    return types.Problem(
        meta["id"],
        tuple(meta["grid"]),
        tuple(map(tuple, meta["starts"])),
        tuple(map(tuple, meta["goals"])),
        optimal_soc=meta["optimal_soc"],
    )


def truth_of(p: types.Problem) -> dict:
    return {
        "grid": list(p.grid),
        "starts": p.starts,
        "goals": p.goals,
        "optimal_soc": p.optimal_soc,
    }


def jitted_rewards(problems, texts, config):
    """The trainer's path: text.parse_answers -> dynamics.verify -> reward.rewards."""
    inst = types.to_instances(problems)
    parsed = text.parse_answers(texts, [p.num_agents for p in problems])
    verdict = dynamics.verify(inst, parsed)
    share = reward.agent_success(inst, parsed) if config.agent_credit else None
    return np.asarray(reward.rewards(verdict, config, share)), dynamics.verdict_rows(verdict)


def assert_same(problems, texts, config):
    """The pure score of every answer equals the jitted reward, verdict and soc."""
    want, rows = jitted_rewards(problems, texts, config)
    for p, t, w, row in zip(problems, texts, want, rows, strict=True):
        got = score.score(t, truth_of(p), config)
        assert got.reward == pytest.approx(float(w), abs=1e-6), (p, t, got, row)
        assert (got.valid, got.failure, got.soc) == (row["valid"], row["failure"], row["soc"])
        assert got.optimal == bool(row["optimal"])
    return rows


# --- pure Python --------------------------------------------------------------------------------


def test_scoring_imports_no_jax(small):
    item = small[0]
    row = dataset.row(item)
    program = f"""
import json, sys
from mapfjax.env import score
item = json.loads({json.dumps(json.dumps(item))})
row = json.loads({json.dumps(json.dumps(row))})
assert score.score_answer(item["answer"], item) == 1.5
gt = row["reward_model"]["ground_truth"]
assert score.compute_score("mapf_frozenlake", item["answer"], gt, row["extra_info"]) == 1.5
assert score.reward([[{{"role": "assistant", "content": item["answer"]}}]],
                    reward_model=[row["reward_model"]]) == [1.5]
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib", "flax", "chex"))
print(heavy)
"""
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_pure_parser_agrees_with_text_parser_on_known_answers():
    assert answer.ACTION_NAMES == types.ACTION_NAMES and answer.WAIT == types.WAIT
    default = inspect.signature(text.parse_answer).parameters["max_steps"].default
    assert answer.MAX_STEPS == default
    for response in MESSY_VALID + [r for r, _ in PARSE_ERRORS]:
        assert answer.parse_answer(response, 2) == text.parse_answer(response, 2)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=500), tag_soup), st.integers(1, 5), st.integers(1, 40))
def test_pure_parser_agrees_with_text_parser_on_fuzzed_text(response, k, max_steps):
    assert answer.parse_answer(response, k, max_steps) == text.parse_answer(response, k, max_steps)


def _answer_text(draw, plan, k):
    """A response for `plan` (None: a parse error), drawn from the fuzzers of test_text."""
    kind = draw(st.sampled_from(["render", "render", "think", "messy", "soup", "dropped"]))
    if plan is None or kind == "soup":
        return draw(st.one_of(tag_soup, st.sampled_from([r for r, _ in PARSE_ERRORS])))
    body = text.render_answer(plan)
    if kind == "think":
        return "<think>draft " + draw(tag_soup) + "</think>\n" + body
    if kind == "messy":
        return body.lower().replace(", ", " ").replace("wait", "stay")
    if kind == "dropped" and k > 1:
        return body.replace(f"Agent {k - 1}:", "Agent :")
    return body


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_score_equals_jitted_reward_on_fuzzed_answers(data):
    """Fixed batch of 8 (one compiled shape per plan length); labels that make some valid
    plans optimal, some not, some unlabelled."""
    cases = data.draw(st.lists(problem_and_plan(), min_size=8, max_size=8))
    problems, texts = [], []
    for p, plan in cases:
        soc = simulate.simulate(p, plan)["soc"]
        label = data.draw(st.sampled_from([None, soc, None if soc is None else soc + 1]))
        problems.append(types.Problem(p.id, p.grid, p.starts, p.goals, optimal_soc=label))
        texts.append(_answer_text(data.draw, plan, p.num_agents))
    assert_same(problems, texts, SHAPED)
    assert_same(problems, texts, score.RewardConfig())


def _mutations(rng, plans, k):
    """One variant of an optimal plan: itself, padded, delayed, edited, cut, swapped, random,
    or text that does not parse."""
    plans = [list(a) for a in plans]
    kind = int(rng.integers(9))
    i = int(rng.integers(k))
    if kind == 1:
        plans = [a + [types.WAIT] * int(rng.integers(1, 4)) for a in plans]
    elif kind == 2:
        plans[i] = [types.WAIT] * int(rng.integers(1, 3)) + plans[i]
    elif kind == 3 and plans[i]:
        plans[i][int(rng.integers(len(plans[i])))] = int(rng.integers(5))
    elif kind == 4 and plans[i]:
        plans[i] = plans[i][: int(rng.integers(len(plans[i])))]
    elif kind == 5 and k > 1:
        plans[0], plans[1] = plans[1], plans[0]
    elif kind == 6:
        plans = [list(rng.integers(0, 5, int(rng.integers(0, 12)))) for _ in range(k)]
    body = text.render_answer(plans)
    if kind == 7:
        return body.replace("</answer>", "") if rng.random() < 0.5 else body.replace("UP", "JUMP")
    if kind == 8:
        return "<think>" + body + "</think>" + body.replace("Agent 0", "agent 0").lower()
    return body


def test_score_equals_jitted_reward_on_10k_generated_plans(small):
    three = dataset.MapfDataset(default_config(num_agents=3, sizes=range(4, 8), seed=5), 24)
    items = list(small) + list(three)
    rng = np.random.default_rng(0)
    chunk, n_chunks = 1024, 10
    kinds = {}
    for _ in range(n_chunks):
        picks = rng.integers(len(items), size=chunk)
        problems = [problem_of(items[j]["metadata"]) for j in picks]
        texts = []
        for j, p in zip(picks, problems, strict=True):
            optimal, _ = answer.parse_answer(items[j]["answer"], p.num_agents)
            texts.append(_mutations(rng, optimal, p.num_agents))
        for row in assert_same(problems, texts, SHAPED):
            label = "optimal" if row["optimal"] else row["failure"] or "valid"
            kinds[label] = kinds.get(label, 0) + 1
    assert sum(kinds.values()) >= 10_000
    assert set(kinds) >= set(types.FAILURE_NAMES) | {"optimal", "valid"}, kinds


# --- the dataset -------------------------------------------------------------------------------


def test_dataset_is_deterministic_per_seed(small):
    cfg = default_config(num_agents=2, sizes=range(3, 7), seed=3)
    again = dataset.MapfDataset(cfg, 12)
    other = dataset.MapfDataset(cfg, 12, seed=4)
    assert len(small) == len(again) == 12 and (small.seed, other.seed) == (3, 4)
    assert list(small) == list(again)
    assert [e["metadata"]["grid"] for e in small] != [e["metadata"]["grid"] for e in other]


def test_entries_have_the_reasoning_gym_shape_and_optimal_answers(small):
    for i, item in enumerate(small):
        assert set(item) == {"question", "answer", "metadata"}
        meta = item["metadata"]
        assert json.loads(json.dumps(meta)) == meta  # plain JSON data
        assert meta["source_index"] == i and meta["num_agents"] == 2
        p = problem_of(meta)
        assert item["question"] == text.render_prompt(p)
        assert meta["size"] == p.height and 0 <= meta["hole_ratio"] <= 0.5
        result = score.score(item["answer"], item)
        assert result.optimal and result.soc == meta["optimal_soc"]
        assert small.score_answer(item["answer"], item) == 1.5
        assert small.score_answer("<answer>nothing</answer>", item) == 0.0
    assert small[-1] == list(small)[-1]


def test_export_round_trips_through_jsonl(small, tmp_path):
    written = small.write(tmp_path / "train.jsonl", split="train")
    assert written == dataset.Written(tmp_path / "train.jsonl", "jsonl", 12)
    back = dataset.read_rows(written.path)
    assert back == small.rows("train")
    for item, row in zip(small, back, strict=True):
        truth = row["reward_model"]["ground_truth"]
        for response in (item["answer"], item["answer"].replace("Agent 1", "Agent 0"), None):
            want = small.score_answer(response, item)
            assert score.compute_score(row["data_source"], response, truth) == want


def test_parquet_without_pyarrow_writes_jsonl_and_says_so(small, tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    written = small.write(tmp_path / "train.parquet")
    assert written.path == tmp_path / "train.jsonl" and written.format == "jsonl"
    assert written.note == "pyarrow is not installed: JSONL instead of train.parquet"
    assert "pyarrow is not installed" in caplog.text
    assert dataset.read_rows(written.path) == small.rows()
    with pytest.raises(ValueError, match=r"unknown file type '\.csv'"):
        small.write(tmp_path / "train.csv")


def test_the_export_never_overwrites_a_file_unless_asked(small, tmp_path, monkeypatch):
    """An existing file is kept, and a .parquet request without pyarrow does not replace the
    .jsonl of the same name the user never named; `overwrite` replaces either."""
    keep = tmp_path / "keep.jsonl"
    keep.write_text("mine\n")
    with pytest.raises(FileExistsError, match=r"keep.jsonl exists; refusing to overwrite it"):
        small.write(keep)
    assert keep.read_text() == "mine\n"
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(FileExistsError, match=r"keep.jsonl exists"):
        small.write(tmp_path / "keep.parquet")
    assert keep.read_text() == "mine\n" and not (tmp_path / "keep.parquet").exists()
    assert small.write(keep, overwrite=True).rows == len(small)
    assert dataset.read_rows(keep) == small.rows()


def test_parquet_round_trip(small, tmp_path):
    pytest.importorskip("pyarrow")
    written = small.write(tmp_path / "train.parquet")
    assert written.format == "parquet"
    assert dataset.read_rows(written.path) == small.rows()


def test_to_hf_dataset(small, monkeypatch):
    try:
        import datasets  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="needs the 'datasets' package"):
            small.to_hf_dataset()
    else:
        hf = small.to_hf_dataset()
        assert hf.column_names == list(dataset.COLUMNS) and len(hf) == len(small)
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match=r"pip install datasets"):
        small.to_hf_dataset()


# --- what verl and TRL call ---------------------------------------------------------------------


def test_rows_have_the_columns_verl_reads(small):
    for i, row in enumerate(small.rows("test")):
        assert tuple(row) == dataset.COLUMNS
        assert row["data_source"] == score.DATA_SOURCE and row["ability"] == dataset.ABILITY
        assert row["prompt"] == [{"role": "user", "content": small[i]["question"]}]
        assert row["reward_model"]["style"] == "rule"
        assert json.loads(row["reward_model"]["ground_truth"]) == small[i]["metadata"]
        assert row["extra_info"]["split"] == "test" and row["extra_info"]["index"] == i


def test_compute_score_has_verls_signature(small):
    params = inspect.signature(score.compute_score).parameters
    names = ["data_source", "solution_str", "ground_truth", "extra_info"]
    assert list(params)[:4] == names and params["extra_info"].default is None
    row = dataset.row(small[0])
    kwargs = dict(
        data_source=row["data_source"],
        solution_str=small[0]["answer"],
        ground_truth=row["reward_model"]["ground_truth"],
        extra_info=row["extra_info"],
    )
    assert score.compute_score(**kwargs) == 1.5
    assert score.compute_score(**kwargs, optimal_bonus=2.0) == 3.0  # reward_kwargs
    with pytest.raises(ValueError, match="unknown reward setting.*optimal_bonsu"):
        score.compute_score(**kwargs, optimal_bonsu=2.0)


def test_score_file_loads_by_path_as_verl_loads_a_reward_file(small):
    spec = importlib.util.spec_from_file_location("custom_module_unregistered", score.__file__)
    module = importlib.util.module_from_spec(spec)  # not put in sys.modules
    spec.loader.exec_module(module)
    truth = dataset.row(small[0])["reward_model"]["ground_truth"]
    assert module.compute_score(score.DATA_SOURCE, small[0]["answer"], truth, {}) == 1.5


def test_reward_takes_trls_arguments(small):
    params = inspect.signature(score.reward).parameters
    assert list(params)[0] == "completions"
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    rows = small.rows()[:3]
    columns = {c: [r[c] for r in rows] for c in dataset.COLUMNS if c != "prompt"}
    answers = [small[i]["answer"] for i in range(3)]
    trl_extras = dict(completion_ids=[[1]] * 3, trainer_state=None)  # also passed by GRPOTrainer
    plain = score.reward(prompts=[r["prompt"] for r in rows], completions=answers, **columns)
    chat = [[{"role": "assistant", "content": a}] for a in answers]
    assert plain == score.reward(completions=chat, **columns, **trl_extras) == [1.5] * 3
    meta = [small[i]["metadata"] for i in range(3)]
    assert score.reward(answers, metadata=meta) == score.reward(answers, ground_truth=meta)
    assert (
        score.reward_function(score.RewardConfig(optimal_bonus=0.0))(answers, metadata=meta)
        == [1.0] * 3
    )
    with pytest.raises(KeyError, match="no ground-truth column among"):
        score.reward(answers, prompts=["p"] * 3)


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [None, b"<answer>Agent 0: UP</answer>", {"content": "x"}, [{"role": "user"}], 7, 2.5, object()],
)
def test_any_answer_type_scores_zero_with_a_label(small, bad):
    item = small[0]
    result = score.score(bad, item)
    assert (result.reward, result.valid, result.failure) == (0.0, False, "parse_error")
    assert type(bad).__name__ in result.reason
    assert small.score_answer(bad, item) == 0.0
    truth = dataset.row(item)["reward_model"]["ground_truth"]
    assert score.compute_score(score.DATA_SOURCE, bad, truth) == 0.0
    assert score.reward([bad], metadata=[item["metadata"]]) == [0.0]


def test_bad_ground_truth_names_the_field():
    good = {"grid": ["FF"], "starts": [[0, 0]], "goals": [[0, 1]], "optimal_soc": 1}
    for change, match in [
        ({"grid": ["FX"]}, "field 'grid'"),
        ({"starts": [[0, "a"]]}, "field 'starts'"),
        ({"goals": []}, "field 'goals'"),
        ({"optimal_soc": -1}, "field 'optimal_soc'"),
        ({"starts": [[0, 0], [0, 1]]}, "2 starts but 1 goals"),
    ]:
        with pytest.raises(ValueError, match=match):
            score.puzzle({**good, **change})
    with pytest.raises(ValueError, match="field 'goals' is missing"):
        score.puzzle({"grid": ["FF"], "starts": [[0, 0]]})
    with pytest.raises(ValueError, match="not JSON"):
        score.compute_score(score.DATA_SOURCE, "x", "{oops")
    assert score.score("<answer>Agent 0: RIGHT</answer>", json.dumps(good)).optimal


def test_zero_entries_and_impossible_configs_name_the_key():
    cfg = default_config(num_agents=2, sizes=[3, 4])
    for size in (0, -1, True, 2.0, 2_000_000_000):
        with pytest.raises(ValueError, match=re.escape(f"size = {size!r}; allowed: an integer")):
            dataset.MapfDataset(cfg, size)
    with pytest.raises(ValueError, match="seed = -1"):
        dataset.MapfDataset(cfg, 1, seed=-1)
    with pytest.raises(ConfigError, match="sizes.s3: 5 agents need 10 distinct cells"):
        dataset.MapfDataset(default_config(num_agents=5, sizes=[3, 4]), 4)
    with pytest.raises(ConfigError, match="num_agents = 6"):
        dataset.MapfDataset(default_config(num_agents=6), 4)
    bad = default_config()
    bad.sizes.s3.hole_ratio = 0.9
    with pytest.raises(ConfigError, match=r"sizes.s3.hole_ratio = 0.9; allowed: a number in"):
        dataset.MapfDataset(bad, 4)


def test_generator_config_reads_round_files_run_files_and_config_files(tmp_path):
    cfg = default_config(num_agents=3, sizes=[4, 5])
    (tmp_path / "round_2").mkdir()
    (tmp_path / "round_2" / "config.json").write_text(json.dumps(cfg.to_dict()))
    assert dataset.generator_config(tmp_path / "round_2" / "config.json").to_dict() == cfg.to_dict()
    (tmp_path / "run_config.json").write_text(json.dumps({"seed": 1, "env": cfg.to_dict()}))
    assert dataset.generator_config(str(tmp_path / "run_config.json")).to_dict() == cfg.to_dict()
    assert dataset.generator_config("configs/tiny_cpu.py").num_agents >= 1
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ConfigError, match="broken.json: not a JSON config"):
        dataset.generator_config(tmp_path / "broken.json")
    (tmp_path / "odd.json").write_text(json.dumps({"env": {**cfg.to_dict(), "colour": 1}}))
    with pytest.raises(ConfigError, match=r"odd.json: env: unknown key\(s\) \['colour'\]"):
        dataset.generator_config(tmp_path / "odd.json")
    with pytest.raises(FileNotFoundError, match="missing.json"):
        dataset.generator_config(tmp_path / "missing.json")


def test_export_command_writes_a_rounds_dataset(tmp_path, one_device_env):
    cfg = default_config(num_agents=2, sizes=[3, 4], seed=11)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    out = tmp_path / "data" / "round.jsonl"
    argv = ["--config", str(tmp_path / "config.json"), "--size", "6", "--out", str(out)]
    command = [sys.executable, "launch/export_dataset.py", *argv, "--split", "test"]
    done = subprocess.run(command, capture_output=True, text=True, env=one_device_env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert f"wrote 6 rows as jsonl to {out}, seed 11" in done.stdout
    rows = dataset.read_rows(out)
    assert [r["extra_info"]["split"] for r in rows] == ["test"] * 6
    for r in rows:
        truth = r["reward_model"]["ground_truth"]
        assert score.compute_score(r["data_source"], r["extra_info"]["answer"], truth) == 1.5
    bad = subprocess.run(
        [*command[:5], "0", *command[6:]], capture_output=True, text=True, cwd=ROOT
    )
    assert bad.returncode == 2 and "refusing to overwrite it" in bad.stderr  # before the size
    again = [*command[:5], "0", *command[6:], "--overwrite"]
    bad = subprocess.run(again, capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "size = 0; allowed" in bad.stderr
    assert dataset.read_rows(out) == rows  # untouched by the refused commands
