"""The record of one run: its handles and counters, one small dataclass that every `common` module passes around.
A leaf (it imports no other `common` module), so that no import circle runs through `run.py`."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass
class Run:
    """The handles and counters of one run, on every rank. Checkpoints carry the counters."""

    args: Any
    algo: str  # the script's name, from its file: a copy (algos/ppo_mine.py) is "ppo_mine" with no edit
    rank: int
    world_size: int
    device: torch.device
    is_main: bool  # rank 0: the one process that logs, prints and writes checkpoints
    run_dir: Path | None = None
    writer: Any = None  # TensorBoard SummaryWriter on rank 0
    wandb_run: Any = None
    checkpoint: dict | None = None  # the checkpoint this run resumes from
    resume_path: Path | None = None
    started_again: bool = False  # --resume auto of a run directory without a checkpoint: its earlier files moved aside
    init_checkpoint: dict | None = None  # --init-from's checkpoint: a new run starts from its weights
    init_path: Path | None = None
    global_step: int = 0
    iteration: int = 0
    best_eval_return: float = -math.inf
    best_iteration: int = -1  # iteration of the evaluation that gave best_eval_return
    last_train_return: float = math.nan
    sps: float = 0.0
    stop_reason: str | None = None  # set once every rank agrees to stop after this iteration
    save_time_due: bool = False  # --save-interval-seconds has passed on some rank
    seconds: dict = field(default_factory=dict)  # seconds per phase, summed (see `timed`)
    compile_seconds: dict = field(default_factory=dict)  # wall seconds until compiled and captured, per function
    graphs: list = field(default_factory=list)  # the CudaGraphModules of captured(), released in finish()
    interval_seconds: dict = field(default_factory=dict)  # phase -> [seconds, iterations] since the last log
    pending_timings: list = field(default_factory=list)  # (phase, start event, end event) not yet read (CUDA)
    env_log: dict = field(default_factory=dict)  # the env's info["log"]: name -> [sum, steps reported]
    eval_chunks: dict = field(default_factory=dict)  # (eval envs, model, episodes) -> (captured chunk, accumulators)
    start_time: float = field(default_factory=time.time)
    last_save_time: float = field(default_factory=time.time)
    steps_at_start: int = 0
    reduced_step: int = 0  # global step of the last reduce_iteration
    guard: Any = None
    progress: Any = None
    closed: bool = False  # close() ran: graphs, writers and the process group are gone
    observation_space: Any = None  # of one env's "policy" observations (for export)
    action_space: Any = None
    given: set = field(default_factory=set)  # the flags the command line set (see given_flags)
    final_step: int = 0  # the global step the run ends at (begin_training)
    totals: dict = field(default_factory=dict)  # wall and phase seconds of the run's earlier processes (its checkpoint)
    foreign_flags: dict = field(default_factory=dict)  # flags of the resumed run that this script lacks: kept, unused
    algorithm: str | None = None  # the ALGO the script declares (a copy keeps its original's)
    steps_per_iteration: int = 0  # env steps of one iteration over all ranks (begin_training)
    iteration_at_start: int = 0  # the iteration this process started from (a resumed run's checkpoint's)
    last_eval_return: float = math.nan  # of the latest evaluation (a resumed run: its checkpoint's until one runs)
    saved: dict = field(default_factory=dict)  # checkpoint file name -> global step of its last complete write
    uploads: set = field(default_factory=set)  # with --track: checkpoints written since their last wandb artifact
    lock: Any = None  # rank 0 of a training run: the run directory's lock (common.run.take_lock)
    output_failed: bool = False  # a file of the run could not be written: the run ends with one line
    made_dirs: list = field(default_factory=list)  # directories open_run made (deepest first), until training begins
    removed_at: int | None = None  # the global step at which rank 0 found its run directory removed (made again)
    held: Any = None  # the TrainingState of the run's last save: what a run whose directory vanished saves again

    def __post_init__(self):
        self.algorithm = self.algorithm or self.algo

    def say(self, msg: str) -> None:
        """Print a line on rank 0."""
        if self.is_main:
            self.progress.write(msg) if self.progress is not None else print(msg, flush=True)
