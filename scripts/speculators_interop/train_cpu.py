"""Run speculators' own trainer (``python -m speculators.train``) on a CPU-only box.

speculators 0.9.0 assumes an accelerator: the Trainer moves the model to
``get_local_rank()`` (0 -> "cuda") and its step timer calls
``torch.accelerator.synchronize()``. Without an accelerator both are patched here
at runtime (site-packages is untouched); all CLI arguments are passed through to
speculators' TrainConfig resolver unchanged. The CLI also needs
``--draft-attn-impl sdpa --loss-implementation eager --hidden-states-dtype float32``
on CPU (see run.sh for the full commands).

Command:
    python train_cpu.py --speculator-type dspark --verifier-name-or-path ... [flags]
"""

import torch

import speculators.train.trainer as _trainer

if not torch.accelerator.is_available():
    _trainer.get_local_rank = lambda: "cpu"
    torch.accelerator.synchronize = lambda *a, **k: None

from speculators.train.cli import main  # noqa: E402
from speculators.train.config import TrainConfig  # noqa: E402

if __name__ == "__main__":  # DataLoader workers use the 'spawn' start method
    main(TrainConfig.resolve())
