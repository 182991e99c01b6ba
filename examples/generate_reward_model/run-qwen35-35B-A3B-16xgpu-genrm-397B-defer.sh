#!/usr/bin/env bash
# Qwen3.5-35B-A3B policy + Qwen3.5-397B-A17B-FP8 judge on 16 GPUs (2 nodes × 8), --colocate,
# shared bundles with the defer-swap sequence (rl-core plan: colocate-defer-swap):
#   A. rollout awake on all 16 GPUs (mem_fraction_static 0.85), the judge asleep;
#      --rm-type dummy gives each sample a "deferred" placeholder, never a score;
#   B. rollout sleeps, the judge wakes (0.85) and post_process_genrm_swap.py scores the batch;
#   C. the judge sleeps, the actor trains on all 16 GPUs.
# Pick this when responses are uniformly short (math RLVR: no long tail to hide the judge in)
# or the judge is several times the policy's size.
#
#   bash examples/generate_reward_model/run-qwen35-35B-A3B-16xgpu-genrm-397B-defer.sh [flags]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

POLICY="${POLICY:-${MODEL_DIR}/Qwen3.5-35B-A3B}"
GENRM_MODEL="${GENRM_MODEL:-${MODEL_DIR}/Qwen3.5-397B-A17B-FP8}"

MODEL_ARGS=(
   --hf-checkpoint "${POLICY}"
   --bf16
   --max-tokens-per-gpu 9216
)

# shared: rollout 16 == genrm 16 == actor 16; the two never hold memory at the same time
PLACEMENT_ARGS=(
   --colocate
   --resource '{"actor": [2, 8], "rollout": [2, 8], "genrm": [2, 8]}'
   --num-gpus-per-node 8
   --rollout-num-gpus-per-engine 4
   --sglang-mem-fraction-static 0.85
)

GENRM_ARGS=(
   --genrm-model-path "${GENRM_MODEL}"
   --genrm-num-gpus-per-engine 8
   --genrm-engine-config '{"max_context_len": 10240, "mem_fraction_static": 0.85}'
   --genrm-sampling-config '{"temperature": 0.1, "top_p": 1.0, "top_k": -1, "max_response_len": 1024}'
)

# inline: a placeholder; after the batch: the hook scores it (dapo-genrm, see the hook's file)
REWARD_ARGS=(
   --rm-type dummy
   --defer-reward-to-post-process
   --custom-reward-post-process-path examples.generate_reward_model.post_process_genrm_swap.post_process
   --reward-key score
)

submit_train run-qwen35-35B-A3B-16xgpu-genrm-397B-defer \
   "${MODEL_ARGS[@]}" "${DATA_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${GRPO_ARGS[@]}" \
   "${OPTIMIZER_ARGS[@]}" "${PLACEMENT_ARGS[@]}" "${GENRM_ARGS[@]}" "${REWARD_ARGS[@]}" "$@"
