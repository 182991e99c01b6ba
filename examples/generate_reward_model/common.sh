# Sourced by the run-*.sh scripts of this folder (not run on its own): where models and data
# live, the GRPO recipe every script trains with, and the `ray job submit` of `rl-core train`.
#
# Environment (all optional):
#   EXP_DIR      data, and models unless MODEL_DIR is set (default: exps/ under the current dir)
#   MODEL_DIR    model folders (default: $EXP_DIR)
#   RAY_ADDRESS  the Ray cluster's dashboard, for `ray job submit` (default http://127.0.0.1:8265)
#   GENRM_PORT   HTTP port of the judge service on the head node (default 8000)
#   RUN_DIR      metrics, samples, plots (default: $EXP_DIR/runs/<script name>)
#   DRY_RUN      1: print the `ray job submit` command instead of running it;
#                args: print only the `rl-core train` arguments, NUL-separated (what tests read)
# Arguments given to a run-*.sh script are appended to `rl-core train`'s; for a flag given twice
# the last value wins, so `bash run-....sh --num-rollout 10` changes one setting.

EXAMPLE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# examples.generate_reward_model.* (the reward function and the hook) import from the repo root
REPO_ROOT="$(cd "${EXAMPLE_DIR}/../.." && pwd)"

# Absolute, because the job runs in the Ray cluster, not in this shell's directory (every node
# must see these paths: a shared file system, as in the original's set-up).
EXP_DIR="$(realpath -m "${EXP_DIR:-exps}")"
MODEL_DIR="$(realpath -m "${MODEL_DIR:-${EXP_DIR}}")"
RAY_ADDRESS="${RAY_ADDRESS:-http://127.0.0.1:8265}"
GENRM_PORT="${GENRM_PORT:-8000}"

DATA_ARGS=(
   --prompt-data "${EXP_DIR}/dapo-math-17k/dapo-math-17k.jsonl"
   --input-key prompt
   --label-key label
   --apply-chat-template
   --eval-prompt-data "${EXP_DIR}/aime-2024/aime-2024.jsonl"
   --n-samples-per-eval-prompt 16
   --eval-max-response-len 16384
   --eval-interval 20
)

ROLLOUT_ARGS=(
   --num-rollout 3000
   --rollout-batch-size 32
   --n-samples-per-prompt 8
   --global-batch-size 256
   --rollout-max-response-len 8192
   --rollout-temperature 1
)

# GRPO as in the original: KL term on with coefficient 0 (its metric is still logged),
# asymmetric clip, truncated importance sampling against the rollout engines' log-probs.
GRPO_ARGS=(
   --advantage-estimator grpo
   --use-kl-loss
   --kl-loss-coef 0.00
   --kl-loss-type low_var_kl
   --eps-clip 0.2
   --eps-clip-high 0.28
   --use-tis
)

OPTIMIZER_ARGS=(
   --optimizer adam
   --lr 1e-6
   --lr-decay-style constant
   --weight-decay 0.1
   --adam-beta1 0.9
   --adam-beta2 0.98
)

# submit_train NAME ARGS... — run `rl-core train ARGS...` on the cluster at $RAY_ADDRESS.
submit_train() {
   local name=$1
   shift
   local train_args=(
      --genrm-port "${GENRM_PORT}"
      --run-dir "${RUN_DIR:-${EXP_DIR}/runs/${name}}"
      "$@"
   )
   local runtime_env
   runtime_env=$(printf '{"env_vars": {"PYTHONPATH": "%s:${PYTHONPATH}", "PYTHONUNBUFFERED": "1"}}' \
      "${REPO_ROOT}")
   local submit=(ray job submit --address "${RAY_ADDRESS}" --runtime-env-json "${runtime_env}"
      -- rl-core train "${train_args[@]}")
   case "${DRY_RUN:-0}" in
      args)
         printf '%s\0' "${train_args[@]}"
         return 0
         ;;
      0) ;;
      *)
         printf '%q ' "${submit[@]}"
         echo
         return 0
         ;;
   esac
   echo "Submitting ${name} to ${RAY_ADDRESS}; the job log streams below."
   echo "Once it shows 'judge service: ...', check the judges on the head node with:"
   echo "  curl http://localhost:${GENRM_PORT}/genrm/health"
   "${submit[@]}"
}
