"""The registry: built-in names, custom functions by path, clear errors."""

import textwrap
from pathlib import Path

import pytest
from rewards_doubles import Args, Sample

from genrm_rewards import (
    RewardConfigError,
    available,
    get_batch_reward_fn,
    get_reward_fn,
    load_custom,
    register,
    resolve_reward_fn,
)
from genrm_rewards.dapo_genrm import compute_score, compute_score_batch


def test_builtins_registered() -> None:
    assert {"dapo-genrm", "dummy", "math", "dual-genrm", "agentic-genrm"} <= set(available())
    assert get_reward_fn("dapo-genrm") is compute_score
    assert get_batch_reward_fn("dapo-genrm") is compute_score_batch


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(RewardConfigError, match=r"rm_type='dapo_genrm'.*dapo-genrm"):
        get_reward_fn("dapo_genrm")


async def test_dummy_is_deferred_zero() -> None:
    result = await get_reward_fn("dummy")(Args(), Sample(response="anything"))
    assert (result["score"], result["status"]) == (0.0, "deferred")


async def test_generic_batch_variant_keeps_order() -> None:
    batch = get_batch_reward_fn("math")
    samples = [Sample(response=f"Answer: {a}", label="4") for a in ("4", "5", "2+2")]
    results = await batch(Args(), samples)
    assert [r["score"] for r in results] == [1.0, 0.0, 1.0]


@pytest.fixture
def custom_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "my_rewards_pkg").mkdir()
    (tmp_path / "my_rewards_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_rewards_pkg" / "fns.py").write_text(
        textwrap.dedent(
            """
            import functools
            async def good(args, sample):
                return {"score": 0.5, "status": "ok"}
            def sync_fn(args, sample):
                return {"score": 1.0}
            class Scorer:
                async def __call__(self, args, sample):
                    return {"score": 0.25, "status": "ok"}
            scorer = Scorer()
            NOT_CALLABLE = 3
            async def one_arg(sample):
                return {"score": 1.0}
            """
        )
    )
    (tmp_path / "broken_rewards_mod.py").write_text("import a_module_that_does_not_exist\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards_pkg.fns"


async def test_load_custom_async_function(custom_module: str) -> None:
    fn = load_custom(f"{custom_module}.good")
    assert (await fn(Args(), Sample(response="")))["score"] == 0.5
    fn = load_custom(f"{custom_module}:scorer")
    assert (await fn(Args(), Sample(response="")))["score"] == 0.25


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_dots", r"must be 'module.func'"),
        ("no_such_module_xyz.fn", r"module 'no_such_module_xyz' not found"),
        ("broken_rewards_mod.fn", r"found but failed to import.*a_module_that_does_not_exist"),
        ("my_rewards_pkg.fns.missing", r"has no attribute 'missing'.*good"),
        ("my_rewards_pkg.fns.sync_fn", r"synchronous callable.*async def"),
        ("my_rewards_pkg.fns.NOT_CALLABLE", r"not callable"),
        ("my_rewards_pkg.fns.one_arg", r"one_arg\(sample\) cannot be called with two arguments"),
    ],
)
def test_load_custom_errors(custom_module: str, path: str, message: str) -> None:
    with pytest.raises(RewardConfigError, match=message):
        load_custom(path)


def test_load_custom_names_the_setting_it_came_from(custom_module: str) -> None:
    """A post-process hook's error names its own flag, not --custom-rm-path."""
    with pytest.raises(RewardConfigError, match=r"^--custom-reward-post-process-path='x\.nope'"):
        load_custom("x.nope", setting="--custom-reward-post-process-path")


def test_resolve_prefers_custom_path(custom_module: str) -> None:
    assert resolve_reward_fn(Args(rm_type="math")) is get_reward_fn("math")
    assert resolve_reward_fn(Args(rm_type="math", custom_rm_path=f"{custom_module}.good")) is (
        load_custom(f"{custom_module}.good")
    )
    assert resolve_reward_fn(Args()) is compute_score


def test_register_rejects_sync_and_duplicates() -> None:
    def sync_fn(args: object, sample: object) -> dict[str, float]:
        return {}

    with pytest.raises(RewardConfigError, match="not an async callable"):
        register("sync-one", sync_fn)  # type: ignore[arg-type]
    with pytest.raises(RewardConfigError, match="already registered"):
        register("dapo-genrm", compute_score)


async def test_score_deferred_uses_the_configured_reward() -> None:
    from genrm_rewards.defer import score_deferred

    samples = [Sample(response="Answer: 4", label="4"), Sample(response="Answer: 5", label="4")]
    results = await score_deferred(Args(deferred_rm_type="math"), samples)
    assert [(r["score"], r["status"]) for r in results] == [(1.0, "ok"), (0.0, "ok")]
    with pytest.raises(ValueError, match="defer forever"):
        await score_deferred(Args(deferred_rm_type="dummy"), samples)
