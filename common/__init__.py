"""Shared helpers of the single-file RL scripts: buffers, normalizers, distributed, checkpoints, envs."""
