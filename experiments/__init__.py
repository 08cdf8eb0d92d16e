"""Entry points only: one tyro config and its presets per script, W&B wiring, benchmarks; `research/` holds the
diagnostics. No script imports another: a script that needs another runs it as a subprocess (`cli.run_stage`)."""
