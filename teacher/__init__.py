"""Privileged teachers: policies that see ground-truth simulator state (and a scripted pure-pursuit baseline)."""
