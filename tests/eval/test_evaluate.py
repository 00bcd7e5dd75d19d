"""Benchmark evaluation: a tiny random checkpoint and a canned local API server as solvers;
answers file, resume, tables against the `mapfjax.env verify` CLI, the paper's numbers."""

import csv
import dataclasses
import http.server
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import jax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mapfjax.env import benchmark, io, oracle, text, types
from mapfjax.eval import evaluate as ev
from mapfjax.eval import paper
from mapfjax.files import CheckpointError
from mapfjax.rl import rollout

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """8 labelled 3-agent instances: 3x3 and 4x4, wait-ratio subsets 0.25 and 0.50."""
    spec = benchmark.BenchmarkSpec(agents=(3,), sizes=(3, 4), wait_ratios=(0.25, 0.5), per_cell=2)
    problems, _ = benchmark.build(spec, progress=False)
    path = tmp_path_factory.mktemp("bench") / "bench.jsonl"
    io.save_instances(path, problems)
    return path, problems


class CountingSolver:
    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __call__(self, problems, start):
        self.calls.append([p.id for p in problems])
        return self.inner(problems, start)


def _cli_verify(instances, answers) -> list[dict]:
    out = subprocess.run(
        [sys.executable, "-m", "mapfjax.env", "verify", "--instances", str(instances)]
        + ["--answers", str(answers)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def _csv_rows(path) -> dict[tuple[str, int, int], tuple[int, float, float]]:
    with open(path) as f:
        return {
            (r["subset"], int(r["agents"]), int(r["size"])): (
                int(r["n"]),
                float(r["valid_pct"]),
                float(r["optimal_pct"]),
            )
            for r in csv.DictReader(f)
        }


def test_checkpoint_answers_tables_and_resume(tiny_model_dir, bench, tmp_path):
    inst_path, problems = bench
    sampling = dataclasses.replace(ev.EVAL_SAMPLING, max_new_tokens=24)
    solver = CountingSolver(ev.CheckpointSolver(tiny_model_dir, sampling))
    answers = tmp_path / "answers.jsonl"
    out = tmp_path / "eval"
    paths = ev.evaluate(solver, problems, out, "tiny", None, answers, batch_size=3, progress=False)
    assert [len(c) for c in solver.calls] == [3, 3, 2]

    # The trainer's own sampling path (rollout.sample, greedy) gives the same texts.
    cfg = rollout.SamplingConfig(max_new_tokens=24, temperature=0.0)
    _, _, _, texts = rollout.sample(solver.inner.model, solver.inner.tokenizer, problems[:3], 1,
                                     cfg, None)  # fmt: skip
    written = io.load_answers(answers)
    assert [a for a, _ in written] == [p.id for p in problems]
    assert [t for _, t in written[:3]] == texts

    # Tables agree with the independent CLI verifier on the same answer file.
    verdicts = {r["id"]: r for r in _cli_verify(inst_path, answers)}
    table = _csv_rows(paths["csv"])
    for subset in ("all", "wr0.25", "wr0.50"):
        for size in (3, 4):
            ids = [
                p.id
                for p in problems
                if p.height == size and (subset == "all" or f"_{subset}_" in p.id)
            ]
            n, valid, optimal = table[(subset, 3, size)]
            assert n == len(ids)
            assert valid == pytest.approx(100 * sum(verdicts[i]["valid"] for i in ids) / n)
            assert optimal == pytest.approx(100 * sum(verdicts[i]["optimal"] for i in ids) / n)
    md = paths["md"].read_text()
    assert "## Wait-ratio subset 0.25" in md and "## Wait-ratio subset 0.50" in md
    assert "paper:" not in md  # a random tiny model matches no setting of the paper
    assert paths["png"].stat().st_size > 1000
    summary = json.loads(paths["json"].read_text())
    assert summary["n"] == len(problems) and summary["full_benchmark"] is False

    # Rerun: nothing regenerated, same file.
    before = answers.read_bytes()
    again = CountingSolver(solver.inner)
    ev.evaluate(again, problems, out, "tiny", None, answers, batch_size=3, progress=False)
    assert again.calls == [] and answers.read_bytes() == before

    # A torn last line (killed while appending) is cut off and only that answer is redone.
    answers.write_bytes(before[: before.rfind(b"\n", 0, len(before) - 1) + 1] + b'{"id": "3a')
    ev.evaluate(again, problems, out, "tiny", None, answers, batch_size=3, progress=False)
    assert again.calls == [[problems[-1].id]]
    assert [a for a, _ in io.load_answers(answers)] == [p.id for p in problems]


def test_answers_file_errors(bench, tmp_path):
    _, problems = bench
    stray = tmp_path / "stray.jsonl"
    stray.write_text('{"id": "not_an_instance", "text": "x"}\n')
    with pytest.raises(ValueError, match=r"stray.jsonl.*'not_an_instance'"):
        ev.generate_answers(lambda ps, s: [""] * len(ps), problems, stray, progress=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(f'{{"id": "{problems[0].id}", "text": "x"}}\n{{"id": 3}}\n')
    with pytest.raises(io.JsonlError, match=r"bad.jsonl:2"):
        ev.generate_answers(lambda ps, s: [""] * len(ps), problems, bad, progress=False)


# --------------------------------------------------------------------------- API solver


class _Handler(http.server.BaseHTTPRequestHandler):
    replies: dict = {}
    fail_first: list = []
    seen: list = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        type(self).seen.append(self.path)
        if type(self).fail_first:
            type(self).fail_first.pop()
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "busy"}}')
            return
        reply = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": type(self).replies[prompt]},
                }
            ],
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def api_server(bench):
    """A local OpenAI-compatible endpoint: the first 3x3 instance gets its optimal plan, the
    first 4x4 one garbage; one 503 before the first answer."""
    pytest.importorskip("openai")
    _, problems = bench
    chosen = [problems[0], problems[2]]
    good = text.render_answer(oracle.answer_actions(oracle.solve(chosen[0])))
    _Handler.replies = {
        text.render_prompt(chosen[0]): f"Plan below.\n{good}",
        text.render_prompt(chosen[1]): "I am not sure. UP UP LEFT maybe?",
    }
    _Handler.fail_first, _Handler.seen = [True], []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", chosen
    server.shutdown()
    server.server_close()


def test_api_solver_rates(api_server, tmp_path):
    url, chosen = api_server
    waits = []
    solver = ev.ApiSolver("gpt-5.4", url, api_key="k", backoff=0.5, sleep=waits.append)
    family = paper.model_family(api_model=solver.model)
    paths = ev.evaluate(solver, chosen, tmp_path / "out", "gpt-5.4", family,
                        tmp_path / "a.jsonl", batch_size=1, progress=False)  # fmt: skip
    assert waits == [0.5]  # the 503 was retried once
    assert all(p == "/v1/chat/completions" for p in _Handler.seen)
    table = _csv_rows(paths["csv"])
    assert table[("all", 3, 3)] == (1, 100.0, 100.0)
    assert table[("all", 3, 4)] == (1, 0.0, 0.0)
    summary = json.loads(paths["json"].read_text())
    assert summary["means"]["all"]["3"] == [50.0, 50.0]
    md = paths["md"].read_text()
    assert "| 3 | 100.0 / 100.0 | 0.0 / 0.0 |" in md
    assert "| ours: gpt-5.4 | 50.00 / 50.00 | - | - |" in md
    assert "| paper: GPT-5.4 (solver) | 32.50 / 20.58 | 17.05 / 10.86 | 9.11 / 6.00 |" in md


def test_api_unreachable_raises_with_instance(bench):
    pytest.importorskip("openai")
    _, problems = bench
    waits = []
    solver = ev.ApiSolver("m", "http://127.0.0.1:9/v1", api_key="k", max_retries=2,
                          timeout=2.0, sleep=waits.append)  # fmt: skip
    with pytest.raises(ev.ApiUnavailable, match=problems[0].id):
        solver(problems[:1], 0)
    assert waits == [1.0, 2.0]


def test_launch_evaluate_api(api_server, bench, tmp_path):
    url, chosen = api_server
    inst = tmp_path / "two.jsonl"
    io.save_instances(inst, chosen)
    env = {**os.environ, "OPENAI_API_KEY": "k", "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "launch/evaluate.py", "--api_model=kimi-k2.5", f"--api_base_url={url}"]
    cmd += [f"--instances={inst}", f"--answers_out={tmp_path / 'a.jsonl'}"]
    cmd += [f"--out_dir={tmp_path / 'out'}"]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "| paper: Kimi-K2.5 | 46.17 / 29.25" in res.stdout
    assert len(io.load_answers(tmp_path / "a.jsonl")) == 2
    bad = subprocess.run(cmd[:2] + [f"--instances={inst}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert bad.returncode == 2 and "exactly one of --checkpoint" in bad.stderr


# --------------------------------------------------------------------------- paper data


def test_paper_data_consistent():
    # The per-size 3-agent row averages to the main table's 3-agent mean of the same method.
    v6 = {r.agents: r for r in paper.MAIN if r.role == "engineer"}
    per = list(paper.PER_SIZE_3AG.values())
    assert sum(v for v, _ in per) / len(per) == pytest.approx(v6[3].valid, abs=0.01)
    assert sum(o for _, o in per) / len(per) == pytest.approx(v6[3].optimal, abs=0.01)
    # Per-size rates are counts out of 150 instances (50 per subset x 3 subsets).
    for v, o in per:
        assert abs(v * 1.5 - round(v * 1.5)) < 0.02 and abs(o * 1.5 - round(o * 1.5)) < 0.02
    # The ablation's aggregate (mean over the 21 cells, averaged over subsets) of V6 matches
    # the cell-weighted main-table valid rates within rounding of the published numbers.
    weighted = (8 * v6[3].valid + 7 * v6[4].valid + 6 * v6[5].valid) / 21
    v6_abl = paper.ABLATION_VALID["V6 +T bookkeeping"]
    assert sum(v6_abl.values()) / 3 == pytest.approx(weighted, abs=0.5)
    assert len(paper.MAIN) == 21 and len(paper.comparable_rows("qwen3-4b")) == 15


def test_model_family(tmp_path):
    assert paper.model_family(api_model="openai/gpt-5.4-2026") == "gpt-5.4"
    assert paper.model_family(api_model="Gemini-3.1-Pro-preview") == "gemini-3.1-pro"
    assert paper.model_family(api_model="llama") is None
    (tmp_path / "config.json").write_text(
        json.dumps({"num_hidden_layers": 36, "hidden_size": 2560, "intermediate_size": 9728})
    )
    assert paper.model_family(checkpoint=str(tmp_path)) == "qwen3-4b"
    assert paper.model_family(checkpoint=str(tmp_path / "nothing")) is None


def test_qwen_tables_show_paper_rows(bench, tmp_path):
    """A Qwen3-4B evaluation's report carries the paper's Qwen3-4B rows and ablation numbers,
    and says when the instance set is not the full benchmark."""
    _, problems = bench
    rows = [
        {"id": p.id, "valid": i % 2 == 0, "optimal": i % 4 == 0} for i, p in enumerate(problems)
    ]
    paths = ev.write_results(tmp_path, problems, rows, "ckpt", "qwen3-4b")
    md = paths["md"].read_text()
    assert "| paper: Qwen3-4B + GRPO + engineer (V6) | 51.67 / 31.67 |" in md
    assert "| paper (V6) | 68.7 / 48.0 |" in md
    assert "not comparable as a mean" in md
    assert "V6 +T bookkeeping 45.2" in md and "V6 +T bookkeeping 35.7" in md
    assert jax.numpy.isfinite(json.loads(paths["json"].read_text())["aggregate_valid"]["all"])


class _SlowEcho(http.server.BaseHTTPRequestHandler):
    """Answers each prompt with its own map size after a short wait, counting the requests in
    flight at once."""

    lock = threading.Lock()
    active = peak = 0

    def log_message(self, *args):
        pass

    def do_POST(self):
        cls = type(self)
        with cls.lock:
            cls.active += 1
            cls.peak = max(cls.peak, cls.active)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(0.2)
        size = body["messages"][-1]["content"].split("There is a ")[1].split(" ")[0]
        message = {"role": "assistant", "content": size}
        choice = {"index": 0, "finish_reason": "stop", "message": message}
        data = json.dumps({"id": "x", "object": "chat.completion", "created": 0,
                           "model": body["model"], "choices": [choice]}).encode()  # fmt: skip
        with cls.lock:
            cls.active -= 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_api_solver_sends_requests_concurrently_and_keeps_order(bench):
    pytest.importorskip("openai")
    _, problems = bench
    chosen = problems[:: max(1, len(problems) // 6)][:6]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowEcho)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        solver = ev.ApiSolver("m", url, api_key="k", concurrency=3)
        answers = solver(chosen, 0)
        assert solver([], 0) == []  # an empty batch sends nothing
    finally:
        server.shutdown()
        server.server_close()
    assert answers == [f"{p.height}x{p.width}" for p in chosen]
    assert _SlowEcho.peak == 3
    with pytest.raises(ValueError, match="concurrency=0"):
        ev.ApiSolver("m", concurrency=0)


# --------------------------------------------------------------------------- bad input


def _tiny(pid: str, row: int, labelled: bool = True, meta=None):
    """A 1-agent puzzle on a 3x3 map, different per `row` (0 or 1); optimal soc 2."""
    grid = ("FFF", "FFF", "FFF")
    p = types.Problem(pid, grid, ((row, 0),), ((row, 2),), meta=meta)
    return p.with_labels(2, 2, False) if labelled else p


def _answer_right(problems, start):
    return ["<answer>Agent 0: RIGHT, RIGHT</answer>"] * len(problems)


def test_answers_of_another_instance_file_are_refused(tmp_path):
    # Two instance files with the same ids (another seed): the first file's answers must not
    # be reused for the second.
    first = [_tiny("a", 0), _tiny("b", 0)]
    second = [_tiny("a", 1), _tiny("b", 0)]
    answers = tmp_path / "answers.jsonl"
    ev.evaluate(_answer_right, first, tmp_path / "e1", "m", answers_out=answers, progress=False)
    rows = [json.loads(line) for line in answers.read_text().splitlines()]
    assert [r["puzzle_hash"] for r in rows] == [io.puzzle_hash(p) for p in first]
    calls = CountingSolver(_answer_right)
    with pytest.raises(ValueError, match=r"answers\.jsonl: field 'puzzle_hash': 1 answer.*'a'"):
        ev.evaluate(calls, second, tmp_path / "e2", "m", answers_out=answers, progress=False)
    assert calls.calls == [] and not (tmp_path / "e2").exists()
    # A file without hashes (nothing ties its answers to puzzles) is not resumed either.
    old = tmp_path / "old.jsonl"
    old.write_text('{"id": "a", "text": "x"}\n')
    with pytest.raises(ValueError, match=r"old\.jsonl:1: field 'puzzle_hash': missing"):
        ev.generate_answers(_answer_right, first, old, progress=False)
    assert old.read_text() == '{"id": "a", "text": "x"}\n'


def test_a_complete_last_line_without_newline_is_kept(tmp_path):
    problems = [_tiny("a", 0), _tiny("b", 1)]
    path = tmp_path / "answers.jsonl"
    line = json.dumps({"id": "a", "text": "x", "puzzle_hash": io.puzzle_hash(problems[0])})
    path.write_text(line)  # valid JSONL without the final newline
    calls = CountingSolver(_answer_right)
    answers = ev.generate_answers(calls, problems, path, progress=False)
    assert calls.calls == [["b"]] and answers["a"] == "x"
    lines = path.read_text().split("\n")
    assert lines[0] == line and len(lines) == 3 and lines[2] == ""
    assert [a.id for a in io.read_answer_lines(path)] == ["a", "b"]


def test_a_torn_last_line_is_dropped_with_a_warning(tmp_path, caplog):
    path = tmp_path / "answers.jsonl"
    good = json.dumps({"id": "a", "text": "x", "puzzle_hash": io.puzzle_hash(_tiny("a", 0))})
    path.write_text(good + "\n" + '{"id": "b", "te')
    with caplog.at_level("WARNING"):
        found = ev.read_answers(path)
    assert list(found) == ["a"] and path.read_text() == good + "\n"
    assert "answers.jsonl:2: the last line is torn" in caplog.text and "15 bytes" in caplog.text
    path.write_text(good + "\n" + '{"id": 3}')  # whole JSON but a bad answer: an error, kept
    with pytest.raises(io.JsonlError, match=r"answers\.jsonl:2: field 'id'"):
        ev.read_answers(path)
    assert path.read_text().endswith('{"id": 3}')


ANSWER_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.dictionaries(st.text(min_size=1, max_size=8), ANSWER_TEXT, max_size=6),
    st.booleans(),
    st.sampled_from([",", ", "]),
)
def test_read_answers_round_trips(tmp_path, answers, trailing_newline, sep):
    path = tmp_path / "rt.jsonl"
    rows = [{"id": i, "text": t, "puzzle_hash": "0123456789abcdef"} for i, t in answers.items()]
    body = "\n".join(json.dumps(r, ensure_ascii=False, separators=(sep, ": ")) for r in rows)
    data = (body + ("\n" if trailing_newline and rows else "")).encode()
    path.write_bytes(data)
    back = ev.read_answers(path)
    assert {i: a.text for i, a in back.items()} == answers
    assert path.read_bytes() == data  # never rewritten


def test_unlabelled_instances_get_valid_rates_and_unknown_optimal(tmp_path):
    problems = [_tiny("a", 0, labelled=False), _tiny("b", 1)]
    paths = ev.evaluate(_answer_right, problems, tmp_path / "e", "m", progress=False)
    md = paths["md"].read_text()
    assert "| 1 | 100.0 / ? |" in md and "1 instance(s) have no optimal_soc label" in md
    table = (paths["csv"].read_text().splitlines())[1]
    assert table == "all,1,3,2,100.0000,"
    summary = json.loads(paths["json"].read_text())
    assert summary["unlabelled"] == 1 and summary["means"]["all"]["1"] == [100.0, None]
    labelled, report = ev.label_unlabelled(problems, processes=1)
    assert labelled[0].optimal_soc == 2 and labelled[1] is problems[1]
    assert report["labelled"] == 1 and report["timeout"] == []


def test_cells_come_from_fields_and_meta_not_the_id(tmp_path):
    # 'wrong_1' used to be read as a wait ratio 'ong' after every answer was generated.
    problems = [
        _tiny("wrong_1", 0, meta={"wait_ratio": 0.5}),
        _tiny("hr_x_9x9_3ag_wr0.25", 1, meta=None),
    ]
    paths = ev.evaluate(_answer_right, problems, tmp_path / "e", "m", progress=False)
    md = paths["md"].read_text()
    assert "## Wait-ratio subset 0.50" in md and "0.25" not in md
    csv_rows = list(csv.DictReader(paths["csv"].open()))
    assert {(r["subset"], r["agents"], r["size"], r["n"]) for r in csv_rows} == {
        ("all", "1", "3", "2"),
        ("wr0.50", "1", "3", "1"),
    }


def test_wrong_labels_are_reported(tmp_path):
    p = _tiny("a", 0).with_labels(5, 5, True)  # a valid plan of cost 2 proves the label wrong
    paths = ev.evaluate(_answer_right, [p], tmp_path / "e", "m", progress=False)
    assert "1 optimal_soc label(s) are wrong" in paths["md"].read_text()
    assert json.loads(paths["json"].read_text())["wrong_labels"] == [
        {"id": "a", "soc": 2, "optimal_soc": 5}
    ]


def test_checkpoint_and_output_paths_are_checked_first(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    cases = {
        tmp_path / "empty": r"empty: not a model checkpoint, it has no config\.json and no \*",
        tmp_path / "nope" / "model": r"nope/model: no such directory",
        tmp_path / "file": r"file: is a file",
        "./runs/x": r"runs/x: no such directory",
    }
    for path, match in cases.items():
        with pytest.raises(CheckpointError, match=match):
            ev.CheckpointSolver(path)
    (tmp_path / "empty" / "config.json").write_text("{}")
    (tmp_path / "empty" / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"no tokenizer files \(one of tokenizer\.json"):
        ev.check_checkpoint_dir(tmp_path / "empty")
    with pytest.raises(NotADirectoryError, match=r"--out_dir .*file/out: .*file is a file"):
        ev.evaluate(_answer_right, [_tiny("a", 0)], tmp_path / "file" / "out", "m", progress=False)


def test_launch_evaluate_bad_paths_are_one_line(tmp_path):
    inst = tmp_path / "i.jsonl"
    io.save_instances(inst, [_tiny("a", 0)])
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    for args, words in (
        ([f"--instances={tmp_path}"], f"{tmp_path}: is a directory"),
        ([f"--instances={inst}", f"--out_dir={inst}"], f"--out_dir {inst}: {inst} is a file"),
        ([f"--instances={inst}"], "no such directory"),
    ):
        cmd = [sys.executable, "launch/evaluate.py", f"--checkpoint={tmp_path / 'm'}", *args]
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 2 and words in res.stderr, res.stderr[-2000:]
        assert "Traceback" not in res.stderr
    cmd = [sys.executable, "launch/evaluate.py", f"--checkpoint={tmp_path / 'm'}", "--top_p=1.5"]
    res = subprocess.run(cmd + [f"--instances={inst}"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert res.returncode != 0 and "--top_p: a probability mass, in (0, 1]" in res.stderr


def test_an_answers_file_with_an_id_twice_is_refused_unless_told_which(tmp_path):
    """It used to keep the first answer silently."""
    path = tmp_path / "answers.jsonl"
    h = io.puzzle_hash(_tiny("a", 0))
    rows = [{"id": "a", "text": t, "puzzle_hash": h} for t in ("first", "second")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(io.JsonlError) as e:
        ev.read_answers(path)
    assert str(e.value).startswith(f"{path}:2: field 'id': 1 id(s) answered more than once")
    assert "'a' on lines [1, 2]" in str(e.value)
    assert ev.read_answers(path, "first")["a"].text == "first"
    assert ev.read_answers(path, "last")["a"].text == "second"


def test_logit_bias_ids_reads_text_value_specs_of_one_token():
    from mapfjax.models import tokenizer as tok_lib

    tok = tok_lib.load_tokenizer(pathlib.Path(ev.__file__).parent.parent / "assets" / "tiny")
    ((tid, value),) = ev.logit_bias_ids(tok, [" H=1.5"])
    assert tok.decode([tid]) == " H" and value == 1.5
    assert ev.logit_bias_ids(tok, []) == ()
    for spec, words in [(" taken=1", ["' taken'", "tokens", "one token"]), (" H", ["TEXT=VALUE"]),
                        (" H=nan", ["finite"]), ("=2", ["TEXT=VALUE"])]:  # fmt: skip
        with pytest.raises(ValueError) as e:
            ev.logit_bias_ids(tok, [spec])
        assert all(w in str(e.value) for w in words), str(e.value)
