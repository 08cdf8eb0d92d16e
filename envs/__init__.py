"""Simulation side of gapbridge: tracks, car physics, cameras, randomization, rewards and the batched envs."""
