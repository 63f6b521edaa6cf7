import os

import pytest
import torch

# Kernel tests run Triton in interpreter mode on CPU; this must be set before triton is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # LLM.collective_rpc(callable)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
