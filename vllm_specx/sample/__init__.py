"""Verification inside vLLM: our acceptance op in vLLM's V1 rejection-sampling step."""
