"""Tests of common/buffer.py: rollout storage layout and in-place writes, replay-buffer
wraparound, uniform sampling over written slots, n-step windows as stored (and td3.py's and
sac.py's n-step targets from them) against a brute-force reference, and exact state_dict round trips."""

import io
from collections import Counter

import pytest
import torch
from tensordict import TensorDict
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from common.buffer import ReplayBuffer, RolloutStorage


# ----------------------------------------------------------------------------- RolloutStorage


def rollout_step(num_envs: int, step: int) -> TensorDict:
    """One step of a PPO-like rollout; every value encodes `step` so rows can be told apart."""
    n = num_envs
    return TensorDict(
        obs=TensorDict(
            policy=torch.full((n, 4), float(step)),
            critic=torch.full((n, 7), float(step) + 0.5),
            batch_size=[n],
        ),
        actions=torch.full((n,), step, dtype=torch.long),
        logprobs=torch.full((n,), -float(step)),
        rewards=torch.arange(n, dtype=torch.float32) + step,
        dones=torch.arange(n) % 2 == step % 2,
        batch_size=[n],
    )


def test_rollout_first_write_registers_nested_layout():
    storage = RolloutStorage(num_steps=5, num_envs=3, device="cpu")
    assert storage.data is None
    storage.write(0, rollout_step(3, 0))

    data = storage.data
    assert data.batch_size == (5, 3)
    assert data.device == torch.device("cpu")
    expected = {
        ("obs", "policy"): ((5, 3, 4), torch.float32),
        ("obs", "critic"): ((5, 3, 7), torch.float32),
        "actions": ((5, 3), torch.long),
        "logprobs": ((5, 3), torch.float32),
        "rewards": ((5, 3), torch.float32),
        "dones": ((5, 3), torch.bool),
    }
    assert set(data.keys(include_nested=True, leaves_only=True)) == set(expected)
    for key, (shape, dtype) in expected.items():
        assert data[key].shape == shape and data[key].dtype == dtype, key
    assert (data[0] == rollout_step(3, 0)).all()
    # Unwritten rows are zeros, not copies of the first write.
    assert not data[1:]["obs", "critic"].any() and not data[1:]["dones"].any()


def test_rollout_writes_in_place_and_flattens_step_major():
    T, N = 6, 4
    storage = RolloutStorage(T, N, "cpu")
    storage.write(0, rollout_step(N, 0))
    leaves = list(storage.data.keys(include_nested=True, leaves_only=True))
    ptrs = {key: storage.data[key].data_ptr() for key in leaves}

    for step in range(T):
        storage.write(step, rollout_step(N, step))
    for key in leaves:
        assert storage.data[key].data_ptr() == ptrs[key], f"{key} was reallocated"
    for step in range(T):
        assert (storage.data[step] == rollout_step(N, step)).all()

    flat = storage.flatten()
    assert flat.batch_size == (T * N,)
    assert flat["obs", "policy"].shape == (T * N, 4)
    assert flat["obs", "policy"].data_ptr() == ptrs[("obs", "policy")]  # a view, not a copy
    assert (flat[2 * N + 1] == storage.data[2, 1]).all()


def test_rollout_rejects_changed_layout():
    storage = RolloutStorage(3, 2, "cpu")
    storage.write(0, rollout_step(2, 0))
    with pytest.raises(KeyError, match="values"):
        storage.write(1, rollout_step(2, 1).set("values", torch.zeros(2)))
    with pytest.raises(KeyError, match="logprobs"):
        storage.write(1, rollout_step(2, 1).exclude("logprobs"))
    with pytest.raises(ValueError, match="batch size"):
        storage.write(1, rollout_step(3, 1))


# ----------------------------------------------------------------------------- ReplayBuffer


def marker_transition(num_envs: int, step: int, rewards=None, terminated=None, truncated=None) -> TensorDict:
    """Transition `step` for every env, with obs/next_obs/actions that identify (env, step).

    obs.policy = [env, step + 1] so that a zero (unwritten) slot never looks like a real one;
    next_obs.policy = [env, -(step + 1)] identifies the transition its next_obs came from.
    """
    n = num_envs
    env = torch.arange(n, dtype=torch.float32)
    tag = torch.full((n,), float(step + 1))
    zeros = torch.zeros(n, dtype=torch.bool)
    return TensorDict(
        obs=TensorDict(policy=torch.stack([env, tag], 1), critic=torch.stack([env, tag, tag], 1), batch_size=[n]),
        actions=torch.stack([env, tag], 1) * 10,
        rewards=torch.zeros(n) if rewards is None else rewards,
        terminated=zeros if terminated is None else terminated,
        truncated=zeros if truncated is None else truncated,
        next_obs=TensorDict(
            policy=torch.stack([env, -tag], 1), critic=torch.stack([env, -tag, -tag], 1), batch_size=[n]
        ),
        batch_size=[n],
    )


def decode(batch: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
    """(env, step) of each sampled start, read back from its obs marker."""
    policy = batch["obs", "policy"]
    return policy[:, 0].long(), policy[:, 1].long() - 1


def test_replay_wraparound_keeps_last_capacity_steps():
    N, C, extra = 3, 5, 3
    buffer = ReplayBuffer(N, C, "cpu")
    for step in range(C + extra):
        buffer.add(marker_transition(N, step))
    assert len(buffer) == C and buffer.capacity == C and buffer.num_envs == N
    assert buffer.ptr == extra
    assert buffer.data.batch_size == (N, C)
    assert buffer.data["obs", "critic"].shape == (N, C, 3)

    tags = buffer.data["obs", "policy"][..., 1].long() - 1  # step stored in each slot
    for env in range(N):
        assert sorted(tags[env].tolist()) == list(range(extra, C + extra))
        # Step s lives in slot s % C, so the oldest retained step sits at ptr.
        assert [s % C for s in tags[env].tolist()] == list(range(C))
    assert (buffer.data["obs", "policy"][..., 0] == torch.arange(N).unsqueeze(1)).all()


def test_replay_newest_and_fold_into_read_each_envs_last_steps_in_order_across_the_wrap():
    """newest(k) is the last k written steps of every env, oldest first, also where they straddle the end
    of the ring; fold_into feeds exactly those to the normalizers: the observation groups named, and
    the rewards with their episode ends as [T, N] in each env's order (what a discounted return needs)."""
    from common.normalize import RewardNormalizer, RunningMeanStd

    N, C, k = 3, 5, 4
    buffer = ReplayBuffer(N, C, "cpu")
    ends = {4, 6}  # episode ends at these steps (env 1 only)
    for step in range(7):  # slots 0..4, then 5 -> 0, 6 -> 1: the newest 4 are steps 3..6, in slots 3, 4, 0, 1
        done = torch.tensor([False, step in ends, False])
        buffer.add(marker_transition(N, step, rewards=torch.arange(N) + 10.0 * step, truncated=done))
    window = buffer.newest(k)
    assert window.batch_size == (N, k)
    assert (window["obs", "policy"][..., 1] - 1 == torch.arange(3, 7)).all()  # steps 3..6 of every env, in order
    assert (window["obs", "policy"][..., 0] == torch.arange(N).unsqueeze(1)).all()
    with pytest.raises(ValueError, match="k=6 needs 0 < k <= written steps per env"):
        buffer.newest(6)

    policy, critic, rewards = RunningMeanStd(2, clip=None), RunningMeanStd(3, clip=None), RewardNormalizer(N, gamma=0.5)
    buffer.fold_into(k, {"policy": policy, "critic": critic}, rewards)
    expected = RunningMeanStd(2, clip=None)
    expected.update(window["obs", "policy"])
    assert policy.count == N * k and torch.equal(policy.mean, expected.mean) and torch.equal(policy.m2, expected.m2)
    assert critic.count == N * k and torch.allclose(
        critic.mean, window["obs", "critic"].reshape(-1, 3).double().mean(0)
    )
    reference = RewardNormalizer(N, gamma=0.5)
    reference.update(window["rewards"].T, window["truncated"].T)  # [T, N]: env 1's return restarts after steps 4 and 6
    got, want = rewards.return_rms, reference.return_rms
    assert got.count == N * k and torch.equal(got.mean, want.mean) and torch.equal(got.m2, want.m2)
    assert torch.equal(rewards.returns, reference.returns) and rewards.returns[1] == 0  # ended at step 6
    untouched = RunningMeanStd(2)
    buffer.fold_into(0, {"policy": untouched})
    assert untouched.count == 0


def n_step_batches(window: TensorDict, gamma: float, normalize=None, reward_norm=None) -> list[TensorDict]:
    """td3.py's and sac.py's n_step_batch (the TD target's inputs, the script's) of a sampled window."""
    from types import SimpleNamespace

    from tests.helpers import load_script

    agent = SimpleNamespace(normalize=normalize or (lambda obs: obs))
    args = SimpleNamespace(gamma=gamma, reward_norm=reward_norm is not None)
    return [load_script(algo).n_step_batch(agent, window, reward_norm, args) for algo in ("td3", "sac")]


def test_the_scripts_n_step_batch_normalizes_the_observations_and_rewards_and_gives_the_bootstrap_factor():
    """td3.py's and sac.py's n_step_batch on a sampled window: both observations through the normalizer, the n-step
    return through the reward normalizer, the bootstrap gamma ** k, 0 where the window ends in a termination."""
    from common.normalize import RewardNormalizer

    N, C = 2, 6
    buffer = ReplayBuffer(N, C, "cpu")
    for step in range(C):
        buffer.add(marker_transition(N, step, rewards=torch.ones(N), terminated=torch.tensor([step == 3, False])))
    normalize = lambda obs: obs.apply(lambda x: x * 2)  # noqa: E731
    reward_norm = RewardNormalizer(N, 0.5)
    reward_norm.update(torch.randn(5, N) * 4, torch.zeros(5, N, dtype=torch.bool))
    window = buffer.sample(64, 3, generator=torch.Generator().manual_seed(0))
    plain = n_step_batches(window, 0.5)[0]
    for batch in n_step_batches(window, 0.5, normalize, reward_norm):
        assert torch.equal(batch["obs_n", "policy"], 2 * window["obs", "policy"])
        assert torch.equal(batch["next_obs_n", "critic"], 2 * window["next_obs", "critic"])
        assert torch.equal(batch["actions"], window["actions"])
        assert torch.equal(batch["rewards"], reward_norm.normalize(plain["rewards"]))
        last = window["included"].sum(1) - 1
        terminated = window["terminated"].gather(1, last.unsqueeze(1)).squeeze(1)
        assert torch.equal(batch["bootstrap"], (0.5 ** (last + 1.0) * ~terminated).float())
        assert (batch["bootstrap"][terminated] == 0).all() and terminated.any()


def test_replay_add_is_in_place():
    buffer = ReplayBuffer(2, 4, "cpu")
    buffer.add(marker_transition(2, 0))
    ptr = buffer.data["next_obs", "critic"].data_ptr()
    for step in range(1, 9):
        buffer.add(marker_transition(2, step))
    assert buffer.data["next_obs", "critic"].data_ptr() == ptr


@pytest.mark.parametrize("capturable", [False, True], ids=["host-bounds", "device-bounds"])
@pytest.mark.parametrize("num_adds", [7, 23], ids=["partial", "wrapped"])
def test_replay_samples_written_slots_uniformly(num_adds, capturable):
    N, C, S = 3, 10, 30_000
    buffer = ReplayBuffer(N, C, "cpu", capturable=capturable)
    for step in range(num_adds):
        buffer.add(marker_transition(N, step))
    written = {(env, step) for env in range(N) for step in range(max(0, num_adds - C), num_adds)}

    batch = buffer.sample(S, generator=torch.Generator().manual_seed(0))
    assert batch.batch_size == (S,)
    env, step = decode(batch)
    counts = Counter(zip(env.tolist(), step.tolist()))
    assert set(counts) == written  # every written slot, and nothing else (no zero slots)
    expected = S / len(written)
    assert max(abs(c - expected) for c in counts.values()) < 0.15 * expected
    # Fields of one sample come from the same transition.
    assert (batch["actions"] == batch["obs", "policy"] * 10).all()
    assert (batch["next_obs", "policy"][:, 1] == -batch["obs", "policy"][:, 1]).all()


def nstep_reference(rewards, terminated, truncated, env, t, n, gamma):
    """Brute-force n-step return of the window starting at step t of env, from the full history."""
    ret, k = 0.0, 0
    while True:
        ret += gamma**k * rewards[t + k][env]
        if terminated[t + k][env] or truncated[t + k][env] or k == n - 1:
            break
        k += 1
    last = t + k
    return ret, gamma ** (k + 1), bool(terminated[last][env]), bool(truncated[last][env]), last, k + 1


@pytest.mark.parametrize("capturable", [False, True], ids=["host-bounds", "device-bounds"])
@pytest.mark.parametrize("n_step", [1, 3, 5])
@pytest.mark.parametrize("num_adds", [11, 45], ids=["partial", "wrapped"])
def test_replay_nstep_matches_brute_force(n_step, num_adds, capturable):
    N, C, gamma, S = 4, 16, 0.9, 6_000
    gen = torch.Generator().manual_seed(1234)
    buffer = ReplayBuffer(N, C, "cpu", capturable=capturable)
    history = {"rewards": [], "terminated": [], "truncated": []}
    for step in range(num_adds):
        rewards = torch.randn(N, generator=gen)
        terminated = torch.rand(N, generator=gen) < 0.15
        truncated = torch.rand(N, generator=gen) < 0.10
        buffer.add(marker_transition(N, step, rewards, terminated, truncated))
        history["rewards"].append(rewards.tolist())
        history["terminated"].append(terminated.tolist())
        history["truncated"].append(truncated.tolist())

    batch = buffer.sample(S, n_step=n_step, generator=torch.Generator().manual_seed(7))
    env, start = decode(batch)
    oldest = max(0, num_adds - C)
    valid = {(e, t) for e in range(N) for t in range(oldest, num_adds - n_step + 1)}
    starts = set(zip(env.tolist(), start.tolist()))
    assert starts == valid  # only windows inside retained, chronological data; all of them
    if num_adds > C and n_step > 1:
        # Windows that cross the physical end of the ring (slot C-1 -> slot 0) were exercised.
        assert any(t % C + n_step - 1 >= C for _, t in starts)

    ref = [nstep_reference(**history, env=e, t=t, n=n_step, gamma=gamma) for e, t in zip(env.tolist(), start.tolist())]
    ref_rewards, ref_discount, ref_term, ref_trunc, ref_last, ref_n = map(list, zip(*ref))
    # the window as stored: n rewards and episode ends, cut after the first end; the TD target's inputs, the scripts'
    assert batch["rewards"].shape == batch["included"].shape == (S, n_step)
    effective_n = batch["included"].sum(1)
    last = (effective_n - 1).unsqueeze(1)
    assert batch["terminated"].gather(1, last).squeeze(1).tolist() == ref_term
    assert batch["truncated"].gather(1, last).squeeze(1).tolist() == ref_trunc
    assert effective_n.tolist() == ref_n
    for target in n_step_batches(batch, gamma):
        torch.testing.assert_close(target["rewards"], torch.tensor(ref_rewards, dtype=torch.float32))
        torch.testing.assert_close(
            target["bootstrap"], torch.tensor(ref_discount) * ~torch.tensor(ref_term), check_dtype=False
        )
    assert (-batch["next_obs", "policy"][:, 1].long() - 1).tolist() == ref_last
    assert (-batch["next_obs", "critic"][:, 2].long() - 1).tolist() == ref_last
    assert (batch["next_obs", "policy"][:, 0].long() == env).all()
    assert (batch["actions"] == batch["obs", "policy"] * 10).all()  # actions at the start
    assert any(ref_term) and any(ref_trunc)  # both kinds of episode end were sampled
    if n_step > 1:
        # The random episodes put ends inside windows as well as windows running the full n.
        assert 1 < len(set(ref_n))


def test_replay_nstep_hand_example():
    # One env, rewards 1, 2, 4, 8, 16; an episode is truncated at step 1, the next terminated at step 3.
    buffer = ReplayBuffer(1, 8, "cpu")
    ends = {1: "truncated", 3: "terminated"}
    for step, reward in enumerate([1.0, 2.0, 4.0, 8.0, 16.0]):
        flags = {key: torch.tensor([ends.get(step) == key]) for key in ("terminated", "truncated")}
        buffer.add(marker_transition(1, step, torch.tensor([reward]), **flags))
    batch = buffer.sample(2000, n_step=3, generator=torch.Generator().manual_seed(0))
    _, start = decode(batch)
    target = n_step_batches(batch, 0.5)[0]  # the TD target's inputs: the script's
    effective_n = batch["included"].sum(1)
    last = (effective_n - 1).unsqueeze(1)
    discount = 0.5 ** effective_n.float()
    columns = (
        target["rewards"],
        discount,
        batch["terminated"].gather(1, last).squeeze(1),
        batch["truncated"].gather(1, last).squeeze(1),
        effective_n,
    )
    got = dict(zip(start.tolist(), zip(*(column.tolist() for column in columns))))
    assert torch.equal(target["bootstrap"], discount * ~columns[2])
    assert got == {
        0: (1 + 0.5 * 2, 0.25, False, True, 2),  # cut by the truncation at step 1, bootstraps
        1: (2.0, 0.5, False, True, 1),  # ends immediately
        2: (4 + 0.5 * 8, 0.25, True, False, 2),  # cut by the termination at step 3, no bootstrap
    }  # start 3 and 4 are the n-1 newest slots: never starts


def test_replay_device_pointer_and_fill_level_follow_the_host_copy():
    """write() advances the device pointer and fill level in place, advance_host() the host copy:
    after every step, across the wrap-around and a state_dict round trip, the two agree."""
    N, C = 2, 5
    buffer = ReplayBuffer(N, C, "cpu")
    device_state = (buffer.device_ptr, buffer.device_size)
    for step in range(3 * C + 2):
        if step % 2:
            buffer.add(marker_transition(N, step))
        else:  # the split a captured function makes: the write in the graph, the host copy outside
            buffer.write(marker_transition(N, step))
            assert (buffer.ptr, buffer.size) == (step % C, min(step, C))  # the host copy waits for advance_host
            buffer.advance_host()
        assert (buffer.ptr, buffer.size) == ((step + 1) % C, min(step + 1, C))
        assert (buffer.device_ptr.item(), buffer.device_size.item()) == (buffer.ptr, buffer.size), step
    assert (buffer.device_ptr, buffer.device_size) == device_state  # the same tensors, written in place
    assert buffer.device_ptr.shape == (1,) and buffer.device_ptr.dtype == torch.int64
    # The oldest step sits at the pointer: the slot the device pointer names.
    assert buffer.data["obs", "policy"][0, buffer.device_ptr.item(), 1].item() - 1 == 3 * C + 2 - C

    restored = ReplayBuffer(N, C, "cpu")
    restored.load_state_dict(buffer.state_dict())
    assert (restored.device_ptr.item(), restored.device_size.item()) == (buffer.ptr, buffer.size)
    assert isinstance(buffer.state_dict()["ptr"], int) and isinstance(buffer.state_dict()["size"], int)


def test_replay_host_bounds_draw_the_stream_of_randint():
    """The default (not capturable) sampling draws its starts with torch.randint(num_starts), the
    stream of earlier versions: runs on CPU stay bit-identical to them."""
    N, C = 3, 12
    buffer = ReplayBuffer(N, C, "cpu")
    for step in range(7):
        buffer.add(marker_transition(N, step))
    batch = buffer.sample(50, n_step=2, generator=torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(3)
    env = torch.randint(N, (50,), generator=gen)
    start = torch.randint(7 - 2 + 1, (50,), generator=gen)
    assert decode(batch)[0].tolist() == env.tolist() and decode(batch)[1].tolist() == start.tolist()


class RecordOps(TorchDispatchMode):
    """The ops of a call with their non-tensor arguments: what a CUDA graph of the call would replay."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flat = torch.utils._pytree.tree_leaves((args, kwargs or {}))
        self.ops.append((func.overloadpacket.__name__, tuple(repr(x) for x in flat if not isinstance(x, torch.Tensor))))
        return func(*args, **(kwargs or {}))


def test_capturable_write_and_sample_run_the_same_kernels_at_every_fill_level():
    """A graph replays the kernels of its capture: a capturable buffer's write and sample must be the
    same ops with the same scalars while it fills, once it is full, and after it wrapped, and
    still sample what is written now (the host-bounds default would freeze the capture's bound)."""
    N, C = 3, 8
    buffer = ReplayBuffer(N, C, "cpu", capturable=True)
    buffer.add(marker_transition(N, 0))  # the first write allocates
    signatures = []
    for step in range(1, 2 * C):
        transition = marker_transition(N, step)
        with RecordOps() as rec:
            buffer.write(transition)
            batch = buffer.sample(256, n_step=1)
        buffer.advance_host()
        signatures.append(rec.ops)
        _, start = decode(batch)
        assert start.min().item() >= max(0, step + 1 - C) and start.max().item() == step, step  # the newest is drawn
    assert all(sig == signatures[0] for sig in signatures)

    host_bounds = ReplayBuffer(N, C, "cpu")
    host_bounds.add(marker_transition(N, 0))
    calls = []
    for step in (1, 2):
        host_bounds.add(marker_transition(N, step))
        with RecordOps() as rec:
            host_bounds.sample(8)
        calls.append(rec.ops)
    assert calls[0] != calls[1]  # the recorder sees the changing bound (the test can fail)


def test_replay_sample_errors():
    buffer = ReplayBuffer(2, 4, "cpu")
    with pytest.raises(RuntimeError, match="empty"):
        buffer.sample(8)
    buffer.add(marker_transition(2, 0))
    buffer.add(marker_transition(2, 1))
    with pytest.raises(ValueError, match="n_step=3"):
        buffer.sample(8, n_step=3)
    with pytest.raises(KeyError, match="rewards"):
        ReplayBuffer(2, 4, "cpu").add(marker_transition(2, 0).exclude("rewards"))
    with pytest.raises(TypeError, match="bool"):
        ReplayBuffer(2, 4, "cpu").add(marker_transition(2, 0).set("terminated", torch.zeros(2)))


def test_replay_state_dict_round_trip(tmp_path):
    N, C = 3, 8
    gen = torch.Generator().manual_seed(0)
    buffer = ReplayBuffer(N, C, "cpu")
    for step in range(C + 3):
        buffer.add(marker_transition(N, step, torch.randn(N, generator=gen), torch.rand(N, generator=gen) < 0.2))

    path = tmp_path / "buffer.pt"
    torch.save({"buffer": buffer.state_dict()}, path)
    restored = ReplayBuffer(N, C, "cpu")
    restored.load_state_dict(torch.load(path, weights_only=True)["buffer"])
    assert (restored.ptr, restored.size, len(restored)) == (buffer.ptr, buffer.size, len(buffer))
    assert (restored.data == buffer.data).all()

    def samples(buf):
        return buf.sample(64, n_step=3, generator=torch.Generator().manual_seed(42))

    assert (samples(restored) == samples(buffer)).all()
    # The resumed buffer keeps going exactly like the original one.
    for step in range(C + 3, C + 8):
        buffer.add(marker_transition(N, step))
        restored.add(marker_transition(N, step))
    assert (samples(restored) == samples(buffer)).all()

    with pytest.raises(ValueError, match="buffer size"):
        ReplayBuffer(N, C + 1, "cpu").load_state_dict(buffer.state_dict())
    # An empty buffer round-trips too.
    empty = io.BytesIO()
    torch.save(ReplayBuffer(N, C, "cpu").state_dict(), empty)
    empty.seek(0)
    fresh = ReplayBuffer(N, C, "cpu")
    fresh.load_state_dict(torch.load(empty, weights_only=True))
    assert fresh.data is None and len(fresh) == 0


class RecordHostReads(TorchFunctionMode):
    """Records tensor calls that read device values back to the host (a sync on CUDA).

    A CPU stand-in for CUDA's sync debug mode, so the no-sync rule is checked on any machine.
    """

    READS = {
        torch.Tensor.item,
        torch.Tensor.tolist,
        torch.Tensor.cpu,
        torch.Tensor.numpy,
        torch.Tensor.nonzero,
        torch.nonzero,
        torch.masked_select,
        torch.Tensor.masked_select,
        torch.Tensor.__bool__,
        torch.Tensor.__int__,
        torch.Tensor.__float__,
        torch.Tensor.__index__,
    }

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            self.calls.append(func.__name__)
        if func is torch.Tensor.__getitem__:  # boolean-mask indexing sizes its output on the host
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index):
                self.calls.append("boolean mask indexing")
        return func(*args, **(kwargs or {}))


def test_no_host_reads_after_first_write():
    N = 4
    storage, buffer = RolloutStorage(3, N, "cpu"), ReplayBuffer(N, 8, "cpu")
    storage.write(0, rollout_step(N, 0))  # first writes allocate and validate: not per-step work
    buffer.add(marker_transition(N, 0))
    rollout = [rollout_step(N, s) for s in range(3)]
    transitions = [marker_transition(N, s) for s in range(1, 12)]
    gen = torch.Generator().manual_seed(0)
    with RecordHostReads() as mode:
        for step, td in enumerate(rollout):
            storage.write(step, td)
        storage.flatten()
        for td in transitions:
            buffer.add(td)
        buffer.sample(32, n_step=3, generator=gen)
    assert mode.calls == []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_capturable_write_and_sample_replay_in_a_cuda_graph():
    """One graph of write + sample, replayed: each replay writes the next slot and samples the slots
    written so far (the device pointer and fill level advance inside the graph)."""
    device = torch.device("cuda")
    N, C = 4, 6
    buffer = ReplayBuffer(N, C, device, capturable=True)
    step_in = marker_transition(N, 0).to(device)
    buffer.add(step_in.clone())  # allocates
    static = step_in.clone()

    def write_and_sample():
        buffer.write(static)
        return buffer.sample(512, n_step=1)["obs", "policy"][:, 1]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up, as CudaGraphModule does
        static.update_(marker_transition(N, 1).to(device))
        write_and_sample()
        buffer.advance_host()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    static.update_(marker_transition(N, 2).to(device))
    with torch.cuda.graph(graph):
        out = write_and_sample()
    graph.replay()  # a capture records without running: this is step 2's call (CudaGraphModule runs it at capture)
    buffer.advance_host()
    for step in range(3, 3 * C):
        static.update_(marker_transition(N, step).to(device))
        graph.replay()
        buffer.advance_host()
        tags = out.long() - 1
        assert tags.max().item() == step and tags.min().item() >= max(0, step + 1 - C), step
        assert (buffer.device_ptr.item(), buffer.device_size.item()) == (buffer.ptr, buffer.size)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_no_host_device_sync_on_cuda():
    device = torch.device("cuda")
    storage = RolloutStorage(4, 8, device)
    buffer = ReplayBuffer(8, 16, device)
    gen = torch.Generator(device).manual_seed(0)
    first = marker_transition(8, 0).to(device)
    storage.write(0, rollout_step(8, 0).to(device))  # first writes allocate: outside the check
    buffer.add(first)
    steps = [marker_transition(8, s).to(device) for s in range(1, 20)]
    rollout = [rollout_step(8, s).to(device) for s in range(4)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for s in range(4):
            storage.write(s, rollout[s])
        storage.flatten()
        for td in steps:
            buffer.add(td)
        buffer.sample(256, n_step=3, generator=gen)
    finally:
        torch.cuda.set_sync_debug_mode("default")
