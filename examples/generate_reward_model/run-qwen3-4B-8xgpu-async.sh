#!/usr/bin/env bash
# Qwen3-4B policy + a GenRM judge, --fully-async on 8 GPUs (rl-core plan: fully-async): every
# role on its own GPUs — actor 2, rollout 3, reference 1, actor_fwd 1, genrm 1, advantages on
# CPU — and the rollout of step k+1 runs while step k trains (one step of staleness).
# The judge's GPU idles while the actor trains: prefer the colocated script when you can.
#
#   bash examples/generate_reward_model/run-qwen3-4B-8xgpu-async.sh [extra rl-core train flags]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

POLICY="${POLICY:-${MODEL_DIR}/Qwen3-4B}"
GENRM_MODEL="${GENRM_MODEL:-${MODEL_DIR}/Qwen3-VL-30B-A3B-Instruct}"

MODEL_ARGS=(
   --hf-checkpoint "${POLICY}"
   --bf16
   --max-tokens-per-gpu 9216
)

PLACEMENT_ARGS=(
   --fully-async
   --resource '{"actor": [1, 2], "rollout": [1, 3], "reference": [1, 1], "actor_fwd": [1, 1], "advantages": [1, 0], "genrm": [1, 1]}'
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

submit_train run-qwen3-4B-8xgpu-async \
   "${MODEL_ARGS[@]}" "${DATA_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${GRPO_ARGS[@]}" \
   "${OPTIMIZER_ARGS[@]}" "${PLACEMENT_ARGS[@]}" "${GENRM_ARGS[@]}" "${REWARD_ARGS[@]}" "$@"
