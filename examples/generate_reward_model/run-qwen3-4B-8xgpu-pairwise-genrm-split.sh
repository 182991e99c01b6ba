#!/usr/bin/env bash
# Qwen3-4B policy + a pairwise judge, --colocate split (rl-core plan: colocate-split): rollout
# on bundles 0..3, the judge on 4..7. --rm-type pairwise-genrm ranks each GRPO group of 8 by
# comparing its responses two at a time (3 rounds of a round robin: 12 pairs, each asked in
# both orders, instead of 28); a response's reward is its win rate. A group's judging stops
# 120 s after its last response: what is not judged by then is judge_timeout (left out of the
# loss and the baseline, never 0). metrics.jsonl: rollout/pairwise_flip_share (pairs whose
# verdict changed with the order), rollout/judge_timeouts.
#
#   bash examples/generate_reward_model/run-qwen3-4B-8xgpu-pairwise-genrm-split.sh [flags]
#
# Needs $MODEL_DIR/Qwen3-4B, $MODEL_DIR/Qwen3-VL-30B-A3B-Instruct and the data under $EXP_DIR
# (see common.sh and README.md). POLICY / JUDGE point elsewhere.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

POLICY="${POLICY:-${MODEL_DIR}/Qwen3-4B}"
JUDGE="${JUDGE:-${MODEL_DIR}/Qwen3-VL-30B-A3B-Instruct}"

MODEL_ARGS=(
   --hf-checkpoint "${POLICY}"
   --bf16
   --max-tokens-per-gpu 9216
)

# split: rollout 4 + genrm 4 == actor 8
PLACEMENT_ARGS=(
   --colocate
   --resource '{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 4]}'
   --rollout-num-gpus 4
   --rollout-num-gpus-per-engine 1
)

# a comparison prompt quotes two whole responses: room for both, and a one-token verdict
GENRM_ARGS=(
   --genrm-model-path "${JUDGE}"
   --genrm-num-gpus-per-engine 2
   --genrm-engine-config '{"max_context_len": 24576}'
   --genrm-sampling-config '{"temperature": 0.0, "max_response_len": 4}'
)

REWARD_ARGS=(
   --rm-type pairwise-genrm
   --pairwise-pairing round-robin
   --pairwise-rounds 3
   --pairwise-score win_rate
   --pairwise-min-comparisons 4
   --max-response-chars 16000
   --group-judge-deadline-s 120
   --reward-key score
)

submit_train run-qwen3-4B-8xgpu-pairwise-genrm-split \
   "${MODEL_ARGS[@]}" "${DATA_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${GRPO_ARGS[@]}" \
   "${OPTIMIZER_ARGS[@]}" "${PLACEMENT_ARGS[@]}" "${GENRM_ARGS[@]}" "${REWARD_ARGS[@]}" "$@"
