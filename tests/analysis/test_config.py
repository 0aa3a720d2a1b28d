"""Threshold overrides from gpufeed.toml and --set: merged, validated, errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufeed.analysis.config import ConfigError, load_file, parse_sets, resolve


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpufeed.toml"
    path.write_text(text)
    return path


def test_toml_tables_and_set_are_merged_with_set_winning(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        "[rules.DataLoaderBottleneck]\nthreshold = 0.3\ncritical = 0.6\n"
        "[rules.warmup]\nsteps = 10\n[profile]\nunrelated = 1\n",
    )
    got = resolve(cfg, ["DataLoaderBottleneck.threshold=0.25", "StepOutlier.enabled=false"])
    assert got == {
        "DataLoaderBottleneck": {"threshold": 0.25, "critical": 0.6},
        "warmup": {"steps": 10},
        "StepOutlier": {"enabled": False},
    }


def test_gpufeed_toml_in_the_working_directory_is_picked_up(tmp_path: Path, monkeypatch) -> None:
    write(tmp_path, "[rules.PeriodicStall]\nmin_periods = 4\n")
    monkeypatch.chdir(tmp_path)
    assert resolve() == {"PeriodicStall": {"min_periods": 4}}


def test_no_config_no_sets_is_empty(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve() == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[rules.DataLoaderBottleneckk]\nthreshold = 0.3\n",
            r"gpufeed.toml: unknown rule 'DataLoaderBottleneckk'",
        ),
        (
            "[rules.DataLoaderBottleneck]\nthreshhold = 0.3\n",
            r"unknown parameter DataLoaderBottleneck.threshhold",
        ),
        (
            "[rules.DataLoaderBottleneck]\nthreshold = 'high'\n",
            r"DataLoaderBottleneck.threshold: expected a number",
        ),
        (
            "[rules]\nDataLoaderBottleneck = 0.3\n",
            r"rules.DataLoaderBottleneck = 0.3 is not a table",
        ),
        ("[rules.DataLoaderBottleneck\n", r"gpufeed.toml: invalid TOML"),
        (
            "[rulez.DataLoaderBottleneck]\nthreshold = 0.3\n",
            r"gpufeed.toml: \[rulez\] is not read; thresholds go in \[rules.RULE\] tables",
        ),
        ("[Rules.warmup]\nsteps = 3\n", r"\[Rules\] is not read"),
        ("[rule.warmup]\nsteps = 3\n", r"\[rule\] is not read"),
    ],
)
def test_bad_files_name_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_file(write(tmp_path, text))


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read config file .*nope.toml"):
        load_file(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("threshold=0.3", "expected RULE.param=value"),
        ("DataLoaderBottleneck.threshold", "expected RULE.param=value"),
        ("DataLoaderBottleneck.threshold=", "expected RULE.param=value"),
        ("Nope.x=1", "--set: unknown rule 'Nope'"),
        ("StepOutlier.k=-1", "StepOutlier.k: expected a number >= 0"),
    ],
)
def test_bad_set_options_are_named(item: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_sets([item])


def test_a_file_that_is_not_utf8_is_named_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "b6.toml"
    path.write_bytes(b"\xff\xfe[rules.StepOutlier]\n")
    with pytest.raises(ConfigError, match=r"config file .*b6.toml is not UTF-8 text \(byte 0xff"):
        load_file(path)


def test_a_bad_override_in_python_is_a_config_error_naming_it(make_run):
    import gpufeed

    run = make_run()
    with pytest.raises(ConfigError, match=r"DataLoaderBottleneck.threshold: expected a number"):
        gpufeed.analyze(run, DataLoaderBottleneck={"threshold": "x"})
    with pytest.raises(ConfigError, match=r"unknown rule 'Nope'"):
        gpufeed.analyze(run, Nope={"k": 1})


def test_a_period_seen_fewer_than_twice_is_refused():
    # min_periods=0 divided by zero inside the rule
    with pytest.raises(ConfigError, match=r"PeriodicStall.min_periods: expected a number >= 2"):
        resolve(None, ["PeriodicStall.min_periods=0"])
