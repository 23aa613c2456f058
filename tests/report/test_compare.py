"""--compare: ratios with confidence intervals, the base a user can run, pooled rounds."""

import numpy as np
import pytest

from lmscope.records.stats import ratio_interval, ratio_interval_rounds
from lmscope.report.compare import find_base
from lmscope.report.tables import build_table

KEYS = ["size", "impl", "steps"]


def step_row(impl, times, *, status="ok", size="tiny", **extra):
    row = {"workload": "bench", "size": size, "impl": impl, "steps": 10, "status": status}
    if status == "ok":
        row |= {"median_ms": float(np.median(times)), "times_ms": list(times)}
    return row | extra


def test_a_ratio_carries_the_interval_of_its_per_step_times():
    order = [(3 * i) % 10 for i in range(10)]  # no trend: a trend widens the interval
    base = [20.0 + 0.1 * i for i in order]  # median 20.45
    other = [10.0 + 0.05 * i for i in order]  # median 10.225: exactly half
    header, rows = build_table([step_row("a", base), step_row("b", other)], KEYS, compare="impl")
    assert header == ["median_ms impl=a", "median_ms impl=b", "ratio a/b"]
    text = rows[0][2]
    assert text == ratio_interval(base, other).as_text()
    assert text.startswith("2.00x [")
    low, high = (float(v) for v in text[text.index("[") + 1 : -1].split(","))
    assert 1.9 < low < 2.0 < high < 2.1


def test_constant_times_give_a_point_interval():
    _, rows = build_table([step_row("a", [6.0] * 5), step_row("b", [2.0] * 7)], KEYS, compare="impl")
    assert rows[0][2] == "3.00x [3.00, 3.00]"


def test_a_difference_inside_the_noise_is_marked():
    rng = np.random.default_rng(7)
    a, b = rng.normal(10.0, 1.0, 25), rng.normal(10.05, 1.0, 25)
    _, rows = build_table([step_row("a", a), step_row("b", b)], KEYS, compare="impl")
    assert rows[0][2].startswith("~") and ratio_interval(a, b).within_noise


def test_a_timing_without_per_step_times_says_it_has_no_interval():
    rows = [{**step_row("a", [4.0]), "times_ms": None}, {**step_row("b", [2.0]), "times_ms": None}]
    _, table = build_table(rows, KEYS, compare="impl")
    assert table[0][2] == "2.00x (no interval)"


def test_a_ratio_of_memory_is_a_plain_number():
    rows = [{"workload": "memory", "size": "tiny", "checkpoint": c, "status": "ok", "step_peak_gib": g}
            for c, g in (("none", 3.0), ("block", 1.5))]
    _, table = build_table(rows, ["size", "checkpoint"], compare="checkpoint")
    assert table[0][-1] == 2.0


def test_too_few_steps_give_the_ratio_and_say_why_there_is_no_interval():
    rows = [step_row("a", [8.0] * 5), step_row("b", [4.0] * 4)]
    _, table = build_table(rows, KEYS, compare="impl")
    assert table[0][-1] == "2.00x (no interval: 4 times on one side, need 5)"


def test_the_base_is_the_first_value_with_an_ok_row():
    rows = [step_row("flash-triton", [], status="error"), step_row("naive", [8.0] * 5),
            step_row("sdpa", [4.0] * 5)]
    header, table = build_table(rows, KEYS, compare="impl")
    assert header[-2:] == ["ratio naive/flash-triton", "ratio naive/sdpa"]
    assert table[0][-2:] == [None, "2.00x [2.00, 2.00]"]


def test_compare_base_chooses_the_base():
    rows = [step_row("naive", [8.0] * 5), step_row("sdpa", [4.0] * 5)]
    header, table = build_table(rows, KEYS, compare="impl", compare_base="sdpa")
    assert header[-1] == "ratio sdpa/naive" and table[0][-1] == "0.50x [0.50, 0.50]"
    with pytest.raises(ValueError, match="not a value of impl: choose one of naive, sdpa"):
        build_table(rows, KEYS, compare="impl", compare_base="flash")


def test_compare_base_reads_on_and_off_as_booleans():
    assert find_base([False, True], "on", "fast") is True
    assert find_base([False, True], "off", "fast") is False
    assert find_base([128, 256], "256", "context_length") == 256


def test_rounds_are_pooled_for_the_median_and_the_interval():
    a_rounds = [[10.0, 10.2], [10.4, 10.6], [10.8, 11.0]]
    b_rounds = [[5.0, 5.1], [5.2, 5.3], [5.4, 5.5]]
    rows = []
    for r in range(3):  # interleaved, as the runner writes them
        speed = 1000.0 / np.median(a_rounds[r])
        rows.append(step_row("a", a_rounds[r], round=r, rounds=3, tokens_per_s=speed))
        rows.append(step_row("b", b_rounds[r], round=r, rounds=3))
    a_all, b_all = sum(a_rounds, []), sum(b_rounds, [])
    header, table = build_table(rows, KEYS, compare="impl")
    expected = ratio_interval_rounds(a_rounds, b_rounds).as_text()  # rounds resampled, not steps
    assert expected != ratio_interval(a_all, b_all).as_text()
    assert table == [[float(np.median(a_all)), float(np.median(b_all)), expected]]
    _, plain = build_table(rows, KEYS)
    assert len(plain) == 2
    pooled = dict(zip(_header(rows), plain[0], strict=True))
    assert pooled["median_ms"] == pytest.approx(10.5)
    assert pooled["tokens_per_s"] == pytest.approx(1000.0 / 10.5)


def test_a_later_single_run_of_a_point_replaces_its_rounds():
    rows = [step_row("a", [10.0], round=0, rounds=2), step_row("a", [12.0], round=1, rounds=2),
            step_row("b", [5.0]), step_row("a", [30.0])]
    header, table = build_table(rows, KEYS, compare="impl")
    cells = dict(zip(header, table[0], strict=True))
    assert cells["median_ms impl=a"] == 30.0 and cells["median_ms impl=b"] == 5.0


def test_rounds_of_other_code_are_not_pooled_with_a_rerun():
    old = [step_row("a", [10.0 + r], round=r, rounds=3, source_hash="old") for r in range(3)]
    rerun = [step_row("a", [20.0], round=0, rounds=3, source_hash="new")]  # stopped after round 0
    resumed = [step_row("a", [22.0], round=1, rounds=3, source_hash="new")]  # the same code goes on
    rows = [*old, *rerun, step_row("b", [5.0], source_hash="new")]
    for found, median in ((rows, 20.0), ([*rows, *resumed], 21.0)):
        header, table = build_table(found, KEYS, compare="impl")
        assert dict(zip(header, table[0], strict=True))["median_ms impl=a"] == median


def test_a_failed_round_is_left_out_of_the_pool():
    rows = [step_row("a", [10.0, 10.0], round=0, rounds=3),
            step_row("a", [], status="error", round=1, rounds=3),
            step_row("a", [14.0, 14.0], round=2, rounds=3), step_row("b", [6.0, 6.0])]
    _, table = build_table(rows, KEYS, compare="impl")
    assert table[0][0] == 12.0


def _header(rows):
    header, _ = build_table(rows, KEYS)
    return header


def test_a_pooled_row_keeps_its_rounds_apart_for_the_interval_and_its_precision():
    from lmscope.records.stats import median_interval_rounds
    from lmscope.report.rounds import pool_rounds, ratio_between

    rng = np.random.default_rng()
    rounds = [list(rng.lognormal(np.log(10.0) + rng.normal(0, 0.05), 0.02, 6)) for _ in range(4)]
    rows = [step_row("a", times, round=r, rounds=4, median_ci_rel=0.001) for r, times in enumerate(rounds)]
    (pooled,) = pool_rounds(rows, KEYS)
    assert pooled["times_ms_by_round"] == rounds and pooled["times_ms"] == sum(rounds, [])
    assert pooled["median_ci_rel"] == median_interval_rounds(rounds).relative_half_width > 0.001
    plain = step_row("b", list(rng.lognormal(np.log(5.0), 0.02, 24)))
    # a row of one process against pooled rounds: one round on that side, too few for an interval
    assert ratio_between(pooled, plain).as_text().endswith("(no interval: 1 round on one side, need 3)")
    assert ratio_between(pooled, {**plain, "times_ms": None}) is None


def test_a_point_with_one_ok_round_of_one_step_pools_to_a_zero_spread():
    from lmscope.report.rounds import pool_rounds

    one_step = {"std_ms": 0.0, "step_ms": 7.0, "step_median_ms": 7.0, "step_std_ms": 0.0}
    rows = [step_row("a", [7.0], round=0, rounds=2, **one_step),
            step_row("a", [], status="error", round=1, rounds=2)]
    (pooled,) = pool_rounds(rows, KEYS)
    assert pooled["rounds"] == 1 and pooled["times_ms"] == [7.0]
    assert pooled["std_ms"] == pooled["step_std_ms"] == 0.0


def test_a_pooled_row_reports_its_longest_compile():
    """The first process on a machine compiles cold; a later round may load the compiled code from
    torch.compile's caches on disk in a fraction of the time. The pooled row keeps the cold one."""
    from lmscope.report.rounds import pool_rounds

    seconds = list(np.random.default_rng().uniform(1.0, 5.0, 3))
    seconds[1] += 100.0
    rows = [step_row("a", [7.0, 7.1], round=r, rounds=3, compile_s=s) for r, s in enumerate(seconds)]
    (pooled,) = pool_rounds(rows, KEYS)
    assert pooled["compile_s"] == seconds[1]
