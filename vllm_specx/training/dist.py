"""Distributed training (DDP): torchrun's processes, each a rank's share of every global batch.

`torchrun --nproc-per-node N -m vllm_specx.cli train ...` starts N
processes (WORLD_SIZE, RANK, LOCAL_RANK in their environment); each joins a process group, gloo
for `--device cpu`, NCCL for `--device cuda` (rank r on cuda:LOCAL_RANK; an explicit `cuda:1` is
refused: pick GPUs with CUDA_VISIBLE_DEVICES). `--batch B` is the global batch (B must divide by
N). The data is sharded by rows of each global batch: every rank draws the same global batch with
the run's seeded rng (the very draws one process makes) and computes on its B / N sequences only
(`shard`); DDP averages the gradients. So the data order is the run's for any N: a run compares
and resumes across world sizes, unlike per-rank data bins (speculators' trainer gives each rank
its own shuffled share, so N changes which samples meet in a step). The price: every rank reads
the whole global batch's samples from disk (forward, backward and optimiser are what it shares).
Each rank's loss is the mean over its own valid positions, so the average DDP takes weighs the
ranks' shares equally where one process weighs them by their valid positions: N processes
train one process's run up to that and float summation order, not bit for bit
(`tests/training/test_distributed.py` bounds it). Validation batches are shared out over the
ranks and summed back in batch order (the numbers one process gets on the same weights);
`--eval-data` runs on rank 0 alone, after training. Rank 0 alone prints and writes
trainer_state.pt (with the world size and every rank's torch RNG state), the checkpoint and
training.json (with "world_size" and "torchrun_command"; its "command", one process, trains the
same run). `--resume` loads the one state on every rank, also with another world size (the same
global batches; then equal up to summation order). `--threads` is per process.

`setup` is a run's first stage (device, seeds, threads, process group); `Dist` is what the other
stages know of it."""

from __future__ import annotations

import dataclasses
import os

import torch

from vllm_specx.training.config import TrainConfig, command_flags


@dataclasses.dataclass
class Dist:
    """Where this process trains: its rank among `world` processes (torchrun's), its device, and
    whether it started the process group (and so ends it)."""

    rank: int = 0
    world: int = 1
    local_world: int = 1
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    owns_group: bool = False

    @property
    def main(self) -> bool:
        """Rank 0: the process that prints, evaluates and writes."""
        return self.rank == 0

    def gather(self, obj) -> list:
        """`obj` of every rank, in rank order (one process: [obj])."""
        if self.world == 1:
            return [obj]
        got = [None] * self.world
        torch.distributed.all_gather_object(got, obj)
        return got

    def mean(self, x: float) -> float:
        """The mean over the ranks of a number (one process: the number)."""
        if self.world == 1:
            return x
        t = torch.tensor([x], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return t.item() / self.world

    def close(self) -> None:
        if self.owns_group and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
            self.owns_group = False



def world_from_env() -> tuple[int, int, int, int]:
    """(rank, world size, local rank, processes per node) as torchrun sets them (1 process: 0, 1,
    0, 1)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, 0, 1
    return (int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")),
            int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))



def shard(batch: dict, rank: int, world: int) -> dict:
    """Rank `rank`'s share of a global batch: every tensor of a hook's batch is [B, ...] (one row
    per sequence), and a rank keeps rows [rank * B / world, (rank + 1) * B / world); values that
    are not tensors (e.g. `chain_tokens`) are kept as they are."""
    sizes = {v.shape[0] for v in batch.values() if isinstance(v, torch.Tensor) and v.dim()}
    if len(sizes) != 1:
        raise ValueError(f"a batch's tensors must all be [B, ...] to be split over ranks; first dims {sorted(sizes)}")
    size = sizes.pop()
    per = size // world
    return {k: v[rank * per:(rank + 1) * per] if isinstance(v, torch.Tensor) and v.dim() else v
            for k, v in batch.items()}



def torchrun_command(cfg: TrainConfig, d: Dist) -> str:
    """The command that launches this distributed run (rendezvous flags left out)."""
    nodes = max(1, d.world // max(1, d.local_world))
    return (("torchrun" + (f" --nnodes {nodes}" if nodes > 1 else "") + f" --nproc-per-node {d.local_world}")
            + " -m vllm_specx.cli train " + command_flags(cfg))



def setup(cfg: TrainConfig) -> Dist:
    """Device, seeds and threads; under torchrun (WORLD_SIZE > 1) the process group too: gloo for
    --device cpu, NCCL for --device cuda, where rank r takes cuda:LOCAL_RANK."""
    rank, world, local, local_world = world_from_env()
    device = torch.device(cfg.device)
    if world > 1:
        if device.type == "cuda":
            if device.index is not None:
                raise SystemExit(f"--device {cfg.device}: under torchrun each process takes the GPU "
                                 f"of its local rank (cuda:LOCAL_RANK); pass --device cuda (pick the "
                                 f"GPUs with CUDA_VISIBLE_DEVICES)")
            device = torch.device("cuda", local)
        elif device.type != "cpu":
            raise SystemExit(f"--device {cfg.device}: distributed training runs on cpu (gloo) or cuda (NCCL)")
        if cfg.batch % world:
            raise SystemExit(f"--batch {cfg.batch}: the global batch must split evenly over the world "
                             f"size {world} (torchrun's processes); pass a multiple of {world}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {cfg.device}: this torch build sees no CUDA device")
    d = Dist(rank, world, local_world, device)
    if world > 1 and not torch.distributed.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                             rank=rank, world_size=world)
        d.owns_group = True
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    return d

