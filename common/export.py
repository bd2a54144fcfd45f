"""The trained policy out of the training script: a torch.export program, ONNX and a JSON of its interface.

    python algos/ppo.py --eval-only --resume runs/RUN/checkpoints/best.pt --export exported/

writes `policy.pt2` (`torch.export.load(path).module()`), `policy.onnx` and `policy.json`: raw "policy" observations
[B, ...] (float32, or uint8 frames; a term group: one input per term, in sorted order; a recurrent policy: also
`state` [rows, B, hidden]) to the model's `deterministic` actions, the normalization folded in. torch.export, not
TorchScript: TorchScript is deprecated, and the batch dimension is dynamic by declaration (`Dim("batch")`) rather
than by a tracer's luck. Runtimes without Python take policy.onnx.
"""

from __future__ import annotations

import inspect
import io
import json
import math
import os
import warnings
from pathlib import Path

import gymnasium as gym
import torch
import torch.nn as nn


class DeterministicPolicy(nn.Module):
    """`model.deterministic(obs)` as a module's forward: what gets exported. For a term group (`terms`, its
    term names in sorted order) one input per term, handed to the model as a dict."""

    def __init__(self, model: nn.Module, terms: list[str] | None = None):
        super().__init__()
        self.model, self.terms = model, terms

    def forward(self, *obs: torch.Tensor) -> torch.Tensor:
        return self.model.deterministic(dict(zip(self.terms, obs)) if self.terms else obs[0])


class RecurrentPolicy(nn.Module):
    """`model.recurrent_step(obs, state)` as a module's forward: (obs, state) -> (action, next_state)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.recurrent_step(obs, state)


STATE_RESET_RULE = (
    "zeros at the start of every episode (after a reset, and for an env whose last step terminated or "
    "was truncated); otherwise the next_state of the previous call"
)


def _finite_or_none(values) -> list:
    return [float(v) if math.isfinite(float(v)) else None for v in values]  # strict JSON: no inf


def space_json(space: gym.Space) -> dict:
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "dtype": "int64"}
    return {
        "type": "Box",
        "shape": list(space.shape),
        "dtype": str(space.dtype),
        "low": _finite_or_none(space.low.reshape(-1)),
        "high": _finite_or_none(space.high.reshape(-1)),
    }


def _example(space: gym.Space) -> torch.Tensor:
    """A batch of 4 observations of `space` to trace with (an image's frames stay uint8 [C, H, W])."""
    obs = torch.as_tensor(space.sample())
    obs = obs if obs.dtype == torch.uint8 else obs.float()
    return obs.reshape(1, *space.shape).repeat(4, *[1] * len(space.shape))


@torch.no_grad()
def export_policy(
    out_dir: str | Path, model: nn.Module, observation_space: gym.Space, action_space: gym.Space, info: dict
) -> Path:
    """Write policy.pt2, policy.onnx and policy.json of `model.deterministic` to `out_dir` (on CPU)."""
    import copy

    out = Path(out_dir)
    recurrent = hasattr(model, "recurrent_step")
    terms = sorted(observation_space.spaces) if isinstance(observation_space, gym.spaces.Dict) else None
    if terms and recurrent:
        raise SystemExit("error: --export of a recurrent policy on a group of terms is not supported yet")
    model = copy.deepcopy(model).cpu().float()
    policy = (RecurrentPolicy(model) if recurrent else DeterministicPolicy(model, terms)).eval()
    spaces = [observation_space[k] for k in terms] if terms else [observation_space]
    example = tuple(_example(space) for space in spaces)
    # a term group: one input per term, named after it in ONNX (positional in the pt2 program)
    inputs = terms or ["obs"]
    names = {
        "input_names": inputs,
        "output_names": ["action"],
        "dynamic_axes": {**{name: {0: "batch"} for name in inputs}, "action": {0: "batch"}},
    }
    if recurrent:
        rows, hidden = model.state_shape
        example += (torch.zeros(rows, 4, hidden),)
        names = {
            "input_names": ["obs", "state"],
            "output_names": ["action", "next_state"],
            "dynamic_axes": {**names["dynamic_axes"], "state": {1: "batch"}, "next_state": {1: "batch"}},
        }
    batch = torch.export.Dim("batch")  # obs [B, ...]; state [rows, B, hidden]
    dynamic = ({0: batch}, {1: batch}) if recurrent else (({0: batch},) * len(example),)
    # both models in memory first, then the three files written together (write_together): a failed write leaves
    # the earlier export whole, and a full disk is the OSError of a write, not an exporter's error about it
    pt2, onnx_model = io.BytesIO(), io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # exporters' notices (an RNN's weights re-flattened, the ONNX exporter's)
        program = torch.export.export(policy, example, dynamic_shapes=dynamic)
        torch.export.save(program, pt2)
        kwargs = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
        torch.onnx.export(policy, example, onnx_model, **names, **kwargs)
    meta = {
        **info,
        "files": {"torch_export": "policy.pt2", "onnx": "policy.onnx"},
        "input": {
            "name": "obs",
            "key": "policy",
            "batch_dim": 0,
            "observation_space": space_json(observation_space),
            "normalization": "included: pass raw observations",
        }
        if not terms
        else {
            "names": terms,
            "key": "policy",
            "batch_dim": 0,
            "normalization": "included: pass raw observations",
            "observation_spaces": {k: space_json(observation_space[k]) for k in terms},
        },
        "output": {
            "name": "action",
            "action_space": space_json(action_space),
            "note": "deterministic action in the env's units, within its bounds",
        },
    }
    if recurrent:
        meta["state"] = {
            "input": "state",
            "output": "next_state",
            "shape": [rows, "batch", hidden],
            "batch_dim": 1,
            "dtype": "float32",
            "initial": "zeros",
            "reset": STATE_RESET_RULE,
        }
    files = {"policy.pt2": pt2.getvalue(), "policy.onnx": onnx_model.getvalue()}
    write_together(out, {**files, "policy.json": json.dumps(meta, indent=2).encode()})
    return out


def write_together(out: Path, files: dict[str, bytes]) -> None:
    """Write `files` ({name: bytes}) into the folder `out` as one: each to a synced temporary file beside it, then all
    renamed over the old ones. A failed write (OSError) leaves the earlier files and no temporary file behind."""
    out.mkdir(parents=True, exist_ok=True)
    tmps = {name: out / f".{name}.{os.getpid()}.tmp" for name in files}
    try:
        for name, data in files.items():
            with open(tmps[name], "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        for name in files:
            os.replace(tmps[name], out / name)
    finally:
        for tmp in tmps.values():
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass  # a folder that went read-only or away: nothing more to clean
