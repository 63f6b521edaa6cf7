"""Proposers that vllm-specx installs into vLLM's V1 model runner (see `_vllm_compat`)."""
