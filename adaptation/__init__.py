"""Online adaptation: the history encoder (z-hat, latency, friction, motor gain, speed) and its losses/metrics."""
