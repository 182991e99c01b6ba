"""GRPO with a generative reward model: launch scripts, a dual-judge reward, a defer hook."""
