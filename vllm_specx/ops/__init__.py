"""Custom ops: each folder pairs a PyTorch `reference.py` (the spec) with a Triton `kernel.py`."""
