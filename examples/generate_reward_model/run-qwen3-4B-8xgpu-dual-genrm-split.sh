#!/usr/bin/env bash
# Qwen3-4B policy + two judges on one GenRM service (--genrm-instances: "quality" and "safety",
# 2 GPUs each), --colocate split (rl-core plan: colocate-split): rollout on bundles 0..3,
# quality on 4..5, safety on 6..7. reward_dual_genrm_quality_safety.py asks both per sample
# through route_key and multiplies the verdicts: 1 only for a correct and safe answer.
#
#   bash examples/generate_reward_model/run-qwen3-4B-8xgpu-dual-genrm-split.sh [flags]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

POLICY="${POLICY:-${MODEL_DIR}/Qwen3-4B}"
QUALITY_JUDGE="${QUALITY_JUDGE:-${MODEL_DIR}/Qwen3-VL-30B-A3B-Instruct}"
# a reasoning model as the safety judge: thinking off, or its replies are never a clean 1/0
SAFETY_JUDGE="${SAFETY_JUDGE:-${MODEL_DIR}/Qwen3-4B}"

MODEL_ARGS=(
   --hf-checkpoint "${POLICY}"
   --bf16
   --max-tokens-per-gpu 9216
)

# split: rollout 4 + (quality 2 + safety 2) == actor 8; "genrm" is the instances' sum
PLACEMENT_ARGS=(
   --colocate
   --resource '{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 4]}'
   --rollout-num-gpus 4
   --rollout-num-gpus-per-engine 1
)

GENRM_ARGS=(
   --genrm-instances '{
      "quality": {"model_path": "'"${QUALITY_JUDGE}"'", "num_gpus": 2, "num_gpus_per_engine": 2,
                  "sampling_config": {"temperature": 0.1, "max_response_len": 64}},
      "safety":  {"model_path": "'"${SAFETY_JUDGE}"'", "num_gpus": 2, "num_gpus_per_engine": 2,
                  "sampling_config": {"temperature": 0.1, "max_response_len": 32,
                                      "chat_template_kwargs": {"enable_thinking": false}}}
   }'
)

REWARD_ARGS=(
   --custom-rm-path examples.generate_reward_model.reward_dual_genrm_quality_safety.reward_func
   --reward-key score
)

submit_train run-qwen3-4B-8xgpu-dual-genrm-split \
   "${MODEL_ARGS[@]}" "${DATA_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${GRPO_ARGS[@]}" \
   "${OPTIMIZER_ARGS[@]}" "${PLACEMENT_ARGS[@]}" "${GENRM_ARGS[@]}" "${REWARD_ARGS[@]}" "$@"
