"""The shipped models' chat templates: with no argument each renders the prompt its model was
trained on, `enable_thinking=True/False` still switch explicitly, and every mode is byte for
byte what this project's own prompt encoding gives (`tokenizer.encode_chat`,
`rl.data.encode_prompts`). The project's prompts always pass the mode, so they are the same as
under the templates shipped before; `bpe` writes these templates when it builds a model."""

import json

import jinja2
import pytest
import transformers
from jinja2.sandbox import ImmutableSandboxedEnvironment

from mapfjax import configfile
from mapfjax.env import text
from mapfjax.env.types import Problem
from mapfjax.models import bpe
from mapfjax.models import tokenizer as tok_lib
from mapfjax.rl import data

ASSETS = configfile.ROOT / "mapfjax" / "assets"
MODELS = ("tiny", "tiny_think")
# A caller's keyword arguments: none (what TRL, verl and vLLM pass by default), None, or a mode.
CALLS = ({}, {"enable_thinking": None}, {"enable_thinking": True}, {"enable_thinking": False})

# A map with holes, a hole-free one (its prompt has no `H:` legend line), a 5x5 one.
PROBLEMS = (
    Problem("holes", ("FFFF", "FHFF", "FFFF", "FFHF"), ((0, 0), (3, 3)), ((3, 0), (0, 3))),
    Problem("open", ("FFF", "FFF", "FFF"), ((0, 0), (2, 2)), ((2, 2), (0, 0))),
    Problem(
        "five", ("FFFFF", "FHFHF", "FFFFF", "HFFFF", "FFFFF"), ((0, 0), (4, 4)), ((4, 0), (0, 4))
    ),
)


def trained_mode(name: str) -> bool:
    """The prompt mode the model was trained and validated with, as its export records it."""
    return json.loads((ASSETS / name / "generation_config.json").read_text())["enable_thinking"]


def expected_mode(name: str, call: dict) -> bool:
    given = call.get("enable_thinking")
    return trained_mode(name) if given is None else given


@pytest.fixture(scope="module", params=MODELS)
def shipped(request):
    return request.param, transformers.AutoTokenizer.from_pretrained(str(ASSETS / request.param))


def test_the_trained_mode_is_the_one_its_recipes_and_main_job_use():
    """What generation_config.json records is what the code that made each model used: SFT
    prompts (`thinking`), its GRPO steps and the main job that starts from it."""
    recipes = configfile.load_module("configs/tiny_model.py")
    gate = configfile.load_module("projects/go_no_go/configs/tiny_model.py")
    main = configfile.load_module("configs/tiny_cpu.py")

    answer_only = [recipes.get_config(""), gate.get_config("broad")]
    assert all(not c.get("thinking", False) and not c.rl.train.enable_thinking for c in answer_only)
    assert main.get_config("answer_only").train.enable_thinking is False
    assert trained_mode("tiny") is False

    think = recipes.get_config("think")
    stages = [*think.stage.values(), gate.get_config("trace_end_scratch")]
    stages.append(gate.get_config("trace_mix"))
    assert all(c.thinking and c.rl.train.enable_thinking for c in stages)
    assert main.get_config("").train.enable_thinking is True
    assert str(ASSETS / "tiny_think") == main.get_config("").model.path
    assert trained_mode("tiny_think") is True


@pytest.mark.parametrize("call", CALLS, ids=["no_kwargs", "none", "thinking_on", "thinking_off"])
def test_templates_render_the_projects_prompts_byte_for_byte(shipped, call):
    name, tok = shipped
    mode = expected_mode(name, call)
    for p in PROBLEMS:
        messages = [{"role": "user", "content": text.render_prompt(p)}]
        got = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **call)
        assert got == tok_lib.builtin_chat_text(messages, mode)
        assert got.endswith(f"<|im_start|>assistant\n{'' if mode else tok_lib.EMPTY_THINK}")
        assert got == tok_lib.chat_text(tok, messages[0]["content"], enable_thinking=mode)
    # Token ids as a trainer gets them (TRL tokenizes in apply_chat_template) against the
    # project's prompt encoding for SFT, GRPO and evaluation.
    batch = [[{"role": "user", "content": text.render_prompt(p)}] for p in PROBLEMS]
    ids = tok.apply_chat_template(batch, add_generation_prompt=True, return_dict=True, **call)
    ours = data.encode_prompts(tok, PROBLEMS, enable_thinking=mode)
    assert ids["input_ids"] == ours
    assert ours == tok_lib.encode_chat(tok, [m[0]["content"] for m in batch], enable_thinking=mode)


def test_the_default_is_the_trained_mode_and_differs_between_the_models():
    plain = {}
    for name in MODELS:
        tok = transformers.AutoTokenizer.from_pretrained(str(ASSETS / name))
        messages = [{"role": "user", "content": text.render_prompt(PROBLEMS[0])}]
        plain[name] = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert plain["tiny"].endswith("<|im_start|>assistant\n" + tok_lib.EMPTY_THINK)
    assert plain["tiny_think"].endswith("<|im_start|>assistant\n")
    assert plain["tiny"] == plain["tiny_think"] + tok_lib.EMPTY_THINK


@pytest.mark.parametrize("mode", [True, False])
def test_the_projects_prompts_are_what_they_were_under_the_previous_templates(shipped, mode):
    """The project passes the mode explicitly everywhere, so changing a template's default
    changes none of its prompts: the shipped models' measured results stand."""
    name, tok = shipped
    assert tok.chat_template == bpe.chat_template(trained_mode(name))
    prompts = [text.render_prompt(p) for p in PROBLEMS]
    conversation = [
        {"role": "system", "content": "Plan carefully."},
        {"role": "user", "content": prompts[0]},
        {"role": "assistant", "content": "<answer>\nAgent 0: UP\nAgent 1: WAIT\n</answer>"},
        {"role": "user", "content": prompts[1]},
    ]
    now = [tok_lib.encode_chat(tok, prompts, enable_thinking=mode)]
    now.append(tok_lib.encode_chat(tok, [conversation], enable_thinking=mode))
    now.append(tok_lib.chat_text(tok, prompts[2], enable_thinking=mode, system="Be brief."))
    now.append(data.encode_prompts(tok, PROBLEMS, enable_thinking=mode))
    own = tok.chat_template
    try:
        tok.chat_template = bpe.PREVIOUS_CHAT_TEMPLATE
        before = [tok_lib.encode_chat(tok, prompts, enable_thinking=mode)]
        before.append(tok_lib.encode_chat(tok, [conversation], enable_thinking=mode))
        before.append(tok_lib.chat_text(tok, prompts[2], enable_thinking=mode, system="Be brief."))
        before.append(data.encode_prompts(tok, PROBLEMS, enable_thinking=mode))
    finally:
        tok.chat_template = own
    assert now == before
    assert now[1] == [tok(tok_lib.builtin_chat_text(conversation, mode))["input_ids"]]


@pytest.mark.parametrize("name", MODELS)
def test_other_jinja_renderers_get_the_same_text(name):
    """No whitespace of the template's layout leaks into the prompt, whatever a renderer's
    block settings (transformers trims blocks; plain Jinja2 keeps a final newline if asked)."""
    source = (ASSETS / name / "chat_template.jinja").read_text()
    messages = [{"role": "user", "content": text.render_prompt(PROBLEMS[1])}]
    envs = [
        ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True),
        jinja2.Environment(),
        jinja2.Environment(keep_trailing_newline=True),
    ]
    for call in CALLS:
        want = tok_lib.builtin_chat_text(messages, expected_mode(name, call))
        for env in envs:
            got = env.from_string(source).render(
                messages=messages, add_generation_prompt=True, **call
            )
            assert got == want, (env, call)
        no_prompt = envs[1].from_string(source).render(messages=messages, **call)
        assert no_prompt == want.removesuffix(
            "<|im_start|>assistant\n" + ("" if expected_mode(name, call) else tok_lib.EMPTY_THINK)
        )


@pytest.mark.parametrize("name", MODELS)
def test_shipped_templates_are_what_bpe_writes(name):
    written = (ASSETS / name / "chat_template.jinja").read_bytes()
    assert written == bpe.chat_template(trained_mode(name)).encode()
    assert bpe.is_own_template(written.decode())


def test_chat_template_refuses_a_mode_that_is_not_a_bool():
    assert bpe.CHAT_TEMPLATE == bpe.chat_template() == bpe.chat_template(True)
    assert bpe.chat_template(True) != bpe.chat_template(False)
    with pytest.raises(TypeError, match=r"enable_thinking = 'no'; allowed: True or False"):
        bpe.chat_template("no")


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory):
    texts = ["Agent 0: UP, LEFT\nF H F\n" * 3, "There is a 3x3 map with 2 agents"] * 5
    built = bpe.build_tokenizer(texts, 300)
    root = tmp_path_factory.mktemp("bpe")
    off = bpe.save_tokenizer(root / "off", built, enable_thinking=False)
    on = bpe.save_tokenizer(root / "on", built)
    return built, off, on


def _model_dir(path, generation: dict | None):
    path.mkdir()
    (path / "config.json").write_text('{"model_type": "qwen3"}')
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps(generation))
    return path


def test_save_tokenizer_writes_the_given_default(small_tokenizer):
    _, off, on = small_tokenizer
    assert (off / "chat_template.jinja").read_text() == bpe.chat_template(False)
    assert (on / "chat_template.jinja").read_text() == bpe.chat_template(True)
    messages = [{"role": "user", "content": "There is a 3x3 map"}]
    for path, mode in ((off, False), (on, True)):
        tok = transformers.AutoTokenizer.from_pretrained(str(path))
        got = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert got == tok_lib.builtin_chat_text(messages, mode)


@pytest.mark.parametrize("mode", [False, True])
@pytest.mark.parametrize("template", ["current", "previous"])
def test_attach_tokenizer_defaults_the_template_to_the_recorded_mode(
    small_tokenizer, tmp_path, mode, template
):
    """The export records its prompt mode in generation_config.json (`launch/train_tiny.py`
    writes it before attaching the tokenizer); the attached template defaults to it, whatever
    this project's template the workdir's tokenizer had, and the tokenizer object is left as
    it was."""
    _, _, on = small_tokenizer
    tok = transformers.AutoTokenizer.from_pretrained(str(on))
    if template == "previous":
        tok.chat_template = bpe.PREVIOUS_CHAT_TEMPLATE
    before = tok.chat_template
    model = _model_dir(tmp_path / "model", {"enable_thinking": mode, "max_new_tokens": 64})
    bpe.attach_tokenizer(model, tok)
    assert tok.chat_template == before
    assert (model / "chat_template.jinja").read_text() == bpe.chat_template(mode)
    loaded = transformers.AutoTokenizer.from_pretrained(str(model))
    messages = [{"role": "user", "content": "There is a 3x3 map"}]
    got = loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert got == tok_lib.builtin_chat_text(messages, mode)
    gen = json.loads((model / "generation_config.json").read_text())
    assert gen["enable_thinking"] is mode and gen["eos_token_id"] == tok.convert_tokens_to_ids(
        tok_lib.IM_END
    )


def test_attach_tokenizer_leaves_other_templates_and_unrecorded_modes(small_tokenizer, tmp_path):
    _, off, _ = small_tokenizer
    tok = transformers.AutoTokenizer.from_pretrained(str(off))
    # No recorded mode: the tokenizer's own default stays.
    bpe.attach_tokenizer(_model_dir(tmp_path / "unrecorded", {"max_new_tokens": 64}), tok)
    written = (tmp_path / "unrecorded" / "chat_template.jinja").read_text()
    assert written == bpe.chat_template(False)
    # Another model's template (say Qwen3's own) is not this module's to rewrite.
    foreign = "{%- for m in messages %}{{ m['content'] }}{%- endfor %}"
    tok.chat_template = foreign
    bpe.attach_tokenizer(_model_dir(tmp_path / "foreign", {"enable_thinking": True}), tok)
    assert (tmp_path / "foreign" / "chat_template.jinja").read_text() == foreign


def test_attach_tokenizer_refuses_a_recorded_mode_that_is_not_a_bool(small_tokenizer, tmp_path):
    _, off, _ = small_tokenizer
    tok = transformers.AutoTokenizer.from_pretrained(str(off))
    model = _model_dir(tmp_path / "bad", {"enable_thinking": "yes"})
    with pytest.raises(ValueError, match=r"generation_config.json: enable_thinking = 'yes'"):
        bpe.attach_tokenizer(model, tok)
    assert not (model / "tokenizer.json").exists()  # nothing written
    (model / "generation_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"generation_config.json: not a JSON object"):
        bpe.attach_tokenizer(model, tok)


def _card_table(card: str, header: str) -> list[list[str]]:
    """The rows of the card's table whose header line is `header`."""
    lines = card.split(header, 1)[1].splitlines()[2:]  # past the header and its rule
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


@pytest.mark.parametrize("name", MODELS)
def test_model_cards_give_the_settings_and_cite_their_rates(name):
    """Each model card states the prompt mode and generation settings its generation_config.json
    records, and every rate it gives is in the file it cites."""
    card = (ASSETS / name / "README.md").read_text(encoding="utf-8")
    assert card.startswith("---\nlibrary_name: transformers\n")
    gen = json.loads((ASSETS / name / "generation_config.json").read_text())
    mode = "on" if gen["enable_thinking"] else "off"
    assert f"## Prompt mode: thinking {mode}\n" in card
    settings = dict(_card_table(card, "| key | value |"))
    assert set(settings) == {"enable_thinking", "max_new_tokens", "do_sample"}
    assert {k: json.loads(v) for k, v in settings.items()} == {k: gen[k] for k in settings}
    rates = _card_table(card, "| puzzles | greedy valid % | source |")
    assert len(rates) >= 3
    for _, values, source in rates:
        path = source.strip("`")
        cited = ASSETS / name / path if (ASSETS / name / path).is_file() else configfile.ROOT / path
        assert cited.is_file(), source
        for value in values.split(" / "):
            assert value in cited.read_text(encoding="utf-8"), (value, source)
