import os

import pytest
import torch

# Kernel tests run Triton in interpreter mode on CPU. TRITON_INTERPRET must be set before any
# `@triton.jit` function is created, so it is set here, before test modules import the kernels.
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # LLM.collective_rpc(callable)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
