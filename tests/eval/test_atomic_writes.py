"""Every picture and tokenizer file goes through `files.atomic_write`: a reader (or a crash)
never sees half a PNG or half a tokenizer.json."""

import json

import pytest
import transformers

from mapfjax import files
from mapfjax.engineer import context
from mapfjax.eval import evaluate as ev
from mapfjax.eval import report
from mapfjax.models import bpe


@pytest.fixture
def written(monkeypatch):
    """Names of the files written through `files.atomic_write` (the real writer still runs)."""
    names: list[str] = []
    real = files.atomic_write

    def recording(path, data):
        names.append(str(path).rsplit("/", 1)[-1])
        real(path, data)

    monkeypatch.setattr(files, "atomic_write", recording)
    return names


def _no_temp_files(directory):
    return not [p.name for p in directory.rglob("*") if p.name.endswith(".tmp")]


def test_result_and_report_plots_are_atomic(tmp_path, written):
    sums = {"all": {3: {3: (50.0, None, 2), 4: (100.0, 50.0, 2)}}}
    ev.results_plot(sums, tmp_path / "results.png")
    assert written == ["results.png"]
    assert (tmp_path / "results.png").read_bytes()[:4] == b"\x89PNG"

    for n in (0, 1):
        d = tmp_path / "run" / f"round_{n}"
        d.mkdir(parents=True)
        entry = {"n": 2, "valid": n + 1, "optimal": n}
        cfg = {"sizes": {"s3": {"data_ratio": 1.0, "hole_ratio": 0.2, "wait_ratio": 0.3}}}
        record = context.RoundRecord(n, cfg, {"s3": entry})
        (d / "record.json").write_text(json.dumps(record.to_dict()))
    report.write_report(tmp_path / "run")
    assert written[1:] == ["validation.png", "configs.png", "report.md"]
    assert (tmp_path / "run" / "configs.png").read_bytes()[:4] == b"\x89PNG"
    assert _no_temp_files(tmp_path)


def test_tokenizer_files_are_atomic(tmp_path, written):
    texts = ["Agent 0: UP, LEFT\nF H F\n" * 3, "There is a 3x3 map with 2 agents"] * 5
    out = bpe.train_tokenizer(texts, 300, tmp_path / "tok")
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(written)
    assert sorted(p.name for p in out.iterdir()) == sorted(written)
    fast = transformers.AutoTokenizer.from_pretrained(str(out))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen3"}')
    del written[:]
    bpe.attach_tokenizer(model, fast)
    assert {"tokenizer.json", "config.json", "generation_config.json"} <= set(written)
    cfg = json.loads((model / "config.json").read_text())
    assert cfg["model_type"] == "qwen3" and cfg["eos_token_id"] == fast.convert_tokens_to_ids(
        "<|im_end|>"
    )
    assert _no_temp_files(tmp_path)
