#!/usr/bin/env bash
# Qwen3-4B policy scored against a weighted rubric (--rm-type rubric-genrm) by a panel of two
# judges on one GenRM service ("judge_a" and "judge_b", 2 GPUs each), --colocate split
# (rl-core plan: colocate-split): rollout on bundles 0..3, judge_a on 4..5, judge_b on 6..7.
# rubric_math_solution.json is the run's rubric (five criteria, weights 4/2/1/1/1; a record's
# own metadata["rubric"] would win over it). Every criterion is one judge question, asked of
# both judges and averaged; a judge that fails is left out while the other answers (quorum 1).
# A response's score is the weighted mean of its criteria; a criterion neither judge answered
# makes the response a judge_error (kept out of the loss), never 0. Each step logs how often the
# two judges agreed: rollout/panel_agreement/judge_a~judge_b.
#
#   bash examples/generate_reward_model/run-qwen3-4B-8xgpu-rubric-panel-split.sh [flags]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

POLICY="${POLICY:-${MODEL_DIR}/Qwen3-4B}"
JUDGE_A="${JUDGE_A:-${MODEL_DIR}/Qwen3-VL-30B-A3B-Instruct}"
# a reasoning model as the second judge: thinking off, or its replies are never a clean 1/0
JUDGE_B="${JUDGE_B:-${MODEL_DIR}/Qwen3-4B}"
RUBRIC="${RUBRIC:-${EXAMPLE_DIR}/rubric_math_solution.json}"

MODEL_ARGS=(
   --hf-checkpoint "${POLICY}"
   --bf16
   --max-tokens-per-gpu 9216
)

# split: rollout 4 + (judge_a 2 + judge_b 2) == actor 8; "genrm" is the instances' sum
PLACEMENT_ARGS=(
   --colocate
   --resource '{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 4]}'
   --rollout-num-gpus 4
   --rollout-num-gpus-per-engine 1
)

GENRM_ARGS=(
   --genrm-instances '{
      "judge_a": {"model_path": "'"${JUDGE_A}"'", "num_gpus": 2, "num_gpus_per_engine": 2,
                  "sampling_config": {"temperature": 0.0, "max_response_len": 4}},
      "judge_b": {"model_path": "'"${JUDGE_B}"'", "num_gpus": 2, "num_gpus_per_engine": 2,
                  "sampling_config": {"temperature": 0.0, "max_response_len": 4,
                                      "chat_template_kwargs": {"enable_thinking": false}}}
   }'
)

REWARD_ARGS=(
   --rm-type rubric-genrm
   --rubric-path "${RUBRIC}"
   --judge-panel judge_a,judge_b
   --judge-panel-aggregate mean
   --judge-panel-quorum 1
   --reward-key score
)

submit_train run-qwen3-4B-8xgpu-rubric-panel-split \
   "${MODEL_ARGS[@]}" "${DATA_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${GRPO_ARGS[@]}" \
   "${OPTIMIZER_ARGS[@]}" "${PLACEMENT_ARGS[@]}" "${GENRM_ARGS[@]}" "${REWARD_ARGS[@]}" "$@"
