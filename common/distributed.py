"""torchrun glue: process-group setup, parameter broadcast, gradient and statistics reduction. Without torchrun every
helper is a no-op; under it a lone process joins a group too, so one GPU checks the distributed code paths."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    is_main: bool  # rank 0: the one process that logs, prints and writes checkpoints

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """ "auto" -> this rank's GPU if there is one, else the CPU; "cuda" -> cuda:LOCAL_RANK."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("error: --device cuda was asked for, but torch sees no CUDA device; use --device cpu")
        if dev.index is None:
            dev = torch.device("cuda", local_rank)
    return dev


def setup(device: str = "auto", timeout_seconds: float = 600.0) -> DistInfo:
    """Join torchrun's process group when launched by it (one rank included), else describe the lone process.
    `timeout_seconds` bounds every collective: a dead or hung rank makes the others fail instead of wait forever."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if "WORLD_SIZE" in os.environ and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        kwargs = {"device_id": dev} if dev.type == "cuda" else {}
        timeout = timedelta(seconds=timeout_seconds)
        store = _restart_scoped_store(world_size, timeout)
        if store is not None:
            kwargs.update(store=store, rank=rank, world_size=world_size)
        dist.init_process_group(backend=backend, timeout=timeout, **kwargs)
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=dev, is_main=rank == 0)


def _restart_scoped_store(world_size: int, timeout: timedelta):
    """The launcher's key-value store, keys scoped to this restart of the worker group (None outside it): unscoped,
    a restarted rank can read dead workers' addresses ("connectFullMesh failed ... Connection refused"). The scope
    assumes every agent counts the same restarts (one node); multi-node runs set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    base = dist.TCPStore(
        host_name=os.environ["MASTER_ADDR"],
        port=int(os.environ["MASTER_PORT"]),
        world_size=world_size,
        is_master=False,
        timeout=timeout,
    )
    return dist.PrefixStore(f"worker-group-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", base)


def is_distributed() -> bool:
    """Whether the collectives run: in a process group, of any size (see the module's docstring)."""
    return dist.is_available() and dist.is_initialized()


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _unflatten_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


@torch.no_grad()
def broadcast_module(module: torch.nn.Module, src: int = 0) -> None:
    """Copy rank `src`'s parameters and buffers to every rank (identical initial weights)."""
    if not is_distributed():
        return
    tensors = [t for t in list(module.parameters()) + list(module.buffers())]
    # sorted: set order follows object ids, which differ between processes
    for dtype in sorted({t.dtype for t in tensors}, key=str):
        group = [t for t in tensors if t.dtype == dtype]
        flat = _flat([t.data for t in group])
        dist.broadcast(flat, src=src)
        _unflatten_into(flat, [t.data for t in group])


@torch.no_grad()
def all_reduce_gradients(params) -> None:
    """Average the gradients of `params` over all ranks in one flat all-reduce (latency dominates for small
    networks). A missing gradient counts as zero, so every rank calls the collective with the same size."""
    if not is_distributed():
        return
    params = [p for p in params if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    flat = _flat(grads)
    flat /= dist.get_world_size()
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    _unflatten_into(flat, grads)


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In-place sum / mean / max / min of `tensor` across ranks; returns it."""
    if not is_distributed():
        return tensor
    ops = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    dist.all_reduce(tensor, op=ops[op])
    if op == "mean":
        tensor /= dist.get_world_size()
    return tensor


def all_gather_object(obj) -> list:
    """Every rank's `obj` (picklable), in rank order; [obj] in a lone process."""
    if not is_distributed():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_object(obj, dst: int = 0) -> list | None:
    """Every rank's `obj`, in rank order, on rank `dst` only (None elsewhere). Send CPU tensors: they stay on CPU."""
    if not is_distributed():
        return [obj]
    out = [None] * dist.get_world_size() if dist.get_rank() == dst else None
    dist.gather_object(obj, out, dst=dst)
    return out


def broadcast_object(obj, src: int = 0):
    """Rank `src`'s `obj` on every rank (e.g. a decision taken on rank 0's statistics)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


# What gloo and NCCL say when a collective's peer is gone: the backend's source path, a phrase of the transport
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted")


def lost_peer(error: BaseException) -> str | None:
    """The one line of a collective that failed because another rank of the job ended (a kill, a crash on that rank,
    a lost node), else None. The backends raise a RuntimeError of several lines, prefixed with the path of their
    source, which says less to a user than this rank's own account."""
    if not is_distributed() or not isinstance(error, RuntimeError):
        return None
    text = str(error)
    backend_error = isinstance(error, getattr(dist, "DistBackendError", ()))
    if not backend_error and not any(phrase in text for phrase in _PEER_GONE):
        return None
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    if first.startswith("[") and "] " in first:  # "[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer"
        first = first.split("] ", 1)[1]
    cause = first.split(". ")[0].rstrip(".")
    return (
        f"error: rank {dist.get_rank()} of {dist.get_world_size()} lost another rank of the job in a collective "
        f"({cause}): that rank ended (killed, failed or its node lost; its own output or the launcher's says why)"
    )


class PreemptionGuard:
    """Turns SIGTERM / SIGUSR1 / SIGINT into a request to stop after the current iteration (a second one exits at
    once). Scripts fold `received` into their per-iteration all-reduce: every rank stops after the same iteration."""

    SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")

    def __init__(self):
        self.received: str | None = None
        self._received_at = 0.0
        self._previous = {}
        for name in self.SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        now = time.monotonic()
        # A launcher forwards the signal it got (SLURM signals every process, torchrun then signals
        # its workers again): a repeat within a second is the same request, not an insistence.
        if self.received is not None:
            if now - self._received_at > 1.0:
                os._exit(128 + signum)
            return
        self.received, self._received_at = signal.Signals(signum).name, now
        if os.environ.get("RANK", "0") == "0":  # said at once, by one process: the iteration may take seconds
            second = "Ctrl-C" if self.received == "SIGINT" else "signal"
            print(
                f"{self.received}: stopping after this iteration: saving last.pt; "
                f"a second {second} ends without saving",
                flush=True,
            )

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


@torch.no_grad()
def params_checksum(module: torch.nn.Module) -> int:
    """An exact integer fingerprint of the parameters' bits (equal iff bit-identical, in practice)."""
    total = 0
    for i, p in enumerate(module.parameters()):
        bits = p.detach().reshape(-1).contiguous()
        bits = bits.view(
            torch.int32 if bits.element_size() == 4 else torch.int16 if bits.element_size() == 2 else torch.int64
        )
        weights = torch.arange(1, bits.numel() + 1, device=bits.device, dtype=torch.int64) * (i + 1)
        total += int((bits.to(torch.int64) * weights).sum().item())
    return total


def check_in_sync(module: torch.nn.Module) -> bool:
    """True if every rank holds bit-identical parameters (a collective; cheap, for checkpoints and the end)."""
    if not is_distributed():
        return True
    sums = all_gather_object(params_checksum(module))
    return all(s == sums[0] for s in sums)
