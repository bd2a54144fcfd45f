"""A task's rsl_rl config gives rsl_rl's update: ppo.py's (and ppo_rnd.py's) update with the `task` settings against
rsl_rl's own PPO.update (rsl-rl-lib 5.4.2, the release mjlab 1.6 pins), on the same rollout batch from the same initial
weights.

Each test registers a task in the CPU stand-in of mjlab (tests/fake_mjlab.py) whose runner config has mjlab 1.6's
shape, and runs the script on it for one iteration with the command line a user types (the task set translated by
common/settings.py). Where the script's `targets` returns its batch, the test takes over: that rollout batch
(observations, actions, old log-probs, the acting distribution's mean and std, values, returns, advantages) and the
agent's initial weights go into rsl_rl's models and storage; rsl_rl's PPO.update runs on them, then the script's
update_fn goes on with its own epochs of the minibatch step its train built. Both draw the same minibatch
permutation (torch's generator seeded alike before each: rsl_rl's generator draws one randperm per update, as
--shuffle once does), and
the test compares, minibatch by minibatch, the losses, the KL and the learning rate each optimizer step ran at, then
every weight after the update. Observation normalization is off on both sides (each normalizes with its own
statistics, docs/rsl_rl.md); the value loss is compared as rsl_rl states it, without ours's 0.5 (the translation doubles
the coefficient instead).

Marked `sims`: CI's first lane has no rsl_rl (the module skips); the sims lane installs it with mjlab.
"""

from __future__ import annotations

import dataclasses
import sys
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from common import symmetry as symmetry_module
from common.args import parse_args
from tests import fake_mjlab
from tests.fake_mjlab import FakeAlgorithmCfg, FakeEnvCfg, FakeModelCfg, FakeRunnerCfg, FakeSymmetryCfg
from tests.helpers import load_script

pytestmark = pytest.mark.sims
pytest.importorskip("rsl_rl")

from rsl_rl.algorithms import PPO  # noqa: E402
from rsl_rl.models import MLPModel  # noqa: E402
from rsl_rl.storage import RolloutStorage  # noqa: E402

NUM_ENVS, NUM_STEPS, SEED = 8, 16, 1234
HIDDEN = (32, 16)


def task_config(symmetry=None, per_minibatch: bool = False, rnd: dict | None = None) -> FakeRunnerCfg:
    """An mjlab 1.6 runner config (the G1 velocity task's shape, small): a rate that the adaptive schedule moves both
    ways, above ppo.py's own cap, a gradient clip tight enough to act on both networks, three epochs of four
    minibatches."""
    return FakeRunnerCfg(
        num_steps_per_env=NUM_STEPS,
        max_iterations=1,
        actor=FakeModelCfg(
            hidden_dims=HIDDEN,
            activation="elu",
            obs_normalization=False,
            distribution_cfg={"class_name": "GaussianDistribution", "init_std": 0.8, "std_type": "scalar"},
        ),
        critic=FakeModelCfg(hidden_dims=HIDDEN, activation="elu", obs_normalization=False),
        algorithm=FakeAlgorithmCfg(
            symmetry_cfg=symmetry,
            rnd_cfg=rnd,
            learning_rate=4e-3,
            schedule="adaptive",
            desired_kl=0.008,
            num_learning_epochs=3,
            num_mini_batches=4,
            clip_param=0.2,
            gamma=0.99,
            lam=0.95,
            value_loss_coef=1.0,
            entropy_coef=0.01,
            max_grad_norm=0.3,
            use_clipped_value_loss=True,
            normalize_advantage_per_mini_batch=per_minibatch,
        ),
    )


def train_locals() -> dict:
    """The variables of the script's train (the agent, its optimizer, the rate, ...), by name, from a function it
    calls."""
    frame = sys._getframe(1)
    while frame.f_code.co_name != "train":
        frame = frame.f_back
    return frame.f_locals


def rsl_rl_frame_losses(alg: PPO, record: list) -> None:
    """Record, at each optimizer step of rsl_rl's update, its losses and KL (the locals of PPO.update) and the rate."""
    step = alg.optimizer.step

    def recording_step(*a, **k):
        seen = sys._getframe(1).f_locals  # PPO.update's frame
        row = {"lr": alg.optimizer.param_groups[0]["lr"]}
        for ours, theirs in (
            ("policy_loss", "surrogate_loss"),
            ("value_loss", "value_loss"),
            ("approx_kl", "kl_mean"),
            ("mirror_loss", "symmetry_loss"),
            ("rnd_loss", "rnd_loss"),
        ):
            if seen.get(theirs) is not None:
                row[ours] = float(seen[theirs].detach())
        row["entropy"] = float(seen["entropy"].detach().mean())
        record.append(row)
        return step(*a, **k)

    alg.optimizer.step = recording_step


def run_both(monkeypatch, tmp_path, script: str, cfg: FakeRunnerCfg, extra: list[str] = ()) -> dict:
    """Run `script` for one iteration on a task whose runner config is `cfg`; at its update, rsl_rl's PPO.update and
    the script's on the same batch from the same weights. Returns both records and both models."""
    fake_mjlab.install(monkeypatch)
    monkeypatch.setitem(fake_mjlab.TASKS, "Fake-Rsl", (FakeEnvCfg(), cfg))
    module = load_script(script)
    mirrors, result = {}, {}
    real_mirrors = symmetry_module.mirrors

    def keep_mirror(envs, obs, args, device):
        mirrors["env"] = real_mirrors(envs, obs, args, device)[0]
        return real_mirrors(envs, obs, args, device)

    monkeypatch.setattr(symmetry_module, "mirrors", keep_mirror)
    targets, add_to = module.targets, module.add_to
    ours = []  # a row per optimizer step of the script's update: the rate it ran at, then its minibatch's losses

    def both_updates(*a, **k):
        """The script's targets; then, on its batch from the same weights, rsl_rl's update; then the script's own
        epochs go on (update_fn's), from the same generator state as rsl_rl's, every optimizer step recorded."""
        batch, *rest = targets(*a, **k)
        held = train_locals()
        agent, optimizer, lr, args = held["agent"], held["optimizer"], held["lr"], held["args"]
        theirs = rsl_rl_ppo(cfg, agent, held.get("rnd"), batch, mirrors.get("env"))
        result["theirs"] = {"record": [], "alg": theirs}
        rsl_rl_frame_losses(theirs, result["theirs"]["record"])
        torch.manual_seed(SEED)
        theirs.update()

        step = optimizer.step

        def recording_step(*a, **k):
            ours.append({"lr": float(lr)})
            return step(*a, **k)

        optimizer.step = recording_step
        result["ours"] = {"record": ours, "agent": agent, "rnd": held.get("rnd"), "args": args}
        torch.manual_seed(SEED)  # the epochs' first permutation is the next draw
        return (batch, *rest)

    def recording_add_to(sums: dict, values: dict) -> None:  # update_fn sums each minibatch's losses after its step
        if "approx_kl" in values and ours:
            ours[-1].update({k: float(v) for k, v in values.items()})
        add_to(sums, values)

    monkeypatch.setattr(module, "targets", both_updates)
    monkeypatch.setattr(module, "add_to", recording_add_to)
    argv = ["--env-id", "mjlab:Fake-Rsl", "--num-envs", str(NUM_ENVS), "--device", "cpu", "--no-progress"]
    argv += ["--output-dir", str(tmp_path), "--eval-interval", "0", "--num-eval-envs", "2", *extra]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])  # the command line max_iterations counts envs from
    module.main(parse_args(module.Args, argv))
    return result


def rsl_rl_ppo(cfg: FakeRunnerCfg, agent, rnd, batch: TensorDict, mirror) -> PPO:
    """rsl_rl's PPO as its runner builds it from `cfg` (MLPModel actor and critic, the algorithm's fields as given),
    with the agent's weights and the script's rollout batch in its storage."""
    obs = batch["obs_n"].reshape(NUM_STEPS, NUM_ENVS)
    groups = {"actor": ["policy"], "critic": ["critic"], "rnd_state": ["policy"]}
    act_dim = batch["actions"].shape[-1]
    model = lambda model_cfg, name, out: MLPModel(  # noqa: E731
        obs[0],
        groups,
        name,
        out,
        hidden_dims=model_cfg.hidden_dims,
        activation=model_cfg.activation,
        obs_normalization=model_cfg.obs_normalization,
        distribution_cfg=dict(model_cfg.distribution_cfg) if model_cfg.distribution_cfg else None,
    )
    actor, critic = model(cfg.actor, "actor", act_dim), model(cfg.critic, "critic", 1)
    with torch.no_grad():  # the script's initial weights (rsl_rl's MLP has the same layers in the same order)
        for theirs, ours in ((actor.mlp, agent.actor), (critic.mlp, agent.critic)):
            for a, b in zip(theirs.parameters(), ours.parameters(), strict=True):
                a.copy_(b[:1] if b.shape[0] == 2 and a.shape[0] == 1 else b)  # ppo_rnd's critic: its extrinsic row
        actor.distribution.std_param.copy_(agent.action_std())
    algorithm = {
        f.name: getattr(cfg.algorithm, f.name)
        for f in dataclasses.fields(cfg.algorithm)
        if getattr(cfg.algorithm, f.name) is not None and f.name not in ("symmetry_cfg", "rnd_cfg")
    }
    symmetry = cfg.algorithm.symmetry_cfg
    if symmetry is not None:  # the same mirror: the one the script's env gives (rsl_rl's contract, less its env)
        symmetry = dict(
            env=None,
            data_augmentation_func=lambda env, obs, actions: mirror(obs=obs, actions=actions),
            use_data_augmentation=symmetry.use_data_augmentation,
            use_mirror_loss=symmetry.use_mirror_loss,
            mirror_loss_coeff=symmetry.mirror_loss_coeff,
        )
    rnd_cfg = None
    if cfg.algorithm.rnd_cfg is not None:
        rnd_cfg = {**cfg.algorithm.rnd_cfg, "num_states": obs["policy"].shape[-1], "obs_groups": groups}
    storage = RolloutStorage("rl", NUM_ENVS, NUM_STEPS, obs[0], [act_dim])
    alg = PPO(actor, critic, storage, **algorithm, rnd_cfg=rnd_cfg, symmetry_cfg=symmetry)
    if rnd is not None:
        with torch.no_grad():
            for theirs, ours in ((alg.rnd.predictor, rnd.predictor), (alg.rnd.target, rnd.target)):
                for a, b in zip(theirs.parameters(), ours.parameters(), strict=True):
                    a.copy_(b)
    rollout = batch.reshape(NUM_STEPS, NUM_ENVS)
    extrinsic = (lambda x: x[..., :1]) if rollout["values"].dim() == 3 else (lambda x: x.unsqueeze(-1))
    storage.observations = obs.clone()
    storage.actions = rollout["actions"].clone()
    storage.values, storage.returns = extrinsic(rollout["values"]).clone(), extrinsic(rollout["returns"]).clone()
    storage.advantages = rollout["advantages"].unsqueeze(-1).clone()
    storage.actions_log_prob = rollout["logprobs"].unsqueeze(-1).clone()
    if "old_out" in rollout.keys():  # the distribution the rollout acted with, stored by it
        storage.distribution_params = (rollout["old_out"].clone(), rollout["old_std"].clone())
    else:  # --kl-estimator k3 stores none: the same one, from the same weights and observations
        with torch.no_grad():
            mean = agent.actor(rollout["obs_n", "policy"])
        storage.distribution_params = (mean, agent.action_std().detach().expand_as(mean).clone())
    return alg


def assert_same_minibatches(ours: list[dict], theirs: list[dict], names: tuple[str, ...]) -> None:
    assert len(ours) == len(theirs) == 12  # 3 epochs x 4 minibatches
    for i, (a, b) in enumerate(zip(ours, theirs)):
        for name in ("lr", *names):
            # rsl_rl's value loss has no 0.5: the translated set doubles the coefficient of ours
            mine = 2 * a[name] if name == "value_loss" else a[name]
            assert mine == pytest.approx(b[name], rel=1e-5, abs=1e-7), f"minibatch {i}: {name} {mine} != {b[name]}"


def assert_same_weights(ours: torch.nn.Module, theirs: torch.nn.Module, what: str) -> None:
    for i, (a, b) in enumerate(zip(ours.parameters(), theirs.parameters(), strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{what} parameter {i}")


LOSSES = ("policy_loss", "value_loss", "entropy", "approx_kl")


def assert_rsl_rls(result: dict, names: tuple[str, ...] = LOSSES) -> None:
    """Every minibatch's `names` and rate, then every weight of the actor (its std too) and the critic."""
    ours, theirs = result["ours"], result["theirs"]
    assert_same_minibatches(ours["record"], theirs["record"], names)
    assert_same_weights(ours["agent"].actor, theirs["alg"].actor.mlp, "actor")
    assert_same_weights(ours["agent"].critic, theirs["alg"].critic.mlp, "critic")
    std = ours["agent"].action_std()
    torch.testing.assert_close(std, theirs["alg"].actor.distribution.std_param, rtol=1e-5, atol=1e-6, msg="std")


@pytest.mark.parametrize("per_minibatch", [False, True], ids=["batch-advantages", "minibatch-advantages"])
def test_ppo_update_is_rsl_rls_on_the_same_batch(monkeypatch, tmp_path, per_minibatch):
    """The task set's update (analytic KL, the rate adapted before each step from that minibatch's KL and capped at
    1e-2, the actor's and the critic's gradient norms clipped apart, Adam's eps 1e-8, one permutation for all epochs,
    a learned std, rsl_rl's value loss scale, advantages normalized per batch or per minibatch) is rsl_rl's: every
    minibatch's losses, KL and rate, and every weight after."""
    result = run_both(monkeypatch, tmp_path, "ppo", task_config(per_minibatch=per_minibatch))
    args = result["ours"]["args"]
    update = (args.kl_estimator, args.lr_adapt, args.lr_max, args.grad_clip, args.adam_eps, args.shuffle)
    assert update == ("analytic", "before-step", 1e-2, "per-network", 1e-8, "once")
    assert args.timeout_bootstrap == "every-timeout"
    assert (args.std_type, args.vf_coef, args.adv_norm) == ("scalar", 2.0, "minibatch" if per_minibatch else "batch")
    assert_rsl_rls(result)
    rates = [row["lr"] for row in result["ours"]["record"]]
    top = rates.index(max(rates))
    assert rates[top] > 5e-3 and rates[-1] < rates[top] and rates[0] == pytest.approx(4e-3), f"up, then down: {rates}"


@pytest.mark.parametrize(
    "ours",
    [
        ["--kl-estimator", "k3"],
        ["--lr-adapt", "after-step"],
        ["--lr-max", "5e-3"],
        ["--grad-clip", "global"],
        ["--adam-eps", "1e-5"],
        ["--shuffle", "every-epoch"],
        ["--std-type", "log"],
        ["--vf-coef", "1.0"],
        ["--adv-norm", "minibatch"],
    ],
    ids=lambda flag: flag[0][2:],
)
def test_each_of_ours_alone_fails_the_comparison(monkeypatch, tmp_path, ours):
    """One flag of the update given as the plain defaults have it (ours), the rest the task set's: the comparison
    above fails, so each flag is one of rsl_rl's differences and the test sees it."""
    with pytest.raises(AssertionError):
        assert_rsl_rls(run_both(monkeypatch, tmp_path, "ppo", task_config(), ours))


def test_ppo_update_with_symmetry_is_rsl_rls(monkeypatch, tmp_path):
    """rsl_rl's symmetry (augmentation and mirror loss, the task's mirror on both sides) on the same batch: every
    minibatch's losses, KL, mirror loss and rate, and every weight after. Advantages normalized per minibatch, from the
    originals alone as rsl_rl does before it adds the mirror images."""
    mirror = FakeSymmetryCfg(
        use_data_augmentation=True,
        use_mirror_loss=True,
        data_augmentation_func=fake_mjlab.mirror_point,
        mirror_loss_coeff=0.5,
    )
    result = run_both(monkeypatch, tmp_path, "ppo", task_config(symmetry=mirror, per_minibatch=True))
    assert (result["ours"]["args"].symmetry, result["ours"]["args"].mirror_loss_coef) == ("both", 0.5)
    assert_rsl_rls(result, (*LOSSES, "mirror_loss"))


def test_ppo_rnd_update_is_rsl_rls_but_for_its_second_value_head(monkeypatch, tmp_path):
    """ppo_rnd.py with rsl_rl's RND config on the same batch: the policy's update (surrogate, entropy, KL, the rate at
    every step, the actor's weights after) and the predictor's (its loss at every minibatch, its weights after) are
    rsl_rl's. The difference ppo_rnd.py keeps on purpose (its module docstring says why): its critic has two heads,
    the extrinsic and the intrinsic return, where rsl_rl's has one value of the summed reward; so its value loss and
    critic weights are not rsl_rl's (the actor's are: the task set clips the two networks' gradients apart)."""
    rnd = dict(
        weight=0.5,
        learning_rate=2e-3,
        state_normalization=False,
        reward_normalization=False,
        predictor_hidden_dims=[16],
        target_hidden_dims=[16],
        num_outputs=4,
    )
    result = run_both(monkeypatch, tmp_path, "ppo_rnd", task_config(rnd=rnd))
    ours, theirs = result["ours"], result["theirs"]
    assert ours["args"].rnd_weight == 0.5 and ours["args"].rnd_num_outputs == 4
    assert_same_minibatches(ours["record"], theirs["record"], ("policy_loss", "entropy", "approx_kl", "rnd_loss"))
    assert_same_weights(ours["agent"].actor, theirs["alg"].actor.mlp, "actor")
    std = ours["agent"].action_std()
    torch.testing.assert_close(std, theirs["alg"].actor.distribution.std_param, rtol=1e-5, atol=1e-6, msg="std")
    assert_same_weights(ours["rnd"].predictor, theirs["alg"].rnd.predictor, "predictor")
    assert ours["agent"].critic[-1].out_features == 2 and theirs["alg"].critic.mlp[-1].out_features == 1


class LastValues(SimpleNamespace):
    """The critic rsl_rl's compute_returns calls: the rollout's last values, no hidden state."""

    def __init__(self, values: torch.Tensor):
        super().__init__(values=values, get_hidden_state=lambda: None, reset=lambda **k: None)

    def __call__(self, obs) -> torch.Tensor:
        return self.values


@pytest.mark.parametrize("script", ["ppo", "ppo_rnd", "ppo_lstm"])
def test_returns_on_steps_that_terminate_and_time_out_are_rsl_rls(script):
    """A rollout where some envs terminate and time out on the same step: rsl_rl's process_env_step (its time-out
    bootstrap) and compute_returns, run on it, give the returns of the script's compute_advantages under
    --timeout-bootstrap every-timeout (the task set's); ours (unless-terminated) differs exactly on those steps."""
    g = torch.Generator().manual_seed(SEED)
    rewards, values = torch.randn(NUM_STEPS, NUM_ENVS, generator=g), torch.randn(NUM_STEPS, NUM_ENVS, generator=g)
    last_values = torch.randn(NUM_ENVS, generator=g)
    terminated = torch.rand(NUM_STEPS, NUM_ENVS, generator=g) < 0.2
    time_outs = torch.rand(NUM_STEPS, NUM_ENVS, generator=g) < 0.2
    both = terminated & time_outs
    assert both.sum() >= 2 and (~both.any(0)).any()
    gamma, lam = 0.99, 0.95
    # rsl_rl's bootstrap reads the stored V(s_t) (final_obs "pre_step"): the same values stand for final_values here
    stored = []
    none = SimpleNamespace(update_normalization=lambda obs: None, reset=lambda *a, **k: None)
    alg = SimpleNamespace(actor=none, critic=none, rnd=None, gamma=gamma, lam=lam, device="cpu")
    alg.storage = SimpleNamespace(add_transition=lambda t: stored.append(t.rewards.clone()))
    for t in range(NUM_STEPS):
        alg.transition = SimpleNamespace(values=values[t].unsqueeze(-1), clear=lambda: None)
        PPO.process_env_step(alg, None, rewards[t], terminated[t] | time_outs[t], {"time_outs": time_outs[t]})
    alg.storage = SimpleNamespace(
        num_transitions_per_env=NUM_STEPS,
        rewards=torch.stack(stored).unsqueeze(-1),
        values=values.unsqueeze(-1),
        dones=(terminated | time_outs).unsqueeze(-1),
        returns=torch.zeros(NUM_STEPS, NUM_ENVS, 1),
    )
    alg.normalize_advantage_per_mini_batch = True
    alg.critic = LastValues(last_values.unsqueeze(-1))
    PPO.compute_returns(alg, None)
    theirs = alg.storage.returns[..., 0]
    module = load_script(script)
    returns = {}
    for flag in ("every-timeout", "unless-terminated"):
        args = parse_args(module.Args, ["--timeout-bootstrap", flag])
        every = args.timeout_bootstrap == "every-timeout"
        step = (rewards, values, last_values, values, terminated, time_outs, gamma, lam, every)
        returns[flag] = module.compute_advantages(*step)[1]
    torch.testing.assert_close(returns["every-timeout"], theirs, rtol=1e-5, atol=1e-6)
    at_both = (returns["unless-terminated"] - theirs).abs() > 1e-4
    assert at_both[both].all(), "ours differs on every step that terminates and times out"
    untouched = ~both.any(0)  # the envs without such a step: the two agree on every step
    torch.testing.assert_close(returns["unless-terminated"][:, untouched], theirs[:, untouched], rtol=1e-5, atol=1e-6)
