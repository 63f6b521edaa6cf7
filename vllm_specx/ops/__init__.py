"""Custom ops: each folder pairs a pure-PyTorch `reference.py` (the spec) with a Triton `kernel.py`."""
