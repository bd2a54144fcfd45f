"""The device-kernel guard: no op inside a compiled or captured function that goes to another kernel on each device.

Every function a script gives `compiled()` or `captured()` (and the evaluation step that common/evaluation.py compiles
and captures) is traced by dynamo here, on the CPU, in the script's built-in and pixel layouts (of
CONTRACT[algo]["captures"] in tests/contract.py), and no graph dynamo builds for it may hold an op of DEVICE_KERNELS:
the fused RNN ops and the ops of one vendor's library (cuDNN, oneDNN, MIOpen). Such an op compiles and passes every
parity test on a CPU and can fail on a GPU, where the same call goes to another kernel: ppo_lstm's acting step through
`torch.lstm` did, dynamo's fake-tensor trace of it stopped on CUDA (torch 2.11) while the CPU suite passed. That failure
itself cannot be reproduced on a CPU (a fake CUDA `torch.lstm` under FakeTensorMode on a CPU build of torch gives the
right shapes: the failure is in the CUDA build's path), so the guard names the ops instead of running them on a GPU.

Dynamo only traces here (a backend that records each graph and runs it as traced: no inductor), so a layout costs
seconds. What runs eagerly in a frame that dynamo gives up on is not seen."""

from __future__ import annotations

import collections
import re
import sys

import pytest
import torch

from tests.helpers import ROOT, load_script
from tests.pixel_env import CATCH, Catch
from tests.contract import CONTRACT, SCRIPTS
from tests.test_scripts import train, units

# The ops that dispatch to a different fused kernel per device: the fused RNNs and their cells (torch.lstm, gru,
# rnn_tanh, rnn_relu, lstm_cell, ...; nn.LSTM / nn.GRU call them), the CUDA cells they decompose to
# (_thnn_fused_*), and anything named for cuDNN, oneDNN (mkldnn) or MIOpen. Matched against the op's name
# (torch.lstm, torch._VF.lstm and aten.lstm.input are all "lstm").
DEVICE_KERNELS = re.compile(r"^_?(quantized_)?(lstm|gru|rnn_tanh|rnn_relu)(_cell)?$|^_thnn_fused_|cudnn|mkldnn|miopen")


def op_name(gm: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
    """The name of the op a graph node calls (None for inputs, outputs and attributes); a call of an nn.RNN /
    nn.LSTM / nn.GRU module (or a cell module) left whole in the graph is named by its class."""
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        return f"nn.{type(module).__name__}" if isinstance(module, (torch.nn.RNNBase, torch.nn.RNNCellBase)) else None
    if node.op not in ("call_function", "call_method"):
        return None
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
    return name.split("::")[-1].split(".")[0]  # aten's "lstm.input" -> "lstm"


def device_kernels(gm: torch.fx.GraphModule) -> list[str]:
    """The ops of DEVICE_KERNELS that a dynamo graph (and any graph nested in it) calls."""
    found = []
    for sub in gm.modules():
        if isinstance(sub, torch.fx.GraphModule):
            for node in sub.graph.nodes:
                name = op_name(sub, node)
                if name is not None and (name.startswith("nn.") or DEVICE_KERNELS.search(name)):
                    found.append(name)
    return found


class TracedGraphs:
    """Stand-ins for `compiled` and `captured` that torch.compile every function given to them with a backend
    recording the graphs dynamo builds, by the function's name, and running them as traced. A captured function
    is traced whole, the compiled functions it calls inlined into its graphs (so what it runs outside of them is
    seen too); `captured(..., capture=False)` (an adapter's rollout, stepped eagerly) is left as it is."""

    def __init__(self):
        self.graphs: dict[str, list[torch.fx.GraphModule]] = collections.defaultdict(list)
        self.called: set[str] = set()  # the captured functions called (from eager code: the scripts' loops)

    def _traced(self, name: str, fn):
        def record(gm: torch.fx.GraphModule, example_inputs):
            self.graphs[name].append(gm)
            return gm.forward

        return torch.compile(fn, backend=record)

    def compiled(self, run, fn):
        return self._traced(getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", "?"), fn)

    def captured(self, run, name: str, fn, capture: bool = True):
        if not capture:
            return fn
        traced = self._traced(name, fn)

        def call(*args, **kwargs):
            self.called.add(name)
            return traced(*args, **kwargs)

        return call

    def found(self) -> dict[str, list[str]]:
        """{function: the DEVICE_KERNELS ops of its graphs}, for the functions whose graphs hold any."""
        found = {
            name: sorted({op for gm in graphs for op in device_kernels(gm)}) for name, graphs in self.graphs.items()
        }
        return {name: ops for name, ops in found.items() if ops}

    def untraced(self) -> list[str]:
        """The captured functions called without a graph of theirs holding an op (the guard would have seen nothing)."""
        return sorted(
            name
            for name in self.called
            if not any(op_name(gm, n) is not None for gm in self.graphs[name] for n in gm.graph.nodes)
        )


def traced_graphs(monkeypatch, module) -> TracedGraphs:
    """Install TracedGraphs in a script's module and in common.evaluation (its evaluation step, whose captured
    chunk of steps is made short: dynamo unrolls the chunk, and every step in it is the same)."""
    import common.evaluation

    traced = TracedGraphs()
    for target in (module, common.evaluation):  # the script's compile-and-capture block, the evaluation's chunk
        for name in ("compiled", "captured"):
            if hasattr(target, name):
                monkeypatch.setattr(target, name, getattr(traced, name))
    monkeypatch.setattr(common.evaluation, "EVAL_CHUNK", 2)  # the captured chunk repeats one step: 2 trace as 64 do
    return traced


@pytest.fixture(autouse=True)
def pixel_env(monkeypatch):
    """Catch among the built-in envs of this process, for the layouts on pixels (as in tests/test_scripts.py)."""
    import common.envs

    monkeypatch.setitem(common.envs.BUILTIN_ENVS, CATCH, Catch)


def guarded_run(algo: str, out, **settings) -> None:
    """A tiny run of `algo` compiled, with an evaluation: every function it compiles and captures is called. Dynamo
    unrolls a captured function's loops, and each turn traces to the same ops, so the loops are short here: rollouts
    of 2 steps and one epoch where a script has them (the layout's ops are the same at any length)."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(load_script(algo).Args)}
    short = {k: v for k, v in (("num_steps", 2), ("update_epochs", 1)) if k in fields and k not in settings}
    train(
        algo,
        out,
        compile=True,
        total_timesteps=units(algo, 2),
        eval_interval=CONTRACT[algo]["sync"],
        **short,
        **settings,
    )


def guarded_layouts(algo: str) -> list[int]:
    """The layouts of CONTRACT[algo]["captures"] the guard traces: the built-in env's (every function the script
    compiles and captures, its networks among them) and the first on pixels (the image encoders' convolutions).
    The other layouts regroup the same networks' ops into other captured functions (an adapter's acting step,
    td3's actor phases); compiled against eager, tests/test_scripts.py runs them all. Each traced layout costs
    seconds of dynamo; the suite keeps to its budget."""
    captures = CONTRACT[algo]["captures"]
    return [0] + [i for i, c in enumerate(captures) if i and "encoder" in c][:1]


@pytest.mark.parametrize("algo, variant", [(algo, i) for algo in SCRIPTS for i in guarded_layouts(algo)])
def test_compiled_and_captured_functions_hold_no_device_dispatched_kernel(algo, variant, tmp_path, monkeypatch):
    """In a script's layouts of compiled and captured functions (guarded_layouts), with an evaluation, every
    function given to compiled() or captured() is traced by dynamo, and no graph of any of them holds an op of
    DEVICE_KERNELS (a fused RNN, a cuDNN/oneDNN/MIOpen op): on CUDA each would go to another kernel than the
    one the CPU suite traced and ran."""
    traced = traced_graphs(monkeypatch, load_script(algo))
    guarded_run(algo, tmp_path, **CONTRACT[algo]["captures"][variant])
    assert traced.called and not traced.untraced(), (traced.called, traced.untraced())
    assert traced.found() == {}, f"device-dispatched kernels in compiled or captured functions: {traced.found()}"


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
    did before; both compile and agree with eager on a CPU) fails the guard, which names the op and the
    function: the rollout (acting, compiled with the env step, is traced whole in it), the targets (the value of
    the next observation), the minibatch update (the replay) and the evaluation step."""
    text = (ROOT / "algos" / "ppo_lstm.py").read_text()
    for old, new in FUSED_RNN:
        assert text.count(old) == 1, "algos/ppo_lstm.py changed: the fused-RNN copy no longer applies"
        text = text.replace(old, new)
    path = tmp_path / "ppo_lstm_fused.py"
    path.write_text(text)
    monkeypatch.setitem(CONTRACT, "ppo_lstm_fused", CONTRACT["ppo_lstm"])
    try:
        traced = traced_graphs(monkeypatch, load_script("ppo_lstm_fused", path))
        guarded_run("ppo_lstm_fused", tmp_path / "runs")
    finally:
        sys.modules.pop("ppo_lstm_fused", None)  # load_script keeps the module by name
    assert traced.found() == {
        "rollout": ["lstm"],
        "targets_fn": ["lstm"],
        "update_minibatch": ["lstm_cell"],
        "evaluation": ["lstm"],
    }, traced.found()
