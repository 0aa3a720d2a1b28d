"""Numbers as the presenters print them."""

from __future__ import annotations

from gpufeed.present.numbers import count, cpu_counts, figure


def test_cores_of_a_run_name_each_host_only_where_the_hosts_differ():
    one = {"hosts": ["a"], "cpu_count": 16}
    assert cpu_counts(one) == "16"
    same = {"hosts": ["a", "b"], "cpu_count": 16, "host_cpu_counts": {"a": 16, "b": 16}}
    assert cpu_counts(same) == "16"
    mixed = {
        "hosts": ["a", "b", "c"],
        "cpu_count": 16,
        "host_cpu_counts": {"c": 8, "a": 16, "b": 16},
    }
    assert cpu_counts(mixed) == "16 + 16 + 8"
    assert cpu_counts({"hosts": ["a"]}) == "?"


def test_a_count_is_singular_for_one_and_plural_otherwise():
    assert count(1, "step") == "1 step"
    assert [count(n, "outlier step") for n in (0, 2)] == ["0 outlier steps", "2 outlier steps"]
    assert count(12345, "image") == "12,345 images"
    assert [count(n, "class") for n in (1, 2)] == ["1 class", "2 classes"]


def test_a_figure_keeps_about_three_significant_digits_so_slow_rates_are_not_zero():
    assert [figure(x) for x in (0.45, 1.26, 11.34, 123.4, 12345.6)] == [
        "0.45", "1.26", "11.3", "123", "12,346",
    ]  # fmt: skip
    assert (
        figure(0.45, " steps/s") == "0.45 steps/s" and figure(float("nan"), missing="n/a") == "n/a"
    )
    assert [count(n, "pass") for n in (1, 4)] == ["1 pass", "4 passes"]
