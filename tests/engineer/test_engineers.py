"""Engineers: the curriculum baselines on synthetic round records, candidate edits, an API
engineer against a local server, policy."""

import json
import math
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from mapfjax import configfile
from mapfjax.engineer import engineers as E
from mapfjax.engineer.context import RoundRecord, failure_breakdown, wait_breakdown
from mapfjax.engineer.prompt import build_prompt
from mapfjax.engineer.proposal import Edit, count_edits, parse_proposal
from mapfjax.env.config import default_config, validate

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


def test_fixed_never_changes():
    d = E.FixedEngineer().propose(CONTEXT, CUR, 0, records((3, 0, 4)))
    assert d.kept_current and "never" in d.reason and d.config.to_dict() == CUR.to_dict()


def rollout_record(round_, config, per_size, validation=()):
    """A round record with training-rollout statistics: per_size {size: (valid_rate,
    learnability, mean_abs_advantage)} over 8 groups of 8 samples."""
    stats = {
        str(n): {
            "groups": 8,
            "samples": 64,
            "valid_rate": v,
            "mixed_groups": 0.5,
            "learnability": lp,
            "mean_abs_advantage": a,
        }
        for n, (v, lp, a) in per_size.items()
    }
    val = failure_breakdown([r for size, ok, n in validation for r in rows(size, ok, n)])
    cfg = config.to_dict() if hasattr(config, "to_dict") else config
    return RoundRecord(round_, cfg, val, "", {"round": round_}, {"sizes": stats})


ROLLOUTS = [rollout_record(0, CUR, {3: (0.9, 0.05, 0.3), 4: (0.5, 0.2, 0.8), 5: (0.1, 0.04, 0.2)})]


def shares(config):
    return {k: config.sizes[k].data_ratio for k in sorted(config.sizes)}


def test_candidate_edits_are_local_and_well_formed():
    cur = default_config()  # 8 sizes, hole 0.2, wait 0.3, data 0.125
    cands = E.candidate_edits(cur)
    # 8 sizes x 2 fields x 4 steps (+-0.05, +-0.1), plus 7 neighbour pairs x 2 ways x 2 steps;
    # no large move: the data is already uniform and there are no records.
    assert len(cands) == 8 * 2 * 4 + 7 * 2 * 2
    for c in cands:
        assert parse_proposal(c.text()).diff == c.diff
        assert len(c.diff) in (1, 2)
        for e in c.diff:
            assert abs(e.value - cur.sizes[f"s{e.size}"][e.field]) <= 0.1 + 1e-9
    edge = default_config(sizes=(3, 4), hole_ratio=0.5, wait_ratio=0.0)
    texts = [c.description for c in E.candidate_edits(edge)]
    assert not any("raise hole_ratio" in t or "lower wait_ratio" in t for t in texts)
    # 0.5 data share per size: both directions of both steps are possible.
    assert sum("move" in t for t in texts) == 4


def test_large_moves_are_candidates_and_one_edit_each():
    cur = E.apply_proposal(
        parse_proposal("sizes.s3.data_ratio: 0.6\nsizes.s4.data_ratio: 0.3"), CUR, "t"
    ).config
    moves = E.large_moves(cur, ROLLOUTS)
    assert E.candidate_edits(cur, records=ROLLOUTS)[-len(moves) :] == moves
    by_text = {c.description.split(",")[0].split(" to ")[0]: c for c in moves}
    assert len(moves) == 4, [c.description for c in moves]
    for c in moves:
        # A whole data_ratio vector: every size, one edit by the MAX_EDITS rule.
        assert [e.size for e in c.diff] == [3, 4, 5] and count_edits(c.diff) == 1
        assert parse_proposal(c.text(), max_edits=1).diff == c.diff
    got = lambda c: {e.size: e.value for e in c.diff}  # noqa: E731
    assert got(by_text["uniform data over all sizes"]) == {3: 0.3333, 4: 0.3333, 5: 0.3333}
    # Half of the data to 4x4 and 3x3 (learnability 0.2 and 0.05), a quarter each.
    half = next(c for c in moves if c.description.startswith("shift half"))
    assert "4x4 and 3x3" in half.description
    assert got(half) == {3: 0.3 + 0.25, 4: 0.15 + 0.25, 5: 0.05}
    # 5x5 (10 % valid) and 4x4 (50 %) are the worst: 0.1 -> 0.2 and 0.3 -> 0.6, 3x3 keeps 0.2.
    double = next(c for c in moves if c.description.startswith("double"))
    assert got(double) == {3: 0.2, 4: 0.6, 5: 0.2}
    # Without rollouts the validation rates decide, and the uniform move stays.
    old = E.large_moves(cur, records((3, 10, 10), (4, 5, 10), (5, 0, 10)))
    assert len(old) == 4 and "5x5 and 4x4, the lowest valid rates" in old[2].description
    assert [c.description for c in E.large_moves(cur)] == ["uniform data over all sizes"]
    assert E.large_moves(CUR) == []  # thirds are uniform, even when rounded to 0.3333


def test_policy_falls_back_to_a_large_move_when_the_model_prefers_it():
    def score(prompt, texts):
        return [1.0 if "uniform data" in t else 0.0 for t in texts]

    eng = E.PolicyEngineer(generate_fn=lambda p, n: ["no diff"] * n, score_fn=score)
    cur = E.apply_proposal(parse_proposal("sizes.s3.data_ratio: 0.6"), CUR, "t").config
    d = eng.propose(CONTEXT, cur, 0, ROLLOUTS)
    assert not d.kept_current and d.extra["candidates"][d.extra["chosen"]].startswith("uniform")
    assert all(math.isclose(v, 1 / 3, abs_tol=1e-3) for v in shares(d.config).values())
    assert d.prompt == build_prompt(CONTEXT, cur, eng.max_edits)


def test_random_is_seeded_domain_randomisation():
    eng = E.RandomEngineer()
    a, b = eng.propose(CONTEXT, CUR, 7), eng.propose(CONTEXT, CUR, np.random.default_rng(7))
    assert a.to_dict() == b.to_dict() and a.prompt == ""
    configs = [eng.propose(CONTEXT, CUR, seed).config for seed in range(30)]
    for c in configs:
        validate(c)
        assert sorted(c.sizes) == sorted(CUR.sizes)
    # A fresh config each round: every ratio of every size is redrawn over its whole range.
    for field, hi in (("hole_ratio", 0.5), ("wait_ratio", 1.0), ("data_ratio", 1.0)):
        values = [c.sizes[s][field] for c in configs for s in c.sizes]
        assert len(set(values)) > 80 and min(values) < 0.2 * hi < 0.8 * hi < max(values)
    with pytest.raises(ValueError, match=r"random\)\.alpha = 0.*> 0"):
        E.RandomEngineer(alpha=0)
    # max_wait bounds the wait draws (round 0 with few waits) and is checked.
    low = [E.RandomEngineer(max_wait=0.2).propose(CONTEXT, CUR, seed) for seed in range(30)]
    waits = [d.config.sizes[s].wait_ratio for d in low for s in d.config.sizes]
    assert max(waits) <= 0.2 < 5 * min(waits) + 0.2 and "waits ~ U[0, 0.2]" in str(low[0].to_dict())
    for bad in (0, 1.5, "0.3", True):
        with pytest.raises(ValueError, match=r"random\)\.max_wait = .*allowed: a number in"):
            E.RandomEngineer(max_wait=bad)


def test_rule_engineer_climbs_its_ladder():
    # 3x3 mastered (10/10), 4x4 learnable (5/10), 5x5 collapsed (0/10); band [0.3, 0.7].
    d = E.RuleEngineer(low=0.3, high=0.7, step=0.05, shift=0.25).propose(
        CONTEXT, CUR, 0, records((3, 10, 10), (4, 5, 10), (5, 0, 10))
    )
    s = d.config.sizes
    assert math.isclose(s.s3.wait_ratio, 0.35) and math.isclose(s.s3.hole_ratio, 0.25)
    assert math.isclose(s.s4.wait_ratio, 0.3) and math.isclose(s.s4.hole_ratio, 0.2)
    assert math.isclose(s.s5.hole_ratio, 0.15) and math.isclose(s.s5.wait_ratio, 0.25)
    assert all(math.isclose(v, 1 / 3) for v in shares(d.config).values())
    assert "5x5 valid 0% (validation): easier" in d.summary and "3x3 valid 100%" in d.summary
    assert parse_proposal(d.raw, max_edits=len(d.diff)).diff == d.diff
    # Rollouts, when the record has them, decide instead of the validation.
    r = E.RuleEngineer().propose(CONTEXT, CUR, 0, ROLLOUTS)
    assert r.config.sizes.s3.hole_ratio == 0.25 and r.config.sizes.s5.hole_ratio == 0.15
    assert "(rollouts)" in r.summary


def test_rule_engineer_moves_data_at_the_ends_of_the_ladder():
    top = default_config(sizes=(3, 4), hole_ratio=0.5, wait_ratio=1.0)
    d = E.RuleEngineer(shift=0.5).propose(CONTEXT, top, 0, records((3, 10, 10), (4, 5, 10)))
    assert shares(d.config) == {"s3": 0.25 / 0.75, "s4": 0.5 / 0.75}
    assert "hardest rung: less data" in d.summary
    low = default_config(sizes=(3, 4), hole_ratio=0.02, wait_ratio=0.0)
    d = E.RuleEngineer().propose(CONTEXT, low, 0, records((3, 0, 4), (4, 5, 10)))
    assert d.config.sizes.s3.hole_ratio == 0.0 and d.config.sizes.s3.wait_ratio == 0.0
    bottom = E.RuleEngineer(shift=0.5).propose(CONTEXT, d.config, 0, records((3, 0, 4)))
    assert shares(bottom.config) == {"s3": 0.75 / 1.25, "s4": 0.5 / 1.25}
    band = E.RuleEngineer().propose(CONTEXT, CUR, 0, records((3, 5, 10), (4, 5, 10), (5, 5, 10)))
    assert band.kept_current and "no rule changes" in band.reason
    none = E.RuleEngineer().propose(CONTEXT, CUR, 0, [])
    assert none.kept_current and "no rollouts or validation" in none.reason
    with pytest.raises(ValueError, match=r"rule\)\.low = 0.9; allowed"):
        E.RuleEngineer(low=0.9, high=0.7)


def test_learnability_follows_p_one_minus_p_with_a_floor():
    d = E.LearnabilityEngineer(floor=0.03).propose(CONTEXT, CUR, 0, ROLLOUTS)
    lp = {"s3": 0.05, "s4": 0.2, "s5": 0.04}
    free = 1 - 3 * 0.03
    for k, v in shares(d.config).items():
        assert math.isclose(v, 0.03 + free * lp[k] / sum(lp.values()))
    # 3x3 passes 90 % (> 0.5 + 0.15): more holes; 5x5 10 %: fewer; 4x4 at 50 %: unchanged.
    s = d.config.sizes
    assert (s.s3.hole_ratio, s.s4.hole_ratio, s.s5.hole_ratio) == (0.25, 0.2, 0.15)
    assert all(s[k].wait_ratio == 0.3 for k in s)
    # A size with no learnability keeps the floor; a size without samples counts as the best.
    flat = [rollout_record(0, CUR, {3: (1.0, 0.0, 0.0), 4: (0.5, 0.25, 1.0)})]
    d = E.LearnabilityEngineer(floor=0.1).propose(CONTEXT, CUR, 0, flat)
    assert shares(d.config) == pytest.approx({"s3": 0.1, "s4": 0.45, "s5": 0.45})
    with pytest.raises(ValueError, match=r"learnability\)\.floor = 1.5; allowed"):
        E.LearnabilityEngineer(floor=1.5)


def test_learnability_falls_back_to_validation_and_keeps_the_floor():
    d = E.LearnabilityEngineer(floor=0.05).propose(
        CONTEXT, CUR, 0, records((3, 10, 10), (4, 5, 10), (5, 2, 10))
    )
    # p(1-p): 0, 0.25, 0.16 -> 3x3 gets only the floor.
    got = shares(d.config)
    assert math.isclose(got["s3"], 0.05)
    assert math.isclose(got["s4"], 0.05 + 0.85 * 0.25 / 0.41)
    assert "validation" in d.summary
    many = default_config(sizes=range(3, 11))
    tight = E.LearnabilityEngineer(floor=0.2).propose(CONTEXT, many, 0, records((3, 10, 10)))
    assert all(math.isclose(v, 1 / 8) for v in shares(tight.config).values())  # 8 x 0.2 > 1


def test_bandit_values_are_td0_and_data_is_their_softmax():
    r0 = rollout_record(0, CUR, {3: (0.9, 0.05, 0.4), 4: (0.5, 0.2, 0.8)})
    r1 = rollout_record(1, CUR, {3: (0.9, 0.05, 0.2), 5: (0.2, 0.1, 0.6)})
    q = E.bandit_values([r0, r1], ["s3", "s4", "s5"], step=0.5)
    # s3: 0 -> 0.2 -> 0.2; s4: 0 -> 0.4 (unplayed in round 1); s5: 0 -> 0.3.
    assert q == pytest.approx({"s3": 0.2, "s4": 0.4, "s5": 0.3})
    d = E.BanditEngineer(step=0.5, temperature=0.1).propose(CONTEXT, CUR, 0, [r0, r1])
    w = {k: math.exp(v / 0.1) for k, v in q.items()}
    assert shares(d.config) == pytest.approx({k: v / sum(w.values()) for k, v in w.items()})
    assert d.extra["values"] == pytest.approx(q)
    assert all(d.config.sizes[k].hole_ratio == 0.2 for k in d.config.sizes)
    # Validation fallback: 2 sqrt(p(1-p)) per size.
    v = E.bandit_values(records((3, 5, 10), (4, 10, 10)), ["s3", "s4"], step=1.0)
    assert v == pytest.approx({"s3": 1.0, "s4": 0.0})


def test_bandit_state_is_recovered_from_the_records_alone():
    recs = [
        rollout_record(n, CUR, {3: (0.8, 0.1, 0.1 * n), 4: (0.4, 0.2, 0.5), 5: (0.1, 0.05, 0.3)})
        for n in range(3)
    ]
    eng = E.BanditEngineer()
    first = eng.propose(CONTEXT, CUR, 0, recs)
    eng.propose(CONTEXT, CUR, 1, recs[:1])  # no state carried from call to call
    reloaded = [RoundRecord.from_json(r.to_json()) for r in recs]
    again = E.make_engineer(load_engineer_config("bandit")).propose(CONTEXT, CUR, 5, reloaded)
    assert first.to_dict() == again.to_dict() and not first.kept_current


@pytest.mark.parametrize("name", ["fixed", "random", "rule", "learnability", "bandit"])
def test_baselines_are_deterministic_and_legal(name):
    eng = E.make_engineer(load_engineer_config(name))
    cur = CUR
    history = []
    for n in range(4):
        rng = np.random.default_rng([0, n, 7])
        per = {size: ((n + size) % 4 / 3, (n * size) % 5 / 20, size / 10) for size in (3, 4, 5)}
        history.append(rollout_record(n, cur, per) if n % 2 else records((3, n, 4))[0])
        d = eng.propose(CONTEXT, cur, rng, tuple(history))
        again = eng.propose(CONTEXT, cur, np.random.default_rng([0, n, 7]), tuple(history))
        assert d.to_dict() == again.to_dict() and d.engineer == name and d.prompt == ""
        validate(d.config)
        assert d.kept_current == (d.config.to_dict() == cur.to_dict())
        cur = d.config
    if name == "fixed":
        assert cur.to_dict() == CUR.to_dict()


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
    assert d.diff == (Edit(5, "hole_ratio", 0.1),) and d.config.sizes.s5.hole_ratio == 0.1
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
    assert d.kept_current and "out of memory" in d.reason and "out of memory" in E.failure(d)
    d = E.PolicyEngineer(score_fn=lambda p, t: [0.0], mode="constrained").propose(CONTEXT, CUR, 0)
    assert d.kept_current and "score_fn failed" in d.reason and "score_fn" in E.failure(d)
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
        "learnability",
        "bandit",
        "wait",
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
    assert d.prompt == body["messages"][0]["content"]  # the exact prompt sent
    assert d.extra["attempts"] == 1 and d.engineer == "api"
    assert "secret" not in json.dumps(d.to_dict())


def test_api_malformed_content_keeps_config(server):
    url, queue, _ = server
    queue.append((200, completion("Make it harder everywhere!")))
    d = api(url, []).propose(CONTEXT, CUR, 0)
    assert d.kept_current and "no ```yaml" in d.reason and d.raw.startswith("Make it")
    assert E.failure(d) == ""  # it answered: keeping the config was the projection's choice
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
    assert E.failure(d) == d.reason  # an engineer that could not run, not a kept choice
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
    assert d.kept_current and "OPENAI_MODEL" in d.reason and "OPENAI_MODEL" in E.failure(d)


def wait_record(wait_ok, wait_n, other_ok, other_n, config=CUR):
    """Round 1's record whose validation has wait_ok of wait_n puzzles that need a wait valid
    and other_ok of other_n others."""
    labelled = [r | {"needs_wait": True} for r in rows(4, wait_ok, wait_n)]
    labelled += [r | {"needs_wait": False} for r in rows(5, other_ok, other_n)]
    return RoundRecord(
        1, config.to_dict(), failure_breakdown(labelled), "", {"round": 1},
        wait_split=wait_breakdown(labelled),
    )  # fmt: skip


def test_wait_engineer_sets_the_wait_share_of_the_failures():
    # 30 of 40 that need a wait fail, 10 of 60 others: 30 / 40 = 75 % of the failures.
    d = E.WaitEngineer().propose(CONTEXT, CUR, 0, [wait_record(10, 40, 50, 60)])
    assert not d.kept_current and d.extra["failure_share"] == pytest.approx(0.75)
    assert {k: v.wait_ratio for k, v in d.config.sizes.items()} == dict.fromkeys(CUR.sizes, 0.75)
    for k in CUR.sizes:  # data and holes untouched
        assert d.config.sizes[k].data_ratio == CUR.sizes[k].data_ratio
        assert d.config.sizes[k].hole_ratio == CUR.sizes[k].hole_ratio
    assert "75% of the held-out failures need a wait" in d.summary
    validate(d.config)
    # Clipped to [low, high] and rounded: every failure on a wait puzzle -> high; none -> low.
    assert (
        E.WaitEngineer(high=0.8)
        .propose(CONTEXT, CUR, 0, [wait_record(0, 30, 30, 30)])
        .config.sizes.s3.wait_ratio
        == 0.8
    )
    assert (
        E.WaitEngineer(low=0.15)
        .propose(CONTEXT, CUR, 0, [wait_record(30, 30, 0, 30)])
        .config.sizes.s3.wait_ratio
        == 0.15
    )
    third = E.WaitEngineer().propose(CONTEXT, CUR, 0, [wait_record(20, 30, 0, 20)])
    assert third.config.sizes.s5.wait_ratio == 0.33  # 10 / 30 failures


def test_wait_engineer_keeps_the_config_without_evidence():
    old = records((3, 1, 4))  # a record without a wait split (older runs, unlabelled sets)
    for recs, why in [
        ([], "0 labelled"),
        (old, "0 labelled"),
        ([wait_record(5, 8, 4, 8)], "16 labelled held-out puzzles (at least 20"),
        ([wait_record(10, 10, 20, 20)], "no held-out failure"),
    ]:
        d = E.WaitEngineer().propose(CONTEXT, CUR, 0, recs)
        assert d.kept_current and why in d.reason, (why, d.reason)
        assert not E.failure(d)  # a choice, not a failure to run
    for bad, word in [({"low": 0.6, "high": 0.5}, "low"), ({"min_rows": 0}, "min_rows")]:
        with pytest.raises(ValueError, match=f"wait.*{word}"):
            E.WaitEngineer(**bad)
