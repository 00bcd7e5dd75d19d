"""Hugging Face Qwen3 checkpoints (config.json + safetensors) to and from our `Qwen3`.

Loading memory-maps the safetensors files and places each parameter straight onto its shards.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from mapfjax import files, parallel
from mapfjax.checks import is_finite_real, is_int
from mapfjax.files import CheckpointError
from mapfjax.models.qwen3 import ATTENTION_IMPLS, Qwen3, Qwen3Config

# safetensors dtype codes <-> numpy dtypes (bfloat16 via ml_dtypes, which numpy lacks).
_DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_CODES = {v: k for k, v in _DTYPES.items()}
_TORCH_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}
_MAX_HEADER = 100 << 20  # bytes; a larger header means a corrupt file


# ---------------------------------------------------------------------------------------------
# Layouts: how one of our parameters is stored in HF's layout (torch Linear weights are
# [out, in]). `read` takes our per-dimension index (a tuple of slices, as handed to
# jax.make_array_from_callback) and reads only that block from the memory-mapped HF tensor.


@dataclasses.dataclass(frozen=True)
class Layout:
    hf_shape: Callable[[tuple[int, ...]], tuple[int, ...]]  # our shape -> HF shape
    read: Callable[[np.ndarray, tuple[slice, ...], tuple[int, ...]], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]  # our full array -> HF array


def _bounds(s: slice, n: int) -> tuple[int, int]:
    start, stop, step = s.indices(n)
    assert step == 1, "shards are contiguous"
    return start, stop


def _read_heads_in(hf, index, shape):
    # ours [H, N, D] <- HF [N*D, H]: read rows of the wanted heads only.
    (sh, sn, sd), (_, n, d) = index, shape
    n0, n1 = _bounds(sn, n)
    block = np.asarray(hf[n0 * d : n1 * d, sh])  # [n*D, h]
    return block.reshape(n1 - n0, d, -1)[:, sd, :].transpose(2, 0, 1)


def _read_heads_out(hf, index, shape):
    # ours [N, D, H] <- HF [H, N*D].
    (sn, sd, sh), (n, d, _) = index, shape
    n0, n1 = _bounds(sn, n)
    block = np.asarray(hf[sh, n0 * d : n1 * d])  # [h, n*D]
    return block.reshape(-1, n1 - n0, d)[:, :, sd].transpose(1, 2, 0)


LAYOUTS: dict[str, Layout] = {
    "same": Layout(lambda s: s, lambda hf, i, s: np.asarray(hf[i]), lambda x: x),
    "transpose": Layout(
        lambda s: s[::-1], lambda hf, i, s: np.asarray(hf[i[::-1]]).T, lambda x: x.T
    ),
    "heads_in": Layout(
        lambda s: (s[1] * s[2], s[0]),
        _read_heads_in,
        lambda x: x.reshape(x.shape[0], -1).T,
    ),
    "heads_out": Layout(
        lambda s: (s[2], s[0] * s[1]),
        _read_heads_out,
        lambda x: x.reshape(-1, x.shape[2]).T,
    ),
}

# HF key -> (our parameter path, layout). "{i}" is the layer index: our layer parameters are
# stacked, layer i being row i of a [L, ...] array.
KEY_TABLE: dict[str, tuple[str, str]] = {
    "model.embed_tokens.weight": ("embedding", "same"),
    "model.norm.weight": ("final_norm.scale", "same"),
    "model.layers.{i}.input_layernorm.weight": ("layers.input_norm.scale", "same"),
    "model.layers.{i}.post_attention_layernorm.weight": ("layers.post_attn_norm.scale", "same"),
    "model.layers.{i}.self_attn.q_proj.weight": ("layers.attn.q", "heads_in"),
    "model.layers.{i}.self_attn.k_proj.weight": ("layers.attn.k", "heads_in"),
    "model.layers.{i}.self_attn.v_proj.weight": ("layers.attn.v", "heads_in"),
    "model.layers.{i}.self_attn.o_proj.weight": ("layers.attn.o", "heads_out"),
    "model.layers.{i}.self_attn.q_norm.weight": ("layers.attn.q_norm.scale", "same"),
    "model.layers.{i}.self_attn.k_norm.weight": ("layers.attn.k_norm.scale", "same"),
    "model.layers.{i}.mlp.gate_proj.weight": ("layers.mlp.gate", "transpose"),
    "model.layers.{i}.mlp.up_proj.weight": ("layers.mlp.up", "transpose"),
    "model.layers.{i}.mlp.down_proj.weight": ("layers.mlp.down", "transpose"),
}
UNTIED_KEYS = {"lm_head.weight": ("unembedding", "transpose")}
# Present in some checkpoints but carrying nothing we need (non-persistent rope buffers).
_IGNORED = re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")


def param_sources(config: Qwen3Config) -> dict[str, tuple[str, list[str] | None, str]]:
    """Our dotted parameter path -> (layout, HF key per layer or None, HF key if unstacked)."""
    table = KEY_TABLE | ({} if config.tie_word_embeddings else UNTIED_KEYS)
    out = {}
    for hf_key, (ours, layout) in table.items():
        if "{i}" in hf_key:
            out[ours] = (layout, [hf_key.format(i=i) for i in range(config.num_layers)], "")
        else:
            out[ours] = (layout, None, hf_key)
    return out


def hf_keys(config: Qwen3Config) -> list[str]:
    """Every tensor name a checkpoint of `config` must hold."""
    return [k for _, layers, key in param_sources(config).values() for k in (layers or [key])]


# ---------------------------------------------------------------------------------------------
# Minimal safetensors reader/writer: numpy's safetensors path has no bfloat16, and parsing the
# header ourselves lets us report truncated files precisely.


@dataclasses.dataclass(frozen=True)
class _Tensor:
    file: pathlib.Path
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data in `file`

    def mmap(self) -> np.ndarray:
        if math.prod(self.shape) == 0:
            return np.zeros(self.shape, self.dtype)
        return np.memmap(self.file, self.dtype, mode="r", offset=self.offset, shape=self.shape)


def read_safetensors_header(file: pathlib.Path) -> dict[str, _Tensor]:
    """Parses and validates one safetensors file's header; tensors stay on disk."""
    if not file.is_file():
        raise CheckpointError(f"{file}: safetensors file not found")
    size = file.stat().st_size
    with open(file, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise CheckpointError(f"{file}: truncated ({size} bytes, no safetensors header)")
        n = int.from_bytes(raw, "little")
        if n > min(_MAX_HEADER, size - 8):
            raise CheckpointError(f"{file}: header length {n} exceeds the file ({size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{file}: corrupt safetensors header ({e})") from None
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        code = info.get("dtype")
        if code not in _DTYPES:
            raise CheckpointError(f"{file}: tensor {name!r} has unsupported dtype {code!r}")
        dtype, shape = _DTYPES[code], tuple(int(d) for d in info["shape"])
        begin, end = info["data_offsets"]
        if end - begin != math.prod(shape) * dtype.itemsize:
            raise CheckpointError(
                f"{file}: tensor {name!r} of shape {shape} {code} has {end - begin} bytes"
            )
        if 8 + n + end > size:
            raise CheckpointError(
                f"{file}: truncated: tensor {name!r} needs bytes up to {8 + n + end} "
                f"but the file has {size}"
            )
        tensors[name] = _Tensor(file, dtype, shape, 8 + n + begin)
    return tensors


def write_safetensors(file: pathlib.Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Writes numpy arrays (bfloat16 included) as one safetensors file, keys sorted."""
    header, offset = {}, 0
    for name in sorted(arrays):
        a = arrays[name]
        if a.dtype not in _CODES:
            raise ValueError(f"tensor {name!r}: dtype {a.dtype} cannot be saved to safetensors")
        header[name] = {
            "dtype": _CODES[a.dtype],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        offset += a.nbytes
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # keep tensor data 8-byte aligned
    with open(file, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for name in sorted(arrays):
            f.write(np.ascontiguousarray(arrays[name]).tobytes())


def _checkpoint_tensors(root: pathlib.Path) -> dict[str, _Tensor]:
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a safetensors index ({e!r})") from None
        headers = {f: read_safetensors_header(root / f) for f in sorted(set(weight_map.values()))}
        tensors = {}
        for name, f in weight_map.items():
            if name not in headers[f]:
                raise CheckpointError(f"{root / f}: tensor {name!r} listed in {index} is absent")
            tensors[name] = headers[f][name]
        return tensors
    single = root / "model.safetensors"
    if single.exists():
        return read_safetensors_header(single)
    raise CheckpointError(
        f"{root}: no model.safetensors or model.safetensors.index.json "
        f"(found: {sorted(p.name for p in root.iterdir())})"
    )


# ---------------------------------------------------------------------------------------------


def read_config(root: pathlib.Path) -> tuple[Qwen3Config, dict]:
    """(our config, the raw config.json dict) of a checkpoint directory."""
    file = root / "config.json"
    if not file.is_file():
        raise CheckpointError(f"{root}: config.json not found")
    try:
        raw = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{file}: invalid JSON ({e})") from None
    archs = raw.get("architectures") or ["Qwen3ForCausalLM"]
    if raw.get("model_type") != "qwen3" or "Qwen3ForCausalLM" not in archs:
        raise CheckpointError(
            f"{file}: model_type={raw.get('model_type')!r}, architectures={archs}; "
            "expected model_type 'qwen3' with architecture 'Qwen3ForCausalLM'"
        )
    try:
        return Qwen3Config.from_hf(raw), raw
    except (KeyError, ValueError, TypeError) as e:
        raise CheckpointError(f"{file}: {e}") from None


def _resolve(path_or_hub_id) -> pathlib.Path:
    path = pathlib.Path(path_or_hub_id).expanduser()
    if path.exists():
        return path
    text = str(path_or_hub_id)
    if files.missing_local_dir(text):
        raise CheckpointError(f"{text}: no such checkpoint directory")
    try:
        import huggingface_hub  # only hub ids need it (a transformers dependency, not ours)

        local = huggingface_hub.snapshot_download(
            text, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]
        )
    except Exception as e:  # offline, unknown repo, no access: all end the same way
        raise CheckpointError(
            f"{text}: not a local directory, and downloading it from the Hugging Face hub "
            f"failed ({type(e).__name__}: {e})"
        ) from e
    return pathlib.Path(local)


def _path_str(path) -> str:
    return ".".join(str(p) for p in path)


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """How `Qwen3` computes (not what): the settings of an experiment config's `model` section
    that go to the model, each `model.<field>` there. attention_impl: a name in
    `qwen3.ATTENTION_IMPLS` for prefill and training ("einsum", "fused", "splash")."""

    attention_impl: str = "einsum"

    def __post_init__(self):
        impl = self.attention_impl
        if not isinstance(impl, str) or impl not in ATTENTION_IMPLS:
            allowed = ", ".join(repr(k) for k in sorted(ATTENTION_IMPLS))
            raise ValueError(f"model.attention_impl = {impl!r}; allowed: {allowed}")

    @classmethod
    def from_config(cls, model: Mapping[str, Any]) -> ModelOptions:
        """From a config's model section (ConfigDict or dict); a field it lacks keeps its
        default (run directories recorded before the field existed)."""
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{k: model[k] for k in names if k in model})

    def kwargs(self) -> dict[str, Any]:
        """The options as keyword arguments of `Qwen3` and `from_pretrained`."""
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# Generation settings: how a checkpoint is meant to be decoded, kept in its generation_config.json
# beside transformers' own keys.

GENERATION_CONFIG = "generation_config.json"
# The key that says whether the checkpoint answers after Qwen3's thinking prompt: the name of the
# chat template's argument (`apply_chat_template(..., enable_thinking=...)`). It is not one of
# transformers' keys; transformers keeps it as an attribute of the GenerationConfig it loads.
THINKING_KEY = "enable_thinking"

# key -> (check of a JSON value, what is allowed); the other keys are transformers' own.
GENERATION_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    THINKING_KEY: (lambda v: isinstance(v, bool), "true or false"),
    "max_new_tokens": (lambda v: is_int(v) and v >= 1, "an integer >= 1"),
    "do_sample": (lambda v: isinstance(v, bool), "true or false"),
    "temperature": (lambda v: is_finite_real(v) and v >= 0, "a finite number >= 0"),
    "top_p": (lambda v: is_finite_real(v) and 0 < v <= 1, "a number in (0, 1]"),
}
# Keys of a copied generation_config.json that `save_pretrained(generation=...)` replaces: a
# stale sampling value (e.g. a base model's top_k) would make transformers decode otherwise.
_DECODING_KEYS = (*GENERATION_KEYS, "top_k")


@dataclasses.dataclass(frozen=True)
class GenerationSettings:
    """How a checkpoint is meant to be decoded, as its generation_config.json records it.

    enable_thinking: answer after Qwen3's thinking prompt (key "enable_thinking");
    max_new_tokens: the response budget; do_sample, temperature, top_p: transformers' sampling
    keys (greedy when do_sample is false). The defaults are what a checkpoint without these keys
    gets: thinking off, 512 new tokens, greedy. `given`: the keys its file set (the others are
    defaults); not part of equality."""

    enable_thinking: bool = False
    max_new_tokens: int = 512
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    given: frozenset[str] = dataclasses.field(default=frozenset(), compare=False)

    def __post_init__(self):
        for key, (ok, allowed) in GENERATION_KEYS.items():
            value = getattr(self, key)
            if not ok(value):
                raise ValueError(f"GenerationSettings.{key} = {value!r}; allowed: {allowed}")

    def to_json(self) -> dict[str, Any]:
        """The keys `save_pretrained` writes into generation_config.json (temperature and top_p
        only when sampling: transformers ignores them, and warns, when greedy)."""
        out = {
            THINKING_KEY: self.enable_thinking,
            "max_new_tokens": self.max_new_tokens,
            "do_sample": self.do_sample,
        }
        if self.do_sample:
            out |= {"temperature": self.temperature, "top_p": self.top_p}
        return out


def _json_object(file: pathlib.Path) -> dict:
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file}: invalid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file}: expected a JSON object, got {type(raw).__name__}")
    return raw


def generation_settings(path_or_hub_id) -> GenerationSettings:
    """The `GenerationSettings` of a checkpoint (local directory or hub id), read from its
    generation_config.json; a key that is absent or null (transformers' "not set") keeps its
    default, and a checkpoint without the file gets every default. A bad value raises
    CheckpointError naming the file, the key, the value and what is allowed."""
    file = _resolve(path_or_hub_id) / GENERATION_CONFIG
    if not file.is_file():
        return GenerationSettings()
    raw, values = _json_object(file), {}
    for key, (ok, allowed) in GENERATION_KEYS.items():
        if raw.get(key) is None:
            continue
        if not ok(raw[key]):
            raise CheckpointError(f"{file}: key {key!r}: {raw[key]!r}; allowed: {allowed}")
        values[key] = raw[key]
    return GenerationSettings(**values, given=frozenset(values))


def from_pretrained(
    path_or_hub_id, dtype=jnp.bfloat16, param_dtype=None, mesh=None, rules="train", **model_kwargs
) -> Qwen3:
    """Loads a Hugging Face Qwen3 checkpoint (local dir or hub id) as our `Qwen3`.

    param_dtype defaults to `dtype`. With a mesh, each parameter is placed straight onto its
    shards according to `rules` (a name in `parallel.RULES` or a dict); without one, onto the
    default device. model_kwargs go to `Qwen3` (e.g. remat=True, attention_chunk=512).
    Raises CheckpointError on any mismatch; nothing is loaded partially.
    """
    root = _resolve(path_or_hub_id)
    config, _ = read_config(root)
    param_dtype = dtype if param_dtype is None else param_dtype
    tensors = _checkpoint_tensors(root)
    keys = hf_keys(config)
    where = {k: str(t.file) for k, t in tensors.items()}

    # Some tied checkpoints also store the (identical) head; its values are not needed.
    allowed = set(keys) | ({"lm_head.weight"} if config.tie_word_embeddings else set())
    unexpected = sorted(k for k in tensors if k not in allowed and not _IGNORED.match(k))
    missing = sorted(k for k in keys if k not in tensors)
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise CheckpointError(f"{root}: missing tensors {missing[:5]}{more}")
    if unexpected:
        raise CheckpointError(
            f"{root}: unexpected tensors {[(k, where[k]) for k in unexpected[:5]]} "
            f"for config {config}"
        )

    abstract = nnx.eval_shape(
        lambda: Qwen3(
            config, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(0), **model_kwargs
        )
    )
    graphdef, state = nnx.split(abstract)
    if mesh is not None:
        shardings = dict(nnx.to_flat_state(parallel.model_shardings(state, mesh, rules)))
    sources = param_sources(config)
    target = np.dtype(param_dtype)
    for path, var in nnx.to_flat_state(state):
        name = _path_str(path)
        if name not in sources:
            raise CheckpointError(f"parameter {name} has no entry in hf.KEY_TABLE")
        layout_name, per_layer, key = sources[name]
        layout, shape = LAYOUTS[layout_name], tuple(var.shape)
        inner = shape[1:] if per_layer else shape
        for k in per_layer or [key]:
            if tensors[k].shape != layout.hf_shape(inner):
                raise CheckpointError(
                    f"{tensors[k].file}: tensor {k!r} has shape {tensors[k].shape}, expected "
                    f"{layout.hf_shape(inner)} for config.json's architecture"
                )
        maps = [tensors[k].mmap() for k in per_layer or [key]]
        if mesh is None:
            sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        else:
            sharding = shardings[path].get_value()

        def read(index, maps=maps, layout=layout, inner=inner, stacked=bool(per_layer)):
            if not stacked:
                return np.asarray(layout.read(maps[0], index, inner), dtype=target)
            first, last = _bounds(index[0], len(maps))
            rows = [layout.read(maps[i], index[1:], inner) for i in range(first, last)]
            return np.stack(rows).astype(target, copy=False)

        var.set_value(jax.make_array_from_callback(shape, sharding, read))
    return nnx.merge(graphdef, state)


def _gather(x: jax.Array) -> np.ndarray:
    if jax.process_count() > 1 and not x.is_fully_addressable:
        from jax.experimental import multihost_utils  # multi-host runs only

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


_COPIED_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "added_tokens.json",
)
_TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def save_pretrained(
    model: Qwen3, path, dtype=None, *, copy_from=None, generation: GenerationSettings | None = None
) -> pathlib.Path:
    """Writes `model` as a transformers-loadable checkpoint directory, atomically.

    path gets config.json, model.safetensors and generation_config.json. dtype: cast every
    tensor (e.g. jnp.bfloat16); default keeps the parameters' dtypes. copy_from: an HF
    checkpoint directory whose token ids (config.json), generation config and tokenizer files
    are carried over. generation: how the checkpoint is meant to be decoded
    (`GenerationSettings`, read back by `generation_settings`), written into
    generation_config.json in place of the copied file's decoding keys; None leaves that file
    as it is (the token ids, or copy_from's file verbatim). Only process 0 writes in a
    multi-process job.
    """
    if generation is not None and not isinstance(generation, GenerationSettings):
        raise TypeError(f"generation = {generation!r}; allowed: a hf.GenerationSettings or None")
    path = pathlib.Path(path).expanduser()
    config = model.config
    arrays = {}
    state = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    for ours, (layout, per_layer, key) in param_sources(config).items():
        value = _gather(state[tuple(ours.split("."))][...])
        if dtype is not None:
            value = value.astype(np.dtype(dtype))
        to_hf = LAYOUTS[layout].to_hf
        for k, v in zip(per_layer, value, strict=True) if per_layer else [(key, value)]:
            arrays[k] = np.ascontiguousarray(to_hf(v))
    if jax.process_index() != 0:
        return path
    hf_config = config.to_hf()
    code = _CODES[arrays["model.embed_tokens.weight"].dtype]
    hf_config["dtype"] = _TORCH_NAMES.get(code, "float32")
    token_ids = {}
    if copy_from is not None:
        _, source = read_config(pathlib.Path(copy_from))
        for k in _TOKEN_KEYS:
            if k in source:
                hf_config[k] = token_ids[k] = source[k]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        write_safetensors(tmp / "model.safetensors", arrays)
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        (tmp / GENERATION_CONFIG).write_text(json.dumps(token_ids, indent=2) + "\n")
        if copy_from is not None:
            for name in _COPIED_FILES:
                if (pathlib.Path(copy_from) / name).is_file():
                    shutil.copy2(pathlib.Path(copy_from) / name, tmp / name)
        if generation is not None:
            kept = _json_object(tmp / GENERATION_CONFIG)
            kept = {k: v for k, v in kept.items() if k not in _DECODING_KEYS}
            text = json.dumps(kept | generation.to_json(), indent=2) + "\n"
            (tmp / GENERATION_CONFIG).write_text(text)
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.old-{os.getpid()}"
            os.rename(path, old)
        os.rename(tmp, path)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path
