"""The CPU checks of the capture contract catch what they say they catch: the host-sync recorder
(tests/host_sync.py) and the Python-state check (tests/replay.py), on their own and on copies of
algos/ppo.py with one of tests/helpers.py's MUTATIONS (written to tmp_path; algos/ is never edited).
tests/test_bench.py shows gpu_check's CPU part failing on the same copies."""

from __future__ import annotations

import operator
import re

import numpy as np
import pytest
import torch

from tests.helpers import load_script, mutated_ppo, run_main
from tests.host_sync import RecordHostSyncs
from tests.replay import (
    assert_keeps_python_state,
    assert_no_host_sync,
    assert_replays_alike,
    changes,
    python_state,
    record_captured,
)
from tests.contract import COMMON, CONTRACT
from tests.test_scripts import units


def test_the_recorder_catches_each_read_to_the_host_once_and_nothing_else():
    """Each read is recorded once, by its name, including those that dispatch no aten op on a CPU
    tensor (.cpu(), .tolist(), .numpy(), .to("cpu"), repr); ops that keep values on the device are not."""
    t, s, i = torch.arange(3.0), torch.tensor(2.0), torch.tensor(1)
    reads = {
        "cpu": lambda: t.cpu(),
        "tolist": lambda: t.tolist(),
        "numpy": lambda: t.numpy(),
        "item": lambda: s.item(),
        "__bool__": lambda: bool(s),
        "__int__": lambda: int(s),
        "__float__": lambda: float(s),
        "__index__": lambda: operator.index(i),
        "__repr__": lambda: repr(t),
        "__format__": lambda: f"{s:.2f}",
        "__array__": lambda: np.asarray(t),
        "to(cpu)": lambda: t.to("cpu"),
        "nonzero": lambda: t.nonzero(),
        "index": lambda: t[t > 1],
        "_local_scalar_dense": lambda: t[i],  # a 0-d index is read in C++
        "normal": lambda: torch.normal(t, t + 1),
    }  # Normal.sample(): std >= 0 checked with .item() on CUDA too
    for name, read in reads.items():
        with RecordHostSyncs() as recorder:
            read()
        assert recorder.syncs == [name], (name, recorder.syncs)
    with RecordHostSyncs() as recorder:  # on the device, whatever the device: no read
        t + 1, t.to(torch.float64), t.to(torch.device("cpu")), t.sum(), torch.where(t > 1, t, 0.0), t[1:], t.clone()
        torch.normal(t, 1.0), torch.empty_like(t).normal_(), torch.multinomial(t + 1, 1, True)  # checked on the device
    assert recorder.syncs == []
    with RecordHostSyncs() as recorder:
        torch.normal(mean=t, std=t + 1)
    assert recorder.syncs == ["normal"]


@pytest.mark.parametrize("kind", ["categorical", "normal"])
def test_sample_draws_what_torch_samples_without_a_host_read(kind):
    """common.nets.sample (the scripts' acting draw) gives torch's .sample() numbers from the same generator state,
    float32 and float64, and reads nothing back: a CUDA graph captures it eagerly too."""
    from common.nets import sample

    for dtype in (torch.float32, torch.float64):
        out = torch.randn(4096, 6, dtype=dtype)
        if kind == "categorical":
            d = torch.distributions.Categorical(logits=out * 3, validate_args=False)
        else:
            d = torch.distributions.Normal(out, torch.rand(6, dtype=dtype).expand_as(out), validate_args=False)
        torch.manual_seed(7)
        expected = d.sample()
        torch.manual_seed(7)
        with RecordHostSyncs() as recorder:
            drawn = sample(d)
        assert recorder.syncs == []
        assert torch.equal(drawn, expected) and drawn.dtype == expected.dtype and not drawn.requires_grad
        assert not torch.equal(sample(d), drawn)  # the generator moved on


COUNTER = 0


def test_python_state_sees_closure_cells_run_attributes_and_module_attributes():
    """What a replay would not redo shows as a change; a tensor written in place (which a replay
    redoes) does not."""
    from common.run import Run

    global COUNTER
    run = Run(args=None, algo="x", rank=0, world_size=1, device=torch.device("cpu"), is_main=True)
    sums, live, calls = {}, torch.zeros(2), 0

    def fn(kind):
        nonlocal live, calls
        global COUNTER
        if kind == "cell":
            calls += 1
        elif kind == "run":
            run.sps += 1.0
        elif kind == "module":
            COUNTER += 1
        elif kind == "key":
            sums["new"] = torch.zeros(())
        elif kind == "rebound":
            live = live + 1
        else:
            live.add_(1)

    expected = {
        "cell": "fn.<calls>: 0 -> 1",
        "run": "fn.<run>.sps: 0.0 -> 1.0",
        "module": f"{__name__}.COUNTER: 0 -> 1",
        "key": "fn.<sums>",
        "rebound": "fn.<live>: tensor@",
    }
    for kind, change in expected.items():
        before = python_state(fn, run)
        fn(kind)
        found = changes(before, python_state(fn, run))
        assert len(found) >= 1 and found[0].startswith(change), (kind, found)
    before = python_state(fn, run)
    fn("in place")
    assert changes(before, python_state(fn, run)) == []
    compiled = torch.compile(fn)  # seen through torch.compile's wrapper (never called here: nothing compiles)
    before = python_state(compiled, run)
    fn("cell")
    assert changes(before, python_state(compiled, run)) == ["fn.<compiled>.<calls>: 1 -> 2"]
    COUNTER = 0


@pytest.mark.parametrize(
    "mutation, message",
    [
        ("tolist", r"update: call 2 reads tensors on the host \(tolist\)"),
        (
            "counter",
            r"update: call 2 changes Python state, which a graph replay would not: "
            r"update_fn\.<iterations_in_stats>: 1 -> 2",  # the captured update_fn, its counter
        ),
    ],
    ids=["tolist", "counter"],
)
def test_the_capture_contract_fails_a_captured_function_with_a_host_read_or_python_state(
    mutation, message, tmp_path, monkeypatch
):
    """The capture contract test's checks (tests/test_scripts.py) on a copy of ppo.py with a `.tolist()`
    in its captured update, or a Python counter of the iterations kept in it: the copy trains as ppo
    does on a CPU, and the check of its update fails, naming it; every other captured function passes."""
    path = mutated_ppo(tmp_path, mutation)
    module = load_script(path.stem, path)
    signatures = record_captured(monkeypatch, module)
    run_main(
        module,
        **{
            **COMMON,
            **CONTRACT["ppo"]["kwargs"],
            "output_dir": str(tmp_path / "out"),
            "total_timesteps": units("ppo", 3),
        },
    )
    assert {"rollout", "update"} <= set(signatures)
    for name, calls in signatures.items():
        checks = (assert_replays_alike, assert_no_host_sync, assert_keeps_python_state)
        if name != "update":
            for check in checks:
                check(name, calls)
            continue
        failed = []
        for check in checks:
            try:
                check(name, calls)
            except AssertionError as e:
                failed.append(str(e))
        assert len(failed) == 1 and re.match(message, failed[0]), failed


def test_the_guard_reports_a_foreach_write_to_each_tensor_of_its_list(monkeypatch):
    """common.capture.graph_writes follows a foreach op's list: `torch._foreach_add_([ema], 1.0)` writes the 0-d
    float64 `ema` as `ema.add_(1.0)` does, and `_foreach_mul_([w, ema], 2.0)` writes both. Where the probe finds
    such writes lost (stood in for here: the torch at hand may keep them), the guard names the tensor and runs the
    graph uncompiled, with eager's result."""
    from types import SimpleNamespace

    import common.capture
    from common.capture import compiled, graph_writes

    found = []

    def recording(gm, example_inputs):
        found.extend(graph_writes(gm))
        return gm.forward

    def writes(ema, w):
        torch._foreach_add_([ema], 1.0)
        torch._foreach_mul_([w, ema], 2.0)
        ema.add_(1.0)

    ema, w = torch.ones((), dtype=torch.float64), torch.ones(3)
    torch._dynamo.reset()
    torch.compile(writes, backend=recording, fullgraph=True)(ema, w)
    names = [("ema" if "ema" in name else "w" if "w" in name else name, form, kind) for name, form, kind in found]
    assert names == [  # the input's name as dynamo's source gives it: L['ema'] on torch 2.13
        ("ema", "foreach", (torch.float64, True)),
        ("w", "foreach", (torch.float32, False)),
        ("ema", "foreach", (torch.float64, True)),
        ("ema", "method", (torch.float64, True)),
    ], found
    assert "foreach" in common.capture.PROBED_FORMS  # the probe tries the form it may have to guard

    said = []
    run = SimpleNamespace(args=SimpleNamespace(compile=True), device=torch.device("cpu"), say=said.append)
    monkeypatch.setattr(common.capture, "lost_writes", lambda device: frozenset({("foreach", torch.float64, True)}))
    torch._dynamo.reset()
    ema, w = torch.ones((), dtype=torch.float64), torch.ones(3)
    compiled(run, writes)(ema, w)
    assert ema.item() == 5.0 and torch.equal(w, torch.full((3,), 2.0))
    assert len(said) == 1 and re.fullmatch(
        r"notice: writes writes in place to .*ema.*, a write .* runs uncompiled", said[0]
    )


@pytest.mark.parametrize(
    "module, refused",
    [
        (lambda: torch.nn.LSTM(3, 8, proj_size=4), r"an LSTM with proj_size=4"),
        (lambda: torch.nn.LSTM(3, 8, bidirectional=True), r"a bidirectional LSTM"),
        (lambda: torch.nn.GRU(3, 8, num_layers=2, bidirectional=True), r"a bidirectional GRU"),
        (lambda: torch.nn.GRU(3, 8, num_layers=2, dropout=0.5), r"a GRU with dropout=0.5 between its layers"),
        (lambda: torch.nn.RNN(3, 8), r"a RNN"),
    ],
    ids=["proj_size", "bidirectional-lstm", "bidirectional-gru", "dropout", "rnn"],
)
def test_rnn_step_refuses_in_one_line_what_it_does_not_compute(module, refused):
    """common.nets.rnn_step (the recurrent scripts' step as matmuls) on a module it would take to a matmul shape
    error (an LSTM's projection) or whose weights it would silently leave out (a bidirectional module's reverse
    direction, dropout between layers): one line naming what it is. The modules it computes still step, to the
    module's own numbers."""
    from common.nets import rnn_step

    rnn = module()
    state = torch.zeros(4 * rnn.num_layers, 5, 8)
    with pytest.raises(
        SystemExit, match=rf"^error: common\.nets\.rnn_step steps a unidirectional nn\.LSTM or nn\.GRU, not {refused}"
    ):
        rnn_step(rnn, torch.randn(5, 3), state)
    for cell in (torch.nn.LSTM(3, 8, num_layers=2), torch.nn.GRU(3, 8, num_layers=2, dropout=0.0)):
        k = 2 if isinstance(cell, torch.nn.LSTM) else 1
        x, state = torch.randn(5, 3), torch.randn(k * 2, 5, 8)
        with torch.no_grad():
            out, next_state = rnn_step(cell, x, state)
            if k == 2:
                expected, (h, c) = cell(x[None], tuple(state.chunk(2)))
                expected_state = torch.cat([h, c])
            else:
                expected, expected_state = cell(x[None], state)
        torch.testing.assert_close(out, expected[0])
        torch.testing.assert_close(next_state, expected_state)


# A td3 copy whose captured update calls the critic step it kept from before the wrapping: under --compile and
# --cudagraphs its graph would hold the eager critic step (what an alias taken before compiled() still reads).
EAGER_CRITIC = [
    (
        "    critic_step, actor_step = compiled(run, critic_step), compiled(run, actor_step)\n",
        "    critic_eager = critic_step  # the function from before the wrapping\n"
        "    critic_step, actor_step = compiled(run, critic_step), compiled(run, actor_step)\n",
    ),
    (
        '            add_step(stats["critic"], critic_step(batch))\n',
        '            add_step(stats["critic"], critic_eager(batch))\n',
    ),
]


def test_the_capture_contract_fails_a_captured_function_that_runs_a_compiled_body_eagerly(tmp_path, monkeypatch, capfd):
    """assert_runs_compiled names the captured update of a td3 copy that calls its critic step uncompiled; the copy
    trains as td3 does on a CPU, so nothing else would show it but the run's own warning (common.capture's
    unwrapped_calls, which td3.py calls after its compile-and-capture block)."""
    from tests.replay import assert_runs_compiled
    from tests.test_copies import copy_text

    path = tmp_path / "td3_eager_critic.py"
    path.write_text(copy_text("td3", EAGER_CRITIC, least=2))
    module = load_script(path.stem, path)
    signatures = record_captured(monkeypatch, module)
    run_main(
        module,
        **{
            **COMMON,
            **CONTRACT["td3"]["kwargs"],
            "output_dir": str(tmp_path / "out"),
            "total_timesteps": units("td3", 3),
        },
    )
    assert list(signatures.eager) == ["update"] and len(signatures.eager["update"]) == 1, signatures.eager
    with pytest.raises(AssertionError, match=r"update: critic_step \(line \d+\)$"):
        assert_runs_compiled(signatures)
    said = capfd.readouterr().out
    assert "warning: update holds critic_step unwrapped (cell critic_eager): it runs the function from before" in said


def test_unwrapped_calls_names_each_closure_that_kept_a_function_from_before_its_wrapping(monkeypatch):
    """common.capture.unwrapped_calls(run, names) after a block that rebinds names to what compiled() and captured()
    return: a closure that reads a rebound name sees the wrapper (nothing said); one that kept the function itself in
    an alias, a default argument or a functools.partial is named, once, through torch.compile's and captured()'s
    wrappers alike; where neither wraps (no --compile, no --cudagraphs) nothing was wrapped and nothing is said."""
    import functools
    from types import SimpleNamespace

    import common.capture
    from common.capture import captured, compiled, unwrapped_calls

    monkeypatch.setattr(common.capture, "lost_writes", lambda device: frozenset())  # no probe: nothing compiles here

    def block(compile: bool):
        said = []
        run = SimpleNamespace(
            args=SimpleNamespace(compile=compile, cudagraphs=False),
            device=torch.device("cpu"),
            say=said.append,
            graphs=[],
            compile_seconds={},
        )

        def loss_step(x):
            return x + 1

        def acting(x):
            return x * 2

        class Policy:  # a class of this file, as a script's Agent
            def act(self, x):
                return x - 1

        act = Policy().act  # a bound method named before the block and never rebound: it wraps nothing

        def step(x):  # compiled below; reads `act`, which the block left as it was: nothing to say
            return act(x)

        def update(x):  # reads the names: sees what they are rebound to
            return loss_step(acting(x))

        kept = loss_step

        def with_alias(x):
            return kept(x)

        def with_default(x, step=acting):
            return step(x)

        partial = functools.partial(loss_step)

        def with_partial(x):
            return partial(x)

        loss_step = compiled(run, loss_step)
        acting = captured(run, "acting", compiled(run, acting))
        update = captured(run, "update", update)
        step = compiled(run, step)
        return unwrapped_calls(run, locals()), said

    found, said = block(compile=True)
    assert found == [
        "with_alias holds loss_step unwrapped (cell kept)",
        "with_default holds acting unwrapped (a default argument)",
        "with_partial holds loss_step unwrapped (a partial)",
    ], found
    assert said == [
        f"warning: {line}: it runs the function from before the compile-and-capture block, not what wraps it"
        for line in found
    ]
    assert block(compile=False) == ([], [])
