"""Training DSpark heads: on-policy data from the target via vLLM, target taps, the trainer."""
