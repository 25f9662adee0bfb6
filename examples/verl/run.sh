#!/usr/bin/env bash
# GRPO with verl on a GPU cluster, the rollout and grader running in plugtune's runtime.
#   pip install 'verl[vllm]==0.9.1' && pip install -e '/path/to/plugtune[verl]'
#   python verl/examples/data_preprocess/gsm8k.py --local_save_dir ~/data/gsm8k   (in a verl checkout)
#   bash examples/verl/run.sh            # from this folder's parent's parent (the plugtune checkout)
# The parquet rows need agent_name "plugtune" or the default_agent_loop override below; plugtune's
# Sample is raw_prompt (messages) and extra_info + reward_model.ground_truth + data_source.
# Try the job's verl path on one machine first (CPU, verl's own agent loop worker and reward loader):
#   python -m plugtune.integrations.verl_dry_run examples/verl/job.yaml --steps 2
# The whole run is one plugtune job: every Ray worker joins it (PLUGTUNE_RUN=<key> names it yourself).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
export PLUGTUNE_JOB="$HERE/job.yaml"     # the job the agent loop and the reward function run
# Every Ray worker records into this store; on more than one node use PostgreSQL (one store for all).
export PLUGTUNE_DATABASE_URL="${PLUGTUNE_DATABASE_URL:-sqlite:///$HOME/.plugtune/plugtune.db}"
MODEL="${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}"
DATA="${DATA:-$HOME/data/gsm8k}"

python -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" \
  data.train_batch_size=256 data.max_prompt_length=512 data.max_response_length=1024 \
  data.return_raw_chat=true \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 actor_rollout_ref.actor.use_kl_loss=true \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async \
  actor_rollout_ref.rollout.n=8 actor_rollout_ref.rollout.calculate_log_probs=true \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/agent_loops.yaml" \
  actor_rollout_ref.rollout.agent.default_agent_loop=plugtune \
  reward.custom_reward_function.path=pkg://plugtune.integrations.verl \
  reward.custom_reward_function.name=compute_score \
  +reward.custom_reward_function.reward_kwargs.job="$PLUGTUNE_JOB" \
  +ray_kwargs.ray_init.runtime_env.env_vars.PLUGTUNE_JOB="$PLUGTUNE_JOB" \
  +ray_kwargs.ray_init.runtime_env.env_vars.PLUGTUNE_DATABASE_URL="$PLUGTUNE_DATABASE_URL" \
  trainer.n_gpus_per_node="${GPUS:-8}" trainer.nnodes="${NODES:-1}" \
  trainer.total_epochs=1 trainer.logger='["console"]' "$@"
