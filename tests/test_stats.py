"""The shared statistics against plain-Python transcriptions of their formulas (no NumPy or
SciPy in the references) and counts made by hand; the detectable difference by simulating the
test it promises (NumPy draws)."""

import math
import random

import numpy as np
import pytest

from mapfjax import stats

Z = 1.959963984540054
# Two-sided 95 % Student t critical values, df -> t(0.975, df), from a printed t table.
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 9: 2.262, 10: 2.228, 29: 2.045}


def wilson_ref(k, n, z=Z):
    p = k / n
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, center - half), min(1.0, center + half)


def t_interval_ref(xs):
    n = len(xs)
    m = sum(xs) / n
    var = sum((x - m) ** 2 for x in xs) / (n - 1)
    half = T_TABLE[n - 1] * math.sqrt(var / n)
    return m, m - half, m + half


@pytest.mark.parametrize("k,n", [(0, 20), (5, 10), (20, 20), (3, 7), (1, 1), (37, 120)])
def test_wilson_and_proportion_match_the_formula(k, n):
    lo, hi = stats.wilson(k / n, n)
    assert (lo, hi) == pytest.approx(wilson_ref(k, n), abs=1e-12)
    e = stats.proportion([True] * k + [False] * (n - k))
    assert (e.value, e.low, e.high, e.n) == pytest.approx((k / n, lo, hi, n))
    assert stats.rate_estimate({"n": n, "valid": k}, "valid") == e
    assert all(math.isnan(x) for x in stats.wilson(0.0, 0))


def test_wilson_known_values_and_edges():
    assert stats.wilson(0.5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    lo, hi = stats.wilson(0.0, 20)
    assert lo == 0.0 and hi == pytest.approx(0.1611, abs=1e-4)  # never a zero-width interval
    assert stats.wilson(1.0, 20)[1] == 1.0


def test_bounded_mean_is_wilson_of_the_scaled_mean():
    e = stats.bounded_mean([0.0, 0.25, 0.25, 0.1], upper=0.25)
    lo, hi = wilson_ref(0.6 * 4, 4)  # mean 0.15 = 0.6 of the bound, over 4 items
    assert (e.value, e.low, e.high) == pytest.approx((0.15, 0.25 * lo, 0.25 * hi))


@pytest.mark.parametrize("df", sorted(T_TABLE))
def test_t_value_matches_the_printed_table(df):
    assert stats.t_value(df) == pytest.approx(T_TABLE[df], abs=6e-4)


def test_t_value_matches_scipy_where_installed():
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 7, 30, 200):
        for level in (0.8, 0.95, 0.99):
            want = scipy_stats.t.ppf(0.5 + level / 2, df)
            assert stats.t_value(df, level) == pytest.approx(want, rel=1e-10)
    with pytest.raises(ValueError, match="df=0"):
        stats.t_value(0)
    with pytest.raises(ValueError, match="level=1"):
        stats.t_value(3, 1)


@pytest.mark.parametrize("n", [2, 3, 5, 6, 11, 30])
def test_mean_interval_over_seeds_matches_the_t_formula(n):
    rng = random.Random(n)
    xs = [rng.uniform(0.2, 0.6) for _ in range(n)]
    e = stats.mean_interval(xs)
    assert (e.value, e.low, e.high) == pytest.approx(t_interval_ref(xs), abs=2e-4)
    assert e.n == n
    one = stats.mean_interval([0.4])
    assert one.value == 0.4 and math.isnan(one.low) and math.isnan(one.high)
    assert math.isnan(stats.mean_interval([]).value)


def test_paired_difference_over_seeds_uses_the_per_seed_differences():
    a = [0.52, 0.61, 0.47, 0.58, 0.55]
    b = [0.50, 0.55, 0.46, 0.51, 0.52]  # seed i of b pairs with seed i of a
    e = stats.paired_difference(a, b)
    want = t_interval_ref([x - y for x, y in zip(a, b, strict=True)])
    assert (e.value, e.low, e.high) == pytest.approx(want, abs=1e-4)
    assert e.low > 0  # the seeds agree on the sign; two separate intervals would overlap
    sep_a, sep_b = t_interval_ref(a), t_interval_ref(b)
    assert sep_a[1] < sep_b[2]
    with pytest.raises(ValueError, match="5 and 4 values"):
        stats.paired_difference(a, b[:4])


def test_paired_proportion_difference_is_the_wald_interval_of_paired_proportions():
    rng = random.Random(0)
    a = [rng.random() < 0.6 for _ in range(80)]
    b = [x if rng.random() < 0.7 else not x for x in a]  # same puzzles, correlated
    n = len(a)
    only_a = sum(x and not y for x, y in zip(a, b, strict=True))
    only_b = sum(y and not x for x, y in zip(a, b, strict=True))
    diff = (only_a - only_b) / n
    half = Z * math.sqrt(only_a + only_b - (only_a - only_b) ** 2 / n) / n
    e = stats.paired_proportion_difference(a, b)
    assert (e.value, e.low, e.high, e.n) == pytest.approx((diff, diff - half, diff + half, n))
    same = stats.paired_proportion_difference([True, False], [True, False])
    assert (same.value, same.low, same.high) == (0.0, 0.0, 0.0)
    assert stats.paired_proportion_difference([True] * 3, [False] * 3).high == 1.0


def test_mean_difference_is_the_welch_normal_interval():
    rng = random.Random(1)
    a = [rng.randint(0, 8) / 8 for _ in range(40)]
    b = [rng.randint(0, 8) / 8 for _ in range(25)]
    mean = lambda x: sum(x) / len(x)
    var = lambda x: sum((v - mean(x)) ** 2 for v in x) / (len(x) - 1)
    diff = mean(a) - mean(b)
    half = Z * math.sqrt(var(a) / len(a) + var(b) / len(b))
    e = stats.mean_difference(a, b)
    assert (e.value, e.low, e.high, e.n) == pytest.approx((diff, diff - half, diff + half, 65))
    assert math.isnan(stats.mean_difference([], b).value)
    one = stats.mean_difference([0.5], b)
    assert one.value == pytest.approx(0.5 - mean(b)) and math.isnan(one.low)


ROWS = [
    {"agents": 2, "size": 3, "valid": True, "optimal": True, "failure": None, "tokens": 10},
    {"agents": 2, "size": 3, "valid": False, "optimal": False, "failure": "hole", "tokens": 30},
    {"agents": 2, "size": 5, "valid": False, "optimal": None, "failure": "hole"},
    {"agents": 3, "size": 3, "valid": True, "optimal": False, "failure": None, "tokens": None},
    {"agents": 2, "size": 3, "valid": False, "failure": "parse_error", "tokens": 5},
]


def test_tally_counts_flags_labels_and_sums_by_hand():
    labels = {"failures": ("failure", ("hole", "parse_error", "edge_conflict"))}
    got = stats.tally(
        ROWS, ("agents", "size"), flags=("valid", "optimal"), labels=labels, sums={"t": "tokens"}
    )
    assert list(got) == [(2, 3), (2, 5), (3, 3)]
    assert got[(2, 3)] == {
        "n": 3,
        "valid": 1,
        "optimal": 1,
        "failures": {"hole": 1, "parse_error": 1, "edge_conflict": 0},
        "t": 45,
        "t_n": 3,
    }
    assert got[(2, 5)]["t_n"] == 0 and got[(3, 3)]["t_n"] == 0
    by_size = stats.tally(ROWS, lambda r: r["size"], flags=("valid",))
    assert by_size == {3: {"n": 4, "valid": 2}, 5: {"n": 1, "valid": 0}}
    with pytest.raises(ValueError, match="row 1: failure = 'hole'; allowed"):
        stats.tally(ROWS, "size", labels={"f": ("failure", ("parse_error",))})
    with pytest.raises(ValueError, match="row 0: missing field 'cell'"):
        stats.tally(ROWS, "cell")


def test_rates_means_and_merges_of_counts():
    cells = stats.tally(ROWS, "size", flags=("valid", "optimal"))
    assert stats.rate(cells[3], "valid") == 0.5 and stats.rate(cells[5], "valid") == 0.0
    assert math.isnan(stats.rate({"n": 0, "valid": 0}, "valid"))
    # Unweighted over cells (0.5 and 0.0), empty cells left out.
    assert stats.mean_rate([*cells.values(), {"n": 0}], "valid") == 0.25
    assert math.isnan(stats.mean_rate([], "valid"))
    assert stats.cell_mean([1.0, math.nan, 3.0]) == 2.0
    total = stats.merge([{"n": 2, "f": {"a": 1}}, {"n": 3, "v": 1, "f": {"a": 2, "b": 1}}])
    assert total == {"n": 5, "f": {"a": 3, "b": 1}, "v": 1}
    assert (
        stats.merge(cells.values()) == stats.tally(ROWS, lambda r: 0, flags=("valid", "optimal"))[0]
    )


def test_markdown_table_and_percent():
    table = stats.markdown_table(["size", "valid %"], [["3x3", stats.percent(0.375)], [5, "-"]])
    assert table == "| size | valid % |\n|---|---|\n| 3x3 | 37.5 |\n| 5 | - |"
    assert stats.markdown_table(["a", "b", "c"], [["mean", "", 0]]).endswith("| mean | | 0 |")
    assert stats.percent(math.nan) == "-" == stats.percent(None)
    assert stats.percent(1 / 3, 0) == "33"
    with pytest.raises(ValueError, match="table row 0: 1 cells for 2 columns"):
        stats.markdown_table(["a", "b"], [["x"]])


def test_interval_text_formats_shares_and_changes():
    e = stats.proportion([True, True, False, False])
    lo, hi = stats.wilson(0.5, 4)
    assert stats.interval_text(e) == f"50.0 [{100 * lo:.0f}, {100 * hi:.0f}]" == "50.0 [15, 85]"
    d = stats.Estimate(0.142, 0.04, 0.24, 120)
    assert stats.interval_text(d, signed=True) == "+14.2 [4, 24]"
    assert stats.interval_text(stats.Estimate(-0.05, -0.13, 0.03, 120), signed=True) == (
        "-5.0 [-13, 3]"
    )
    assert stats.interval_text(stats.Estimate(0.0, 0.0, 0.0, 0)) == "-"  # empty


def test_detectable_difference_has_its_power_in_simulation():
    """The printed-table value, and a simulated paired t test at that true difference rejects
    0 in about 80 % of draws (NumPy, an independent check of the formula)."""
    assert stats.detectable_difference(1.0, 5) == pytest.approx((2.776 + 0.941) / 5**0.5, abs=1e-3)
    for n, sd in ((5, 0.03), (10, 2.0)):
        mdd = stats.detectable_difference(sd, n)
        rng = np.random.default_rng(n)
        d = rng.normal(mdd, sd, size=(40000, n))
        t = d.mean(1) / (d.std(1, ddof=1) / np.sqrt(n))
        power = float((np.abs(t) > stats.t_value(n - 1)).mean())
        assert power == pytest.approx(0.8, abs=0.01)
    assert np.isnan(stats.detectable_difference(1.0, 1))
    with pytest.raises(ValueError, match="power=1"):
        stats.detectable_difference(1.0, 5, power=1)
