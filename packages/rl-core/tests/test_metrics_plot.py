"""Metrics JSONL + TensorBoard, and the PNG curves ``rl-core plot`` writes from them."""

from rl_core.metrics import MetricsWriter, PhaseClock, read_metrics
from rl_core.plot import plot_run


def test_metrics_then_plot(tmp_path):
    w = MetricsWriter(tmp_path)
    for step in range(3):
        w.log(
            step,
            {
                "rollout/reward_mean": 0.1 * step,
                "rollout/reward_std": 0.05,
                "rollout/response_len_mean": 4 + step,
                "eval/accuracy": None,
                "note": "x",
            },
        )
    w.log(3, {"eval/accuracy": 0.5, "eval/reward_mean": 0.4})
    w.close()
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert records[2]["rollout/reward_mean"] == 0.2
    assert any((tmp_path / "tb").iterdir())
    paths = plot_run(tmp_path)
    assert {p.name for p in paths} == {"reward.png", "accuracy.png", "length.png"}
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_phase_clock_records_times():
    clock = PhaseClock(show=False)
    with clock.phase("rollout", total=2) as advance:
        advance()
    with clock.phase("rollout"):
        pass
    times = clock.reset()
    assert set(times) == {"rollout"} and times["rollout"] >= 0
    assert clock.times == {}


def test_plot_of_a_folder_that_is_no_run_is_one_line_and_exit_2(tmp_path, capsys):
    from rl_core.cli import main

    assert main(["plot", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing/metrics.jsonl: no metrics" in err
    (tmp_path / "metrics.jsonl").write_text("not json\n")
    assert main(["plot", str(tmp_path)]) == 2
    assert "metrics.jsonl: not a metrics file" in capsys.readouterr().err


def test_tables_in_a_log_file_are_not_cut_at_80_columns(monkeypatch):
    import io

    from rich.table import Table

    from rl_core.terminal import LOG_WIDTH, make_console

    monkeypatch.delenv("COLUMNS", raising=False)
    console = make_console()  # pytest's stdout is not a terminal, as a log file is not
    assert console.width == LOG_WIDTH
    console.file = io.StringIO()
    table = Table("phase", "who", "note")
    table.add_row("inference", "genrm:__default__", "offloaded: bundles 0..7 " * 5)
    console.print(table)
    assert "offloaded: bundles 0..7 " * 5 in console.file.getvalue()
    monkeypatch.setenv("COLUMNS", "100")
    assert make_console().width == 100  # the user's choice wins
