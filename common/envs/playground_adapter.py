"""Adapter: MuJoCo Playground tasks behind the torch env contract (`make_env("playground:<Task>", ...)`).

    envs = make_env("playground:CartpoleBalance", num_envs=4096, device="cuda", seed=1)
    envs = make_env("playground:CheetahRun", 64, impl="jax", episode_length=500)   # the task config's fields

MuJoCo Playground (https://github.com/google-deepmind/mujoco_playground) writes each task as a pure JAX function of
one env, `state = env.step(state, action)`, on MJX or MuJoCo Warp. The adapter batches it with `jax.vmap`, counts
episode steps with brax's `EpisodeWrapper` (the time limit is the task config's `episode_length`, actions repeated
`action_repeat` times), applies the task's domain randomization per env (`registry.get_domain_randomizer`, as
Playground's trainers do; `randomize=False` turns it off), and compiles one step with `jax.jit` that also restarts
the envs that finished, in the same call.

The reset inside the step. Playground's trainers (`wrap_for_brax_training`, which its torch wrapper
`RSLRLBraxWrapper` steps) replace a finished env's observation by the reset's and keep nothing of the last one, so an
actor-critic built on them bootstraps a time-out with V(first observation of the next episode). The adapter's step
does the same restart, drawing the same keys in the same order (so that from the same keys it returns what
`wrap_for_brax_training` returns, step for step; tests/test_playground_adapter.py checks it), but reads the step's
observation before the restart and returns it as `info["final_obs"]`. Playground is not patched: the adapter's step
is its own function over the task's `step` and `reset`.

- `full_reset=True` (default): a finished env starts its next episode from `env.reset(key)` with a fresh key, as
  gymnasium, mjlab and envpool envs do. Under `vmap` the reset is computed for every env at every step and selected
  where an episode ended (a branch per env is not possible in a vmapped step), which costs one reset's work per step.
- `full_reset=False`: Playground's trainers' default, a finished env goes back to the first state it was reset to
  (its data and observation; its `info`, such as a joystick task's command schedule, carries on).

Observations: a dict observation's `state` and `privileged_state` are the `"policy"` and `"critic"` groups (other
keys are left out), a flat one is `"policy"`; each flattened to float32 [N, D]. Rewards float32 [N]; `terminated` is a
done that is not a time-out, `truncated` brax's `truncation` (the time limit reached by an env that did not fail).
Actions are clipped to the tasks' [-1, 1]. The task's per-step metrics (`state.metrics`, e.g. reward terms) go to
`info["log"]` as their mean over the envs (0-d tensors on the device), logged under `env/`.

Arrays cross between the frameworks by DLPack without a copy, on the device of `--device` (JAX's GPU of the same
index, or its CPU): observations, rewards and flags come to torch as the step returns them (JAX never writes an array
again, so they belong to the caller), actions go to JAX. Nothing in the step reads the host.

Memory: JAX preallocates 75% of a GPU at its first use. Before JAX is first imported the adapter sets
`XLA_PYTHON_CLIENT_PREALLOCATE=false` (JAX then allocates what it uses, and torch's caching allocator keeps the
rest), unless the environment already says otherwise (`XLA_PYTHON_CLIENT_MEM_FRACTION=.3` with preallocation, for
instance), and says so in one line.

Seeds: `seed` gives JAX's key as `RSLRLBraxWrapper` derives it (split into the reset keys and the randomization
keys, one per env), folded with the upper bits of the scripts' 62-bit seeds. `state_dict()` holds the whole batched
JAX state (physics, episode counters, each env's key), so a resumed run continues its episodes exactly; the domain
randomization is re-derived from the same seed.

Warp and MJX print while the first step compiles (Warp's module loads, its CUDA driver probe): that output is held
back and its distinct lines shown once per process, after the envs are made; Warp's module-load lines are switched
off (`warp.config.quiet`)."""

from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import math
import os
import sys
import tempfile

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict

PLAYGROUND_GROUPS = {"policy": "state", "critic": "privileged_state"}  # Playground's dict observation keys
INSTALL = "pip install -e '.[playground]'"
_said: set[str] = set()  # lines said once per process
_COMPILED: dict[tuple, PlaygroundEnv] = {}  # the first env of each kind, whose compiled functions later ones share


def _say_once(line: str) -> None:
    if line not in _said:
        _said.add(line)
        print(line, flush=True)


def configure_jax_memory() -> None:
    """Keep JAX from preallocating a GPU before its first import (see the module docstring); one line says what."""
    if "jax" in sys.modules:
        if os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").lower() != "false":
            _say_once(
                "notice: playground: JAX was imported before the adapter could set XLA_PYTHON_CLIENT_PREALLOCATE="
                "false; on a GPU it may hold 75% of the memory torch needs"
            )
        return
    keys = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR")
    given = {k: os.environ[k] for k in keys if k in os.environ}
    if given:
        _say_once(f"playground: JAX memory as the environment says: {' '.join(f'{k}={v}' for k, v in given.items())}")
        return
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    _say_once("playground: JAX allocates as it goes (XLA_PYTHON_CLIENT_PREALLOCATE=false), torch keeps the rest")


@contextlib.contextmanager
def simulator_output_once():
    """Hold back what the simulators print to stdout/stderr (file descriptors 1 and 2) while the envs are built and
    their step first compiles; then show each distinct line once per process."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 1)
        os.dup2(held.fileno(), 2)
        failed = False
        try:
            yield
        except BaseException:
            failed = True  # the error says what went wrong: what was printed on the way is not shown
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            held.seek(0)
            lines = [ln.strip() for ln in held.read().decode(errors="replace").splitlines()]
            new = [ln for ln in dict.fromkeys(lines) if ln and ln not in _said]
            if new and not failed:
                _said.update(new)
                shown = new[:5] + ([f"(+{len(new) - 5} more lines)"] if len(new) > 5 else [])
                print("playground: the simulator said while compiling: " + " | ".join(shown), flush=True)


def jax_key(seed: int):
    """JAX's key of a seed: `PRNGKey(seed)` for a 32-bit one (as Playground's trainers take it), the upper bits of a
    larger one folded in."""
    import jax

    seed = int(seed)
    key = jax.random.PRNGKey(seed % 2**32)
    return jax.random.fold_in(key, (seed >> 32) % 2**32) if seed >= 2**32 else key


def _jax_device(device: torch.device, env_id: str):
    import jax

    if device.type == "cpu":
        return jax.devices("cpu")[0]
    if device.type != "cuda":
        raise ValueError(f"{env_id}: --device {device} is neither cpu nor cuda; JAX runs the simulator on one of them")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        raise ValueError(
            f"{env_id}: --device {device} needs a CUDA build of JAX, but JAX {jax.__version__} sees no GPU; "
            f"pip install -U 'jax[cuda12]' (or run with --device cpu)"
        )
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= len(gpus):
        raise ValueError(f"{env_id}: --device {device}: JAX sees {len(gpus)} GPU(s)")
    return gpus[index]


def _config_fields(config) -> list[str]:
    return sorted(config.keys())


def make_playground_env(
    task: str,
    num_envs: int,
    device: str | torch.device = "cpu",
    seed: int = 0,
    *,
    randomize: bool = True,
    full_reset: bool = True,
    **config_overrides,
) -> PlaygroundEnv:
    """Build Playground's registered `task` with `num_envs` envs on `device`, wrapped in the contract.

    Keyword arguments: `randomize` (the task's domain randomization per env, where it has one), `full_reset` (see the
    module docstring); every other one is a field of the task's config (`registry.get_default_config(task)`), e.g.
    `impl="jax"` (MJX) or `"warp"`, `episode_length`, `action_repeat`, or a nested field by its dotted name.
    """
    env_id = f"playground:{task}"
    if not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"{env_id}: num_envs must be a positive int, got {num_envs!r}")
    configure_jax_memory()
    try:
        import jax
        from mujoco_playground import registry
    except ImportError as e:
        raise ValueError(f"{env_id} needs MuJoCo Playground ({e}); install it with: {INSTALL}") from None
    if task not in registry.ALL_ENVS:
        close = difflib.get_close_matches(task, list(registry.ALL_ENVS), n=3)
        hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
        raise ValueError(f"unknown Playground task {task!r}{hint}; its tasks: {', '.join(registry.ALL_ENVS)}")
    torch_device = torch.device(device)
    jax_device = _jax_device(torch_device, env_id)
    config = registry.get_default_config(task)
    unknown = sorted(k for k in config_overrides if k.split(".")[0] not in config)
    if unknown:
        raise ValueError(
            f"{env_id}: --env-kwargs {', '.join(unknown)} is no field of the task's config; its fields: "
            f"{', '.join(_config_fields(config))}; the adapter's own: randomize, full_reset"
        )
    # Envs of one task, config, size and options share one compiled reset and step (a run's training and eval envs
    # of the same size, a test's runs): compiling them takes tens of seconds on a CPU.
    randomizer = registry.get_domain_randomizer(task) if randomize else None  # its models depend on the seed
    key = (task, repr(sorted(config_overrides.items())), num_envs, full_reset, randomizer and seed, str(jax_device))
    if key in _COMPILED:
        adapter = copy.copy(_COMPILED[key])
        adapter._state, adapter._needs_reset = None, True
        return adapter
    compiling = False
    try:
        with jax.default_device(jax_device), simulator_output_once():
            _quiet_warp()
            env = registry.load(task, config_overrides=config_overrides or None)
            iterations = _without_iteration_warnings(env)
            adapter = PlaygroundEnv(
                env,
                env_id,
                num_envs,
                torch_device,
                jax_device,
                seed,
                episode_length=int(env._config.episode_length),
                action_repeat=int(env._config.get("action_repeat", 1)),
                randomizer=randomizer,
                full_reset=full_reset,
            )
            compiling = True  # a failure from here on is the simulator's, not the config's
            adapter.reset(seed=seed)  # compiles reset and step here, where their output is held back
            adapter.step(torch.zeros(num_envs, adapter.act_dim, device=torch_device))
            adapter._state, adapter._needs_reset = None, True
    except Exception as e:  # assets absent: Playground clones the menagerie with git at first use
        from mujoco_playground._src import mjx_env

        if compiling:  # the simulator's own failure, with its traceback: not a bad input's one line (a ValueError's)
            raise RuntimeError(f"{env_id}: the simulator failed while compiling its step: {type(e).__name__}") from e
        if task in registry.dm_control_suite.ALL_ENVS or mjx_env.MENAGERIE_PATH.exists():
            raise

        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"{env_id}: the task's assets could not be loaded ({first}): Playground's locomotion and manipulation "
            f"tasks need mujoco_menagerie at {mjx_env.MENAGERIE_PATH}, which it clones with git at first use; on a "
            f'machine with internet run python -c "from mujoco_playground._src import mjx_env; '
            f"mjx_env.ensure_menagerie_exists()\" once, or clone it there by hand; the DM Control suite's tasks "
            f"(CartpoleBalance, CheetahRun, ...) need no assets"
        ) from None
    if iterations is not None:
        _say_once(
            f"playground: MuJoCo Warp's per-step warning that the solver reached its iteration limit is off (the "
            f"task's config sets {iterations}); its buffer overflow warnings are kept"
        )
    _COMPILED[key] = adapter
    return copy.copy(adapter)


ITERATIONS_OVERFLOW = 1 << 9  # mujoco_warp's OverflowType.ITERATIONS: "solver iterations limit reached"


def _without_iteration_warnings(env) -> int | None:
    """MuJoCo Warp prints "solver iterations limit reached" from inside every step whose solver stops at the task's
    iterations, which Playground's DM Control configs set low on purpose (1 for CartpoleBalance): thousands of lines
    that bury the progress. That warning is turned off (its other overflows', the contact and constraint buffers', are
    kept); returns the task's solver iterations where it was on, else None (MJX, or already off)."""
    model = getattr(env, "_mjx_model", None)
    impl = getattr(getattr(model, "opt", None), "_impl", None)
    flags = getattr(impl, "warn_overflow", None)
    if not isinstance(flags, int) or not flags & ITERATIONS_OVERFLOW:
        return None
    env._mjx_model = model.replace(
        opt=model.opt.replace(_impl=impl.replace(warn_overflow=flags & ~ITERATIONS_OVERFLOW))
    )
    return int(env.mj_model.opt.iterations)


def _quiet_warp() -> None:
    """Warp prints a line for every module it loads (dozens while a step compiles): off."""
    try:
        import warp

        warp.config.quiet = True
    except Exception:  # Warp absent (MJX only) or a release without the switch
        pass


def _split(keys):
    """Each env's key split in two as Playground's training wrapper splits them (its `[..., 0]` and `[..., 1]`: the
    words of the two new keys at one position each), so that the same keys draw the same episodes."""
    import jax

    pairs = jax.vmap(jax.random.split)(keys)
    return pairs[..., 0], pairs[..., 1]


def _to_torch(x) -> torch.Tensor:
    return torch.from_dlpack(x)


class PlaygroundEnv:
    """A batch of one Playground task in the torch env contract (see the module docstring)."""

    capturable = False  # the simulator is JAX's: acting is captured apart, the step runs between

    def __init__(
        self,
        env,
        env_id: str,
        num_envs: int,
        device: torch.device,
        jax_device,
        seed: int,
        *,
        episode_length: int,
        action_repeat: int,
        randomizer,
        full_reset: bool,
    ):
        import jax
        from brax.envs.wrappers import training as brax_training
        from mujoco_playground._src import wrapper as playground_wrapper

        self.env_id = env_id
        self.num_envs = int(num_envs)
        self.device = device
        self.jax_device = jax_device
        self.max_episode_steps = int(math.ceil(episode_length / action_repeat))
        self.full_reset = bool(full_reset)
        self.seed = int(seed)
        self.task = env
        keys = jax.random.split(jax_key(seed))  # as RSLRLBraxWrapper: reset keys, randomization keys
        if randomizer is None:
            batched = brax_training.VmapWrapper(env)
        else:
            per_env = jax.random.split(keys[1], self.num_envs)
            batched = playground_wrapper.BraxDomainRandomizationVmapWrapper(
                env, functools.partial(randomizer, rng=per_env)
            )
        self.randomized = randomizer is not None
        self._episodes = brax_training.EpisodeWrapper(batched, episode_length, action_repeat)
        self._reset_fn = jax.jit(self._reset_batch)
        self._step_fn = jax.jit(self._step_batch)

        size = env.observation_size
        if isinstance(size, dict):
            if PLAYGROUND_GROUPS["policy"] not in size:
                raise ValueError(f"{env_id}: a dict observation without a 'state' key: {sorted(size)}")
            self.obs_keys = {k: g for k, g in PLAYGROUND_GROUPS.items() if g in size}
            dims = {k: int(np.prod(size[g])) for k, g in self.obs_keys.items()}
        else:
            self.obs_keys = {"policy": None}
            dims = {"policy": int(np.prod(size))}
        box = functools.partial(spaces.Box, -math.inf, math.inf, dtype=np.float32)
        self.single_observation_space = box(shape=(dims["policy"],))
        self.single_critic_observation_space = box(shape=(dims["critic"],)) if "critic" in dims else None
        self.act_dim = int(env.action_size)
        self.single_action_space = spaces.Box(-1.0, 1.0, shape=(self.act_dim,), dtype=np.float32)
        self._state = None
        self._needs_reset = True
        self._batch_size = torch.Size([self.num_envs])

    # -- the JAX functions (compiled once each) ------------------------------------------------

    def _reset_batch(self, keys):
        """Reset every env from its key; keep each one's next key and, for full_reset=False, its first state."""

        state = self._episodes.reset(_split(keys)[1])
        state.info["adapter_rng"] = _split(keys)[0]
        if not self.full_reset:
            state.info["adapter_first_data"] = state.data
            state.info["adapter_first_obs"] = state.obs
        return state

    def _step_batch(self, state, action):
        """One step of every env; a finished env restarts in the same call, its last observation kept apart.
        The keys, the step counters and the restart are those of Playground's training wrapper."""
        import jax
        from jax import numpy as jp

        next_rng, reset_key = _split(state.info["adapter_rng"])
        info = dict(state.info)
        info["steps"] = jp.where(state.done > 0, jp.zeros_like(info["steps"]), info["steps"])  # a restarted episode
        stepped = self._episodes.step(state.replace(done=jp.zeros_like(state.done), info=info), action)
        done = stepped.done > 0

        def where_done(new, old):
            if new.ndim == 0 or new.shape[0] != done.shape[0]:  # a leaf all envs share (MuJoCo Warp's data has some)
                return old
            return jp.where(done.reshape(done.shape + (1,) * (new.ndim - 1)), new, old)

        if self.full_reset:
            fresh = self._episodes.reset(_split(reset_key)[1])  # as the wrapper's own reset draws it
            data = jax.tree.map(where_done, fresh.data, stepped.data)
            obs = jax.tree.map(where_done, fresh.obs, stepped.obs)
            info = jax.tree.map(where_done, fresh.info, {k: v for k, v in stepped.info.items() if k in fresh.info})
            info["steps"] = stepped.info["steps"]  # zeroed at the next step, as the training wrapper does
        else:
            data = jax.tree.map(where_done, stepped.info["adapter_first_data"], stepped.data)
            obs = jax.tree.map(where_done, stepped.info["adapter_first_obs"], stepped.obs)
            info = dict(stepped.info)
        info["adapter_rng"] = next_rng
        if not self.full_reset:
            info["adapter_first_data"] = stepped.info["adapter_first_data"]
            info["adapter_first_obs"] = stepped.info["adapter_first_obs"]
        truncated = done & (stepped.info["truncation"] > 0)
        out = {
            "obs": self._groups(obs),
            "final_obs": self._groups(stepped.obs),
            "reward": stepped.reward.astype(jp.float32),
            "terminated": done & ~truncated,
            "truncated": truncated,
            "log": {k: v.astype(jp.float32).mean() for k, v in stepped.metrics.items()},
        }
        return stepped.replace(data=data, obs=obs, info=info), out

    def _groups(self, obs) -> dict:
        from jax import numpy as jp

        n = self.num_envs
        if self.obs_keys == {"policy": None}:
            return {"policy": obs.reshape(n, -1).astype(jp.float32)}
        return {k: obs[g].reshape(n, -1).astype(jp.float32) for k, g in self.obs_keys.items()}

    # -- the contract -------------------------------------------------------------------------

    def _obs(self, groups: dict) -> TensorDict:
        return TensorDict({k: _to_torch(v) for k, v in groups.items()}, batch_size=self._batch_size, device=self.device)

    def reset(self, seed: int | None = None) -> tuple[TensorDict, dict]:
        """Reset every env; `seed` gives the reset keys (the construction's seed at the first reset), else each env's
        key goes on."""
        import jax

        if seed is None and self._state is not None:
            keys = self._state.info["adapter_rng"]
        else:
            keys = jax.random.split(jax.random.split(jax_key(self.seed if seed is None else seed))[0], self.num_envs)
        with jax.default_device(self.jax_device):
            self._state = self._reset_fn(jax.device_put(keys, self.jax_device))
        self._needs_reset = False
        return self._obs(self._groups(self._state.obs)), {}

    def step(self, action) -> tuple[TensorDict, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """Step every env; finished envs restart in the same call, their last observation in `info["final_obs"]`."""
        import jax

        if self._needs_reset:
            raise RuntimeError(f"{self.env_id}: call reset() before step()")
        action = torch.as_tensor(action, device=self.device, dtype=torch.float32)
        if self.act_dim == 1 and action.shape == (self.num_envs,):
            action = action.reshape(self.num_envs, 1)
        if action.shape != (self.num_envs, self.act_dim):
            raise ValueError(
                f"{self.env_id}: expected an action batch of shape [{self.num_envs}, {self.act_dim}], "
                f"got {list(action.shape)}"
            )
        action = jax.dlpack.from_dlpack(action.clamp(-1.0, 1.0).contiguous())
        with jax.default_device(self.jax_device):  # as at the compile: JAX keys its compiled steps on it too
            self._state, out = self._step_fn(self._state, action)
        info = {"final_obs": self._obs(out["final_obs"]), "log": {k: _to_torch(v) for k, v in out["log"].items()}}
        return (
            self._obs(out["obs"]),
            _to_torch(out["reward"]),
            _to_torch(out["terminated"]),
            _to_torch(out["truncated"]),
            info,
        )

    def state_dict(self) -> dict:
        """The whole batched JAX state, leaf by leaf, as CPU tensors (a host read: at save time only)."""
        import jax

        if self._state is None:
            return {}
        leaves = jax.tree.leaves(self._state)
        out = {}
        for i, leaf in enumerate(leaves):
            array = np.asarray(leaf)
            if array.dtype == np.uint32:  # torch keeps few uint32 ops: the bits as int32
                array = array.view(np.int32)
            out[f"leaf{i:04d}"] = torch.from_numpy(array.copy())
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore a `state_dict()` of the same task, envs and options, leaf by leaf."""
        import jax

        if self._state is None:
            self.reset(seed=0)  # the structure to fill
        leaves, treedef = jax.tree.flatten(self._state)
        if len(state_dict) != len(leaves):
            raise ValueError(
                f"{self.env_id}: the saved env state has {len(state_dict)} arrays, this env's {len(leaves)} "
                f"(another task, config or full_reset)"
            )
        restored = []
        for i, leaf in enumerate(leaves):
            saved = state_dict[f"leaf{i:04d}"].cpu().numpy()
            dtype = np.asarray(leaf).dtype
            if saved.shape != leaf.shape:
                raise ValueError(f"{self.env_id}: saved env state array {i} has shape {saved.shape}, not {leaf.shape}")
            restored.append(jax.device_put(saved.view(dtype) if saved.dtype != dtype else saved, self.jax_device))
        self._state = jax.tree.unflatten(treedef, restored)
        self._needs_reset = False

    def close(self) -> None:
        self._state = None

    def __repr__(self) -> str:
        critic = self.single_critic_observation_space
        return (
            f"PlaygroundEnv({self.env_id}, num_envs={self.num_envs}, device={self.device}, "
            f"obs={self.single_observation_space.shape[0]}, critic_obs={critic.shape[0] if critic else None}, "
            f"act={self.act_dim}, full_reset={self.full_reset}, randomized={self.randomized})"
        )
