"""`gpufeed show` judges a run with the same thresholds as `gpufeed report`: ./gpufeed.toml,
--config and --set."""

from __future__ import annotations

from typer.testing import CliRunner

from gpufeed.cli import app

runner = CliRunner(env={"COLUMNS": "200"})  # findings on one line each
STEPS = {0: [(i, 1010.0 + i, 1011.0 + i, 0.8, 8.0, None) for i in range(40)]}  # 80% data wait
FOUND = "Input pipeline: steps wait 80% of the time"
OFF = "[rules.DataLoaderBottleneck]\nenabled = false\n"


def test_show_applies_gpufeed_toml_in_the_working_directory(make_run, tmp_path, monkeypatch):
    run_dir = make_run(ranks=STEPS)
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["show", str(run_dir)])
    assert res.exit_code == 0 and FOUND in res.stdout, res.output
    (tmp_path / "gpufeed.toml").write_text(OFF)
    res = runner.invoke(app, ["show", str(run_dir)])
    assert res.exit_code == 0 and FOUND not in res.stdout and "no bottleneck found" in res.stdout


def test_show_takes_config_and_set_like_report(make_run, tmp_path):
    run_dir = make_run(ranks=STEPS)
    config = tmp_path / "strict.toml"
    config.write_text(OFF)
    assert FOUND in runner.invoke(app, ["show", str(run_dir)]).stdout
    res = runner.invoke(app, ["show", str(run_dir), "--config", str(config)])
    assert res.exit_code == 0 and FOUND not in res.stdout, res.output
    res = runner.invoke(app, ["show", str(run_dir), "--set", "DataLoaderBottleneck.enabled=false"])
    assert res.exit_code == 0 and FOUND not in res.stdout, res.output
    res = runner.invoke(app, ["show", str(run_dir), "--set", "DataLoaderBottleneck.treshold=1"])
    assert res.exit_code == 2 and "unknown parameter DataLoaderBottleneck.treshold" in res.stderr
