"""The update: sequence log-probs, the micro-batched PPO step and the CPU-offloaded optimizer."""
