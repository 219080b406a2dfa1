"""Multi-process runs: one process, or the processes of a `torchrun` / `accelerate launch`
launch through accelerate's `PartialState`."""
from __future__ import annotations

import os

import torch


def world_size() -> int:
    """Processes of this launch (WORLD_SIZE; 1 outside a launcher)."""
    text = os.environ.get("WORLD_SIZE", "1")
    try:
        size = int(text)
    except ValueError:
        size = 0
    if size < 1:
        raise ValueError(f"the environment variable WORLD_SIZE={text!r} must be a process count >= 1 "
                         f"(set by torchrun / accelerate launch)")
    return size


def refuse_several_processes(what: str) -> None:
    """A ValueError when this is one of several launched processes: `what` runs in one process."""
    if world_size() > 1:
        raise ValueError(f"{what} runs in one process, but this is one of {world_size()} launched processes "
                         f"(WORLD_SIZE={world_size()}); run it without torchrun / accelerate launch")


def is_main_process() -> bool:
    """True in a single-process run and on the main process of a multi-process launch."""
    if world_size() <= 1:
        return True
    return int(os.environ.get("RANK", os.environ.get("PROCESS_INDEX", "0"))) == 0


class Distributed:
    """This process's place in the launch: `rank`, `world`, its `device`, a barrier and a gather
    of Python objects. Single process: rank 0 of 1, the barrier and gather do nothing."""

    def __init__(self):
        self.state = None
        self.rank, self.world = 0, 1
        if world_size() > 1:
            try:
                from accelerate import PartialState   # optional: only multi-process launches need it
            except ImportError:
                raise RuntimeError("a multi-process launch needs accelerate: pip install 'dllm[dist]'") from None
            self.state = PartialState(cpu=not torch.cuda.is_available())
            self.rank, self.world = self.state.process_index, self.state.num_processes

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device | None:
        """The launch's device for this process; None in a single-process run."""
        return None if self.state is None else self.state.device

    def barrier(self) -> None:
        if self.state is not None:
            self.state.wait_for_everyone()

    def gather(self, rows: list) -> list:
        if self.state is None:
            return rows
        from accelerate.utils import gather_object
        return gather_object(rows)

    def first_failure(self, failure: str | None) -> str | None:
        """The first failure any process reports (None when none does), so that every process takes
        the same path after a step that failed on some; every process must call it."""
        if self.state is None:
            return failure
        found = [f for f in self.gather([failure]) if f is not None]
        return found[0] if found else None


def run_together(dist, step, what: str):
    """`step()` on this process, then agreement with the others (`first_failure`, also a barrier)
    on whether it failed on any: every process then raises (the failing one its own error, the
    others a RuntimeError naming it), so none waits in a collective for a process that left.
    Returns `step()`'s value; in a single process an error is raised as it comes."""
    value, failure, error = None, None, None
    try:
        value = step()
    except Exception as err:          # noqa: BLE001 - any error on one process must stop every process
        if dist.world == 1:
            raise
        failure, error = f"process {dist.rank}: {type(err).__name__}: {err}", err
    first = dist.first_failure(failure)
    if error is not None:
        raise error
    if first is not None:
        raise RuntimeError(f"{what} failed on another process ({first})")
    return value
