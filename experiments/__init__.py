"""Entry points: one tyro config per script, presets, W&B wiring, benchmarks."""
