"""Named settings (common.settings, each script's SETTINGS): the set chosen by the env id's family or --settings,
the flags given over it, --help, config.json and --resume, a copy of a script, mjlab tasks' rsl_rl configs, the
threads chosen on a busy CPU, and the learning experiments' short flags against the long ones the results used."""

from __future__ import annotations

import shlex
import json
from pathlib import Path
import math
from dataclasses import asdict

import pytest
import torch

from common import settings
from common import args as common_args
from common.args import as_flag, given_flags, parse_args
from tests import fake_mjlab
from tests.helpers import ROOT, load_script

SCRIPTS = sorted(path.stem for path in (ROOT / "algos").glob("*.py"))  # a copy in algos/ among them


@pytest.mark.parametrize(
    "env_id, family",
    [
        ("gym:Hopper-v5", "mujoco"),
        ("gym:HalfCheetah-v4", "mujoco"),
        ("envpool:Walker2d-v4", "mujoco"),
        ("envpool:Pong-v5", "atari"),
        ("gym:ALE/Breakout-v5", "atari"),
        ("MinAtar/Breakout-v1", "minatar"),
        ("mjlab:Mjlab-Velocity-Flat-Unitree-G1", "task"),
        ("MountainCarContinuous-v0", "mountaincar"),
        ("gym:MountainCarContinuous-v0", "mountaincar"),
        ("CartPole-v1", None),
        ("gym:CartPole-v1", None),
        ("Pendulum-v1", None),
    ],
)
def test_the_family_of_an_env_id(env_id, family):
    assert common_args.family(env_id) == family


def test_the_family_set_is_the_default_and_every_flag_given_wins():
    td3 = load_script("td3")
    args = parse_args(td3.Args, ["--env-id", "gym:Hopper-v5"])
    assert args.settings == "mujoco"
    assert (args.num_envs, args.batch_size, args.num_updates, args.n_step) == (32, 256, 8, 1)
    assert (args.tau, args.obs_norm) == (0.005, False)
    assert (args.q_lr, args.policy_lr) == (1e-3, 1e-3)
    assert (args.num_eval_envs, args.eval_interval) == (10, 1563)
    assert given_flags(args) == {"env_id"}  # the set's values are defaults: a checkpoint's win over them on resume

    args = parse_args(td3.Args, ["--env-id", "gym:Hopper-v5", "--n-step", "3", "--q-lr=3e-4"])
    assert (args.n_step, args.q_lr, args.policy_lr, args.settings) == (3, 3e-4, 1e-3, "mujoco")
    assert given_flags(args) == {"env_id", "n_step", "q_lr"}

    plain = parse_args(td3.Args, ["--env-id", "gym:Hopper-v5", "--settings", "builtin"])
    assert plain.settings == "builtin" and asdict(plain) == {
        **asdict(td3.Args(env_id="gym:Hopper-v5")),
        "settings": "builtin",
    }
    assert parse_args(td3.Args, []).settings == "builtin"  # Pendulum-v1: no set for its family
    for spelling in (
        ["--env-id=gym:Hopper-v5"],
        ["--env_id", "gym:Hopper-v5"],
        ["--env-id", "x", "--env-id", "gym:Hopper-v5"],
    ):
        assert parse_args(td3.Args, spelling).settings == "mujoco"


def test_settings_picks_a_set_for_another_family_and_an_unknown_name_is_one_line():
    ppo = load_script("ppo")
    args = parse_args(ppo.Args, ["--env-id", "CartPole-v1", "--settings", "minatar"])
    assert (args.settings, args.num_envs, args.encoder) == ("minatar", 128, "minatar")
    with pytest.raises(SystemExit, match=r"^error: --settings atari: td3.py has builtin, mujoco, task; see --help$"):
        parse_args(load_script("td3").Args, ["--settings", "atari"])


def test_a_set_that_names_a_flag_the_script_lacks_stops_with_one_line(monkeypatch):
    td3 = load_script("td3")
    monkeypatch.setitem(td3.SETTINGS, "mujoco", {**td3.SETTINGS["mujoco"], "clip_coef": 0.1})
    with pytest.raises(SystemExit, match=r"^error: SETTINGS\['mujoco'\] of td3.py sets --clip-coef, which td3.py"):
        parse_args(td3.Args, ["--env-id", "gym:Hopper-v5"])


@pytest.mark.parametrize("algo", ["ppo", "ppo_rnd", "ppo_lstm"])
def test_ppo_mujoco_is_cleanrl_ppo_continuous_action(algo):
    """Every value of CleanRL's ppo_continuous_action.py, whether the set or the defaults give it (the sets list only
    what differs from their defaults); ppo_lstm.py's 64 tanh units come after its cell."""
    script = load_script(algo)
    args = parse_args(script.Args, ["--env-id", "gym:Hopper-v5", "--total-timesteps", "1000000"])
    expected = dict(
        settings="mujoco",
        num_envs=1,
        num_steps=2048,
        num_minibatches=32,
        update_epochs=10,
        learning_rate=3e-4,
        lr_schedule="linear",
        clip_coef=0.2,
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        obs_norm=True,
        reward_norm=True,
        hidden_sizes=(64,) if algo == "ppo_lstm" else (64, 64),
        activation="tanh",
        init_log_std=0.0,
        gamma=0.99,
        gae_lambda=0.95,
        clip_vloss=True,
        adv_norm="minibatch",
    )
    assert {k: getattr(args, k) for k in expected} == expected


def test_ppo_atari_is_cleanrl_ppo_atari_envpool():
    """python algos/ppo.py --env-id envpool:Pong-v5 starts with CleanRL's Atari agent and settings (resolved without
    envpool: the set is chosen from the id)."""
    ppo = load_script("ppo")
    args = parse_args(ppo.Args, ["--env-id", "envpool:Pong-v5"])
    expected = dict(
        settings="atari",
        env_kwargs='{"preset": "atari"}',
        total_timesteps=10_000_000,
        num_envs=8,
        num_steps=128,
        num_minibatches=4,
        update_epochs=4,
        learning_rate=2.5e-4,
        lr_schedule="linear",
        clip_coef=0.1,
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=0.5,
        reward_norm=False,
        encoder="nature",
        shared_encoder=True,
        hidden_sizes=(),
        gamma=0.99,
        gae_lambda=0.95,
        clip_vloss=True,
    )
    assert {k: getattr(args, k) for k in expected} == expected


def test_pqn_atari_is_purejaxqls_pqn_atari_with_cleanrls_end_epsilon_and_anneal():
    """python algos/pqn.py --env-id envpool:Pong-v5 starts with PQN's own Atari config (purejaxql's pqn_atari.yaml), its
    end epsilon and learning-rate anneal CleanRL's pqn_atari_envpool.py's, whether the set or the defaults give them."""
    pqn = load_script("pqn")
    args = parse_args(pqn.Args, ["--env-id", "envpool:Pong-v5"])
    expected = dict(
        settings="atari",
        env_kwargs='{"preset": "atari"}',
        total_timesteps=10_000_000,
        num_envs=128,
        num_steps=32,
        num_minibatches=32,
        update_epochs=2,
        learning_rate=2.5e-4,
        anneal_lr=True,
        gamma=0.99,
        q_lambda=0.65,
        max_grad_norm=10.0,
        start_e=1.0,
        end_e=0.01,
        exploration_fraction=0.1,
        reward_scale=1.0,
        encoder="nature",
        hidden_sizes=(),
    )
    assert {k: getattr(args, k) for k in expected} == expected


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_lists_every_set_with_its_values(script, capsys):
    module = load_script(script)
    with pytest.raises(SystemExit) as exit:
        parse_args(module.Args, ["--help"])
    assert exit.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--settings" in out and "named settings" in out
    for name, values in module.SETTINGS.items():
        assert f"{name} (" in out
        if isinstance(values, dict):
            changed = [as_flag(k, v) for k, v in values.items() if v != getattr(module.Args(), k)]
            assert " ".join(changed) in out


def test_a_copy_of_a_script_gets_its_sets(tmp_path):
    copy = tmp_path / "algos" / "ppo_settings_copy.py"
    copy.parent.mkdir()
    copy.write_text((ROOT / "algos" / "ppo.py").read_text())
    module = load_script("ppo_settings_copy", copy)
    args = parse_args(module.Args, ["--env-id", "gym:Hopper-v5"])
    assert (args.settings, args.num_steps, args.num_minibatches) == ("mujoco", 2048, 32)


def run_parsed(module, argv: list[str], monkeypatch):
    """main() of `argv` as the command line gives it, on one thread (OMP_NUM_THREADS set: choose_threads keeps off)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return module.main(parse_args(module.Args, argv))
    finally:
        torch.set_num_threads(threads)


def test_config_records_the_set_and_resume_keeps_its_values_whatever_the_set_has_become(tmp_path, monkeypatch, capsys):
    ppo = load_script("ppo")
    monkeypatch.setitem(ppo.SETTINGS, "mountaincar", {**ppo.SETTINGS["mountaincar"], "num_eval_envs": 3})
    sizes = ["--num-envs", "4", "--num-steps", "8", "--num-minibatches", "2", "--device", "cpu", "--no-progress"]
    where = ["--output-dir", str(tmp_path), "--run-name", "car"]
    argv = ["--env-id", "MountainCarContinuous-v0", "--total-timesteps", "32", "--eval-interval", "2", *sizes, *where]
    run_parsed(ppo, argv, monkeypatch)
    assert "settings mountaincar (for MountainCarContinuous-v0" in capsys.readouterr().out  # the start line
    config = json.loads((tmp_path / "car" / "config.json").read_text())
    assert (config["settings"], config["gamma"], config["init_log_std"]) == ("mountaincar", 0.999, 0.5)
    assert config["num_eval_envs"] == 3

    # the set changed since; the run resumed without its env id (parsed with the builtin set of ppo's default env)
    monkeypatch.setitem(ppo.SETTINGS, "mountaincar", dict(gamma=0.9, init_log_std=0.0, num_eval_envs=3))
    resume = ["--resume", "auto", "--total-timesteps", "64", "--eval-interval", "2", *sizes, *where]
    args = parse_args(ppo.Args, resume)
    assert (args.settings, args.gamma, args.num_eval_envs) == ("builtin", 0.99, 128)  # until the checkpoint is read
    summary = run_parsed(ppo, resume, monkeypatch)
    assert summary["global_step"] == 64
    config = json.loads((tmp_path / "car" / "config.json").read_text())
    assert (config["settings"], config["env_id"], config["gamma"], config["init_log_std"]) == (
        "mountaincar",
        "MountainCarContinuous-v0",
        0.999,
        0.5,
    )
    assert config["num_eval_envs"] == 3  # a run flag of the run's set, not of the set the command line resolved
    assert "--gamma 0.999 --init-log-std 0.5" in capsys.readouterr().out  # "from the checkpoint: ..."


# --------------------------------------------------------------------------------------------
# mjlab tasks: their rsl_rl runner config
# --------------------------------------------------------------------------------------------
# rsl_rl's update, which every runner config brings with it (common.settings.RSL_RL_UPDATE, the layout's clip, the
# minibatch order, the time-out bootstrap); a test's config without obs_groups: the adapter finds the groups by name
RSL_RL = dict(
    kl_estimator="analytic",
    lr_adapt="before-step",
    lr_max=1e-2,
    adam_eps=1e-8,
    reward_norm=False,
    timeout_bootstrap="every-timeout",
    grad_clip="per-network",
    shuffle="once",
    env_kwargs='{"final_obs": "pre_step"}',
)


def test_a_mjlab_task_brings_its_rsl_rl_config_and_names_what_has_no_flag(monkeypatch):
    fake_mjlab.install(monkeypatch)
    ppo = load_script("ppo")
    args = parse_args(ppo.Args, ["--env-id", "mjlab:Fake-Point-Tuned", "--learning-rate", "1e-4"])
    expected = dict(
        settings="task",
        num_steps=12,
        hidden_sizes=(32, 16),
        activation="elu",
        obs_norm=True,
        init_log_std=round(math.log(0.5), 6),
        std_type="scalar",  # rsl_rl 5 learns the std itself
        learning_rate=1e-4,  # given: it wins
        lr_schedule="constant",
        desired_kl=0.02,
        update_epochs=3,
        num_minibatches=2,
        clip_coef=0.3,
        gamma=0.98,
        gae_lambda=0.9,
        vf_coef=1.4,  # rsl_rl's value_loss_coef 0.7 weighs (V - R)^2; ours weighs 0.5 * (V - R)^2
        ent_coef=0.002,
        max_grad_norm=0.8,
        clip_vloss=False,
        adv_norm="batch",
        **RSL_RL,
    )
    assert {k: getattr(args, k) for k in expected} == expected
    untranslated = args._settings_origin[1]
    assert any("critic hidden dims (64, 32)" in u for u in untranslated)
    assert any("optimizer='adamw'" in u for u in untranslated)
    assert len(untranslated) == 2

    mirrored = parse_args(ppo.Args, ["--env-id", "mjlab:Fake-Point-Symmetric"])
    assert mirrored.symmetry == "augmentation"
    lstm = parse_args(load_script("ppo_lstm").Args, ["--env-id", "mjlab:Fake-Point-Symmetric"])
    assert any("symmetry_cfg" in u for u in lstm._settings_origin[1])  # ppo_lstm.py has no --symmetry: named
    plain = parse_args(ppo.Args, ["--env-id", "mjlab:Fake-Point-Tuned", "--settings", "builtin"])
    assert {k: getattr(plain, k) for k in RSL_RL} == {k: getattr(ppo.Args(), k) for k in RSL_RL}  # ours


def test_a_mjlab_run_says_what_its_task_config_has_that_the_script_cannot_take(monkeypatch, tmp_path, capsys):
    fake_mjlab.install(monkeypatch)
    ppo = load_script("ppo")
    argv = ["--env-id", "mjlab:Fake-Point-Tuned", "--num-envs", "4", "--total-timesteps", "48", "--eval-interval", "0"]
    summary = run_parsed(ppo, [*argv, "--device", "cpu", "--no-progress", "--output-dir", str(tmp_path)], monkeypatch)
    out = capsys.readouterr().out
    assert summary["global_step"] == 48  # 4 envs x the task's 12 steps per env
    line = next(
        line for line in out.splitlines() if line.startswith("settings task: the task's config has no flag here for")
    )
    assert "critic hidden dims" in line and "optimizer" in line
    assert "settings task (for mjlab:Fake-Point-Tuned" in out
    # kept in config.json, and said again by a resume that does not name the task
    config = json.loads((Path(summary["run_dir"]) / "config.json").read_text())
    assert "; ".join(config["settings_untranslated"]) in line
    resume = ["--resume", str(Path(summary["run_dir"]) / "checkpoints" / "last.pt"), "--total-timesteps", "96"]
    again = run_parsed(ppo, [*resume, "--device", "cpu", "--no-progress", "--output-dir", str(tmp_path)], monkeypatch)
    assert again["global_step"] == 96
    assert "; ".join(config["settings_untranslated"]) in capsys.readouterr().out


# mjlab 1.6's G1 velocity task's runner config as mjlab's train.py hands it to rsl_rl's runner (asdict of
# unitree_g1_ppo_runner_cfg(): src/mjlab/tasks/velocity/config/g1/rl_cfg.py, the rest mjlab.rl.config's defaults)
MJLAB_G1 = {
    "seed": 42,
    "num_steps_per_env": 24,
    "max_iterations": 30_000,
    "obs_groups": {"actor": ("actor",), "critic": ("critic",)},
    "save_interval": 50,
    "experiment_name": "g1_velocity",
    "run_name": "",
    "logger": "wandb",
    "wandb_project": "mjlab",
    "wandb_tags": (),
    "resume": False,
    "load_run": ".*",
    "load_checkpoint": "model_.*.pt",
    "clip_actions": None,
    "upload_model": True,
    "class_name": "OnPolicyRunner",
    "actor": {
        "hidden_dims": (512, 256, 128),
        "activation": "elu",
        "obs_normalization": True,
        "cnn_cfg": None,
        "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": 1.0, "std_type": "scalar"},
        "rnn_type": None,
        "rnn_hidden_dim": 256,
        "rnn_num_layers": 1,
        "class_name": "MLPModel",
    },
    "critic": {
        "hidden_dims": (512, 256, 128),
        "activation": "elu",
        "obs_normalization": True,
        "cnn_cfg": None,
        "distribution_cfg": None,
        "rnn_type": None,
        "rnn_hidden_dim": 256,
        "rnn_num_layers": 1,
        "class_name": "MLPModel",
    },
    "algorithm": {
        "num_learning_epochs": 5,
        "num_mini_batches": 4,
        "learning_rate": 1.0e-3,
        "schedule": "adaptive",
        "gamma": 0.99,
        "lam": 0.95,
        "entropy_coef": 0.01,
        "desired_kl": 0.01,
        "max_grad_norm": 1.0,
        "value_loss_coef": 1.0,
        "use_clipped_value_loss": True,
        "clip_param": 0.2,
        "normalize_advantage_per_mini_batch": False,
        "optimizer": "adam",
        "share_cnn_encoders": False,
        "class_name": "PPO",
    },
}
G1_FLAGS = dict(  # each field's flag: nothing of the config is left without one, nothing named
    seed=42,
    num_steps=24,
    total_timesteps=4096 * 24 * 30_000,  # max_iterations of --num-envs' default on one process
    save_interval=50,
    wandb_project_name="mjlab",
    hidden_sizes=(512, 256, 128),
    activation="elu",
    obs_norm=True,
    init_log_std=0.0,
    std_type="scalar",
    update_epochs=5,
    num_minibatches=4,
    learning_rate=1e-3,
    lr_schedule="adaptive",
    gamma=0.99,
    gae_lambda=0.95,
    ent_coef=0.01,
    desired_kl=0.01,
    max_grad_norm=1.0,
    vf_coef=2.0,
    clip_vloss=True,
    clip_coef=0.2,
    adv_norm="batch",
    **{**RSL_RL, "env_kwargs": '{"obs_groups": {"policy": "actor", "critic": "critic"}, "final_obs": "pre_step"}'},
)


@pytest.mark.parametrize("script", ["ppo", "ppo_rnd", "ppo_lstm"])
def test_mjlab_g1s_config_is_every_field_a_flag(script):
    """mjlab 1.6's G1 config, every field: its flag (rsl_rl's update with it), or a runner field that is not the
    training's (where it logs and what it loads: RUNNER_BOOKKEEPING); ppo.py and ppo_rnd.py name nothing at start,
    ppo_lstm.py only that the config has no memory (its cell is its own)."""
    fields = set(load_script(script).Args.__dataclass_fields__)
    values, named = settings.translate_rsl_rl(MJLAB_G1, fields)
    assert values == G1_FLAGS
    assert named == ([] if script != "ppo_lstm" else [next(n for n in named if "a policy without a memory" in n)])
    assert set(MJLAB_G1) - {"actor", "critic", "algorithm"} <= settings.RUNNER_BOOKKEEPING | {
        "seed", "num_steps_per_env", "max_iterations", "obs_groups", "save_interval", "wandb_project"
    }  # fmt: skip


def test_max_iterations_counts_the_runs_envs_and_processes(monkeypatch):
    """max_iterations -> --total-timesteps = num_envs x num_steps x max_iterations x world size: the command line's
    --num-envs (the default without one) and torchrun's WORLD_SIZE, so the run has the config's iterations."""
    fake_mjlab.install(monkeypatch)
    tuned = fake_mjlab.TASKS["Fake-Point-Tuned"]
    monkeypatch.setitem(fake_mjlab.TASKS, "Fake-Long", (tuned[0], {**MJLAB_G1, "max_iterations": 100}))
    ppo = load_script("ppo")
    argv = ["--env-id", "mjlab:Fake-Long", "--num-envs", "64"]
    monkeypatch.setattr(common_args.sys, "argv", ["ppo.py", *argv])
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert parse_args(ppo.Args, argv).total_timesteps == 64 * 24 * 100 * 2
    monkeypatch.setattr(common_args.sys, "argv", ["ppo.py", *argv, "--total-timesteps", "1000"])
    assert parse_args(ppo.Args, [*argv, "--total-timesteps", "1000"]).total_timesteps == 1000  # given: it wins


def test_td3_on_a_playground_task_takes_fasttd3s_published_settings_in_this_runs_units(monkeypatch):
    """td3.py's `task` set for a Playground id: FastTD3's Playground defaults and its values for the task where it has
    them; its per-env buffer and its iteration counts become this run's transitions and env steps (the command line's
    --num-envs); what has no flag is named; flags given win; another family's task id gets no values from it."""
    td3 = load_script("td3")
    argv = ["--env-id", "playground:Go1JoystickFlatTerrain", "--device", "cuda"]  # a CPU gets the cpu set (below)
    monkeypatch.setattr(common_args.sys, "argv", ["td3.py", *argv])
    args = parse_args(td3.Args, argv)
    assert args.settings == "task" and (args.num_envs, args.batch_size, args.gamma, args.tau) == (
        1024,
        32768,
        0.97,
        0.1,
    )
    assert (args.std_min, args.std_max, args.policy_noise, args.num_updates) == (0.2, 0.8, 0.2, 8)  # Go1's own
    assert args.distributional and (args.v_min, args.v_max, args.num_atoms) == (-10.0, 10.0, 101)
    assert args.hidden_sizes == (512, 256, 128) and args.critic_hidden_sizes == (1024, 512, 256)
    assert (args.buffer_size, args.learning_starts, args.total_timesteps) == (10240 * 1024, 10 * 1024, 50_000 * 1024)
    assert args.n_step == 1 and args.bf16 and args.obs_norm

    argv = ["--env-id", "playground:CheetahRun", "--num-envs", "64", "--v-max", "400", "--settings", "task"]
    monkeypatch.setattr(common_args.sys, "argv", ["td3.py", *argv])
    args = parse_args(td3.Args, argv)
    assert (args.n_step, args.v_min, args.v_max, args.std_min, args.policy_noise) == (3, -500.0, 400.0, 0.1, 0.1)
    assert (args.num_envs, args.buffer_size, args.total_timesteps) == (64, 10240 * 64, 1_500_000 * 64)

    values, named = settings.fasttd3_settings("playground:LeapCubeReorient", set(td3.Args.__dataclass_fields__))
    assert values["n_step"] == 3 and values["v_max"] == 50.0
    assert [n.split("=")[0] for n in named] == ["use_cdq", "weight_decay", "init_scale", "use_domain_randomization"]
    values, named = settings.fasttd3_settings(
        "mjlab:Mjlab-Velocity-Flat-Unitree-G1", set(td3.Args.__dataclass_fields__)
    )
    assert values == {} and named == [
        "no published FastTD3 settings for mjlab:Mjlab-Velocity-Flat-Unitree-G1 here: the plain defaults"
    ]


# Isaac Lab's rsl_rl 2-3 runner config with a recurrent policy, as its to_dict() gives it (isaaclab_rl's
# RslRlOnPolicyRunnerCfg with RslRlPpoActorCriticRecurrentCfg): what mjlab's earlier config looked like too
ISAAC_LAB_LSTM = {
    "seed": 7,
    "device": "cuda:0",
    "num_steps_per_env": 32,
    "max_iterations": 1500,
    "empirical_normalization": None,
    "obs_groups": {"policy": ["policy"], "critic": ["critic"]},
    "clip_actions": None,
    "save_interval": 100,
    "experiment_name": "anymal_c_rough",
    "run_name": "",
    "logger": "tensorboard",
    "neptune_project": "isaaclab",
    "wandb_project": "isaaclab",
    "resume": False,
    "load_run": ".*",
    "load_checkpoint": "model_.*.pt",
    "class_name": "OnPolicyRunner",
    "policy": {
        "class_name": "ActorCriticRecurrent",
        "init_noise_std": 0.5,
        "noise_std_type": "log",
        "state_dependent_std": False,
        "actor_obs_normalization": False,
        "critic_obs_normalization": False,
        "actor_hidden_dims": [128, 64],
        "critic_hidden_dims": [128, 64],
        "activation": "elu",
        "rnn_type": "gru",
        "rnn_hidden_dim": 96,
        "rnn_num_layers": 2,
    },
    "algorithm": {
        "class_name": "PPO",
        "num_learning_epochs": 4,
        "num_mini_batches": 8,
        "learning_rate": 5e-4,
        "schedule": "adaptive",
        "gamma": 0.995,
        "lam": 0.9,
        "entropy_coef": 0.005,
        "desired_kl": 0.02,
        "max_grad_norm": 0.5,
        "value_loss_coef": 0.5,
        "use_clipped_value_loss": True,
        "clip_param": 0.1,
        "normalize_advantage_per_mini_batch": True,
        "rnd_cfg": None,
        "symmetry_cfg": None,
    },
}
# Where each field of ISAAC_LAB_LSTM goes: (flag, value) for ppo_lstm.py, or the words of its line at start, or
# BOOKKEEPING (the runner's, not the training's)
BOOKKEEPING = "the runner's bookkeeping"
ISAAC_LAB_FIELDS = {
    "seed": ("seed", 7),
    "device": BOOKKEEPING,
    "num_steps_per_env": ("num_steps", 32),
    "max_iterations": ("total_timesteps", 4096 * 32 * 1500),
    "obs_groups": ("env_kwargs", '{"obs_groups": {"policy": "policy", "critic": "critic"}, "final_obs": "pre_step"}'),
    "save_interval": ("save_interval", 100),
    "experiment_name": BOOKKEEPING,
    "run_name": BOOKKEEPING,
    "logger": BOOKKEEPING,
    "neptune_project": BOOKKEEPING,
    "wandb_project": ("wandb_project_name", "isaaclab"),
    "resume": BOOKKEEPING,
    "load_run": BOOKKEEPING,
    "load_checkpoint": BOOKKEEPING,
    "class_name": BOOKKEEPING,
    "policy.class_name": "the critic's own memory",  # ActorCriticRecurrent: a memory for the actor and the critic
    "policy.init_noise_std": ("init_log_std", round(math.log(0.5), 6)),
    "policy.noise_std_type": ("std_type", "log"),
    "policy.state_dependent_std": ("std_type", "log"),  # False: the state-independent std
    "policy.actor_obs_normalization": ("obs_norm", False),
    "policy.critic_obs_normalization": ("obs_norm", False),
    "policy.actor_hidden_dims": ("hidden_sizes", (128, 64)),
    "policy.critic_hidden_dims": ("hidden_sizes", (128, 64)),
    "policy.activation": ("activation", "elu"),
    "policy.rnn_type": ("cell", "gru"),
    "policy.rnn_hidden_dim": ("rnn_hidden_size", 96),
    "policy.rnn_num_layers": ("rnn_layers", 2),
    "algorithm.class_name": ("update_epochs", 4),  # PPO
    "algorithm.num_learning_epochs": ("update_epochs", 4),
    "algorithm.num_mini_batches": ("num_minibatches", 8),
    "algorithm.learning_rate": ("learning_rate", 5e-4),
    "algorithm.schedule": ("lr_schedule", "adaptive"),
    "algorithm.gamma": ("gamma", 0.995),
    "algorithm.lam": ("gae_lambda", 0.9),
    "algorithm.entropy_coef": ("ent_coef", 0.005),
    "algorithm.desired_kl": ("desired_kl", 0.02),
    "algorithm.max_grad_norm": ("max_grad_norm", 0.5),
    "algorithm.value_loss_coef": ("vf_coef", 1.0),
    "algorithm.use_clipped_value_loss": ("clip_vloss", True),
    "algorithm.clip_param": ("clip_coef", 0.1),
    "algorithm.normalize_advantage_per_mini_batch": ("adv_norm", "minibatch"),
}


def leaves(cfg: dict, prefix: str = "") -> set[str]:
    """The config's fields with a value, nested ones as `section.field` (a dict-valued obs_groups is one field)."""
    out = set()
    for name, value in cfg.items():
        if isinstance(value, dict) and name != "obs_groups":
            out |= leaves(value, f"{prefix}{name}.")
        elif value is not None:
            out.add(f"{prefix}{name}")
    return out


def test_isaac_labs_recurrent_config_is_every_field_a_flag_of_ppo_lstm_or_a_line():
    """rsl_rl 2-3's layout (one policy config, an LSTM/GRU actor-critic, both normalization switches, the std's
    type) for ppo_lstm.py: every field is its flag or its line at start (ISAAC_LAB_FIELDS holds every field of the
    dict, the test says so first); rsl_rl 2-3's one gradient norm over the whole actor-critic (--grad-clip global),
    its recurrent minibatches (envs in order: --shuffle never). ppo.py takes the same config and says at start that it
    is recurrent: use algos/ppo_lstm.py."""
    assert leaves(ISAAC_LAB_LSTM) == set(ISAAC_LAB_FIELDS)
    values, named = settings.translate_rsl_rl(ISAAC_LAB_LSTM, set(load_script("ppo_lstm").Args.__dataclass_fields__))
    for field, where in ISAAC_LAB_FIELDS.items():
        if isinstance(where, tuple):
            assert values[where[0]] == where[1], field
        elif where != BOOKKEEPING:
            assert any(where in line for line in named), (field, named)
    assert (values["grad_clip"], values["shuffle"], values["reward_norm"]) == ("global", "never", False)
    assert {k: values[k] for k in ("kl_estimator", "lr_adapt", "lr_max", "adam_eps")} == {
        k: RSL_RL[k] for k in ("kl_estimator", "lr_adapt", "lr_max", "adam_eps")
    }
    assert named == ["the critic's own memory (rsl_rl's: one for each network; one cell here, read by both heads)"]

    values, named = settings.translate_rsl_rl(ISAAC_LAB_LSTM, set(load_script("ppo").Args.__dataclass_fields__))
    assert named == [
        "rnn_type='gru', rnn_hidden_dim=96, rnn_num_layers=2 (this task's config is recurrent: use algos/ppo_lstm.py)"
    ]
    assert "cell" not in values and values["hidden_sizes"] == (128, 64)


def test_a_recurrent_task_says_so_at_the_start_of_ppo_py_and_runs_with_ppo_lstm(monkeypatch, tmp_path, capsys):
    """mjlab 1.6's spelling of a recurrent actor (RNNModel, rnn_type): ppo.py runs its MLP and its start names the
    config recurrent; ppo_lstm.py takes the cell's flags."""
    fake_mjlab.install(monkeypatch)
    actor = fake_mjlab.FakeModelCfg(hidden_dims=(16,), rnn_type="lstm", rnn_hidden_dim=24, class_name="RNNModel")
    cfg = fake_mjlab.FakeRunnerCfg(num_steps_per_env=8, actor=actor, critic=fake_mjlab.FakeModelCfg(hidden_dims=(16,)))
    monkeypatch.setitem(fake_mjlab.TASKS, "Fake-Memory", (fake_mjlab.FakeEnvCfg(), cfg))
    argv = ["--env-id", "mjlab:Fake-Memory", "--num-envs", "4", "--total-timesteps", "32", "--eval-interval", "0"]
    run_parsed(
        load_script("ppo"), [*argv, "--device", "cpu", "--no-progress", "--output-dir", str(tmp_path)], monkeypatch
    )
    out = capsys.readouterr().out
    assert "this task's config is recurrent: use algos/ppo_lstm.py" in out.split("\nppo on mjlab:Fake-Memory")[0]
    lstm = parse_args(load_script("ppo_lstm").Args, argv)
    assert (lstm.cell, lstm.rnn_hidden_size, lstm.rnn_layers, lstm.hidden_sizes, lstm.shuffle) == (
        "lstm",
        24,
        1,
        (16,),
        "never",
    )


def test_obs_groups_pick_the_task_groups_and_one_the_task_lacks_is_a_one_line_error(monkeypatch, tmp_path):
    """obs_groups: the task groups the actor and the critic read (the adapter's obs_groups); a group the task lacks
    stops the run in one line before it trains; several groups for one network (rsl_rl concatenates them) are named."""
    fake_mjlab.install(monkeypatch)
    cfg = fake_mjlab.FakeRunnerCfg(num_steps_per_env=8, obs_groups={"actor": ("actor",), "critic": ("actor",)})
    monkeypatch.setitem(fake_mjlab.TASKS, "Fake-Groups", (fake_mjlab.FakeEnvCfg(), cfg))
    ppo = load_script("ppo")
    args = parse_args(ppo.Args, ["--env-id", "mjlab:Fake-Groups"])
    assert json.loads(args.env_kwargs)["obs_groups"] == {"policy": "actor", "critic": "actor"}
    cfg.obs_groups = {"actor": ("actor", "camera"), "critic": ("critic",)}
    args = parse_args(ppo.Args, ["--env-id", "mjlab:Fake-Groups"])
    assert "obs_groups['actor']=('actor', 'camera') (one group per network here)" in args._settings_origin[1]
    cfg.obs_groups = {"actor": ("actor",), "critic": ("privileged",)}
    argv = ["--env-id", "mjlab:Fake-Groups", "--num-envs", "4", "--total-timesteps", "32", "--device", "cpu"]
    with pytest.raises(SystemExit, match=r"^error: .*observation group\(s\) \['privileged'\] not in the task's groups"):
        run_parsed(ppo, [*argv, "--no-progress", "--output-dir", str(tmp_path)], monkeypatch)


def test_isaac_lab_spelling_and_rnd_cfg_translate_too():
    """rsl_rl 2-3 / Isaac Lab's runner config as a dict (its config-to-dict form): one policy config, empirical
    normalization, the RND config for ppo_rnd.py (named, not dropped, for ppo.py)."""
    cfg = {
        "num_steps_per_env": 24,
        "empirical_normalization": True,
        "policy": {
            "actor_hidden_dims": [512, 256, 128],
            "critic_hidden_dims": [512, 256, 128],
            "activation": "elu",
            "init_noise_std": 1.0,
        },
        "algorithm": {
            "learning_rate": 1e-3,
            "schedule": "adaptive",
            "entropy_coef": 0.01,
            "rnd_cfg": {
                "weight": 0.5,
                "learning_rate": 1e-3,
                "predictor_hidden_dims": [32],
                "target_hidden_dims": [32],
                "num_outputs": 8,
                "state_normalization": True,
                "reward_normalization": False,
                "weight_schedule": {"mode": "step"},
            },
        },
    }
    ppo, ppo_rnd = load_script("ppo"), load_script("ppo_rnd")
    fields = {f for f in ppo.Args.__dataclass_fields__}
    values, untranslated = settings.translate_rsl_rl(cfg, fields)
    assert values == dict(
        num_steps=24,
        hidden_sizes=(512, 256, 128),
        activation="elu",
        obs_norm=True,
        init_log_std=0.0,
        std_type="scalar",  # Isaac Lab's noise_std_type default
        lr_schedule="adaptive",
        learning_rate=1e-3,
        ent_coef=0.01,
        adv_norm="batch",  # rsl_rl's default: normalize_advantage_per_mini_batch=False
        **{**RSL_RL, "grad_clip": "global"},  # rsl_rl 2-3: one norm over the one actor-critic
    )
    assert untranslated == ["rnd_cfg (ppo_rnd.py's RND)"]
    values, untranslated = settings.translate_rsl_rl(cfg, set(ppo_rnd.Args.__dataclass_fields__))
    assert (values["rnd_weight"], values["rnd_hidden_sizes"], values["rnd_num_outputs"]) == (0.5, (32,), 8)
    assert (values["rnd_state_norm"], values["rnd_reward_norm"]) == (True, False)
    assert untranslated == ["rnd_cfg.weight_schedule={'mode': 'step'} (--rnd-weight-final)"]
    cfg["algorithm"]["rnd_cfg"]["weight_schedule"] = {"mode": "linear", "initial_step": 10, "final_step": 90}
    cfg["algorithm"]["rnd_cfg"]["weight_schedule"]["final_value"] = 0.1
    cfg["obs_groups"] = {"policy": ["policy"], "critic": ["critic"], "rnd_state": ["critic"]}
    values, untranslated = settings.translate_rsl_rl(cfg, set(ppo_rnd.Args.__dataclass_fields__))
    assert (values["rnd_weight_final"], values["rnd_weight_steps"], values["rnd_obs_group"]) == (
        0.1,
        (10, 90),
        "critic",
    )
    assert untranslated == []


def test_every_unknown_field_is_named_never_dropped():
    """A field the translation does not know, at any level, is named at start with its value."""
    cfg = {**MJLAB_G1, "curriculum": "hard", "algorithm": {**MJLAB_G1["algorithm"], "kl_penalty": 0.3}}
    cfg["actor"] = {
        **MJLAB_G1["actor"],
        "distribution_cfg": {**MJLAB_G1["actor"]["distribution_cfg"], "learn_std": False},
    }
    _, named = settings.translate_rsl_rl(cfg, set(load_script("ppo").Args.__dataclass_fields__))
    assert named == ["curriculum='hard'", "actor.distribution_cfg.learn_std=False", "algorithm.kl_penalty=0.3"]


# --------------------------------------------------------------------------------------------
# threads
# --------------------------------------------------------------------------------------------
def test_threads_follow_the_free_cores_unless_omp_num_threads_is_set(monkeypatch):
    import os

    threads = torch.get_num_threads()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        torch.set_num_threads(2)
        monkeypatch.setattr(os, "getloadavg", lambda: (4.6, 4.7, 4.8))
        line = settings.choose_threads()
        assert torch.get_num_threads() == 1 and "1 of 2 cores" in line and "4.6" in line
        torch.set_num_threads(2)
        monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.2, 0.2))
        assert settings.choose_threads() is None and torch.get_num_threads() == 2  # an idle machine: torch's own
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        monkeypatch.setattr(os, "getloadavg", lambda: (4.6, 4.7, 4.8))
        assert settings.choose_threads() is None and torch.get_num_threads() == 2  # the user's choice
    finally:
        torch.set_num_threads(threads)


# --------------------------------------------------------------------------------------------
# the learning experiments: their short flags give the Args the committed results ran with
# --------------------------------------------------------------------------------------------
# Each experiment's flags as the committed results ran them, over the scripts' plain defaults (before named settings).
OLD_FLAGS = {  # shell words
    "ppo:CartPole-v1": shlex.split(""),
    "ppo:Acrobot-v1": shlex.split(""),
    "ppo:Pendulum-v1": shlex.split(""),
    "ppo:MountainCarContinuous-v0": shlex.split("--gamma 0.999 --init-log-std 0.5"),
    "ppo:MountainCarContinuous-v0@defaults": shlex.split(""),
    "ppo_rnd:MountainCarContinuous-v0": shlex.split(""),
    "ppo:MountainCar-v0": shlex.split(""),
    "ppo_rnd:MountainCar-v0": shlex.split(""),
    "ppo_rnd:MountainCar-v0@decay": shlex.split("--rnd-weight-final 0 --rnd-weight-steps 0 488"),
    "ppo:Pendulum-v1@log": shlex.split("--symmetry log"),
    "ppo:Pendulum-v1@augmentation": shlex.split("--symmetry augmentation"),
    "ppo:Pendulum-v1@mirror-loss": shlex.split("--symmetry mirror-loss"),
    "ppo:Acrobot-v1@log": shlex.split("--symmetry log"),
    "ppo:Acrobot-v1@augmentation": shlex.split("--symmetry augmentation"),
    "ppo:Acrobot-v1@mirror-loss": shlex.split("--symmetry mirror-loss"),
    "pqn:CartPole-v1": shlex.split(""),
    "pqn:Acrobot-v1": shlex.split(""),
    "td3:Pendulum-v1": shlex.split(""),
    "sac:Pendulum-v1": shlex.split(""),
    "ppo_lstm:CartPole-v1@masked": shlex.split("--env-kwargs '{\"mask_velocity\": true}' --no-asymmetric-critic"),
    "ppo:CartPole-v1@masked": shlex.split("--env-kwargs '{\"mask_velocity\": true}' --no-asymmetric-critic"),
    "ppo_lstm:Pendulum-v1@masked": shlex.split("--env-kwargs '{\"mask_velocity\": true}' --no-asymmetric-critic"),
    "ppo:Pendulum-v1@masked": shlex.split("--env-kwargs '{\"mask_velocity\": true}' --no-asymmetric-critic"),
    "ppo_lstm:CartPole-v1": shlex.split(""),
    "ppo_lstm:Pendulum-v1": shlex.split(""),
    "ppo:CartPole-v1@teacher": shlex.split("--num-envs 256 --num-steps 32 --eval-interval 4"),
    "distill:CartPole-v1@masked-lstm": shlex.split(
        "--env-kwargs '{\"mask_velocity\": true}' --num-envs 256 --num-steps 32 --eval-interval 2"
    ),
    "distill:CartPole-v1@masked-mlp": shlex.split(
        "--env-kwargs '{\"mask_velocity\": true}' --num-envs 256 --num-steps 32 --eval-interval 2 --cell none"
    ),
    "ppo_lstm:CartPole-v1@finetune": shlex.split(
        "--env-kwargs '{\"mask_velocity\": true}' --num-envs 256 --num-steps 32 --eval-interval 1 "
        "--learning-rate 1e-5 --lr-schedule constant --ent-coef 0"
    ),
    "ppo:Pendulum-v1@teacher": shlex.split(""),
    "distill:Pendulum-v1@masked-lstm": shlex.split(
        "--env-kwargs '{\"mask_velocity\": true}' --num-envs 256 --update-epochs 5 --num-minibatches 8 "
        "--learning-rate 2e-3 --eval-interval 4"
    ),
    "ppo:CartPole-v1@fast": shlex.split("--num-envs 256 --num-steps 32 --eval-interval 4"),
    "pqn:MinAtar/Breakout-v1": shlex.split(
        "--num-envs 128 --num-steps 32 --num-eval-envs 16 --eval-interval 10 --num-minibatches 32 "
        "--learning-rate 5e-4 --reward-scale 1.0 --exploration-fraction 0.1 --hidden-sizes 128 --encoder "
        "minatar"
    ),
    "pqn:MinAtar/Breakout-v1@mlp": shlex.split(
        "--num-envs 128 --num-steps 32 --num-eval-envs 16 --eval-interval 10 --num-minibatches 32 "
        "--learning-rate 5e-4 --reward-scale 1.0 --exploration-fraction 0.1 --hidden-sizes 128 --encoder mlp"
    ),
    "ppo:MinAtar/Breakout-v1": shlex.split(
        "--num-envs 128 --num-steps 32 --num-eval-envs 16 --eval-interval 10 --num-minibatches 8 "
        "--update-epochs 4 --ent-coef 0.01 --encoder minatar"
    ),
    "ppo:MinAtar/Breakout-v1@mlp": shlex.split(
        "--num-envs 128 --num-steps 32 --num-eval-envs 16 --eval-interval 10 --num-minibatches 8 "
        "--update-epochs 4 --ent-coef 0.01 --encoder mlp"
    ),
    "pqn:MinAtar/Asterix-v1": shlex.split(
        "--num-envs 128 --num-steps 32 --num-eval-envs 16 --eval-interval 10 --num-minibatches 32 "
        "--learning-rate 5e-4 --reward-scale 1.0 --exploration-fraction 0.1 --hidden-sizes 128 --encoder "
        "minatar"
    ),
    "ppo:MinAtar/Asterix-v1": shlex.split(
        "--num-envs 128 --num-steps 32 --num-eval-envs 16 --eval-interval 10 --num-minibatches 8 "
        "--update-epochs 4 --ent-coef 0.01 --encoder minatar"
    ),
    "pqn:MinAtar/Freeway-v1": shlex.split(
        "--num-envs 128 --num-steps 32 --num-eval-envs 16 --eval-interval 10 --num-minibatches 32 "
        "--learning-rate 5e-4 --reward-scale 1.0 --exploration-fraction 0.1 --hidden-sizes 128 --encoder "
        "minatar"
    ),
    "ppo:MinAtar/Freeway-v1": shlex.split(
        "--num-envs 128 --num-steps 32 --num-eval-envs 16 --eval-interval 10 --num-minibatches 8 "
        "--update-epochs 4 --ent-coef 0.01 --encoder minatar"
    ),
    "pqn:MinAtar/Seaquest-v1": shlex.split(
        "--num-envs 128 --num-steps 32 --num-eval-envs 16 --eval-interval 10 --num-minibatches 32 "
        "--learning-rate 5e-4 --reward-scale 1.0 --exploration-fraction 0.1 --hidden-sizes 128 --encoder "
        "minatar"
    ),
    "ppo:MinAtar/Seaquest-v1": shlex.split(
        "--num-envs 128 --num-steps 32 --num-eval-envs 16 --eval-interval 10 --num-minibatches 8 "
        "--update-epochs 4 --ent-coef 0.01 --encoder minatar"
    ),
    "pqn:MinAtar/SpaceInvaders-v1": shlex.split(
        "--num-envs 128 --num-steps 32 --num-eval-envs 16 --eval-interval 10 --num-minibatches 32 "
        "--learning-rate 5e-4 --reward-scale 1.0 --exploration-fraction 0.1 --hidden-sizes 128 --encoder "
        "minatar"
    ),
    "ppo:MinAtar/SpaceInvaders-v1": shlex.split(
        "--num-envs 128 --num-steps 32 --num-eval-envs 16 --eval-interval 10 --num-minibatches 8 "
        "--update-epochs 4 --ent-coef 0.01 --encoder minatar"
    ),
    "ppo:envpool:Pong-v5": shlex.split(
        '--env-kwargs \'{"preset": "atari"}\' --encoder nature --num-envs 8 --num-steps 128 --num-minibatches 4'
        " --update-epochs 4 --learning-rate 2.5e-4 --lr-schedule linear --clip-coef 0.1 --ent-coef 0.01 "
        "--vf-coef 0.5 --max-grad-norm 0.5 --no-reward-norm --shared-encoder --hidden-sizes --num-eval-envs 8"
        " --eval-interval 50 --save-interval-seconds 600 --resume auto"
    ),
    "td3:gym:Hopper-v5": shlex.split("--device cpu --num-eval-envs 10 --eval-interval 1563"),
    "td3:gym:HalfCheetah-v5": shlex.split("--device cpu --num-eval-envs 10 --eval-interval 1563"),
    "td3:gym:Walker2d-v5": shlex.split("--device cpu --num-eval-envs 10 --eval-interval 1563"),
    "sac:gym:Hopper-v5": shlex.split("--device cpu --num-eval-envs 10 --eval-interval 1563"),
    "sac:gym:HalfCheetah-v5": shlex.split("--device cpu --num-eval-envs 10 --eval-interval 1563"),
    "sac:gym:Walker2d-v5": shlex.split("--device cpu --num-eval-envs 10 --eval-interval 1563"),
    "ppo:gym:HalfCheetah-v5": shlex.split(
        "--num-envs 8 --num-steps 256 --num-minibatches 32 --update-epochs 10 --learning-rate 3e-4 "
        "--lr-schedule linear --ent-coef 0 --vf-coef 0.5 --max-grad-norm 0.5 --reward-norm --num-eval-envs 8 "
        "--eval-interval 25"
    ),
    "td3:gym:Hopper-v5@n1": shlex.split("--device cpu --num-eval-envs 10 --eval-interval 1563 --n-step 1"),
    "td3:gym:HalfCheetah-v5@n1": shlex.split("--device cpu --num-eval-envs 10 --eval-interval 1563 --n-step 1"),
    "td3:gym:Walker2d-v5@n1": shlex.split("--device cpu --num-eval-envs 10 --eval-interval 1563 --n-step 1"),
    "sac:gym:Hopper-v5@n1": shlex.split("--device cpu --num-eval-envs 10 --eval-interval 1563 --n-step 1"),
    "td3:gym:HalfCheetah-v5@n1u4": shlex.split(
        "--device cpu --num-eval-envs 10 --eval-interval 1563 --n-step 1 --num-updates 4 --batch-size 256"
    ),
    "sac:gym:HalfCheetah-v5@u4": shlex.split(
        "--device cpu --num-eval-envs 10 --eval-interval 1563 --num-updates 4 --batch-size 256"
    ),
    "td3:gym:Hopper-v5@n1lr": shlex.split(
        "--device cpu --num-eval-envs 10 --eval-interval 1563 --n-step 1 --q-lr 1e-3 --policy-lr 1e-3"
    ),
    "td3:gym:HalfCheetah-v5@n1lr": shlex.split(
        "--device cpu --num-eval-envs 10 --eval-interval 1563 --n-step 1 --q-lr 1e-3 --policy-lr 1e-3"
    ),
    "td3:gym:Walker2d-v5@n1lr": shlex.split(
        "--device cpu --num-eval-envs 10 --eval-interval 1563 --n-step 1 --q-lr 1e-3 --policy-lr 1e-3"
    ),
    "sac:gym:Hopper-v5@n1lr": shlex.split(
        "--device cpu --num-eval-envs 10 --eval-interval 1563 --n-step 1 --q-lr 1e-3 --policy-lr 1e-3"
    ),
    "sac:gym:HalfCheetah-v5@n1lr": shlex.split(
        "--device cpu --num-eval-envs 10 --eval-interval 1563 --n-step 1 --q-lr 1e-3 --policy-lr 1e-3"
    ),
    "sac:gym:Walker2d-v5@n1lr": shlex.split(
        "--device cpu --num-eval-envs 10 --eval-interval 1563 --n-step 1 --q-lr 1e-3 --policy-lr 1e-3"
    ),
}


def resolved(module, argv: list[str]) -> dict:
    """The Args a command line gives, with the sizes a CPU run resolves (DEVICE_DEFAULTS) and without the set's name."""
    args = parse_args(module.Args, argv)
    for name, (_, elsewhere) in getattr(module, "DEVICE_DEFAULTS", {}).items():
        if getattr(args, name) is None and args.device == "cpu":
            setattr(args, name, elsewhere)
    return {k: v for k, v in asdict(args).items() if k != "settings"}


# Experiments first run with the named settings: what their committed runs recorded is their flags of today.
FIVE_MUJOCO = ("Hopper", "Walker2d", "HalfCheetah", "Ant", "Humanoid")
NEW_EXPERIMENTS = {
    "td3:gym:Hopper-v5@500k",
    "td3:gym:Ant-v5@1m",
    "td3:gym:Ant-v5@1mnoobsnorm",
    "td3:gym:Ant-v5@1mnoobsnorm27",
    "td3:gym:Ant-v5@1mnoobsnorm27u8",
    "td3:gym:Ant-v5@1mnoobsnorm27u8tau",
    "td3:gym:Ant-v5@1mnoobsnorm27u8lr",
    "td3:gym:Ant-v5@1mnoobsnorm27u16tau",
    "td3:gym:Hopper-v5@noobsnormu8tau",
    "td3:gym:Walker2d-v5@noobsnormu8tau",
    "td3:gym:HalfCheetah-v5@noobsnormu8tau",
    "td3:gym:Humanoid-v5@noobsnormu8tau",
    "td3:gym:Ant-v5@noobsnormu8tau",
    *(f"td3:gym:{task}-v5@obsnormu8tau" for task in FIVE_MUJOCO),
    "sac:gym:Ant-v5@set",
    "sac:gym:Humanoid-v5@set",
    *(f"ppo:gym:{task}-v5@set" for task in FIVE_MUJOCO),
}


# td3's mujoco set before issue 78's runs gave it 8 updates, tau 0.005 and no observation normalization, as flags over
# the plain defaults: the set under which the td3 MuJoCo experiments committed before then ran.
TD3_MUJOCO_BEFORE_78 = shlex.split(
    "--num-envs 32 --batch-size 256 --num-updates 4 --n-step 1 --q-lr 1e-3 --policy-lr 1e-3 --num-eval-envs 10 "
    "--eval-interval 1563"
)


def test_every_experiment_had_long_flags_or_ran_with_the_settings():
    from tests.benchmarks.learning import ANT_ARMS, COMMITTED, EXPERIMENTS, split_name

    # and td3 on Ant-v5, one change at a time from the mujoco set: every arm the benchmark defines
    new_experiments = NEW_EXPERIMENTS | {f"td3:gym:Ant-v5@{arm}" for arm in ANT_ARMS}
    assert set(EXPERIMENTS) == set(OLD_FLAGS) | new_experiments and not set(OLD_FLAGS) & new_experiments
    td3, checked_over_the_old_set = load_script("td3"), 0
    for path in COMMITTED.rglob("learning.json"):
        for name, spec in json.loads(path.read_text())["experiments"].items():
            if name not in new_experiments or spec["flags"] == EXPERIMENTS[name]["flags"]:
                continue
            # a td3 MuJoCo run under the set of before issue 78: its flags over that set give the Args of today's
            algo, env_id, _ = split_name(name)
            assert algo == "td3" and env_id.startswith("gym:"), f"{path}: {name} ran with other flags"
            common = ["--env-id", env_id, "--seed", "1", "--total-timesteps", str(spec["budget"])]
            then = resolved(td3, ["--settings", "builtin", *common, *TD3_MUJOCO_BEFORE_78, *spec["flags"]])
            assert then == resolved(td3, [*common, *EXPERIMENTS[name]["flags"]]), f"{path}: {name}"
            checked_over_the_old_set += 1
    assert checked_over_the_old_set >= 10  # Hopper@500k and the Ant arms that ran


@pytest.mark.parametrize("name", sorted(OLD_FLAGS))
def test_an_experiments_short_flags_give_the_args_its_long_flags_gave(name):
    from tests.benchmarks.learning import EXPERIMENTS, split_name

    algo, env_id, _ = split_name(name)
    module = load_script(algo)
    common = ["--env-id", env_id, "--seed", "1", "--total-timesteps", str(EXPERIMENTS[name]["budget"])]
    short = resolved(module, [*common, *EXPERIMENTS[name]["flags"]])
    long = resolved(module, ["--settings", "builtin", *common, *OLD_FLAGS[name]])
    assert short == long


def test_the_2_3_layouts_normalization_switches_that_disagree_are_said_with_their_precedence():
    """rsl_rl 3 reads the policy's actor/critic_obs_normalization and ignores the runner's empirical_normalization:
    where they disagree the policy's win, and the start line of the untranslated fields says so."""
    fields = set(load_script("ppo").Args.__dataclass_fields__)
    cfg = {
        "empirical_normalization": False,
        "policy": {"actor_obs_normalization": True, "critic_obs_normalization": True, "actor_hidden_dims": [32]},
    }
    values, untranslated = settings.translate_rsl_rl(cfg, fields)
    assert values["obs_norm"] is True
    assert any("empirical_normalization=False" in line and "the policy's switches win" in line for line in untranslated)
    agreeing = {**cfg, "empirical_normalization": True}
    assert not any("empirical_normalization" in line for line in settings.translate_rsl_rl(agreeing, fields)[1])


@pytest.mark.parametrize("algo", ["ppo", "ppo_rnd", "ppo_lstm", "distill", "pqn", "td3", "sac"])
def test_a_run_by_the_env_name_alone_has_its_communitys_budget_in_whole_iterations(algo):
    """No default run ends on a rounding notice: the plain defaults' budget is whole iterations of the default sizes
    (td3/sac: of either device's number of envs), and each family's set carries its community's budget, whole too:
    CleanRL's 1M steps for MuJoCo (ppo's, its 488 iterations of 2048), the MinAtar tables'. Atari keeps CleanRL's
    10M as CleanRL states it (CleanRL rounds it down to whole iterations too; the test above holds it)."""
    script = load_script(algo)
    plain = parse_args(script.Args, [])
    per_iteration = [plain.num_envs * plain.num_steps] if hasattr(plain, "num_steps") else [1024, 32]
    assert all(plain.total_timesteps % n == 0 for n in per_iteration), (plain.total_timesteps, per_iteration)
    budgets = {"mujoco": ("gym:Hopper-v5", 1_000_000), "minatar": ("MinAtar/Breakout-v1", 655_360)}
    for family, (env_id, budget) in budgets.items():
        if family not in script.SETTINGS:
            continue
        args = parse_args(script.Args, ["--env-id", env_id])
        assert args.settings == family
        per = args.num_envs * args.num_steps if hasattr(args, "num_steps") else args.num_envs
        assert args.total_timesteps % per == 0 and budget - per < args.total_timesteps <= budget, (family, args)


@pytest.mark.parametrize("algo", ["ppo", "ppo_rnd", "ppo_lstm", "sac", "td3"])
def test_a_playground_task_by_name_on_a_cpu_gets_a_cpus_sizes_and_its_task_set_on_cuda(algo, monkeypatch, capsys):
    """A Playground task's `task` set is a GPU's (brax PPO's 2,048 envs in 983,040-step iterations, FastTD3's 1,024 envs
    and batches of 32,768): without CUDA and without --settings the env id gives the `cpu` set instead, minutes on a
    CPU, and the start line names the command of the task's own config. --settings task, --device cuda or a machine
    with CUDA give the task set; another family's id (mjlab) is not touched. Resolved without Playground installed."""
    module = load_script(algo)
    task = "playground:CartpoleBalance"

    def parsed(*argv, cuda=False):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(common_args.sys, "argv", [f"{algo}.py", "--env-id", task, *argv])
        return parse_args(module.Args, ["--env-id", task, *argv])

    args = parsed()
    assert args.settings == "cpu" and args.total_timesteps <= settings.CPU_OFF_POLICY_STEPS * 2, args
    origin, untranslated = args._settings_origin
    assert origin.startswith(f"for {task} on a machine without CUDA: a CPU's sizes") and not untranslated, origin
    assert origin.endswith(f"the task's own config, a GPU's: python algos/{algo}.py --env-id {task} --settings task")
    assert json.loads(args.env_kwargs) == {"impl": "jax"}  # MJX: it compiles and steps faster than Warp on a CPU
    assert args.num_eval_envs == 16 and given_flags(args) == {"env_id"}  # the set's values are defaults
    if hasattr(args, "update_epochs"):  # on-policy: the plain defaults at 64 envs
        plain = parse_args(module.Args, ["--settings", "builtin"])
        assert (args.num_envs, args.total_timesteps) == (64, 307_200) and args.total_timesteps % (
            64 * plain.num_steps
        ) == 0
        assert (args.num_steps, args.update_epochs, args.lr_schedule) == (
            plain.num_steps,
            plain.update_epochs,
            plain.lr_schedule,
        )
    else:  # off-policy: an evaluation every 12,800 steps of the run's envs (td3 and sac here: 32 by the device)
        envs = args.num_envs or module.DEVICE_DEFAULTS["num_envs"][1]
        assert args.total_timesteps == 204_800 and args.eval_interval * envs == 12_800, (envs, args.eval_interval)
        assert args.batch_size in (None, 512) and not getattr(args, "distributional", False)
    for task_set in (parsed("--settings", "task"), parsed("--device", "cuda"), parsed(cuda=True)):
        assert task_set.settings == "task", task_set.settings
    assert parsed("--num-envs", "8").num_envs == 8  # a flag given wins over the set
    assert parse_args(module.Args, ["--env-id", "mjlab:Mjlab-Velocity-Flat-Unitree-G1"]).settings == "task"
    with pytest.raises(SystemExit):
        parse_args(module.Args, ["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "cpu (MuJoCo Playground tasks on a machine without CUDA" in help_text
