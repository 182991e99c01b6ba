#!/usr/bin/env bash
# Qwen3-4B policy + a small GenRM judge on 8 GPUs, --colocate, split sub-mode (rl-core plan:
# colocate-split): rollout on bundles 0..3, the judge on 4..7, in parallel; every finished
# sample is scored inline (--rm-type dapo-genrm); the actor takes back all 8 GPUs to train.
#
#   bash examples/generate_reward_model/run-qwen3-4B-8xgpu-colocated.sh [extra rl-core train flags]
#
# Needs $MODEL_DIR/Qwen3-4B, $MODEL_DIR/Qwen3-VL-30B-A3B-Instruct and the data under $EXP_DIR
# (see common.sh and README.md). POLICY / GENRM_MODEL point elsewhere.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

POLICY="${POLICY:-${MODEL_DIR}/Qwen3-4B}"
GENRM_MODEL="${GENRM_MODEL:-${MODEL_DIR}/Qwen3-VL-30B-A3B-Instruct}"

MODEL_ARGS=(
   --hf-checkpoint "${POLICY}"
   --bf16
   --max-tokens-per-gpu 9216
)

# split: rollout 4 + genrm 4 == actor 8
PLACEMENT_ARGS=(
   --colocate
   --resource '{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 4]}'
   --rollout-num-gpus-per-engine 1
)

GENRM_ARGS=(
   --genrm-model-path "${GENRM_MODEL}"
   --genrm-num-gpus-per-engine 1
   --genrm-engine-config '{"max_context_len": 10240}'
   --genrm-sampling-config '{"temperature": 0.1, "top_p": 1.0, "top_k": -1, "max_response_len": 1024}'
)

REWARD_ARGS=(
   --rm-type dapo-genrm
   --reward-key score
)

submit_train run-qwen3-4B-8xgpu-colocated \
   "${MODEL_ARGS[@]}" "${DATA_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${GRPO_ARGS[@]}" \
   "${OPTIMIZER_ARGS[@]}" "${PLACEMENT_ARGS[@]}" "${GENRM_ARGS[@]}" "${REWARD_ARGS[@]}" "$@"
