"""Engineers: baselines, the rule curriculum, an API engineer against a local server, policy."""

import json
import math
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mapfjax import configfile
from mapfjax.engineer import engineers as E
from mapfjax.engineer.context import RoundRecord, failure_breakdown
from mapfjax.engineer.proposal import parse_proposal
from mapfjax.env.config import default_config

CUR = default_config(sizes=(3, 4, 5))
ENGINEERS_FILE = Path(__file__).parents[2] / "configs" / "engineer" / "engineers.py"


def load_engineer_config(name):
    return configfile.get_config(ENGINEERS_FILE, name)


CONTEXT = "## Failure breakdown\n(latest numbers)\n"


def rows(size, valid, total):
    return [
        {
            "id": f"{size}-{i}",
            "size": size,
            "num_agents": 2,
            "valid": i < valid,
            "optimal": False,
            "failure": None if i < valid else "vertex_conflict",
            "response_tokens": 50,
            "truncated": False,
        }
        for i in range(total)
    ]


def records(*per_size):
    rs = [r for size, valid, total in per_size for r in rows(size, valid, total)]
    return [RoundRecord(0, CUR.to_dict(), failure_breakdown(rs), "", {"round": 0})]


def changed_keys(a, b):
    out = set()
    for s in set(a.sizes) | set(b.sizes):
        for f in ("data_ratio", "hole_ratio", "wait_ratio"):
            if not math.isclose(a.sizes[s][f], b.sizes[s][f], abs_tol=1e-9):
                out.add(f"sizes.{s}.{f}")
    return out


def test_fixed_never_changes():
    d = E.FixedEngineer().propose(CONTEXT, CUR, 0, records((3, 0, 4)))
    assert d.kept_current and "never" in d.reason and d.config.to_dict() == CUR.to_dict()


def test_candidate_edits_are_local_and_well_formed():
    cur = default_config()  # 8 sizes, hole 0.2, wait 0.3, data 0.125
    cands = E.candidate_edits(cur)
    # 8 sizes x 2 fields x 4 steps (+-0.05, +-0.1), plus 7 neighbour pairs x 2 ways x 2 steps.
    assert len(cands) == 8 * 2 * 4 + 7 * 2 * 2
    for c in cands:
        assert parse_proposal(c.text()).diff == c.diff
        assert len(c.diff) in (1, 2)
        for k, v in c.diff.items():
            s, f = k.split(".")[1:]
            assert abs(v - cur.sizes[s][f]) <= 0.1 + 1e-9
    edge = default_config(sizes=(3, 4), hole_ratio=0.5, wait_ratio=0.0)
    texts = [c.description for c in E.candidate_edits(edge)]
    assert not any("raise hole_ratio" in t or "lower wait_ratio" in t for t in texts)
    # 0.5 data share per size: both directions of both steps are possible.
    assert sum("move" in t for t in texts) == 4


def test_random_is_seeded_and_local():
    eng = E.RandomEngineer(num_edits=2)
    a, b = eng.propose(CONTEXT, CUR, 7), eng.propose(CONTEXT, CUR, 7)
    assert a.to_dict() == b.to_dict()
    outcomes = {json.dumps(eng.propose(CONTEXT, CUR, s).diff, sort_keys=True) for s in range(20)}
    assert len(outcomes) > 5
    for seed in range(20):
        d = eng.propose(CONTEXT, CUR, seed)
        assert not d.kept_current and 2 <= len(d.diff) <= 4
        assert changed_keys(CUR, d.config) <= set(d.diff) | {
            f"sizes.{s}.data_ratio" for s in CUR.sizes
        }


def test_rule_engineer_follows_its_documented_rules():
    # 3x3 mastered (10/10), 4x4 learnable (5/10), 5x5 collapsed (0/10); band [0.3, 0.8].
    d = E.RuleEngineer(low=0.3, high=0.8, step=0.05, shift=0.25).propose(
        CONTEXT, CUR, 0, records((3, 10, 10), (4, 5, 10), (5, 0, 10))
    )
    s = d.config.sizes
    assert math.isclose(s.s3.wait_ratio, 0.35) and math.isclose(s.s3.hole_ratio, 0.2)
    assert math.isclose(s.s4.wait_ratio, 0.3) and math.isclose(s.s4.hole_ratio, 0.2)
    assert math.isclose(s.s5.hole_ratio, 0.15) and math.isclose(s.s5.wait_ratio, 0.25)
    # Weights 1/3 x (0.75, 1.25, 0.75) -> shares 3/11, 5/11, 3/11.
    for k, share in (("s3", 3 / 11), ("s4", 5 / 11), ("s5", 3 / 11)):
        assert math.isclose(s[k].data_ratio, share)
    assert "5x5 valid 0% < 30%" in d.summary and "4x4 valid 50% is learnable" in d.summary
    assert parse_proposal(d.raw).diff == d.diff


def test_rule_engineer_clips_and_keeps_when_nothing_fires():
    low = default_config(sizes=(3, 4), hole_ratio=0.02, wait_ratio=0.0)
    d = E.RuleEngineer().propose(CONTEXT, low, 0, records((3, 0, 4), (4, 0, 4)))
    assert d.config.sizes.s3.hole_ratio == 0.0 and d.config.sizes.s3.wait_ratio == 0.0
    band = E.RuleEngineer().propose(CONTEXT, CUR, 0, records((3, 5, 10), (4, 5, 10), (5, 5, 10)))
    assert band.kept_current and "no rule changes" in band.reason
    none = E.RuleEngineer().propose(CONTEXT, CUR, 0, [])
    assert none.kept_current and "no validation" in none.reason


def test_choose_by_likelihood_with_a_fake_scorer():
    cands = E.candidate_edits(CUR)
    target = next(i for i, c in enumerate(cands) if "sizes.s4.wait_ratio: 0.4" in c.text())
    seen = {}

    def score(prompt, texts):
        seen["prompt"] = prompt
        return [10.0 if "sizes.s4.wait_ratio: 0.4" in t else -float(len(t)) for t in texts]

    best, scores = E.choose_by_likelihood(score, "P", cands)
    assert best == target and seen["prompt"] == "P" and len(scores) == len(cands)
    flat = [0.0] * len(cands)
    assert E.choose_by_likelihood(lambda p, t: flat, "P", cands)[0] == 0
    nan_first = [math.nan] + [-1.0] * (len(cands) - 1)
    assert E.choose_by_likelihood(lambda p, t: nan_first, "P", cands)[0] == 1
    with pytest.raises(ValueError, match="returned 1 scores"):
        E.choose_by_likelihood(lambda p, t: [0.0], "P", cands)


GOOD = "Because 4x4 conflicts.\n```yaml\nsizes.s4.wait_ratio: 0.45\n```\nSummary: more waits."


def test_policy_free_takes_the_first_sample_that_changes_the_config():
    calls = []

    def generate(prompts, n):
        calls.append((prompts, n))
        return [
            "I am not sure.",
            "```yaml\nsizes.s3.hole_ratio: 0.2\n```",  # parses but changes nothing
            GOOD,
            "```yaml\nsizes.s5.hole_ratio: 0.0\n```",
        ]

    d = E.PolicyEngineer(generate_fn=generate, mode="free", num_samples=4).propose(CONTEXT, CUR, 0)
    ((prompts, n),) = calls
    assert n == 4 and len(prompts) == 1 and CONTEXT.strip() in prompts[0]
    assert d.extra["chosen"] == 2 and d.raw == GOOD and d.summary == "more waits."
    assert d.config.sizes.s4.wait_ratio == 0.45 and d.config.sizes.s5.hole_ratio == 0.2
    assert [s["changed"] for s in d.extra["samples"]] == [False, False, True]
    assert d.extra["samples"][0]["text"] == "I am not sure."


def test_policy_falls_back_to_the_models_choice_among_local_edits():
    bad = lambda prompts, n: ["no diff here"] * n

    def score(prompt, texts):
        return [1.0 if "sizes.s5.hole_ratio: 0.1\n" in t else 0.0 for t in texts]

    eng = E.PolicyEngineer(generate_fn=bad, score_fn=score, num_samples=3)
    d = eng.propose(CONTEXT, CUR, 0)
    assert not d.kept_current and d.extra["mode"] == "constrained"
    assert d.diff == {"sizes.s5.hole_ratio": 0.1} and d.config.sizes.s5.hole_ratio == 0.1
    chosen = d.extra["chosen"]
    assert d.extra["scores"][chosen] == 1.0 and sorted(d.extra["scores"])[-2] == 0.0
    assert d.extra["candidates"][chosen] == "lower hole_ratio of 5x5 from 0.2 to 0.1"
    only_free = E.PolicyEngineer(generate_fn=bad, mode="free", num_samples=2)
    k = only_free.propose(CONTEXT, CUR, 0)
    assert k.kept_current and "sample 0" in k.reason and "sample 1" in k.reason


def test_policy_failures_keep_the_config_and_say_why():
    def boom(prompts, n):
        raise RuntimeError("out of memory")

    d = E.PolicyEngineer(generate_fn=boom, mode="free").propose(CONTEXT, CUR, 0)
    assert d.kept_current and "out of memory" in d.reason
    d = E.PolicyEngineer(score_fn=lambda p, t: [0.0], mode="constrained").propose(CONTEXT, CUR, 0)
    assert d.kept_current and "score_fn failed" in d.reason
    with pytest.raises(ValueError, match="mode.*allowed"):
        E.PolicyEngineer(mode="greedy")


def test_make_engineer_from_config():
    for name in E.ENGINEERS:
        cfg = load_engineer_config(name)
        eng = E.make_engineer(cfg, **({"score_fn": None} if name in ("policy", "base") else {}))
        assert eng.name == name
    assert isinstance(E.make_engineer({"name": "fixed"}), E.FixedEngineer)
    base = E.make_engineer({"name": "base", "num_samples": 2}, generate_fn=lambda p, n: [])
    assert base.name == "base" and base.num_samples == 2
    rule = E.make_engineer({"name": "rule", "low": 0.2})
    assert rule.low == 0.2 and set(E.ENGINEERS) == {
        "fixed",
        "random",
        "rule",
        "api",
        "policy",
        "base",
    }
    with pytest.raises(ValueError, match="'oracle'.*allowed"):
        E.make_engineer({"name": "oracle"})
    with pytest.raises(ValueError, match=r"rule.*\['colour'\]"):
        E.make_engineer({"name": "rule", "colour": 1})


# ----------------------------------------------------------------------------- api


def completion(content):
    return {
        "id": "c1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


@pytest.fixture
def server():
    """A chat-completions endpoint on 127.0.0.1 answering from a queue of (status, body)."""
    queue, requests = [], []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            requests.append((self.path, json.loads(body), self.headers.get("Authorization")))
            status, payload = queue.pop(0) if queue else (500, {"error": "empty queue"})
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", queue, requests
    httpd.shutdown()
    httpd.server_close()


def api(url, sleeps, **kw):
    pytest.importorskip("openai")  # the optional `api` extra
    return E.ApiEngineer(
        base_url=url,
        model="m",
        api_key="secret-123",
        backoff=0.5,
        timeout=5,
        sleep=sleeps.append,
        **kw,
    )


def test_api_success(server):
    url, queue, requests = server
    queue.append((200, completion(GOOD)))
    sleeps = []
    d = api(url, sleeps).propose(CONTEXT, CUR, 0)
    assert not d.kept_current and d.config.sizes.s4.wait_ratio == 0.45 and sleeps == []
    ((path, body, auth),) = requests
    assert path == "/v1/chat/completions" and body["model"] == "m" and auth == "Bearer secret-123"
    assert CONTEXT.strip() in body["messages"][0]["content"]
    assert d.extra["attempts"] == 1 and d.engineer == "api"
    assert "secret" not in json.dumps(d.to_dict())


def test_api_malformed_content_keeps_config(server):
    url, queue, _ = server
    queue.append((200, completion("Make it harder everywhere!")))
    d = api(url, []).propose(CONTEXT, CUR, 0)
    assert d.kept_current and "no ```yaml" in d.reason and d.raw.startswith("Make it")
    queue.append((200, b"this is not json"))
    d = api(url, []).propose(CONTEXT, CUR, 0)
    assert d.kept_current and "API request failed" in d.reason


def test_api_retries_5xx_with_backoff_then_succeeds(server):
    url, queue, requests = server
    queue += [(500, {"error": "busy"}), (503, {"error": "busy"}), (200, completion(GOOD))]
    sleeps = []
    d = api(url, sleeps, max_retries=3).propose(CONTEXT, CUR, 0)
    assert not d.kept_current and d.extra["attempts"] == 3 and len(requests) == 3
    assert sleeps == [0.5, 1.0] and len(d.extra["errors"]) == 2


def test_api_does_not_retry_client_errors(server):
    url, queue, requests = server
    queue.append((401, {"error": {"message": "bad key"}}))
    sleeps = []
    d = api(url, sleeps).propose(CONTEXT, CUR, 0)
    assert d.kept_current and "after 1 attempt" in d.reason and sleeps == [] and len(requests) == 1


def test_api_unreachable_keeps_config_with_reason():
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps = []
    d = api(f"http://127.0.0.1:{port}/v1", sleeps, max_retries=2).propose(CONTEXT, CUR, 0)
    assert d.kept_current and "after 3 attempt(s)" in d.reason and "Connection" in d.reason
    assert sleeps == [0.5, 1.0] and d.config.to_dict() == CUR.to_dict()


def test_api_settings_from_environment(server, monkeypatch):
    url, queue, requests = server
    pytest.importorskip("openai")
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    monkeypatch.setenv("OPENAI_API_KEY", "env-key")
    monkeypatch.setenv("OPENAI_MODEL", "env-model")
    queue.append((200, completion(GOOD)))
    d = E.ApiEngineer(sleep=lambda s: None).propose(CONTEXT, CUR, 0)
    assert not d.kept_current and requests[0][1]["model"] == "env-model"
    assert requests[0][2] == "Bearer env-key"
    monkeypatch.delenv("OPENAI_MODEL")
    d = E.ApiEngineer().propose(CONTEXT, CUR, 0)
    assert d.kept_current and "OPENAI_MODEL" in d.reason
