"""Shared fixtures: a tiny random-weight causal LM saved to disk (seconds to build, MBs of RAM)."""

import sys
from pathlib import Path

import pytest
import torch

from genrm_serve.testing import ray_test_env

# Before any test module imports ray.
ray_test_env()

# --import-mode=importlib does not put test folders on sys.path; tiny_grpo (helpers) needs it.
sys.path.insert(0, str(Path(__file__).parent))


def build_tiny_model(path, vocab_size=96, seed=0):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        sliding_window=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = Gemma3ForCausalLM(cfg)
    model.save_pretrained(path)
    return path


@pytest.fixture
def data_file(tmp_path):
    """A small generated easy-math prompt file (JSONL) in the test's tmp dir."""
    from tiny_grpo import write_easy_math_data

    return write_easy_math_data(tmp_path / "train.jsonl")


@pytest.fixture
def grpo_config(data_file):
    """``grpo_config(root, **flags)``: the config of a tiny GRPO run on ``data_file``, its run
    directory ``root/run`` (the flags override the defaults below)."""
    from rl_core.config import build_config

    def make(root, **kw):
        base = dict(
            hf_checkpoint="unused",
            prompt_data=str(data_file),
            rm_type="math",
            num_rollout=2,
            rollout_batch_size=2,
            n_samples_per_prompt=4,
            rollout_max_response_len=6,
            rollout_temperature=1.5,
            lr=1e-3,
            seed=7,
            run_dir=str(root / "run"),
            use_tis=True,
            genrm_model_path="scripted",  # the plan's judge; the tests put their own in its phases
            genrm_engine="scripted",
            # The tiny random policy almost never writes EOS within 6 tokens, so nearly every
            # response is cut off at the length limit. These tests pin the driver's mechanics
            # (train, weight sync, swaps, staleness, resume, judge-error masking), which do not
            # depend on which samples the loss holds: they train on cut-off responses (and so
            # cover the opt-out). The default rule has its own tests.
            keep_cut_off=True,
        )
        base.update(kw)
        # defer mode: the plan needs a hook; the tests hand the trainer theirs
        base.setdefault(
            "builtin_reward_post_process", base.get("defer_reward_to_post_process", False)
        )
        return build_config(**base)

    return make


@pytest.fixture
def grpo_trainer(tiny_model_path, char_tokenizer, test_engine_factory):
    """``await grpo_trainer(cfg, ...)``: ``(trainer, engine, backend)`` of a tiny in-process GRPO
    run (test engine, torch backend, a recording judge in the phases). ``reward``: the inline
    reward (default ``ScriptedReward()``); ``deferred``: scored in a post-process batch instead,
    logging the states it was scored in to ``judge_log``; ``eval_data``: an evaluation set;
    ``stop``: the stop request."""
    from tiny_grpo import RecordingJudge, ScriptedReward, local_stack, make_trainer

    from rl_core.evaluation import Evaluation
    from rl_core.rewards import RewardSetup, defer_swap_post_process

    async def make(cfg, *, reward=None, deferred=False, judge_log=None, eval_data=None, stop=None):
        judge = RecordingJudge(judge_log if judge_log is not None else [])
        engine, handle, backend, phases = await local_stack(
            cfg, tiny_model_path, test_engine_factory, judge
        )
        reward = reward or ScriptedReward()
        if deferred:

            async def batch_fn(args, samples):
                judge_log.append(("scored", dict(phases.states), engine.state))
                return [await reward(args, s) for s in samples]

            setup = RewardSetup(
                args=cfg,
                reward_key="score",
                inline_fn=None,
                batch_fn=batch_fn,
                post_process=defer_swap_post_process,
            )
        else:
            setup = RewardSetup(args=cfg, reward_key="score", inline_fn=reward)
        evaluation = Evaluation(cfg, eval_data) if eval_data is not None else None
        trainer = make_trainer(
            cfg, char_tokenizer, handle, backend, phases, setup, evaluation=evaluation, stop=stop
        )
        return trainer, engine, backend

    return make


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny-model"), vocab_size=len(build_char_tokenizer())
    )


# --- a char-level tokenizer and a transformers *test engine* for the tiny model -------------------

CHARS = list("0123456789+-=?: \nabcdefghijklmnopqrstuvwxyzQAW.,")


def build_char_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3}
    for ch in CHARS:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", 1)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
    )


@pytest.fixture(scope="session")
def char_tokenizer():
    return build_char_tokenizer()


def make_test_engine(model_path, engine_id="rollout-0"):
    """A rollout *test engine*: plain transformers sampling token by token, behind the real
    ``Engine`` interface (stand-in for genrm-serve's hf engine in unit tests)."""
    from transformers import AutoModelForCausalLM

    from genrm_serve.engines.base import Engine, EngineAsleepError, EngineOutput

    class TorchTestEngine(Engine):
        def __init__(self):
            self.engine_id = engine_id
            self.state = "created"
            self.weight_version = 0
            self.model = None
            self._weights = None
            self.calls = 0

        async def start(self):
            self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
            self.state = "awake"

        async def generate(self, requests):
            if self.state != "awake":
                raise EngineAsleepError(f"{self.engine_id} is asleep")
            self.calls += 1
            outs = []
            for req in requests:
                sp = req.sampling
                gen = torch.Generator().manual_seed(sp.seed or 0)
                ids = list(req.prompt_token_ids)
                toks, lps, finish = [], [], "length"
                with torch.no_grad():
                    for _ in range(sp.max_response_len):
                        logits = self.model(torch.tensor([ids])).logits[0, -1].float()
                        logp = torch.log_softmax(logits / max(sp.temperature or 1.0, 1e-5), -1)
                        if not sp.temperature:
                            t = int(torch.argmax(logp))
                        else:
                            t = int(torch.multinomial(logp.exp(), 1, generator=gen))
                        toks.append(t)
                        lps.append(float(logp[t]))
                        ids.append(t)
                        if t == 2:
                            finish = "stop"
                            break
                outs.append(
                    EngineOutput(
                        text="",
                        finish_reason=finish,
                        prompt_tokens=len(req.prompt_token_ids),
                        completion_tokens=len(toks),
                        token_ids=toks,
                        logprobs=lps,
                        weight_version=self.weight_version,
                    )
                )
            return outs

        async def sleep(self):
            if self.state == "awake":
                self._weights = {k: v.clone() for k, v in self.model.state_dict().items()}
                self.model = None
                self.state = "asleep"

        async def wake(self):
            if self.state == "asleep":
                self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
                self.model.load_state_dict(self._weights)
                self._weights = None
                self.state = "awake"

        async def update_weights(self, state_dict, version):
            if version <= self.weight_version:
                raise ValueError(f"weight version {version} ≤ {self.weight_version}")
            if self.state != "awake":
                raise EngineAsleepError("update_weights while asleep")
            own = dict(self.model.named_parameters())
            unknown = set(state_dict) - set(own)
            if unknown:
                raise ValueError(f"unknown parameters {sorted(unknown)}")
            with torch.no_grad():
                for k, v in state_dict.items():
                    own[k].copy_(v)
            self.weight_version = version

    return TorchTestEngine()


@pytest.fixture(scope="session")
def test_engine_factory():
    return make_test_engine


@pytest.fixture
def tiny_run_flags():
    """The ``rl-core train`` flags of a two-step CPU run of the tiny random policy, colocated:
    what the end-to-end tests of one feature share (each appends its own)."""
    return [
        "--num-rollout", "2",
        "--rollout-batch-size", "2",
        "--n-samples-per-prompt", "4",
        "--rollout-max-response-len", "6",
        # the tiny random policy is cut off at the limit: train on it
        "--keep-cut-off",
        "--rollout-temperature", "1.2",
        "--lr", "1e-3",
        "--colocate",
        "--device", "cpu",
    ]  # fmt: skip
