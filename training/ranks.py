"""Which training process this is, under `accelerate launch --num_processes N` (or any torchrun-style launcher).

The launcher sets `RANK` and `WORLD_SIZE` in every process it starts. With more than one process, building TRL's
config (`training.grpo.grpo_config`, which `training.job.prepare` does first) initialises the process group
(accelerate's `PartialState`, a singleton the trainer then shares: gloo on CPUs, NCCL on GPUs) with the job's
`ddp_timeout`, so that the ranks can wait for the main process before training starts:

- the main process (rank 0) writes what the job writes once: the manifest, the generator's response sets, the
  checkpoint, `train_log.jsonl`, the TensorBoard events and the figure;
- the other ranks wait at a barrier (`barrier`) and then read what the main process wrote (the sets);
- during training each rank generates and rewards its own share of every batch (TRL hands each rank whole groups:
  `training.job` checks it), and TRL averages the logged metrics over the ranks.

A barrier waits at most the process group's timeout (`grpo.extra.ddp_timeout`, TRL's default 1800 s): the
generator's ranks wait there while the main process samples the response sets, so at scale the timeout must
cover the sampling (the paper-scale configs set it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Ranks:
    """This process's place among the training processes."""

    rank: int
    """Global rank (0: the main process)."""
    world: int
    """Number of processes."""

    @property
    def main(self) -> bool:
        return self.rank == 0


def current() -> Ranks:
    """The ranks as the launcher set them (`RANK`, `WORLD_SIZE`; one process when unset). Initialises nothing."""
    return Ranks(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))


def barrier() -> None:
    """Wait until every process gets here (a no-op for one process)."""
    if current().world > 1:
        from accelerate import PartialState

        PartialState().wait_for_everyone()
