"""The trainer-facing scorer under bad input: reward settings are finite and in range, a
malformed ground truth (off the map, on a hole, two agents on one cell, too deep to read) is a
ValueError naming the field, and so is a malformed `reward_model` column."""

import json
import math

import pytest

from mapfjax.env import score

PUZZLE = {"grid": ["FF", "FF"], "starts": [[0, 0], [1, 1]], "goals": [[0, 1], [1, 0]],
          "optimal_soc": 2}  # fmt: skip
RIGHT = "<answer>\nAgent 0: RIGHT\nAgent 1: LEFT\n</answer>"


def test_a_right_answer_scores_as_before():
    assert score.score(RIGHT, PUZZLE).reward == 1.5


@pytest.mark.parametrize("key", ["valid_reward", "invalid_reward", "optimal_bonus"])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1e300, True, "1"])
def test_a_reward_setting_that_is_not_a_finite_number_in_range_names_the_key(key, value):
    with pytest.raises(ValueError, match=rf"reward\.{key} = .*; allowed: a finite number in"):
        score.RewardConfig(**{key: value})
    with pytest.raises(ValueError, match=rf"reward\.{key} = "):
        score.compute_score("mapf", RIGHT, json.dumps(PUZZLE), **{key: value})


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"starts": [[-5, -5], [1, 1]]}, r"field 'starts' has \[-5, -5\], off the 2x2 grid"),
        ({"goals": [[99, 99], [1, 0]]}, r"field 'goals' has \[99, 99\], off the 2x2 grid"),
        ({"grid": ["HF", "FF"]}, r"field 'starts' has \[0, 0\] on a hole"),
        ({"starts": [[0, 0], [0, 0]]}, r"field 'starts' = .*; allowed: distinct cells"),
        ({"goals": [[0, 1], [0, 1]]}, r"field 'goals' = .*; allowed: distinct cells"),
        (
            {
                "grid": ["FFFF"] * 3,
                "starts": [[0, i] for i in range(4)] + [[1, 0], [1, 1]],
                "goals": [[2, i] for i in range(4)] + [[1, 2], [1, 3]],
            },
            r"6 agents; allowed: 1 to 5",
        ),  # fmt: skip
    ],
)
def test_a_malformed_ground_truth_is_a_value_error_naming_the_field(edit, message):
    bad = {**PUZZLE, **edit}
    with pytest.raises(ValueError, match=message):
        score.score("<answer>\nAgent 0: \nAgent 1: \n</answer>", bad)


def test_a_ground_truth_nested_too_deep_to_read_is_a_value_error():
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ValueError, match="ground truth is not JSON"):
        score.score(RIGHT, deep)


@pytest.mark.parametrize("column", [[None], ["not json"], [{"style": "rule"}], [7]])
def test_a_malformed_reward_model_column_is_a_value_error_naming_it(column):
    with pytest.raises(ValueError, match=r"column 'reward_model' = .*'ground_truth' field"):
        score.reward([RIGHT], reward_model=column)


def test_the_reward_model_column_may_be_json():
    cell = json.dumps({"style": "rule", "ground_truth": json.dumps(PUZZLE)})
    assert score.reward([RIGHT], reward_model=[cell]) == [1.5]


@pytest.mark.parametrize(
    "text, reason",
    [
        ("<answer>\nAgent ０: RIGHT\nAgent 1: LEFT\n</answer>", "malformed agent line"),
        ("<answer>\nAgent ٠: RIGHT\nAgent 1: LEFT\n</answer>", "malformed agent line"),
        ("<answer>\nAgent 0: rıght\nAgent 1: LEFT\n</answer>", "unknown action 'rıght'"),
    ],
)
def test_the_answer_syntax_is_ascii(text, reason):
    """A fullwidth or Arabic-Indic digit, or an action name with a dotless i, is not the
    prompt's syntax: a parse error (0), not a valid plan (1.5)."""
    result = score.score(text, PUZZLE)
    assert result.reward == 0.0 and result.failure == "parse_error" and reason in result.reason
    assert score.score(RIGHT.replace("RIGHT", "right"), PUZZLE).reward == 1.5  # any ASCII case
