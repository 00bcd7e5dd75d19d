"""The shipped models in clients outside this project, prompted by their chat templates alone.

TRL's `GRPOTrainer` (the `interop` extra) trains the answer-only model for a few steps on a
dataset written by `launch/export_dataset.py`, scored by `mapfjax.env.score.reward`: some
completions are rewarded and the scorer never imports JAX. transformers' `generate`, given the
prompt and nothing else, answers greedily as this project's sampler does. The settings
docs/other_trainers.md gives each trainer are checked against the models they are for.
"""

import ast
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

import mapfjax
from mapfjax.env import io, score, text

ROOT = pathlib.Path(__file__).resolve().parents[1]
ASSETS = pathlib.Path(mapfjax.__file__).parent / "assets"
MODELS = ("tiny", "tiny_think", "tiny_base")

# GRPO as a TRL user runs it, scaled to 2 CPU cores: 3 steps of 2 puzzles x 4 completions.
STEPS, PER_STEP, GROUP = 3, 8, 4
# Puzzles answered greedily by transformers and by this project's sampler.
PUZZLES = 12

# Runs in a fresh interpreter: argv = dataset file, model directory, output directory. Prints
# one JSON line: what the reward function saw and returned, and what TRL logged.
TRL_RUN = """
import json, sys, time
started = time.time()
from datasets import load_dataset
from trl import GRPOConfig, GRPOTrainer
from mapfjax.env import score

data, model, out = sys.argv[1:4]
steps, per_step, group = (int(a) for a in sys.argv[4:7])
calls = []

def reward(completions, **columns):  # score.reward, recording what it returned
    rewards = score.reward(completions, **columns)
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    calls.append({"rewards": rewards, "texts": texts, "jax": "jax" in sys.modules})
    return rewards

args = GRPOConfig(
    output_dir=out, max_steps=steps, per_device_train_batch_size=per_step,
    num_generations=group, max_completion_length=64, logging_steps=1, report_to="none",
    save_strategy="no", use_cpu=True, bf16=False, seed=0, dataloader_num_workers=0,
)
train = load_dataset("json", data_files=data, split="train")
trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=train)
trainer.train()
logged = [h["rewards/reward/mean"] for h in trainer.state.log_history if "rewards/reward/mean" in h]
print(json.dumps({
    "calls": calls, "logged": logged, "steps": trainer.state.global_step,
    "jax_at_end": "jax" in sys.modules, "seconds": time.time() - started,
}))
"""


def _offline_env(home: pathlib.Path) -> dict:
    """The environment of a client run: no network, Hugging Face caches under `home`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        HF_HOME=str(home),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        CUDA_VISIBLE_DEVICES="",
    )
    return env


def test_trl_grpo_trainer_rewards_the_shipped_answer_only_model(tmp_path):
    pytest.importorskip(
        "trl", reason="trl is not installed: pip install -e '.[interop]' (CI installs it)"
    )
    data = tmp_path / "train.jsonl"
    export = [sys.executable, "launch/export_dataset.py", "--config", "configs/tiny_cpu.py"]
    export += ["--size", "32", "--out", str(data)]
    done = subprocess.run(export, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(data.read_text().splitlines()) == 32

    started = time.monotonic()
    args = [str(data), str(ASSETS / "tiny"), str(tmp_path / "trl_out"), STEPS, PER_STEP, GROUP]
    run = subprocess.run(
        [sys.executable, "-c", TRL_RUN, *map(str, args)],
        cwd=tmp_path,
        env=_offline_env(tmp_path / "hf_home"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.monotonic() - started
    assert run.returncode == 0, run.stderr[-5000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])

    assert got["steps"] == STEPS
    rewards = [r for call in got["calls"] for r in call["rewards"]]
    assert len(rewards) == STEPS * PER_STEP, len(rewards)
    assert set(rewards) <= {0.0, 1.0, 1.5}, sorted(set(rewards))
    rewarded = sum(r > 0 for r in rewards)
    # With the thinking prompt this model never saw, every completion was `</answer>` (0 of 24).
    assert rewarded > 0, [t for call in got["calls"] for t in call["texts"]][:8]
    # TRL trained on these rewards: each step's logged mean is the mean of what the scorer gave.
    means = [sum(c["rewards"]) / len(c["rewards"]) for c in got["calls"]]
    assert len(got["logged"]) == STEPS
    assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(got["logged"], means)), (
        got["logged"],
        means,
    )
    # The scorer needs the standard library only: JAX was never imported in the client.
    assert not any(call["jax"] for call in got["calls"]) and not got["jax_at_end"]
    print(f"TRL: {rewarded} of {len(rewards)} completions rewarded; {seconds:.0f} s in all")


def _puzzles(n: int):
    """`n` exported rows of the main job's round-0 distribution with their Problems."""
    from mapfjax.env import dataset
    from mapfjax.env.config import default_config

    cfg = default_config(num_agents=2, sizes=range(3, 7), hole_ratio=0.2, wait_ratio=0.5, seed=0)
    rows = dataset.MapfDataset(cfg, size=n, seed=3).rows()
    problems = []
    for row in rows:
        meta = json.loads(row["reward_model"]["ground_truth"])
        problems.append(
            io.problem_from_row({k: v for k, v in meta.items() if k in io.INSTANCE_FIELDS})
        )
    return rows, problems


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_transformers_generate_answers_as_the_projects_sampler(name):
    """The checkpoint as a transformers user loads it: the chat template with no arguments and
    `generate` with the decoding settings of its generation_config.json (greedy, its token
    budget) give, token for token, what this project's sampler gives with the prompt mode the
    model was trained on."""
    import jax.numpy as jnp
    import torch
    import transformers

    from mapfjax.models import hf
    from mapfjax.models import tokenizer as tok_lib
    from mapfjax.rl import rollout

    path = ASSETS / name
    rows, problems = _puzzles(PUZZLES)
    assert [r["prompt"][0]["content"] for r in rows] == [text.render_prompt(p) for p in problems]

    settings = hf.generation_settings(path)
    tok = tok_lib.load_tokenizer(path)
    ours = rollout.sample(
        hf.from_pretrained(path, dtype=jnp.float32),
        tok,
        problems,
        1,
        rollout.SamplingConfig(
            settings.max_new_tokens, 0.0, enable_thinking=settings.enable_thinking
        ),
        None,
    )

    hf_tok = transformers.AutoTokenizer.from_pretrained(str(path))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # with two, PyTorch's rotary embedding is now and then 1.5e-4 off
    theirs, texts = [], []
    try:
        for row, prompt in zip(rows, ours.prompts, strict=True):
            inputs = hf_tok.apply_chat_template(
                row["prompt"], add_generation_prompt=True, return_dict=True, return_tensors="pt"
            )
            assert (
                inputs["input_ids"][0].tolist() == prompt
            )  # the project's prompt, token for token
            with torch.no_grad():
                out = model.generate(**inputs)  # greedy, max_new_tokens: generation_config.json
            theirs.append(out[0, inputs["input_ids"].shape[1] :].tolist())
            texts.append(hf_tok.decode(theirs[-1]))
    finally:
        torch.set_num_threads(threads)

    assert theirs == ours.completions
    ground = [r["reward_model"] for r in rows]
    rewards = score.reward(texts, reward_model=ground)
    assert rewards == score.reward(ours.texts, reward_model=ground)
    # Each model answers in the form it was trained to: after its own think block, or at once.
    opening = "<think>" if settings.enable_thinking else "<answer>"
    assert all(t.startswith(opening) for t in texts), texts
    if not settings.enable_thinking:  # 37.5 % greedy valid on such puzzles: some are solved
        assert any(r > 0 for r in rewards), texts
    print(f"{name}: {sum(r > 0 for r in rewards)} of {len(rows)} greedy answers rewarded")


# The settings table of docs/other_trainers.md: model, prompt mode, TRL, verl, token budget.
_SETTINGS_HEADING = "## The prompt mode: settings for the shipped models and Qwen3"


def settings_rows() -> dict[str, list[str]]:
    """The rows of docs/other_trainers.md's settings table, by their first cell."""
    page = (ROOT / "docs" / "other_trainers.md").read_text(encoding="utf-8")
    assert _SETTINGS_HEADING in page, "docs/other_trainers.md lost its settings section"
    section = page.split(_SETTINGS_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 5 and not set(cells[0]) <= {"-"}:
            rows[cells[0].strip("`")] = cells
    return rows


def _literal(cell: str):
    """The text of a cell's leading `code` span, or None where the cell says "none"."""
    m = re.fullmatch(r"`([^`]*)`(?: \(.*\))?|none(?: \(.*\))?", cell)
    assert m, f"not a `value` or none: {cell!r}"
    return None if m.group(1) is None else m.group(1)


@pytest.mark.parametrize("name", MODELS)
def test_the_documented_settings_are_the_shipped_models(name):
    """Each shipped model's row says its trained prompt mode and token budget as its
    generation_config.json records them, and that no trainer needs a chat-template argument;
    the explicit TRL and verl settings it gives render the trained prompt too."""
    import transformers

    from mapfjax.models import tokenizer as tok_lib

    rows = settings_rows()
    key = f"mapfjax/assets/{name}"
    assert key in rows, sorted(rows)
    _, mode, trl_cell, verl_cell, budget = rows[key]
    gen = json.loads((ASSETS / name / "generation_config.json").read_text())
    assert mode.startswith("thinking on" if gen["enable_thinking"] else "thinking off"), mode
    assert int(_literal(budget)) == gen["max_new_tokens"]
    assert trl_cell.startswith("none") and verl_cell.startswith("none")
    # "none" is enough; the explicit form in parentheses gives the same prompt.
    kwargs = ast.literal_eval(re.search(r"chat_template_kwargs=(\{[^}]*\})", trl_cell).group(1))
    assert kwargs == {"enable_thinking": gen["enable_thinking"]}
    verl = re.search(r"\+data\.apply_chat_template_kwargs\.enable_thinking=(\w+)", verl_cell)
    assert verl and verl.group(1) == str(gen["enable_thinking"])
    tok = transformers.AutoTokenizer.from_pretrained(str(ASSETS / name))
    messages = [{"role": "user", "content": "Plan a path"}]
    plain = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    explicit = tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **kwargs
    )
    assert plain == explicit == tok_lib.builtin_chat_text(messages, gen["enable_thinking"])


def test_the_documented_qwen3_settings_switch_the_prompt_mode():
    """The Qwen3 rows: thinking on (Qwen3's default, this project's paper setting) needs no
    argument; answer-only needs enable_thinking=False in TRL's and verl's form."""
    rows = settings_rows()
    thinking = next(v for k, v in rows.items() if k.startswith("Qwen3") and "thinking on" in v[1])
    answer = next(v for k, v in rows.items() if k.startswith("Qwen3") and "thinking off" in v[1])
    assert thinking[2].startswith("none") and thinking[3].startswith("none")
    trl_kwargs = ast.literal_eval(re.fullmatch(r"`chat_template_kwargs=(.*)`", answer[2]).group(1))
    assert trl_kwargs == {"enable_thinking": False}
    assert answer[3] == "`+data.apply_chat_template_kwargs.enable_thinking=False`"
    paper = (ROOT / "configs" / "paper_qwen3_4b.py").read_text()
    assert "c.train.enable_thinking = True" in paper
    assert int(_literal(thinking[4])) == int(re.search(r"max_new_tokens = (\d+)", paper).group(1))


# transformers 5 warns about a setting TRL's config passes on; not this test's concern.
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
def test_trl_accepts_the_documented_chat_template_kwargs():
    trl = pytest.importorskip(
        "trl", reason="trl is not installed: pip install -e '.[interop]' (CI installs it)"
    )
    for cells in settings_rows().values():
        m = re.search(r"chat_template_kwargs=(\{[^}]*\})", cells[2])
        if m:
            kwargs = ast.literal_eval(m.group(1))
            config = trl.GRPOConfig(output_dir="unused", chat_template_kwargs=kwargs, use_cpu=True)
            assert config.chat_template_kwargs == kwargs
