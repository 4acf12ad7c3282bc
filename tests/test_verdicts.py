"""The verdicts' error rates, by simulation through the project's own statistics and
adaptive rounds (tests/benchmarks/verdicts.py, at fewer studies than its 10,000; its
table is in docs/measurement.md): identical settings are rarely called different, the
intervals hold the truth, the headline crowns none of K equal candidates, and a true
difference is found as often as the method states."""

from __future__ import annotations

import pytest

from tests.benchmarks import verdicts


@pytest.mark.parametrize("spread", [0.02, 0.05, 0.09])
def test_identical_settings_are_rarely_called_different_after_the_rounds(spread):
    r = verdicts.run(verdicts.equal(f"A/A {spread}", 10, spread), 60)
    assert r["faster"] + r["slower"] <= 0.025, r
    assert r["coverage"] >= 0.94, r
    # the rounds went on where undecided: more than the minimum's two trials on average
    assert 2 < r["trials"] <= 4


def test_a_kin_of_mixed_noise_does_not_narrow_its_noisy_pairs():
    """Six of 39 experiments of one kin at 9 %, the rest at 3 %: the comparisons among
    the noisy ones (the baseline among them) keep their error rates, each way at most
    2.5 % (about 1 % each way here: at 2,000 scored comparisons a rate's standard error
    is about 0.25 points, so the bound is not met by the luck of a seed)."""
    r = verdicts.run(verdicts.mixed("mixed"), 400)
    assert max(r["faster"], r["slower"]) <= 0.025, r
    assert r["coverage"] >= 0.94, r


def test_a_heavier_tail_than_the_log_normal_keeps_the_error_rates():
    """One trial in ten slowed by 15 % (a neighbour), beyond the 5 % spread between
    trials: identical settings are still rarely called different."""
    r = verdicts.run(verdicts.slowed("slowed", 10, 0.05, 0.1, 0.15), 60)
    assert r["faster"] + r["slower"] <= 0.025, r
    assert r["coverage"] >= 0.94, r


@pytest.mark.parametrize("k", [10, 26, 40])
def test_the_headline_crowns_none_of_k_equal_candidates(k):
    r = verdicts.run(verdicts.equal(f"K={k}", k, 0.09), 40)
    assert r["crowned"] <= 0.025, r


def test_a_true_ten_percent_difference_is_found_and_never_reversed():
    """The power the docs state (about a third at a 5 % spread and 4 trials: the margin
    of 3 % and the looks cost it) and no reversed verdict."""
    r = verdicts.run(verdicts.one_faster("10 %", 10, 0.05, 1.10), 150)
    assert 0.15 <= r["faster"] <= 0.6 and r["slower"] == 0, r
    assert r["coverage"] >= 0.94, r
