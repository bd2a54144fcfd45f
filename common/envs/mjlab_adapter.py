"""Adapter: mjlab tasks behind the torch env contract (`make_env("mjlab:<task>", ...)`).

    envs = make_env("mjlab:Mjlab-Velocity-Flat-Unitree-G1", num_envs=4096, device="cuda", seed=1)
    envs = make_env("mjlab:Mjlab-Cartpole-Balance", 64, configure=lambda cfg: setattr(cfg, "episode_length_s", 10.0))

mjlab (https://github.com/mujocolab/mjlab) is Isaac Lab's manager-based API on MuJoCo Warp: all envs of a task live in
one batched simulator on the device, like the built-in envs here. Its `ManagerBasedRlEnv` has Isaac Lab's shape, which
is all `ManagerBasedEnvAdapter` below relies on in "pre_step" mode:

    obs_dict, extras = env.reset(seed=...)
    obs_dict, reward, terminated, truncated, extras = env.step(action)   # torch tensors
    obs_dict[group] -> [N, ...] tensor, or a dict of per-term tensors
    extras["log"]   -> episode statistics of the envs reset in this step (tensors or numbers)
    env.num_envs, env.max_episode_length, env.single_action_space.shape, env.cfg.is_finite_horizon

so an Isaac Lab env (ManagerBasedRLEnv, DirectRLEnv) can be wrapped by the same class, with `final_obs="pre_step"`
(Isaac Lab always resets inside `step`).

Observation groups map to the contract's keys: "policy" <- the task's "policy" group (Isaac Lab's name) or "actor"
(mjlab's); "critic" <- "critic" when the task has privileged critic inputs. Groups whose terms are not concatenated are
flattened and concatenated in term order. Other groups (cameras, ...) are not passed on; `obs_groups` picks them
explicitly.

Final observations (`final_obs`)
--------------------------------
- "terminal" (default, mjlab only): `info["final_obs"]` holds the true last observation of the
  envs whose episode ended: the observation of the state the step ended in, before the reset.
- "pre_step": `info["final_obs"]` of a finished env is its observation *before* the final step,
  the approximation rsl_rl makes when it bootstraps time-outs with V(s_{T-1}) in place of V(s_T).
  Works with any Isaac Lab-shaped env; slightly biased on truncation.

How "terminal" gets the last observation. mjlab 1.6's `ManagerBasedRlEnv.step` (src/mjlab/envs/manager_based_rl_env.py)
runs, after the physics and the rewards:

    reset_env_ids = reset_buf.nonzero()                        # the simulator's own host sync
    if auto_reset and any: self._reset_idx(reset_env_ids)      # resets the finished envs' state
    sim.forward(); command_manager.compute(dt=...); sim.sense()
    obs_buf = observation_manager.compute(update_history=True)

so with its auto-reset on, the observation of a finished env's last state is never computed: the single
forward/observation pass sees the new episode. With `cfg.auto_reset = False`, step computes every env's observation at
the state the step ended in and the caller resets the finished envs with `reset(env_ids)`, whose second half is the same
pass scoped to those envs: `sim.forward(); command_manager.compute(dt=0.0, env_ids); sim.sense();
observation_manager.compute(update_history=True, env_ids)` (the `env_ids` forms backfill only the reset envs'
observation history and delay buffers and advance only their commands, so the other envs' observation timelines, command
timers and history stay as the step left them).

The adapter runs that explicit sequence *inside* mjlab's step, with mjlab's auto-reset on, so it needs neither the
caller's list of finished envs (a host sync) nor a second call into mjlab: a hook on the env instance replaces
`env._reset_idx`, which step calls only when episodes ended, with the ids it has already read back. When called from the
adapter's step, the hook

1. computes the terminal observations as the auto_reset=False step would: `sim.forward()`,
   `command_manager.compute(dt=step_dt)`, `sim.sense()`,
   `observation_manager.compute(update_history=True)` (history and delay buffers advance once,
   observation noise is drawn once, exactly as in a step without reset);
2. calls mjlab's own `_reset_idx(env_ids)` (curriculum, sim/scene reset, reset events, the
   managers' resets with their `extras["log"]` statistics);
3. arms two one-shot redirects, so that the rest of mjlab's step (its forward and sensing run
   unchanged) computes the commands and observations as `reset(env_ids)` does:
   `command_manager.compute(dt=0.0, env_ids)` and
   `observation_manager.compute(update_history=True, env_ids)`.

The result is, call for call and random draw for random draw, the auto_reset=False step followed by `reset(env_ids)`
(tests/test_mjlab_adapter.py checks them equal, bit for bit; only mjlab's recorders also get the pre-reset call of its
auto-reset path): the returned obs of a finished env is its new episode's first observation, `final_obs` its terminal
one, and the other envs' rows are the step's observations. On steps where no episode ends, mjlab does not call
`_reset_idx` and the hook costs nothing. Why a hook and not a copy of mjlab's step: the step (physics, rewards, events,
recorders, metrics) stays mjlab's own, and the hook touches only the three calls whose arguments the reset path changes.

Cost against mjlab's own auto-reset, on steps where some episode ends: one more forward, sensing, command and
observation pass over all envs (mjlab's auto-reset saves it by never computing the terminal observation; any true final
observation needs the forward kinematics of the terminal state). No host sync of the adapter's own: the ids are the ones
mjlab's step read back; mjlab's managers keep their own (the resampling check of command timers, the `.item()` of some
reset statistics), one of them in the extra command pass. On those steps mjlab's command metrics
(`Metrics/<command>/...`, logging only) of the continuing envs are refreshed twice, as in mjlab's own `reset(env_ids)`
path. The plain alternative, auto_reset=False and the adapter calling `env.reset(env_ids)` after each step, runs the
same passes plus two host syncs per step (the adapter's `done.nonzero()` to list the finished envs, and mjlab's check
for pending manual resets at the start of its step) and a second round of Python through mjlab's reset.

What "terminal" relies on is checked when the adapter is built (`terminal_hook_problems`): `_reset_idx`,
`sim.forward`/`sim.sense`, the `env_ids` forms of the two `compute` methods, and the order of those calls in `step`;
after every step the adapter checks that both redirects were consumed. Another mjlab version that fails a check is
refused with the cause and the way out (mjlab 1.6.x, or `final_obs="pre_step"`); `CHECKED_MJLAB` is the version it was
checked on.

Per-step work of the adapter: no host reads, no per-step tensors from host values. mjlab 1.6 builds new observation
tensors at every `compute` (a `torch.cat` per concatenated group, a clone per term), so they are passed on without
copies (`copy_obs=False`); reward and done flags live in buffers mjlab rewrites in place, so they are copied.
`extras["log"]` values that are tensors stay on the device (0-d float32), numbers stay Python floats: no host-to-device
copy per value and step. Returned tensors belong to the caller: neither mjlab nor the adapter writes them again.

Episodes that hit the time limit are `truncated` (bootstrapped) unless the task declares a finite horizon
(`cfg.is_finite_horizon`), in which case the time limit is terminal and the adapter reports them as `terminated`, as
mjlab's rsl_rl wrapper does.

Mirror symmetry (`data_augmentation`, for `ppo.py --symmetry`)
---------------------------------------------------------------
An rsl_rl user declares a task's mirror in its rsl_rl runner config, which mjlab's registry keeps
beside the env config (`register_mjlab_task(..., rl_cfg=...)`, read back by `load_rl_cfg(task)`):
`rl_cfg.algorithm.symmetry_cfg.data_augmentation_func`, as in Isaac Lab's `RslRlPpoAlgorithmCfg`
(whose `symmetry_cfg` is an `RslRlSymmetryCfg`). mjlab 1.6's algorithm config has no such field: a
task declares it in a subclass, and rsl_rl (5.4.2, which mjlab 1.6 pins) reads it from the dict
mjlab's train script makes of the config. rsl_rl calls it `func(env=..., obs=..., actions=...)`,
`obs` a TensorDict of the task's groups (rsl_rl >= 3), or once per group with
`obs_type="policy"|"critic"` and that group's tensor (rsl_rl 2, older Isaac Lab); a "module:name"
string (what Isaac Lab's config-to-dict makes of a function) is imported. The adapter's
`data_augmentation(obs=None, actions=None)` (common/symmetry.py's contract, the same for every env
kind: flat [B] rows in, each batch followed by its mirror images along dim 0 out) calls it with the
wrapped env (whose `unwrapped` is itself, as the functions expect of rsl_rl's wrapper) and the
observations under the task's group names, a group of separate terms split back into its terms, and
maps the result back to the adapter's groups. A `data_augmentation` attribute of the unwrapped env,
or else of its config, is taken as is, before the task's function (a mirror written for the
adapter's own observations, under the same contract).
Without either the adapter has no `data_augmentation` attribute (`--symmetry` then stops the run).

Seeding and checkpoints: mjlab draws its randomness (resets, domain randomisation, noise) from the process-wide
torch/numpy/warp generators, so `seed` (at construction and in `reset(seed=...)`) re-seeds those global generators,
exactly as mjlab does; numpy and warp take 32-bit seeds, so a seed is folded to `seed % 2**31` first (the scripts derive
62-bit ones). The simulator and manager state cannot be snapshotted through mjlab's API, so `state_dict()` is empty and
a resumed run starts from freshly reset envs (resume is exact only for the built-in envs)."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import math
import numbers
from typing import Any, Callable

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict

FINAL_OBS_MODES = ("terminal", "pre_step")
POLICY_GROUPS = ("policy", "actor")  # Isaac Lab's name, then mjlab's
CRITIC_GROUPS = ("critic",)

# The mjlab release whose step and reset path "terminal" was checked against (see the module
# docstring; tests/test_mjlab_adapter.py compares it with mjlab's explicit reset flow).
CHECKED_MJLAB = "1.6"


def make_mjlab_env(
    task: str,
    num_envs: int,
    device: str | torch.device = "cpu",
    seed: int = 0,
    *,
    play: bool = False,
    configure: Callable[[Any], None] | None = None,
    final_obs: str = "terminal",
    obs_groups: dict[str, str] | None = None,
    clip_actions: float | None = None,
    data_augmentation_func: Callable | str | None = None,
) -> ManagerBasedEnvAdapter:
    """Build mjlab's registered `task` with `num_envs` envs on `device`, wrapped in the contract.

    Keyword arguments:
        play: use the task's "play" config (for viewing a policy: typically no observation noise
            and practically endless episodes, so not for training or `ppo.py`'s evaluation)
        configure: called with the task's env config before the env is built, to change it
            (episode length, terrain, rewards, ...); num_envs, seed and auto_reset are set after it
        final_obs: "terminal" (true last observation, default) or "pre_step" (see the module doc)
        obs_groups: contract key -> task group, e.g. {"policy": "actor", "critic": "critic"};
            default: found by name (see POLICY_GROUPS, CRITIC_GROUPS)
        clip_actions: bound of the action space, so scripts clip actions to [-c, c]; default:
            the task's own rsl_rl setting (`clip_actions` of its registered runner config)
        data_augmentation_func: the task's mirror, rsl_rl's `func(env, obs, actions)` (see the module
            doc); default: the `symmetry_cfg` of its registered runner config, if it has one
    """
    if final_obs not in FINAL_OBS_MODES:
        raise ValueError(f"mjlab:{task}: final_obs must be one of {', '.join(FINAL_OBS_MODES)}, got {final_obs!r}")
    if not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"mjlab:{task}: num_envs must be a positive int, got {num_envs!r}")
    try:
        import mjlab.tasks  # noqa: F401  (importing the package registers the tasks)
        from mjlab.envs import ManagerBasedRlEnv
        from mjlab.tasks.registry import list_tasks, load_env_cfg, load_rl_cfg
    except ImportError as e:
        raise ModuleNotFoundError(
            f"mjlab:{task} needs mjlab ({e}); install it with: pip install mjlab (see the README for a CPU-only torch)"
        ) from None

    installed = mjlab_version()
    if final_obs == "terminal" and installed is not None and not installed.startswith(CHECKED_MJLAB + "."):
        print(
            f"notice: mjlab {installed}: the true final observations were checked with mjlab {CHECKED_MJLAB}.x "
            f"(they take the observation inside its step, before its auto-reset); run tests/test_mjlab_adapter.py",
            flush=True,
        )
    tasks = list_tasks()
    if task not in tasks:
        close = difflib.get_close_matches(task, tasks, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown mjlab task {task!r}{hint}; registered tasks: {', '.join(tasks)}")

    cfg = load_env_cfg(task, play=play)
    if configure is not None:
        configure(cfg)
    cfg.scene.num_envs = num_envs
    cfg.seed = sim_seed(seed)
    enable_auto_reset(cfg)
    rl_cfg = load_rl_cfg(task)
    if clip_actions is None:
        clip_actions = getattr(rl_cfg, "clip_actions", None)
    if data_augmentation_func is None:
        data_augmentation_func = symmetry_function(rl_cfg)
    env = ManagerBasedRlEnv(cfg, device=str(torch.device(device)))
    try:
        # copy_obs=False: mjlab builds new observation tensors at every compute (see the module doc).
        return ManagerBasedEnvAdapter(
            env,
            f"mjlab:{task}",
            final_obs=final_obs,
            obs_groups=obs_groups,
            clip_actions=clip_actions,
            copy_obs=False,
            data_augmentation_func=data_augmentation_func,
        )
    except Exception:
        env.close()
        raise


def symmetry_function(rl_cfg) -> Callable | str | None:
    """`rl_cfg.algorithm.symmetry_cfg.data_augmentation_func` of an rsl_rl runner config (config objects or
    the dicts made of them), or None where any of them is missing, None or unset (a config's MISSING)."""
    value = rl_cfg
    for name in ("algorithm", "symmetry_cfg", "data_augmentation_func"):
        value = value.get(name) if isinstance(value, dict) else getattr(value, name, None)
        if value is None or value is dataclasses.MISSING:
            return None
    return value


def resolve_function(function: Callable | str) -> Callable:
    """A callable as is; a string "package.module:name" (or "package.module.name") imported, as rsl_rl does."""
    if callable(function):
        return function
    if not isinstance(function, str):
        raise TypeError(f"data_augmentation_func must be a callable or a 'module:name' string, got {function!r}")
    module, sep, attr = function.rpartition(":") if ":" in function else function.rpartition(".")
    if not sep or not module:
        raise ValueError(f"data_augmentation_func {function!r}: expected 'module:name'")
    value = importlib.import_module(module)
    for part in attr.split("."):
        value = getattr(value, part)
    return value


def own_data_augmentation(env) -> Callable | None:
    """A mirror in the adapter's own terms that the env carries: `data_augmentation` of its unwrapped env,
    else of its config."""
    for owner in (getattr(env, "unwrapped", env), getattr(env, "cfg", None)):
        function = getattr(owner, "data_augmentation", None)
        if callable(function):
            return function
    return None


def sim_seed(seed: int) -> int:
    """`seed` folded into the range the simulator's generators accept (numpy's 32-bit, warp's int32)."""
    return int(seed) % 2**31


def mjlab_version() -> str | None:
    """The installed mjlab distribution's version, or None (a source checkout, a stand-in)."""
    try:
        from importlib.metadata import version

        return version("mjlab")
    except Exception:  # not installed as a distribution (a source checkout, a stand-in)
        return None


def enable_auto_reset(cfg) -> None:
    """mjlab resets finished envs inside `step` (both modes rely on it): `cfg.auto_reset = True`
    where the config has the field (mjlab >= 1.6; older configs have none and always reset)."""
    names = {f.name for f in dataclasses.fields(cfg)} if dataclasses.is_dataclass(cfg) else set(vars(cfg))
    if "auto_reset" in names:
        cfg.auto_reset = True


def _parameters(fn) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def terminal_hook_problems(env) -> list[str]:
    """What `final_obs="terminal"` needs from the env and does not find there (empty: all found).

    Checked once, when the adapter is built: the hook points (see the module docstring), the
    reset-path forms of the two `compute` methods, and that `step` calls `_reset_idx` before it
    computes commands and observations (read from the source of the env class's `step`).
    """
    problems = []
    cfg = getattr(env, "cfg", None)
    if not getattr(cfg, "auto_reset", True):
        problems.append("the env was built with cfg.auto_reset=False (it must reset finished envs inside step)")
    if not callable(getattr(type(env), "_reset_idx", None)):
        problems.append("the env has no _reset_idx(env_ids) method")
    sim = getattr(env, "sim", None)
    if not (callable(getattr(sim, "forward", None)) and callable(getattr(sim, "sense", None))):
        problems.append("the env has no sim.forward() and sim.sense()")
    for manager, needed in (
        ("observation_manager", {"update_history", "env_ids"}),
        ("command_manager", {"dt", "env_ids"}),
    ):
        method = getattr(getattr(env, manager, None), "compute", None)
        missing = needed - _parameters(method)
        if missing:
            problems.append(f"{manager}.compute takes no {', '.join(sorted(missing))} argument")
    if not hasattr(env, "step_dt"):
        problems.append("the env has no step_dt")
    try:
        source = inspect.getsource(type(env).step)
    except (OSError, TypeError):
        source = None
    if source is None:
        problems.append("the source of the env's step cannot be read to check the order of its calls")
    else:
        reset = source.find("self._reset_idx(")
        if reset < 0:
            problems.append("the env's step never calls self._reset_idx(...)")
        else:
            for call in ("self.command_manager.compute(", "self.observation_manager.compute("):
                if source.find(call, reset) < 0:
                    problems.append(f"the env's step does not call {call}...) after self._reset_idx(...)")
    return problems


def _flat_dim(space) -> int:
    """Size of one env's observation of a group: a box, or a dict of per-term boxes."""
    if hasattr(space, "spaces"):
        return sum(_flat_dim(s) for s in space.spaces.values())
    return int(math.prod(space.shape))


def _flat_box(space) -> spaces.Box:
    return spaces.Box(-math.inf, math.inf, shape=(_flat_dim(space),), dtype=np.float32)


def _find_group(available: list[str], names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in available), None)


class ManagerBasedEnvAdapter:
    """Wraps an Isaac Lab-shaped manager-based env (mjlab's ManagerBasedRlEnv) in the torch env contract.

    `copy_obs`: copy the observation tensors the env returns before handing them on (needed for an
    env that rewrites them in place on its next step); `make_mjlab_env` passes False.
    `data_augmentation_func`: the task's rsl_rl mirror function (or a "module:name" string), which the
    adapter's `data_augmentation` calls with this env (see the module docstring); a `data_augmentation`
    the env or its config carries comes first.
    """

    def __init__(
        self,
        env,
        env_id: str,
        final_obs: str = "terminal",
        obs_groups: dict[str, str] | None = None,
        clip_actions: float | None = None,
        copy_obs: bool = True,
        data_augmentation_func: Callable | str | None = None,
    ):
        if final_obs not in FINAL_OBS_MODES:
            raise ValueError(f"{env_id}: final_obs must be one of {', '.join(FINAL_OBS_MODES)}, got {final_obs!r}")
        if final_obs == "terminal":
            problems = terminal_hook_problems(env)
            if problems:
                version = mjlab_version() if type(env).__module__.split(".")[0] == "mjlab" else None
                found = f"mjlab {version}" if version else "this env"
                raise ValueError(
                    f"{env_id}: final_obs='terminal' cannot take the true final observations from {found}: "
                    f"{problems[0]}; install mjlab {CHECKED_MJLAB}.x (pip install 'mjlab=={CHECKED_MJLAB}.*') "
                    f'or pass --env-kwargs \'{{"final_obs": "pre_step"}}\''
                )
        self.env = env
        self.env_id = env_id
        self.final_obs_mode = final_obs
        self.num_envs = int(env.num_envs)
        self.device = torch.device(env.device)
        self.max_episode_steps: int | None = int(env.max_episode_length)
        self._finite_horizon = bool(getattr(env.cfg, "is_finite_horizon", False))
        self._copy_obs = bool(copy_obs)
        self._batch_size = torch.Size([self.num_envs])
        self._needs_reset = True
        self._last_obs: TensorDict | None = None  # "pre_step": the observations returned by the last call

        # Which task groups feed "policy" and "critic".
        available = list(env.single_observation_space.spaces.keys())
        if obs_groups is None:
            obs_groups = {}
            if (g := _find_group(available, POLICY_GROUPS)) is not None:
                obs_groups["policy"] = g
            if (g := _find_group(available, CRITIC_GROUPS)) is not None:
                obs_groups["critic"] = g
        if "policy" not in obs_groups:
            raise ValueError(
                f"{env_id}: no policy observation group among {available}; pass obs_groups={{'policy': <group>}}"
            )
        missing = sorted(set(obs_groups.values()) - set(available))
        if missing:
            raise ValueError(f"{env_id}: observation group(s) {missing} not in the task's groups {available}")
        self.obs_groups = dict(obs_groups)

        group_spaces = env.single_observation_space.spaces
        self.single_observation_space = _flat_box(group_spaces[self.obs_groups["policy"]])
        self.single_critic_observation_space = (
            _flat_box(group_spaces[self.obs_groups["critic"]]) if "critic" in self.obs_groups else None
        )
        act_dim = int(math.prod(env.single_action_space.shape))
        bound = math.inf if clip_actions is None else float(clip_actions)
        self.single_action_space = spaces.Box(-bound, bound, shape=(act_dim,), dtype=np.float32)

        # "terminal": the hook on the env instance (see the module docstring).
        self._in_step = False  # the hook acts only inside this adapter's step, not in env.reset()
        self._terminal_obs: dict | None = None  # taken by the hook in this step: the finished envs ended
        self._reset_ids: torch.Tensor | None = None
        self._armed: set[str] = set()  # redirects not yet consumed in this step
        if final_obs == "terminal":
            env._reset_idx = self._reset_idx_hook  # an instance attribute shadows the class's method

        # The mirror (see the module docstring): set only where there is one, so `getattr(envs,
        # "data_augmentation", None)` tells a script whether the task has a mirror.
        self._group_shapes = {g: tuple(s.shape) for g, s in group_spaces.items() if not hasattr(s, "spaces")}
        # Terms of the groups that are not concatenated, in the order `_group_tensor` flattens them:
        # the space's order until reset() reads theirs from the first observations (not in step: nothing
        # for the mirror's sake runs per env step).
        self._term_layout = {
            g: [(t, tuple(ts.shape)) for t, ts in s.spaces.items()]
            for g, s in group_spaces.items()
            if hasattr(s, "spaces")
        }
        own = own_data_augmentation(env)
        if own is not None:
            self.data_augmentation = own
        elif data_augmentation_func is not None:
            self._task_mirror = resolve_function(data_augmentation_func)
            # rsl_rl 2 (older Isaac Lab) mirrors one group at a time, named by obs_type
            self._mirror_per_group = "obs_type" in _parameters(self._task_mirror)
            self.data_augmentation = self._data_augmentation_by_task

    # -- the hook ("terminal") ------------------------------------------------------------------

    def _reset_idx_hook(self, env_ids: torch.Tensor) -> None:
        """Stands in for `env._reset_idx`: terminal observations first, then mjlab's reset, then the
        redirects that make the rest of the step compute commands and observations as reset(env_ids)."""
        env = self.env
        if not self._in_step:  # env.reset(): nothing to capture
            return type(env)._reset_idx(env, env_ids)
        env.sim.forward()
        env.command_manager.compute(dt=env.step_dt)
        env.sim.sense()
        self._terminal_obs = env.observation_manager.compute(update_history=True)
        type(env)._reset_idx(env, env_ids)
        self._reset_ids = env_ids
        env.command_manager.compute = self._command_compute_for_reset
        env.observation_manager.compute = self._observation_compute_for_reset
        self._armed = {"command_manager", "observation_manager"}

    def _command_compute_for_reset(self, dt=None, env_ids=None):
        """One shot, in place of mjlab's `command_manager.compute(dt=per-env dt)` after the reset."""
        manager = self._disarm("command_manager")
        return manager.compute(dt=0.0, env_ids=self._reset_ids)

    def _observation_compute_for_reset(self, update_history=False, env_ids=None):
        """One shot, in place of mjlab's `observation_manager.compute(update_history=True)` after the reset."""
        manager = self._disarm("observation_manager")
        return manager.compute(update_history=True, env_ids=self._reset_ids)

    def _disarm(self, name: str):
        manager = getattr(self.env, name)
        manager.__dict__.pop("compute", None)  # the class's method again
        self._armed.discard(name)
        return manager

    # -- conversions ---------------------------------------------------------------------

    def _group_tensor(self, value) -> torch.Tensor:
        n = self.num_envs
        if isinstance(
            value, dict
        ):  # a group whose terms are not concatenated: flatten each, in term order (new tensor)
            return torch.cat([v.reshape(n, -1) for v in value.values()], dim=-1).to(torch.float32)
        value = value.reshape(n, -1).to(torch.float32)
        return value.clone() if self._copy_obs else value

    def _convert_obs(self, obs: dict) -> TensorDict:
        return TensorDict(
            {key: self._group_tensor(obs[group]) for key, group in self.obs_groups.items()},
            batch_size=self._batch_size,
            device=self.device,
        )

    # -- the mirror (data_augmentation) by the task's function ------------------------------------

    def _data_augmentation_by_task(self, obs: TensorDict | None = None, actions: torch.Tensor | None = None):
        """rsl_rl's data_augmentation_func less `env`, on flat [B] rows (common/symmetry.py's contract): the task's
        function on its own group names and terms, its result back in the adapter's groups."""
        if self._mirror_per_group:
            mirrored, actions_aug = self._mirror_each_group(obs, actions)
        else:
            task_obs = None
            if obs is not None:
                task_obs = TensorDict(
                    {self.obs_groups[k]: self._task_group(self.obs_groups[k], obs[k]) for k in obs.keys()},
                    batch_size=obs.batch_size,
                )
            obs_aug, actions_aug = self._task_mirror(env=self.env, obs=task_obs, actions=actions)
            mirrored = (
                None
                if obs is None
                else {k: self._flat_rows(self.obs_groups[k], obs_aug[self.obs_groups[k]]) for k in obs.keys()}
            )
        if obs is None:
            return None, actions_aug
        rows = next(iter(mirrored.values())).shape[0]
        obs_aug = {k: v.reshape(rows, *obs[k].shape[1:]) for k, v in mirrored.items()}
        return TensorDict(obs_aug, batch_size=[rows], device=obs.device), actions_aug

    def _mirror_each_group(self, flat_obs: TensorDict | None, flat_actions: torch.Tensor | None):
        """rsl_rl 2's calls: one per group with its flat tensor and obs_type, the actions with the policy's."""
        mirrored, actions_aug = {}, None
        keys = [] if flat_obs is None else list(flat_obs.keys())
        for key in keys:
            given = flat_actions if key == "policy" else None
            mirrored[key], out = self._task_mirror(env=self.env, obs=flat_obs[key], actions=given, obs_type=key)
            if given is not None:
                actions_aug = out
        if flat_actions is not None and "policy" not in keys:
            _, actions_aug = self._task_mirror(env=self.env, obs=None, actions=flat_actions, obs_type="policy")
        return mirrored, actions_aug

    def _task_group(self, group: str, rows: torch.Tensor):
        """A group's flat rows [B, D] as the task's observations have it: its shape, or a TensorDict of its terms."""
        b = rows.shape[0]
        if group in self._group_shapes:
            return rows.reshape(b, *self._group_shapes[group])
        layout = self._term_layout[group]
        parts = rows.split([math.prod(shape) for _, shape in layout], dim=-1)
        return TensorDict({t: p.reshape(b, *shape) for (t, shape), p in zip(layout, parts)}, batch_size=[b])

    def _flat_rows(self, group: str, value) -> torch.Tensor:
        """The inverse of `_task_group`, for any number of rows."""
        b = value.shape[0]
        if group in self._group_shapes:
            return value.reshape(b, -1)
        return torch.cat([value[t].reshape(b, -1) for t, _ in self._term_layout[group]], dim=-1)

    def _log(self, extras: dict) -> dict[str, torch.Tensor | float]:
        """Scalar episode statistics from extras["log"]: tensors as 0-d float32 on the device (no host
        read), numbers as Python floats (no host-to-device copy); other values are left out."""
        out = {}
        for key, value in (extras.get("log") or {}).items():
            if isinstance(value, torch.Tensor):
                if value.numel() == 1:
                    out[key] = value.detach().reshape(()).to(self.device, torch.float32)
            elif isinstance(value, numbers.Real) and not isinstance(value, bool):
                out[key] = float(value)
        return out

    def _check_action(self, action) -> torch.Tensor:
        n, act_dim = self.num_envs, int(self.single_action_space.shape[0])
        action = torch.as_tensor(action, device=self.device, dtype=torch.float32)
        if act_dim == 1 and action.shape == (n,):
            action = action.reshape(n, 1)
        if action.shape != (n, act_dim):
            raise ValueError(
                f"{self.env_id}: expected an action batch of shape [{n}, {act_dim}], got {list(action.shape)}"
            )
        return action

    # -- the contract -----------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> tuple[TensorDict, dict]:
        """Reset every env; `seed` re-seeds the simulator's (process-wide) generators first."""
        obs, _ = self.env.reset(seed=sim_seed(seed)) if seed is not None else self.env.reset()
        # the order the mirror splits a term group's flat rows by: the env's, as _group_tensor flattens it
        self._term_layout.update(
            {
                g: [(t, tuple(v.shape[1:])) for t, v in value.items()]
                for g, value in obs.items()
                if isinstance(value, dict)
            }
        )
        self._last_obs = self._convert_obs(obs)
        self._needs_reset = False
        return self._last_obs, {}

    def step(self, action) -> tuple[TensorDict, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """Step every env; finished envs restart in the same call, `info["final_obs"]` as chosen by final_obs."""
        if self._needs_reset:
            raise RuntimeError(f"{self.env_id}: call reset() before step()")
        action = self._check_action(action)
        self._in_step, self._terminal_obs = True, None
        try:
            obs, reward, terminated, truncated, extras = self.env.step(action)
        finally:
            self._in_step = False
            leftover = sorted(self._armed)
            for name in leftover:
                self._disarm(name)
        if leftover:
            raise RuntimeError(
                f"{self.env_id}: mjlab's step reset envs but did not call {leftover[0]}.compute afterwards, which "
                f"final_obs='terminal' relies on (checked with mjlab {CHECKED_MJLAB}.x); use final_obs='pre_step'"
            )
        # Copies: the simulator rewrites its reward and done buffers in place on the next step.
        reward = reward.to(torch.float32, copy=True)
        truncated = truncated.to(torch.bool, copy=True)
        if self._finite_horizon:  # the time limit ends the task: no bootstrap
            terminated = terminated.to(torch.bool) | truncated
        else:
            terminated = terminated.to(torch.bool, copy=True)
        step_obs = self._convert_obs(obs)
        log = self._log(extras)

        if self.final_obs_mode == "terminal":
            if self._terminal_obs is None:  # no episode ended in this step: everyone's current observation
                next_obs = final_obs = step_obs
            else:  # the step's obs hold the reset envs' first observations; the hook kept everyone's terminal ones
                final_obs = self._convert_obs(self._terminal_obs)
                self._terminal_obs = self._reset_ids = None
                done = (terminated | truncated).unsqueeze(-1)
                next_obs = TensorDict(
                    {k: torch.where(done, step_obs[k], final_obs[k]) for k in self.obs_groups},
                    batch_size=self._batch_size,
                    device=self.device,
                )
        else:  # mjlab already reset the finished envs; fall back on their pre-step observations
            done = (terminated | truncated).unsqueeze(-1)
            next_obs = step_obs
            final_obs = TensorDict(
                {k: torch.where(done, self._last_obs[k], step_obs[k]) for k in self.obs_groups},
                batch_size=self._batch_size,
                device=self.device,
            )
            self._last_obs = next_obs
        return next_obs, reward, terminated, truncated, {"final_obs": final_obs, "log": log}

    def state_dict(self) -> dict:
        """Empty: the simulator and manager state cannot be snapshotted; a resumed run starts from reset envs."""
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        """Accepts only the empty dict that `state_dict()` returns (nothing to restore)."""
        if state_dict:
            raise ValueError(f"{self.env_id}: this env has no restorable state; got keys {sorted(state_dict)}")

    def close(self) -> None:
        self.env.__dict__.pop("_reset_idx", None)  # the hook goes with the adapter
        self.env.close()

    def __repr__(self) -> str:
        critic = self.single_critic_observation_space
        return (
            f"ManagerBasedEnvAdapter({self.env_id}, num_envs={self.num_envs}, device={self.device}, "
            f"obs={self.single_observation_space.shape[0]}, critic_obs={critic.shape[0] if critic else None}, "
            f"act={self.single_action_space.shape[0]}, final_obs={self.final_obs_mode!r})"
        )
