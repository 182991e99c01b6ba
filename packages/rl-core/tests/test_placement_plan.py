"""The pure placement plan: every layout of the original document, and the ones it must refuse."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rl_core.cli import main
from rl_core.placement import (
    PlacementError,
    PlacementPlan,
    add_placement_args,
    plan_from_args,
    render_plan,
)

SPLIT_8 = [
    "--genrm-model-path", "/m/judge", "--genrm-num-gpus-per-engine", "4",
    "--resource", '{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 4]}',
    "--colocate", "--rm-type", "dapo-genrm",
]  # fmt: skip
SHARED_8 = [
    "--genrm-model-path", "/m/judge", "--genrm-num-gpus-per-engine", "8",
    "--genrm-engine-config", '{"max_context_len": 10240, "mem_fraction_static": 0.3}',
    "--rollout-num-gpus-per-engine", "1", "--sglang-mem-fraction-static", "0.6",
    "--resource", '{"actor": [1, 8], "rollout": [1, 8], "genrm": [1, 8]}',
    "--colocate", "--rm-type", "dapo-genrm",
]  # fmt: skip
DEFER_16 = [
    "--genrm-model-path", "/m/judge-397b", "--genrm-num-gpus-per-engine", "16",
    "--rollout-num-gpus-per-engine", "8",
    "--resource", '{"actor": [2, 8], "rollout": [2, 8], "genrm": [2, 8]}',
    "--colocate", "--rm-type", "dummy", "--defer-reward-to-post-process",
    "--custom-reward-post-process-path", "examples.post_process_genrm_swap.post_process",
]  # fmt: skip
SPLIT_16 = [
    "--genrm-model-path", "/m/judge-397b", "--genrm-num-gpus-per-engine", "8",
    "--rollout-num-gpus-per-engine", "4",
    "--resource", '{"actor": [2, 8], "rollout": [1, 8], "genrm": [1, 8]}',
    "--colocate", "--rm-type", "dapo-genrm",
]  # fmt: skip
ASYNC_8 = [
    "--genrm-model-path", "/m/judge", "--genrm-num-gpus-per-engine", "1",
    "--resource",
    '{"actor": [1, 2], "rollout": [1, 3], "reference": [1, 1], "actor_fwd": [1, 1], '
    '"advantages": [1, 0], "genrm": [1, 1]}',
    "--fully-async", "--rm-type", "dapo-genrm",
]  # fmt: skip
DUAL_8 = [
    "--genrm-instances",
    '{"quality": {"model_path": "/q", "num_gpus": 2, "num_gpus_per_engine": 2,'
    ' "sampling_config": {"temperature": 0.1, "max_response_len": 64}},'
    ' "safety": {"model_path": "/s", "num_gpus": 2, "num_gpus_per_engine": 2}}',
    "--rollout-num-gpus", "4",
    "--resource", '{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 4]}',
    "--colocate", "--custom-rm-path", "examples.reward_dual.reward_func", "--reward-key", "score",
]  # fmt: skip


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_placement_args(parser)
    args, _unknown = parser.parse_known_args(argv)
    return args


def plan(argv: list[str]) -> PlacementPlan:
    return plan_from_args(parse(argv))


def replace(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def drop(argv: list[str], flag: str) -> list[str]:
    i = argv.index(flag)
    return argv[:i] + argv[i + 2 :]


def phase(p: PlacementPlan, name: str) -> dict[str, tuple[str, tuple[int, ...], float | None]]:
    (ph,) = [x for x in p.phases if x.name == name]
    return {a.who: (a.state, a.bundles, a.mem_fraction_static) for a in ph.activities}


def engines(p: PlacementPlan, role: str, instance: str | None = None) -> list[tuple[int, ...]]:
    return [e.bundles for e in p.engines_of(role, instance)]


R8 = tuple(range(8))
R16 = tuple(range(16))


def test_split_8_gpus_rollout_first_then_judge() -> None:
    p = plan(SPLIT_8)
    assert p.mode == "colocate-split"
    assert [g.name for g in p.groups] == ["colocate"] and p.groups[0].num_bundles == 8
    assert p.roles["actor"].bundles == R8
    assert engines(p, "rollout") == [(0,), (1,), (2,), (3,)]
    assert engines(p, "genrm", "__default__") == [(4, 5, 6, 7)]
    inference = phase(p, "inference")
    assert inference["rollout"][:2] == ("active", (0, 1, 2, 3))
    assert inference["genrm:__default__"][:2] == ("active", (4, 5, 6, 7))
    assert inference["actor"][0] == "asleep"
    train = phase(p, "train")
    assert train["actor"][:2] == ("active", R8)
    assert train["rollout"][0] == train["genrm:__default__"][0] == "asleep"
    assert p.judging == "inline" and not p.phases_overlap and p.warnings == ()
    # roles meeting on one bundle fit in it
    assert p.roles["actor"].gpu_fraction + p.roles["rollout"].gpu_fraction <= 1.0


def test_shared_8_gpus_same_bundles_with_memory_split() -> None:
    p = plan(SHARED_8)
    assert p.mode == "colocate-shared"
    assert engines(p, "rollout") == [(i,) for i in range(8)]
    assert engines(p, "genrm", "__default__") == [R8]
    inference = phase(p, "inference")
    assert inference["rollout"] == ("active", R8, 0.6)
    assert inference["genrm:__default__"] == ("active", R8, 0.3)
    assert p.warnings == ()
    fractions = {e.role: e.gpu_fraction for e in p.engines}
    assert p.roles["actor"].gpu_fraction + fractions["rollout"] + fractions["genrm"] <= 1.0


def test_defer_swap_16_gpus_takes_turns() -> None:
    p = plan(DEFER_16)
    assert p.mode == "colocate-defer-swap"
    assert p.num_gpus == 16 and p.groups[0].num_bundles == 16
    assert engines(p, "rollout") == [tuple(range(8)), tuple(range(8, 16))]
    (judge,) = p.engines_of("genrm", "__default__")
    assert judge.bundles == R16 and judge.may_span_nodes
    assert [ph.name for ph in p.phases] == ["inference", "reward", "train"]
    assert phase(p, "inference")["rollout"] == ("active", R16, 0.85)
    assert phase(p, "inference")["genrm:__default__"][0] == "asleep"
    assert phase(p, "reward")["rollout"][0] == "asleep"
    assert phase(p, "reward")["genrm:__default__"] == ("active", R16, 0.85)
    train = phase(p, "train")
    assert train["actor"][:2] == ("active", R16)
    assert train["rollout"][0] == train["genrm:__default__"][0] == "asleep"
    assert p.judging == "deferred"
    assert p.post_process == "examples.post_process_genrm_swap.post_process"


def test_defer_swap_with_builtin_hook_and_own_fractions() -> None:
    argv = [a for a in DEFER_16 if a != "examples.post_process_genrm_swap.post_process"]
    argv.remove("--custom-reward-post-process-path")
    argv += ["--builtin-reward-post-process", "--sglang-mem-fraction-static", "0.8"]
    p = plan(argv)
    assert p.mode == "colocate-defer-swap" and p.post_process == "builtin"
    assert phase(p, "inference")["rollout"][2] == 0.8  # the user's value wins over ≈0.85


def test_split_16_gpus_with_an_8_gpu_judge_engine_on_the_second_node() -> None:
    p = plan(SPLIT_16)
    assert p.mode == "colocate-split"
    assert engines(p, "rollout") == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert engines(p, "genrm", "__default__") == [tuple(range(8, 16))]
    assert {p.node_of(b) for b in engines(p, "genrm", "__default__")[0]} == {1}
    assert p.roles["actor"].bundles == R16


def test_engines_that_sleep_are_those_the_phases_put_to_sleep() -> None:
    """Colocated engines sleep (the actor takes their GPUs back), so they reserve host buffers
    at start; fully-async engines keep their GPUs and must not hold a host copy."""
    for layout in (SHARED_8, ASYNC_8):
        p = plan(layout)
        colocated = p.mode.startswith("colocate")
        assert p.sleeps("rollout") is colocated, p.mode
        assert p.sleeps("genrm:__default__") is colocated, p.mode


@pytest.mark.parametrize("layout", ["shared", "async"])
def test_engines_the_plan_puts_to_sleep_reserve_host_buffers_at_start(layout: str) -> None:
    from rl_core.config import parse_train_args
    from rl_core.specs import judge_specs, rollout_spec

    argv = SHARED_8 if layout == "shared" else ASYNC_8
    cfg = parse_train_args(["--hf-checkpoint", "/m/p", "--prompt-data", "/d.jsonl", *argv])
    want = "start" if layout == "shared" else "first_sleep"
    assert rollout_spec(cfg, "/m/p", "hf").engine_config.sleep_buffers == want
    judges = judge_specs(cfg)
    assert judges and {s.engine_config.sleep_buffers for s in judges.values()} == {want}


def test_fully_async_every_role_its_own_group() -> None:
    p = plan(ASYNC_8)
    assert p.mode == "fully-async" and p.phases_overlap
    sizes = {g.name: g.num_bundles for g in p.groups}
    assert sizes == {"actor": 2, "reference": 1, "actor_fwd": 1, "rollout": 3, "genrm": 1}
    assert p.num_gpus == 8
    assert engines(p, "rollout") == [(0,), (1,), (2,)]
    assert [e.group for e in p.engines] == ["rollout"] * 3 + ["genrm"]
    assert all(r.gpu_fraction == 1.0 for r in p.roles.values())
    assert phase(p, "inference")["rollout"][0] == "active"
    assert phase(p, "train")["actor"][0] == "active"


def test_roles_that_share_a_gpu_are_those_the_plan_puts_on_one_bundle() -> None:
    """rl-core train starts the engines of roles on disjoint GPUs at the same time, and engines
    sharing a GPU one after another (each sizes its memory from what is free when it starts)."""
    assert not plan(SPLIT_8).shares_gpus("rollout", "genrm")
    assert plan(SPLIT_8).shares_gpus("actor", "genrm")
    assert plan(SHARED_8).shares_gpus("rollout", "genrm")
    assert plan(DEFER_16).shares_gpus("rollout", "genrm")
    fully_async = plan(ASYNC_8)
    assert not fully_async.shares_gpus("rollout", "genrm")
    assert not fully_async.shares_gpus("actor", "rollout")


def test_two_judge_instances_at_their_prefix_offsets() -> None:
    p = plan(DUAL_8)
    assert p.mode == "colocate-split"
    assert list(p.judges) == ["quality", "safety"]
    assert p.judges["quality"].bundles == (4, 5)
    assert p.judges["safety"].bundles == (6, 7)
    assert engines(p, "genrm", "quality") == [(4, 5)]
    assert engines(p, "genrm", "safety") == [(6, 7)]
    assert p.roles["genrm"].bundles == (4, 5, 6, 7)


def test_shared_mode_with_two_instances_checks_each_sum() -> None:
    argv = [
        "--genrm-instances",
        '{"a": {"model_path": "/a", "num_gpus": 4,'
        ' "engine_config": {"mem_fraction_static": 0.3}},'
        ' "b": {"model_path": "/b", "num_gpus": 4,'
        ' "engine_config": {"mem_fraction_static": 0.35}}}',
        "--sglang-mem-fraction-static", "0.6",
        "--resource", '{"actor": [1, 8], "rollout": [1, 8], "genrm": [1, 8]}', "--colocate",
    ]  # fmt: skip
    p = plan(argv)
    assert p.mode == "colocate-shared"
    assert p.judges["a"].bundles == (0, 1, 2, 3) and p.judges["b"].bundles == (4, 5, 6, 7)
    assert len(p.warnings) == 1 and "'b' 0.35 = 0.95 per GPU > 0.9" in p.warnings[0]


def test_colocate_without_a_judge() -> None:
    p = plan(["--resource", '{"actor": [1, 4]}', "--colocate", "--rm-type", "math"])
    assert p.mode == "colocate" and p.judging == "none"
    assert engines(p, "rollout") == [(0,), (1,), (2,), (3,)] and p.judges == {}


def test_legacy_genrm_num_gpus_defaults_to_the_resource_entry() -> None:
    p = plan(SPLIT_8)  # the original's script gives no --genrm-num-gpus
    assert len(p.judges["__default__"].bundles) == 4
    explicit = plan([*SPLIT_8, "--genrm-num-gpus", "4"])
    assert explicit == p


INVALID: list[tuple[str, list[str], list[str]]] = [
    (
        "split-arithmetic",
        [*replace(SPLIT_8, "--resource", '{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 2]}'),
         "--genrm-num-gpus-per-engine", "2"],
        ["rollout 4 + genrm 2 = 6 ≠ actor 8", "split:", '"rollout": [1, 6]', "shared:"],
    ),
    (
        "overcommitted",
        replace(SPLIT_8, "--resource", '{"actor": [1, 8], "rollout": [1, 8], "genrm": [1, 4]}'),
        ["rollout 8 + genrm 4 = 12 ≠ actor 8", "not shared: 8, 4, 8", "--fully-async"],
    ),
    (
        "unknown-role",
        replace(SPLIT_8, "--resource", '{"actor": [1, 8], "critic": [1, 4]}'),
        ["unknown role(s) ['critic']", "known roles: actor, rollout, genrm"],
    ),
    ("bad-json", replace(SPLIT_8, "--resource", "{actor: [1, 8]}"), ["--resource: invalid JSON"]),
    ("not-object", replace(SPLIT_8, "--resource", "[1, 8]"), ["must be a JSON object"]),
    (
        "entry-shape",
        replace(SPLIT_8, "--resource", '{"actor": [8]}'),
        ["'actor': expected [groups, gpus_per_group] (two integers), got [8]"],
    ),
    (
        "entry-type",
        replace(SPLIT_8, "--resource", '{"actor": [1, "8"]}'),
        ["'actor': gpus_per_group='8' must be an integer"],
    ),
    (
        "entry-float",
        replace(SPLIT_8, "--resource", '{"actor": [1, 2.5]}'),
        ["gpus_per_group=2.5 must be an integer"],
    ),
    (
        "zero-groups",
        replace(SPLIT_8, "--resource", '{"actor": [0, 8], "rollout": [1, 4], "genrm": [1, 4]}'),
        ["'actor': groups=0 must be a positive integer"],
    ),
    (
        "negative-gpus",
        replace(SPLIT_8, "--resource", '{"actor": [1, 8], "rollout": [1, -4], "genrm": [1, 4]}'),
        ["'rollout': gpus_per_group=-4 must not be negative"],
    ),
    (
        "zero-gpus",
        replace(SPLIT_8, "--resource", '{"actor": [1, 8], "rollout": [1, 0], "genrm": [1, 4]}'),
        ["rollout [1, 0] has 0 GPUs per group", "advantages"],
    ),
    (
        "missing-actor",
        replace(SPLIT_8, "--resource", '{"rollout": [1, 4], "genrm": [1, 4]}'),
        ['missing the "actor" entry'],
    ),
    (
        "rollout-engine-divides",
        [*replace(SPLIT_8, "--resource", '{"actor": [1, 8], "rollout": [1, 6], "genrm": [1, 2]}'),
         "--genrm-num-gpus-per-engine", "2", "--rollout-num-gpus-per-engine", "4"],
        ["rollout: 6 GPUs is not a multiple of --rollout-num-gpus-per-engine 4", "1.5 engines"],
    ),
    (
        "genrm-engine-divides",
        replace(SPLIT_8, "--genrm-num-gpus-per-engine", "3"),
        ["num_gpus=4 must be a multiple of num_gpus_per_engine=3"],
    ),
    (
        "defer-with-split",
        [*SPLIT_8[:-1], "dummy", "--defer-reward-to-post-process", "--builtin-reward-post-process"],
        ["with colocate-split", "defer-swap needs shared bundles"],
    ),
    (
        "defer-in-fully-async",
        [*ASYNC_8, "--defer-reward-to-post-process"],
        ["--defer-reward-to-post-process with --fully-async"],
    ),
    (
        "defer-needs-dummy",
        replace(DEFER_16, "--rm-type", "dapo-genrm"),
        ["needs --rm-type dummy (got --rm-type dapo-genrm)"],
    ),
    (
        "defer-needs-hook",
        DEFER_16[:-2],
        ["needs a post-process hook", "--builtin-reward-post-process"],
    ),
    (
        "shared-needs-fractions",
        drop(replace(SHARED_8, "--genrm-engine-config", "{}"), "--sglang-mem-fraction-static"),
        ["both mem_fraction_static values must be set", "rollout: --sglang-mem-fraction-static",
         "genrm '__default__': mem_fraction_static"],
    ),
    (
        "shared-sum-too-big",
        replace(SHARED_8, "--sglang-mem-fraction-static", "0.7"),
        ["rollout 0.7 + genrm '__default__' 0.3 = 1.0 per GPU ≥ 1.0"],
    ),
    (
        "judge-engine-larger-than-node",
        [*replace(DEFER_16, "--resource", '{"actor": [2, 8], "rollout": [2, 8], "genrm": [2, 8]}'),
         "--genrm-engine", "scripted"],
        ["needs 16 GPUs, more than a node (--num-gpus-per-node 8)",
         "engine=scripted runs in one process"],
    ),
    (
        "hf-judge-engine-of-two-gpus",
        [*replace(SPLIT_8, "--resource", '{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 4]}'),
         "--genrm-engine", "hf", "--genrm-num-gpus-per-engine", "2"],
        ["num_gpus_per_engine=2 with engine=hf", "runs on one device"],
    ),
    (
        "hf-rollout-engine-of-two-gpus",
        [*SPLIT_8, "--rollout-engine", "hf", "--rollout-num-gpus-per-engine", "2"],
        ["--rollout-num-gpus-per-engine 2 with --rollout-engine hf", "runs on one device"],
    ),
    (
        "spanning-engine-whole-nodes",
        [*replace(SPLIT_16, "--resource", '{"actor": [2, 8], "rollout": [1, 4], "genrm": [1, 12]}'),
         "--genrm-num-gpus-per-engine", "12"],
        ["spans nodes with 12 GPUs from bundle 4", "must take whole nodes (8, 16, ... GPUs)"],
    ),
    (
        "engine-across-node-boundary",
        [*replace(SPLIT_16, "--resource", '{"actor": [2, 8], "rollout": [1, 6], "genrm": [1, 10]}'),
         "--genrm-num-gpus-per-engine", "5", "--rollout-num-gpus-per-engine", "2"],
        ["engine 0 (engine=auto) would take bundles 6..10", "node boundary at bundle 8"],
    ),
    (
        "smaller-nodes",
        [*SPLIT_16, "--num-gpus-per-node", "4", "--genrm-engine", "scripted"],
        ["needs 8 GPUs, more than a node (--num-gpus-per-node 4)"],
    ),
    ("both-modes", [*SPLIT_8, "--fully-async"], ["choose exactly one", "both were given"]),
    ("no-mode", [a for a in SPLIT_8 if a != "--colocate"], ["choose exactly one of --colocate"]),
    (
        "judge-without-genrm-entry",
        [*replace(SPLIT_8, "--resource", '{"actor": [1, 8], "rollout": [1, 4]}'),
         "--genrm-num-gpus-per-engine", "1"],
        ['has no "genrm" entry: add "genrm": [1, 1]'],
    ),
    (
        "genrm-entry-without-judge",
        ["--resource", '{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 4]}', "--colocate"],
        ["no judge is configured: set --genrm-model-path or --genrm-instances"],
    ),
    (
        "instances-sum",
        replace(DUAL_8, "--resource", '{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 2]}'),
        ["genrm instances need quality 2 + safety 2 = 4 GPUs ≠ --resource genrm [1, 2] = 2"],
    ),
    (
        "rollout-flag-disagrees",
        replace(DUAL_8, "--rollout-num-gpus", "2"),
        ["--rollout-num-gpus 2 ≠ --resource rollout [1, 4] = 4"],
    ),
    (
        "colocate-no-judge-rollout",
        ["--resource", '{"actor": [1, 8], "rollout": [1, 4]}', "--colocate"],
        ["without a judge: rollout 4 ≠ actor 8"],
    ),
    (
        "async-needs-rollout",
        ["--resource", '{"actor": [1, 4]}', "--fully-async"],
        ['needs a "rollout" entry'],
    ),
    (
        "colocate-reference",
        replace(SPLIT_8, "--resource",
                '{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 4], "reference": [1, 2]}'),
        ["reference [1, 2] = 2 ≠ actor 8", "runs on the actor's GPUs"],
    ),
    (
        "dapo-genrm-needs-judge",
        ["--resource", '{"actor": [1, 8]}', "--colocate", "--rm-type", "dapo-genrm"],
        ["--rm-type dapo-genrm needs a judge"],
    ),
    (
        "instance-missing-num-gpus",
        replace(DUAL_8, "--genrm-instances", '{"q": {"model_path": "/q"}}'),
        ["genrm instance 'q': missing required key 'num_gpus'"],
    ),
    (
        "mem-fraction-range",
        replace(SHARED_8, "--sglang-mem-fraction-static", "1.2"),
        ["--sglang-mem-fraction-static 1.2: must be between 0 and 1"],
    ),
    (
        "two-hooks",
        [*DEFER_16, "--builtin-reward-post-process"],
        ["either --custom-reward-post-process-path", "not both"],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "expected"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid_layouts_are_refused_with_an_actionable_message(
    argv: list[str], expected: list[str]
) -> None:
    with pytest.raises(PlacementError) as info:
        plan(argv)
    for text in expected:
        assert text in str(info.value)


def test_cli_plan_text_map(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *DUAL_8]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("mode: colocate-split")
    rows = {line.split()[1] if line.split()[0] == "inference" else line.split()[0]: line
            for line in out.splitlines() if "engine" in line and "×" in line}  # fmt: skip
    assert re.search(r"r0 r1 r2 r3\s+\.\s+\.\s+\.\s+\.", rows["rollout"])
    assert re.search(r"\.\s+\.\s+\.\s+\.\s+g0 g0\s+\.\s+\.", rows["genrm:quality"])
    assert re.search(r"\.\s+\.\s+\.\s+\.\s+\.\s+\.\s+g0 g0", rows["genrm:safety"])
    assert "A  A  A  A  A  A  A  A" in out
    # the train-only flags of the original script are named, not silently dropped
    assert "ignoring arguments that are not about placement: --custom-rm-path" in err


def test_cli_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *SHARED_8, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mode"] == "colocate-shared"
    assert PlacementPlan.model_validate(data) == plan(SHARED_8)


def test_cli_plan_invalid_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    bad = replace(SPLIT_8, "--resource", '{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 2]}')
    assert main(["plan", *bad, "--genrm-num-gpus-per-engine", "1"]) == 2
    err = capsys.readouterr().err
    assert "rollout 4 + genrm 2 = 6 ≠ actor 8" in err


def test_cli_plan_refuses_megatron_sizes_as_train_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``rl-core plan`` with the training backend's flags refuses what ``rl-core train`` would,
    with the same message (it printed a plan and exited 0 while train exited 2)."""
    from rl_core.config import ConfigError, parse_train_args

    tp3 = ["--train-backend", "megatron", "--tensor-model-parallel-size", "3"]
    assert main(["plan", *SHARED_8, *tp3]) == 2
    err = capsys.readouterr().err
    with pytest.raises(ConfigError) as train:
        parse_train_args([*SHARED_8, *tp3, "--hf-checkpoint", "m", "--prompt-data", "d.jsonl"])
    assert str(train.value) in err and "--tensor-model-parallel-size 3" in err
    assert (
        main(
            ["plan", *SHARED_8, "--train-backend", "megatron", "--tensor-model-parallel-size", "2"]
        )
        == 0
    )
    assert "ignoring" not in capsys.readouterr().err  # the backend's flags are read, not ignored


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(replace(SPLIT_8, "--rm-type", "dummy"), id="dummy-without-defer"),
        pytest.param([*ASYNC_8, "--defer-reward-to-post-process"], id="defer-in-fully-async"),
        pytest.param(
            [*SPLIT_8[:-1], "dummy", "--defer-reward-to-post-process"], id="defer-with-split"
        ),
        pytest.param(replace(SPLIT_8, "--genrm-num-gpus-per-engine", "3"), id="judge-gpus"),
    ],
)
def test_cli_plan_refuses_what_train_refuses_with_its_message(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from rl_core.config import ConfigError, parse_train_args

    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    with pytest.raises(ConfigError) as train:
        parse_train_args([*argv, "--hf-checkpoint", "m", "--prompt-data", "d.jsonl"])
    assert f"rl-core plan: error: {train.value}" in err


def test_cli_plan_warns_above_0_9(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *replace(SHARED_8, "--sglang-mem-fraction-static", "0.65")]) == 0
    assert "warning: colocate-shared: rollout 0.65 + genrm '__default__' 0.3 = 0.95" in (
        capsys.readouterr().out
    )


def test_rl_core_plan_console_script() -> None:
    """The installed command: exit status 2 and the message for an invalid layout."""
    bad = replace(DEFER_16, "--resource", '{"actor": [2, 8], "rollout": [1, 8], "genrm": [1, 8]}')
    proc = subprocess.run(
        [sys.executable, "-m", "rl_core.cli", "plan", *bad, "--genrm-num-gpus-per-engine", "8"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "defer-swap needs shared bundles" in proc.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "rl_core.cli", "plan", *DEFER_16, "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["mode"] == "colocate-defer-swap"


def test_render_marks_node_boundaries() -> None:
    text = render_plan(plan(SPLIT_16))
    assert "  0  1  2  3  4  5  6  7 |  8  9 10 11 12 13 14 15" in text
    assert re.search(r"(\.\s+){8}\|\s+g0 g0 g0 g0 g0 g0 g0 g0", text)
    assert re.search(r"r0 r0 r0 r0 r1 r1 r1 r1 \|(\s+\.){8}", text)


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(["--rm-type", "dapo-genrm"], id="colocate"),
        pytest.param(["--rm-type", "dapo-genrm", "--fully-async"], id="fully-async"),
        pytest.param(
            [
                "--rm-type",
                "dummy",
                "--defer-reward-to-post-process",
                "--builtin-reward-post-process",
            ],
            id="defer",
        ),
    ],
)
def test_cli_plan_without_resource_is_trains_default_layout(
    flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``rl-core plan`` takes the layout ``rl-core train`` falls back to without ``--resource``
    (one owner of that default), instead of refusing the flags."""
    from rl_core.config import parse_train_args

    argv = ["--genrm-model-path", "/m/judge", *flags]
    assert main(["plan", *argv, "--json"]) == 0
    shown = PlacementPlan.model_validate(json.loads(capsys.readouterr().out))
    train = parse_train_args(["--hf-checkpoint", "/m/policy", "--prompt-data", "/d.jsonl", *argv])
    assert shown == train.plan


def test_cli_plan_preset_is_the_plan_train_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """``rl-core plan --preset cpu-demo`` ignored the preset and printed "colocate, no judge,
    1 GPU"; train ran the preset's colocate-split layout."""
    from rl_core.config import parse_train_args

    assert main(["plan", "--preset", "cpu-demo", "--json"]) == 0
    printed = PlacementPlan.model_validate(json.loads(capsys.readouterr().out))
    assert printed.mode == "colocate-split"
    assert printed == parse_train_args(["--preset", "cpu-demo"]).plan
    # the command line still wins over the preset, as in train
    one_judge_gpu = ["--resource", '{"actor": [1, 3], "rollout": [1, 1], "genrm": [1, 2]}']
    assert main(["plan", "--preset=cpu-demo", *one_judge_gpu]) == 0
    assert "GPUs: 3" in capsys.readouterr().out


def test_cli_plan_config_file_is_the_plan_train_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rl_core.config import parse_train_args

    config = tmp_path / "job.yaml"
    config.write_text("\n".join(["hf-checkpoint: m", "prompt_data: d.jsonl", *_yaml(SPLIT_8)]))
    assert main(["plan", "--config", str(config), "--json"]) == 0
    printed = PlacementPlan.model_validate(json.loads(capsys.readouterr().out))
    assert printed == parse_train_args(["--config", str(config)]).plan == plan(SPLIT_8)
    # refused as train refuses: a missing file, a key that is not a train flag
    assert main(["plan", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "--config " in capsys.readouterr().err
    config.write_text("resourse: {}\n")
    assert main(["plan", "--config", str(config)]) == 2
    assert "unknown key 'resourse' (not a train flag)" in capsys.readouterr().err


def _yaml(argv: list[str]) -> list[str]:
    """``--flag value`` / ``--switch`` pairs as YAML lines (values quoted as JSON strings)."""
    lines, i = [], 0
    while i < len(argv):
        key = argv[i].removeprefix("--")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            lines.append(f"{key}: {json.dumps(argv[i + 1])}")
            i += 2
        else:
            lines.append(f"{key}: true")
            i += 1
    return lines
