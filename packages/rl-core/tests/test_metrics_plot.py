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
