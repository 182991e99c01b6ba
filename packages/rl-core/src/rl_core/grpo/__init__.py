"""GRPO maths: group-normalised advantages and the clipped policy loss with KL and TIS."""
