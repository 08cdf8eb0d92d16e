"""Research diagnostics: probes of a student's features and motion estimates, odometry, observability ceilings, the
two physics backends side by side. Run as `python -m experiments.research.<name>`; not part of the user's workflow."""
