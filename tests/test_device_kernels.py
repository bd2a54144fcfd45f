"""The device-kernel guard: no op inside a captured function that goes to another kernel on each device.

The captured-replay test (tests/test_scripts.py) watches every call it records of every function a script captures
(and of the evaluation's chunk), in every capture layout of CONTRACT[algo]["captures"], at torch's Python surface for
the ops of tests/replay.py's DEVICE_KERNELS: the fused RNN ops and the ops of one vendor's library (cuDNN, oneDNN,
MIOpen). Such an op compiles and passes every parity test on a CPU and can fail on a GPU, where the same call goes to
another kernel: ppo_lstm's acting step through `torch.lstm` did, dynamo's fake-tensor trace of it stopped on CUDA (torch
2.11) while the CPU suite passed. That failure itself cannot be reproduced on a CPU (a fake CUDA `torch.lstm` under
FakeTensorMode on a CPU build of torch gives the right shapes: the failure is in the CUDA build's path), so the guard
names the ops instead of running them on a GPU. The calls are those dynamo traces into a compiled function's graph
(nn.LSTM's forward calls torch._VF.lstm), seen in the eager run the replay test makes anyway: no run of its own.

Here: the guard fails a copy of ppo_lstm.py that puts the fused ops back, naming each op, its function and its line."""

from __future__ import annotations

import sys

import pytest

from tests.contract import CONTRACT
from tests.helpers import ROOT, load_script
from tests.replay import assert_no_device_kernels, record_captured
from tests.test_scripts import train, units

# Today's ppo_lstm with the fused ops it used to call put back: torch.lstm / torch.gru for acting (compiled with the
# env step, or captured as the acting step), torch.lstm_cell in the replay of the update.
FUSED_RNN = [
    (
        "        return nets.rnn_step(self.rnn, self.encoder(policy_obs_n), state)\n",
        "        layers, x = self.rnn.num_layers, self.encoder(policy_obs_n).unsqueeze(0)\n"
        "        weights = [getattr(self.rnn, f'{w}_l{i}') for i in range(layers) for w in ('weight_ih', 'weight_hh', "
        "'bias_ih', 'bias_hh')]\n"
        "        out, h, c = torch.lstm(x, (state[:layers], state[layers:]), weights, True, layers, 0.0, False, False, "
        "False)\n"
        "        return out[0], torch.cat([h, c])\n",
    ),
    (
        "            out, state = nets.rnn_step(self.rnn, features[t], state * keep[t])\n",
        "            h, c = torch.lstm_cell(features[t], tuple(state * keep[t]), self.rnn.weight_ih_l0, "
        "self.rnn.weight_hh_l0,\n"
        "                                   self.rnn.bias_ih_l0, self.rnn.bias_hh_l0)\n"
        "            out, state = h, torch.stack([h, c])\n",
    ),
]


def test_the_guard_names_a_fused_rnn_put_back_into_ppo_lstm(tmp_path, monkeypatch):
    """A copy of algos/ppo_lstm.py that acts through torch.lstm and replays through torch.lstm_cell (what it
    did before; both compile and agree with eager on a CPU) fails the guard, which names the op, the captured
    function and the copy's line: the rollout (acting), the update (the value of the next observation in its
    targets, torch.lstm; the replay of its minibatches, torch.lstm_cell) and the evaluation step."""
    text = (ROOT / "algos" / "ppo_lstm.py").read_text()
    for old, new in FUSED_RNN:
        assert text.count(old) == 1, "algos/ppo_lstm.py changed: the fused-RNN copy no longer applies"
        text = text.replace(old, new)
    path = tmp_path / "ppo_lstm_fused.py"
    path.write_text(text)
    lines = text.splitlines()
    acting = 1 + next(i for i, line in enumerate(lines) if "torch.lstm(x, " in line)
    replay = 1 + next(i for i, line in enumerate(lines) if "torch.lstm_cell(" in line)
    monkeypatch.setitem(CONTRACT, "ppo_lstm_fused", CONTRACT["ppo_lstm"])
    try:
        signatures = record_captured(monkeypatch, load_script("ppo_lstm_fused", path))
        sync = CONTRACT["ppo_lstm"]["sync"]
        train("ppo_lstm_fused", tmp_path / "runs", total_timesteps=units("ppo_lstm", 2), eval_interval=sync)
    finally:
        sys.modules.pop("ppo_lstm_fused", None)  # load_script keeps the module by name
    at = lambda line: f"(ppo_lstm_fused.py:{line})"  # noqa: E731
    assert signatures.device_kernels == {
        "rollout": {f"lstm {at(acting)}"},
        "update": {f"lstm {at(acting)}", f"lstm_cell {at(replay)}"},
        "evaluation": {f"lstm {at(acting)}"},
    }, signatures.device_kernels
    with pytest.raises(AssertionError, match=r"^device-dispatched kernels in captured functions: evaluation: lstm"):
        assert_no_device_kernels(signatures)
