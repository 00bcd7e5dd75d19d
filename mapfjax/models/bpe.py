"""A small byte-level BPE tokenizer for MAPF-FrozenLake text, written as Hugging Face files
(`tokenizer.json`, `tokenizer_config.json` with a Qwen3-style chat template)."""

from __future__ import annotations

import json
import pathlib
import tempfile
from collections.abc import Iterable, Sequence

from mapfjax import files
from mapfjax.checks import is_int, require
from mapfjax.models.tokenizer import (
    EMPTY_THINK,
    END_THINK,
    ENDOFTEXT,
    IM_END,
    IM_START,
    THINK,
    builtin_chat_text,
)

# Fixed ids 0..4, in this order; <|endoftext|> doubles as the pad token.
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, THINK, END_THINK)

# Pre-tokenisation (regex pieces are isolated; BPE merges only inside a piece):
#  - one digit per piece, so coordinates and sizes tokenise digit by digit;
#  - a grid symbol standing alone between spaces/newlines (with its leading space), so every
#    cell of a map row is one token whatever its neighbours;
#  - an action word with its leading ", " or " ", so each action of a plan is one token;
#  - newlines on their own.
# Everything else (the fixed role, legend and rule text) stays in long pieces that BPE
# compresses into a few tokens.
GRID_SYMBOLS = "FHSsABCGgabc"
ACTIONS = ("UP", "DOWN", "LEFT", "RIGHT", "WAIT")
SPLIT_PATTERN = (
    r"\d"
    rf"|(?: |(?<![^ \n]))[{GRID_SYMBOLS}](?![^ \n])"
    rf"|,? ?(?:{'|'.join(ACTIONS)})(?![A-Za-z])"
    r"|\n"
)

# Pieces every vocabulary must hold as single tokens, even when the corpus never shows them
# (e.g. agents 2..4's symbols in a 2-agent corpus): fed to the trainer as often as the corpus.
REQUIRED_TEXT = " ".join(GRID_SYMBOLS) + "\n" + ": " + " ".join(ACTIONS) + ", " + ", ".join(ACTIONS)

# With coordinate tokens (a tokenizer for reasoning traces, `mapfjax.env.trace`), every cell
# "(r, c)" of a map up to 10x10 is one piece and one token, in the prompt's agent lines as in
# the trace, so a look-up of a cell is a match of one token.
# The piece takes the space before it, as action words do: " (r, c)" is the token.
COORDINATE_PATTERN = r" ?\(\d, \d\)"
COORDINATES = tuple(f" ({r}, {c})" for r in range(10) for c in range(10))


def split_pattern(coordinates: bool = False) -> str:
    """The pre-tokenisation regex (coordinates first: a regex alternation takes the first)."""
    return f"{COORDINATE_PATTERN}|{SPLIT_PATTERN}" if coordinates else SPLIT_PATTERN


def required_text(coordinates: bool = False) -> str:
    """What every vocabulary must hold as single tokens (see REQUIRED_TEXT)."""
    return REQUIRED_TEXT + ("".join(COORDINATES) if coordinates else "")


# Qwen3-style chat template: the text of `tokenizer.builtin_chat_text`. A caller's
# `enable_thinking=True/False` decides the prompt mode as in Qwen3's own template (False appends
# the empty think block to the generation prompt); a caller that passes none (or None) gets the
# template's default, which a shipped model sets to the mode it was trained on, so that
# transformers, TRL, verl or vLLM prompt it right without an argument. This project's own
# prompts always pass it (`tokenizer.chat_text`), so the default never changes them.
_TEMPLATE_HEAD = (
    "{#- The prompt mode where a caller passes no enable_thinking (or None): the one this model "
    "was trained on. true: the generation prompt ends at the assistant's header; false: in an "
    "empty think block. #}\n"
    "{%- set thinking = DEFAULT %}\n"
)
_TEMPLATE_BODY = (
    "{%- if enable_thinking is defined and enable_thinking is not none %}\n"
    "    {%- set thinking = enable_thinking %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}"
)


def chat_template(enable_thinking: bool = True) -> str:
    """The chat template whose default prompt mode is `enable_thinking` (True: Qwen3's own
    default, the generation prompt ends at `<|im_start|>assistant\\n`; False: it ends in the
    empty think block). Explicit `enable_thinking=True/False` from a caller always wins."""
    if not isinstance(enable_thinking, bool):
        raise TypeError(f"enable_thinking = {enable_thinking!r}; allowed: True or False")
    default = "true" if enable_thinking else "false"
    return _TEMPLATE_HEAD.replace("DEFAULT", default) + _TEMPLATE_BODY


# Qwen3's default: thinking on (what `save_tokenizer` writes unless told otherwise).
CHAT_TEMPLATE = chat_template(True)
# The template the tiny models shipped with before their templates carried a default: thinking
# on unless a caller passed enable_thinking=False. `attach_tokenizer` recognises it as this
# project's own and rewrites its default.
PREVIOUS_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


def is_own_template(template) -> bool:
    """Whether `template` is one this module writes (either default, or the previous one)."""
    return template in (chat_template(True), chat_template(False), PREVIOUS_CHAT_TEMPLATE)


def check_vocab_size(vocab_size, key: str = "vocab_size") -> None:
    """A trainable vocabulary: the 256 byte tokens, the special tokens and at least one merge."""
    least = 256 + len(SPECIAL_TOKENS) + 1
    allowed = f"an integer >= {least} (256 bytes + {len(SPECIAL_TOKENS)} special tokens + merges)"
    require(key, vocab_size, is_int(vocab_size) and vocab_size >= least, allowed)


def build_tokenizer(texts: Iterable[str], vocab_size: int, coordinates: bool = False):
    """A trained `tokenizers.Tokenizer` (byte-level BPE, `split_pattern` pre-tokenisation).

    vocab_size counts the 256 byte tokens and the 5 special tokens; it must exceed 261.
    coordinates: every "(r, c)" with single-digit r and c is one token (raises RuntimeError if
    vocab_size leaves too few merges for that).
    """
    # Imported here: only training needs it.
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    check_vocab_size(vocab_size)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split_pattern(coordinates)), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = list(texts)
    required = required_text(coordinates)
    tok.train_from_iterator(texts + [required] * max(len(texts), 10), trainer=trainer)
    for i, s in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(s) != i:
            raise RuntimeError(f"special token {s!r} got id {tok.token_to_id(s)}, expected {i}")
    if coordinates:
        split = [c for c in COORDINATES if len(tok.encode(c).ids) != 1]
        if split:
            raise RuntimeError(
                f"vocab_size={vocab_size} leaves {len(split)} coordinates (e.g. {split[0]!r}) "
                "as several tokens: raise vocab_size"
            )
    return tok


def _save_pretrained_atomically(tokenizer, out_dir) -> list[str]:
    """`tokenizer.save_pretrained` into a scratch directory, then each file into `out_dir`
    through `files.atomic_write`, so no reader ever sees a half-written tokenizer file. Returns the
    names written."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tokenizer.") as scratch:
        tokenizer.save_pretrained(scratch)
        names = sorted(f.name for f in pathlib.Path(scratch).iterdir() if f.is_file())
        for name in names:
            files.atomic_write(out / name, (pathlib.Path(scratch) / name).read_bytes())
    return names


def save_tokenizer(
    out_dir, tok, max_length: int = 4096, enable_thinking: bool = True
) -> pathlib.Path:
    """Write the `tokenizers.Tokenizer` `tok` as HF tokenizer files into `out_dir`, with the
    chat template whose default prompt mode is `enable_thinking` (`chat_template`)."""
    import transformers  # slow to import (seconds); only writing HF files needs it

    template = chat_template(enable_thinking)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START, THINK, END_THINK],
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = template
    _save_pretrained_atomically(fast, out_dir)
    return pathlib.Path(out_dir)


def train_tokenizer(texts: Iterable[str], vocab_size: int, out_dir) -> pathlib.Path:
    """Train a BPE on `texts` (rendered prompts and answers) and write HF files to `out_dir`.

    Loadable with `transformers.AutoTokenizer.from_pretrained(out_dir)` and
    `mapfjax.models.tokenizer.load_tokenizer(out_dir)`. Returns `out_dir` as a Path.
    """
    return save_tokenizer(out_dir, build_tokenizer(texts, vocab_size))


def corpus(prompts: Sequence[str], answers: Sequence[str], thinking: bool = False) -> list[str]:
    """Training texts: one whole chat turn per (rendered prompt, rendered answer) pair, so the
    role names and the think block get merged too, plus the empty think block alone.

    prompts: `env.text.render_prompt` outputs; answers: `env.text.render_answer` outputs, or
    with `thinking` the model's whole turn (`env.forms.TraceForm.response`: trace, answer).
    """
    return [
        builtin_chat_text([{"role": "user", "content": p}], thinking) + f"{a}{IM_END}\n"
        for p, a in zip(prompts, answers, strict=True)
    ] + [EMPTY_THINK]


def recorded_thinking(model_dir) -> bool | None:
    """The prompt mode a checkpoint records in its generation_config.json (`enable_thinking`,
    written by `hf.save_pretrained(generation=...)`), or None where it records none."""
    path = pathlib.Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text()).get("enable_thinking")
    except (ValueError, AttributeError) as e:
        raise ValueError(f"{path}: not a JSON object ({e})") from e
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{path}: enable_thinking = {value!r}; allowed: true, false or absent")
    return value


def attach_tokenizer(model_dir, tokenizer) -> None:
    """Copy `tokenizer`'s files into an HF model directory and record its special token ids
    (bos/eos/pad) in config.json and generation_config.json, so transformers generation stops
    on `<|im_end|>`.

    Where the directory's generation_config.json records the prompt mode the model was trained
    on (`enable_thinking`) and the tokenizer's chat template is this module's (`is_own_template`),
    the written template defaults to that mode (`chat_template`), so callers that pass no
    `enable_thinking` prompt the model as it was trained. `tokenizer` itself is left as it was.
    """
    model_dir = pathlib.Path(model_dir)
    trained = recorded_thinking(model_dir)
    own = tokenizer.chat_template
    if trained is not None and is_own_template(own):
        tokenizer.chat_template = chat_template(trained)
    try:
        _save_pretrained_atomically(tokenizer, model_dir)
    finally:
        tokenizer.chat_template = own
    ids = {
        "bos_token_id": tokenizer.convert_tokens_to_ids(IM_START),
        "eos_token_id": tokenizer.convert_tokens_to_ids(IM_END),
        "pad_token_id": tokenizer.convert_tokens_to_ids(ENDOFTEXT),
    }
    for name in ("config.json", "generation_config.json"):
        path = model_dir / name
        cfg = json.loads(path.read_text()) if path.is_file() else {}
        files.atomic_write(path, json.dumps(cfg | ids, indent=2) + "\n")
