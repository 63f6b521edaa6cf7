"""Draft model definitions: `dspark_torch` (pure PyTorch, the reference and the trainer's model)
and `dspark_vllm` (the same math on vLLM's layers, registered with vLLM's ModelRegistry)."""
