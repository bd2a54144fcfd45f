"""The flags of the run around an algorithm: each script's `Args` extends `RunArgs` with its own, each flag with a
docstring (its --help). Also: the numeric checks, the command line, the flags a run was given and those a checkpoint
supplies, and the seeds derived from --seed."""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import MISSING, asdict, dataclass, field, fields, make_dataclass
from typing import Annotated, Literal


# ----------------------------------------------------------------------------------------------
# Numeric flags: a valid range is declared beside the default, and checked before anything is written
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bound:
    """One side of a numeric flag's valid range, declared in its annotation:
    `clip_coef: Annotated[float, Ge(0)] = 0.2`, `gamma: Annotated[float, Ge(0), Le(1)] = 0.99`.
    A tuple flag's bound holds for each of its numbers; None (an unset optional flag) is not checked."""

    op: str  # ">=", ">", "<=", "<"
    value: float

    def holds(self, x) -> bool:
        return {">=": x >= self.value, ">": x > self.value, "<=": x <= self.value, "<": x < self.value}[self.op]

    def __str__(self) -> str:
        return f"{self.op} {self.value:g}"


def Ge(value: float) -> Bound:  # noqa: N802 (read as a type's annotation)
    return Bound(">=", value)


def Gt(value: float) -> Bound:  # noqa: N802
    return Bound(">", value)


def Le(value: float) -> Bound:  # noqa: N802
    return Bound("<=", value)


def Lt(value: float) -> Bound:  # noqa: N802
    return Bound("<", value)


def declared_bounds(args_class) -> dict[str, tuple[Bound, ...]]:
    """{flag: its bounds}. A class that re-declares a field without bounds (to change its default) keeps its
    base's; one that declares bounds replaces them."""
    import typing

    bounds = {}
    for klass in reversed(args_class.__mro__):
        own = klass.__dict__.get("__annotations__", {})
        if not own:
            continue
        hints = typing.get_type_hints(klass, include_extras=True)
        for name in own:
            declared = tuple(m for m in getattr(hints.get(name), "__metadata__", ()) if isinstance(m, Bound))
            if declared:
                bounds[name] = declared
    return bounds


def usage_error(line: str) -> SystemExit:
    """The exit of a flag value the run cannot take: `line` on stderr, and exit status 2, a usage error's, as the
    command line's own (tyro's) are. Python prints nothing for an exit status, so the line is printed here; the
    exception's message is the line too (`pytest.raises(SystemExit, match=...)`, a caller that reports it)."""
    print(line, file=sys.stderr, flush=True)
    error = SystemExit(line)
    error.code = 2
    return error


def check_numbers(args) -> None:
    """Every numeric flag within its declared bounds, or a usage error naming it."""
    for name, bounds in declared_bounds(type(args)).items():
        value = getattr(args, name, None)
        values = value if isinstance(value, (tuple, list)) else (value,)
        for x in values:
            if x is None or isinstance(x, bool) or not isinstance(x, (int, float)):
                continue
            if x != x or not all(b.holds(x) for b in bounds):  # NaN fails every bound
                low = [b for b in bounds if b.op in (">=", ">")]
                high = [b for b in bounds if b.op in ("<=", "<")]
                if len(low) == len(high) == 1 and low[0].op == ">=" and high[0].op == "<=":
                    rule = f"in [{low[0].value:g}, {high[0].value:g}]"
                else:
                    rule = " and ".join(map(str, bounds))
                what = "each of " if isinstance(value, (tuple, list)) else ""
                raise usage_error(f"error: {what}--{name.replace('_', '-')} must be {rule}, got {value}")


@dataclass
class RunArgs:
    """The flags of the run around the algorithm; each script's Args extends them (and may change defaults)."""

    env_id: str = "CartPole-v1"
    """environment id: a built-in env (CartPole-v1, Pendulum-v1, ...) or an adapter prefix (gym:..., mjlab:...)"""
    settings: str | None = None
    """named settings of the script (listed at the top of --help) under the flags given; default: the set of the env
    id's family (gym MuJoCo, Atari, MinAtar, mjlab tasks) where the script has one, else builtin (the plain defaults)"""
    num_envs: Annotated[int, Ge(1)] = 4096
    """parallel environments per process (per GPU)"""
    env_kwargs: str | None = None
    """JSON object of extra make_env arguments, e.g. '{"max_episode_steps": 100}' or '{"vectorization": "async"}'"""
    total_timesteps: Annotated[int, Ge(1)] = 5_000_000
    """env steps to train for, summed over all processes"""
    seed: int = 1
    """seed of the experiment; every env stream and generator of every rank derives from a hash of (seed, rank, stream)
    """
    device: str = "auto"
    """'auto' (this rank's GPU if any, else CPU), 'cpu', 'cuda'"""
    torch_deterministic: bool | Literal["auto"] = "auto"
    """deterministic kernels (cudnn.deterministic, torch.use_deterministic_algorithms): True, False, or auto (on
    CPU, where exact resume rests on them and they cost nothing; off on CUDA, where they are sort-based and slow)"""
    output_dir: str = "runs"
    """where run directories are created"""
    run_name: str | None = None
    """name of the run directory; default {env_id}__{algo}__{seed}__{timestamp}"""
    resume: str | None = None
    """checkpoint to resume from: a path, a run directory, or 'auto' (this run's last.pt if it exists); the run it
    continues defines every flag not given on the command line (its env, named settings, sizes, intervals and the
    algorithm's flags), but those of the sitting: --device, --compile, --cudagraphs, --torch-deterministic,
    --dist-timeout, --max-wall-seconds and where the run is"""
    init_from: str | None = None
    """start a new run from the model weights and normalizers of this checkpoint (a path or a run directory), e.g.
    a baseline for a modified script: nothing else is taken (no counters, optimizers, schedules or flags); tensors
    whose name or shape differ keep this run's initialisation, and the run says which. A checkpoint that --resume
    finds wins (so --resume auto --init-from X survives restarts)"""
    resume_other_script: bool = False
    """let --resume continue a run that another script wrote (the copy it came from, or a copy of it): without it, a
    resume that would cross scripts stops and names both (start a new run from its weights with --init-from instead)"""
    overwrite: bool = False
    """start over in an existing run directory: clear it (all but its lock) once this process holds its lock (without
    it, a run never writes over another)"""
    eval_only: bool = False
    """load --resume, evaluate the deterministic policy, print the returns, and exit"""
    save_interval: Annotated[int, Ge(1)] = 50
    """iterations between writes of checkpoints/last.pt (also written at the end and on SIGTERM/SIGUSR1)"""
    save_interval_seconds: Annotated[float | None, Ge(0)] = None
    """also write last.pt when this many seconds have passed since the last write (checked when the statistics are
    logged)"""
    eval_interval: Annotated[int, Ge(0)] = 10
    """iterations between evaluations (0 disables); best.pt is written when the eval return improves. An evaluation
    plays at most 5% of the steps trained between two (at least 1,000 an episode per eval env): the episodes it cuts
    count with their return so far, and a line says so"""
    eval_episodes: Annotated[int, Ge(1)] = 1
    """episodes per eval env in an evaluation"""
    num_eval_envs: Annotated[int, Ge(1)] = 128
    """eval environments per process (separate from the training envs)"""
    eval_env_kwargs: str | None = None
    """JSON object merged over --env-kwargs for the eval envs only (evaluate on a differently configured env)"""
    capture_video: bool = False
    """record the episodes of the first --video-envs eval envs at every evaluation: TensorBoard (videos/eval),
    wandb, and videos/step_<global_step>.mp4 in the run directory (needs the [video] extra)"""
    video_envs: Annotated[int, Ge(1)] = 1
    """eval envs whose episodes --capture-video records (their videos follow one another)"""
    checkpoint_interval: Annotated[int, Ge(0)] = 0
    """also keep checkpoints/step_<global_step>.pt every this many iterations (0: only last.pt and best.pt)"""
    keep_checkpoints: Annotated[int, Ge(0)] = 0
    """keep only the newest this many step_<global_step>.pt files (0: all)"""
    export: str | None = None
    """with --eval-only: write the checkpoint's deterministic policy to this directory (policy.pt2, a
    torch.export program; policy.onnx; policy.json), observation normalization included"""
    export_best: bool = False
    """export the policy to {run_dir}/export/ every time best.pt is written"""
    target_return: float | None = None
    """stop once the eval return reaches this value"""
    max_wall_seconds: Annotated[float | None, Ge(0)] = None
    """stop (and save) after this many seconds of training (checked when the statistics are logged)"""
    track: bool = False
    """mirror the TensorBoard logs to Weights & Biases"""
    wandb_project_name: str = "parallel-rl"
    """wandb project"""
    wandb_entity: str | None = None
    """wandb team or user"""
    progress: bool = True
    """print a progress line (step, SPS, last training return, time left) at least every 30 s, at the log points
    (where they are further apart, a smaller --log-interval gives more); plain lines, a terminal and a file alike"""
    compile: bool | Literal["auto"] = "auto"
    """torch.compile the hot functions (acting with the env step, targets, update): True, False, or auto (on CUDA,
    where it pays for itself within a minute; on a CPU compiling takes a minute or more, and eager is as fast for
    the small networks a CPU trains)"""
    cudagraphs: bool | Literal["auto"] = "auto"
    """capture the hot functions in CUDA graphs (a built-in env's whole rollout, the whole update): True, False,
    or auto (on CUDA)"""
    log_interval: Annotated[int | None, Ge(1)] = None
    """iterations between two reductions of the statistics (logs, NaN guard, stop flags: one host read each);
    default by device"""
    dist_timeout: Annotated[float, Gt(0)] = 600.0
    """seconds a collective may wait for the other ranks before the run fails (a dead or hung rank)"""


# The run flags that define the run a checkpoint continues, beside the env and the algorithm's own flags
# (--num-envs sizes every per-rank tensor; the schedules run to --total-timesteps; every random stream
# derives from --seed).
CONTINUED_FLAGS = {"env_id", "env_kwargs", "eval_env_kwargs", "num_envs", "total_timesteps", "seed"}
# Flags that change how a run is driven, not what it is: left out of the "saved with ..." hint of a
# checkpoint that does not fit, and repeated by the command that continues a stopped run.
RUN_FLAGS = {f for f in RunArgs.__dataclass_fields__} - CONTINUED_FLAGS
# The flags of one sitting, not of the run: where this process writes and reads, and how it runs on this
# machine (a resume may run on another machine, under a time limit of its own). A resume takes every other
# flag, intervals included, from its checkpoint unless given again; these always come from the command line.
SITTING_FLAGS = {
    "resume",
    "resume_other_script",
    "overwrite",
    "eval_only",
    "export",
    "output_dir",
    "run_name",
    "progress",
    "device",
    "compile",
    "cudagraphs",
    "torch_deterministic",
    "dist_timeout",
    "max_wall_seconds",
}
# --eval-only takes the run's flags too (its eval envs and episodes), but not whether to record a video: a
# video of an --eval-only is asked for on its own command line.
EVAL_ONLY_OWN_FLAGS = {"capture_video", "video_envs"}


# ----------------------------------------------------------------------------------------------
# Named settings: each script's SETTINGS (name -> {flag: value}, or a function (env_id, fields) -> (values, what has
# no flag)), right after its Args. With no --settings the set named after the env id's family (FAMILIES) is taken
# where the script has one, else builtin: the plain defaults, which every script has without declaring it. The set's
# values become the command line's defaults (parse_args), so every flag given wins, and a checkpoint's win on resume.
# ----------------------------------------------------------------------------------------------
BUILTIN = "builtin"

MUJOCO_TASKS = (
    "Ant|HalfCheetah|Hopper|Humanoid|HumanoidStandup|InvertedDoublePendulum|InvertedPendulum|Pusher|Reacher|Swimmer"
    "|Walker2d"
)
# family -> (what it holds, whether an env id belongs to it); the first that matches is the env id's family
FAMILIES = {
    "task": (
        "mjlab and MuJoCo Playground tasks: their own training config",
        lambda env_id: env_id.startswith(("mjlab:", "playground:")),
    ),
    "mujoco": (
        "gymnasium / envpool MuJoCo on CPU simulators",
        lambda env_id: re.fullmatch(rf"(gym|envpool):({MUJOCO_TASKS})-v\d+", env_id) is not None,
    ),
    "minatar": ("MinAtar games", lambda env_id: env_id.split(":")[-1].startswith("MinAtar/")),
    "atari": (
        "Atari games (envpool, gym:ALE/)",
        lambda env_id: (
            env_id.startswith(("envpool:", "gym:ALE/"))
            and re.match(r"[A-Z][A-Za-z]*-v5$", env_id.split(":")[-1].removeprefix("ALE/")) is not None
        ),
    ),
    "mountaincar": (
        "MountainCarContinuous: a goal hundreds of steps away",
        lambda env_id: env_id.split(":")[-1].startswith("MountainCarContinuous-"),
    ),
}


def family(env_id: str) -> str | None:
    """The family of `env_id` (a key of FAMILIES), or None."""
    return next((name for name, (_, belongs) in FAMILIES.items() if belongs(env_id)), None)


def on_cuda(device: str | None) -> bool:
    """Whether --device (`auto` where None) runs on CUDA: a named CUDA device, or auto on a machine that has one."""
    if device in (None, "auto"):
        import torch

        return torch.cuda.is_available()
    return device.startswith("cuda")


CPU_SET = "cpu"  # a Playground task's set without CUDA (common.settings.cpu_settings)


def resolve_settings(
    settings: dict, script: str, env_id: str, name: str | None, fields: set[str], device: str | None = None
):
    """(name, {flag: value}, where they come from, a task config's fields that have no flag) for `env_id` on --device
    `device` (None: auto). A Playground task without CUDA gets the `cpu` set (its `task` set's `cpu_set`,
    common.settings) in place of the `task` set, which is a GPU's; --settings task, or a CUDA device, gives the
    task's."""
    cpu_set = getattr(settings.get("task"), "cpu_set", None) if env_id.startswith("playground:") else None
    if cpu_set is not None:  # a set of every script with a `task` set, declared in common.settings
        settings = {**settings, CPU_SET: cpu_set}
    names = [BUILTIN, *settings]
    if name is not None and name not in names:
        raise usage_error(f"error: --settings {name}: {script}.py has {', '.join(names)}; see --help")
    cpu = False
    if name is None:
        own = family(env_id)
        name = own if own in settings else BUILTIN
        cpu = name == "task" and cpu_set is not None and not on_cuda(device)
        name = CPU_SET if cpu else name
        origin = f"for {env_id}, {FAMILIES[own][0]}" if name != BUILTIN else "the plain defaults"
        if name != BUILTIN:
            origin += "; --settings builtin for the plain defaults"
    else:
        origin = "--settings"
    values, untranslated = settings.get(name, {}), []
    if callable(values):
        values, untranslated = values(env_id, fields)
    if cpu:  # the start line's words: the sizes, and the command of the task's own config
        sizes = " ".join(
            as_flag(k, values[k]) for k in ("num_envs", "batch_size", "total_timesteps", "env_kwargs") if k in values
        )
        origin = (
            f"for {env_id} on a machine without CUDA: a CPU's sizes, {sizes}; the task's own config, a GPU's: "
            f"python algos/{script}.py --env-id {env_id} --settings task"
        )
    unknown = sorted(set(values) - fields)
    if unknown:
        raise SystemExit(
            f"error: SETTINGS[{name!r}] of {script}.py sets {', '.join('--' + n.replace('_', '-') for n in unknown)}, "
            f"which {script}.py does not have; fix the set or run with --settings builtin"
        )
    return name, dict(values), origin, untranslated


def describe_settings(settings: dict, defaults: dict) -> str:
    """The --help text of the sets: each one's flags with their values, the script's defaults beside them."""
    lines = ["named settings (--settings NAME; default: the env id's family's, else builtin, the defaults):"]
    for name, values in settings.items():
        what = FAMILIES[name][0] if name in FAMILIES else "chosen with --settings only"
        if callable(values):
            lines.append(f"  {name} ({what})")
            continue
        flags = " ".join(f"{as_flag(k, v)}" for k, v in values.items() if v != defaults.get(k, object()))
        lines.append(f"  {name} ({what}): {flags or 'the defaults'}")
    if "task" in settings:  # common.settings' set for a Playground task without CUDA
        lines.append("  cpu (MuJoCo Playground tasks on a machine without CUDA, where task is a GPU's: a CPU's sizes)")
    return "\n".join(lines)


def as_flag(name: str, value) -> str:
    """One flag's value as a command line spells it, quoted for a shell: --no-reward-norm, --hidden-sizes 64 64."""
    import shlex

    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return flag if value else "--no-" + name.replace("_", "-")
    if isinstance(value, (tuple, list)):
        return " ".join([flag, *(shlex.quote(str(v)) for v in value)])
    return f"{flag} {shlex.quote(str(value))}"


# ----------------------------------------------------------------------------------------------
# The command line: the algorithm's flags first, then the run's, in two groups of --help
# ----------------------------------------------------------------------------------------------
def field_docs(cls) -> dict[str, str]:
    """{field: the string under it in the class body} of `cls` and its bases (the nearest wins)."""
    import ast
    import inspect
    import textwrap

    docs = {}
    for klass in reversed([k for k in cls.__mro__ if k is not object]):
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        except (OSError, TypeError):  # no source (a class made at run time)
            continue
        for node, after in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split())  # tyro wraps it
    return docs


def parse_args(args_class, argv: list[str] | None = None):
    """A script's Args from the command line, the flags flat; --help shows the algorithm's first, the run's after."""
    import typing

    import tyro

    hints, docs = typing.get_type_hints(args_class, include_extras=True), field_docs(args_class)
    bounds = declared_bounds(args_class)

    def flag(f):  # a field of args_class as a group's: its type with its docstring (and range) as the help, its default
        if f.name in values:
            default = field(default=values[f.name])
        elif f.default is not MISSING:
            default = field(default=f.default)
        else:
            default = field(default_factory=f.default_factory)
        help = docs.get(f.name, "") + (f" [{', '.join(map(str, bounds[f.name]))}]" if f.name in bounds else "")
        return f.name, typing.Annotated[hints[f.name], tyro.conf.arg(help=help)], default

    def group(name: str, keep) -> type:
        return make_dataclass(name, [flag(f) for f in fields(args_class) if keep(f.name)])

    run_names = set(RunArgs.__dataclass_fields__)
    module = sys.modules.get(args_class.__module__)
    algo = script_name(args_class, getattr(module, "ALGO", "algorithm"))
    argv = sys.argv[1:] if argv is None else argv
    check_flag_names(argv, {f.name for f in fields(args_class)})
    check_flag_values(argv, hints)
    # the named set for this env id: its values are the defaults the command line's flags override
    sets = getattr(module, "SETTINGS", None) or {}
    name, values, origin, untranslated = resolve_settings(
        sets,
        algo,
        flag_value(argv, "env_id") or args_class.env_id,
        flag_value(argv, "settings"),
        {f.name for f in fields(args_class)},
        flag_value(argv, "device") or args_class.device,
    )
    values["settings"] = name
    cli = make_dataclass(
        "CommandLine",
        [
            (algo, typing.Annotated[group(f"{algo} flags", lambda n: n not in run_names), tyro.conf.OmitArgPrefixes]),
            ("run", typing.Annotated[group("run flags", lambda n: n in run_names), tyro.conf.OmitArgPrefixes]),
        ],
    )
    description = (module.__doc__ or "").strip().split("\n\n")[0] if module is not None else None
    if sets:
        description = f"{description or ''}\n\n{describe_settings(sets, asdict(args_class()))}".strip()
    parsed = tyro.cli(cli, args=argv, description=description)
    args = args_class(**asdict(getattr(parsed, algo)), **asdict(parsed.run))
    args._settings = values  # the defaults this run's flags override (given_flags)
    args._settings_origin = (origin if args.settings == name else "--settings", untranslated)
    # the flags the command line names, also where a value equals its default (given_flags); an
    # attribute of this instance, not a field, so no class name is compared (a copy may rename Args)
    names = {token[2:].split("=")[0].replace("-", "_") for token in argv if token.startswith("--")}
    args._command_line = {
        n[3:] if n.startswith("no_") and n[3:] in args_class.__dataclass_fields__ else n for n in names
    }
    return args


def flag_value(argv: list[str], name: str) -> str | None:
    """The value the command line gives flag `name` (--env-id X, --env-id=X, --env_id X; the last one wins), or None."""
    value = None
    for i, token in enumerate(argv):
        given, equals, after = token[2:].partition("=")
        if token.startswith("--") and given.replace("-", "_") == name:
            value = after if equals else (argv[i + 1] if i + 1 < len(argv) else None)
    return value


def script_name(args_class, algo: str) -> str:
    """The name a script runs under: its file's, so that a copy (algos/ppo_mine.py) prints, logs, names its runs and
    writes its checkpoints as `ppo_mine` with no edit; `algo` (the ALGO it declares: the algorithm it implements, which
    its checkpoints are compatible with) where `args_class` does not come from a script's file."""
    module = sys.modules.get(getattr(args_class, "__module__", ""))
    path = getattr(module, "__file__", None)
    if path is None or not hasattr(module, "ALGO"):
        return algo
    from pathlib import Path

    return Path(path).stem


# A flag of the projects our users come from, for a concept a script has under another flag: (whose, the flag here,
# what to give it). One concept has one flag here; the other's name gets a line that names ours.
FLAGS_ELSEWHERE = {
    "anneal_lr": ("CleanRL's", "lr_schedule", "--lr-schedule linear"),
    "no_anneal_lr": ("CleanRL's", "lr_schedule", "--lr-schedule constant"),
}


def check_flag_names(argv: list[str], names: set[str]) -> None:
    """Stop with one line for a flag the script does not have, naming the flags it may have meant: tyro's own
    suggestions go by spelling, so `--lr` gets `--lr-schedule`, not `--learning-rate`; here initials count too, and
    another project's flag (FLAGS_ELSEWHERE) gets the one that does it here."""
    import difflib

    for token in argv:
        if not token.startswith("--") or token in ("--help", "--"):
            continue
        name = token[2:].split("=")[0].replace("-", "_")
        if name in names or (name.startswith("no_") and name[3:] in names):  # --no-X: tyro judges whether X is a bool
            continue
        whose, ours, said = FLAGS_ELSEWHERE.get(name, (None, None, None))
        if ours in names:
            raise usage_error(f"error: {token.split('=')[0]} is {whose} flag; here it is {said}")
        initials = [n for n in sorted(names) if "".join(w[0] for w in n.split("_") if w) == name]
        prefixed = [n for n in sorted(names) if n.startswith(name) or name.startswith(n)]
        close = difflib.get_close_matches(name, sorted(names), n=3, cutoff=0.6)
        meant = list(dict.fromkeys(initials + close + prefixed))[:3]
        hint = f"; did you mean {' or '.join('--' + n.replace('_', '-') for n in meant)}?" if meant else "; see --help"
        raise usage_error(f"error: unknown flag {token.split('=')[0]}{hint}")


def check_flag_values(argv: list[str], hints: dict) -> None:
    """A usage error in one line for a value a numeric or choice flag cannot take (tyro says it in a box of nine
    lines). The ranges are check_numbers'; other flags (strings, switches) are tyro's."""
    i = 0
    while i < len(argv):
        token, i = argv[i], i + 1
        if not token.startswith("--") or token == "--":
            continue
        flag, inline, value = token.partition("=")
        name = flag[2:].replace("-", "_")
        if name not in hints:
            continue
        values = [value] if inline else []
        while not inline and i < len(argv) and not argv[i].startswith("--"):
            values, i = values + [argv[i]], i + 1
        problem = _bad_values(hints[name], values)
        if problem:
            raise usage_error(f"error: {flag} takes {problem}")


def _bad_values(hint, values: list[str]) -> str | None:
    """What a flag of type `hint` takes and what it got, where `values` (its words) do not fit; else None."""
    import types
    import typing

    if typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if type(None) in members and values == ["None"]:  # an optional flag set back to unset
        return None
    members, count = tuple(m for m in members if m is not type(None)), 1
    if len(members) == 1 and typing.get_origin(members[0]) is tuple:  # tuple[int, ...] or tuple[int, int]
        items = typing.get_args(members[0])
        members, count = items[:1], None if len(items) == 2 and items[1] is Ellipsis else len(items)
    if members in ((int,), (float,)):
        kind = members[0]
        noun = "an integer" if kind is int else "a number"
        if count != 1:
            noun = f"{'any number of' if count is None else count} {'integers' if kind is int else 'numbers'}"
    elif count == 1 and members != (bool,) and all(m is bool or typing.get_origin(m) is Literal for m in members):
        kind = [str(c) for m in members for c in ((True, False) if m is bool else typing.get_args(m))]
        noun = f"one of {', '.join(kind)}"
    else:  # a string, a switch (--flag, --no-flag), ...: tyro's
        return None

    def accepted(word: str) -> bool:
        if isinstance(kind, list):
            return word in kind
        try:
            kind(word)  # as tyro reads it: int("1.5") and int("1e3") fail
        except ValueError:
            return False
        return True

    if count is not None and len(values) != count:  # tuple[int, ...] may be empty: `--hidden-sizes` alone, no layers
        return f"{noun}, got {len(values) or 'none'}"
    bad = next((word for word in values if not accepted(word)), None)
    return None if bad is None else f"{noun}, got {bad!r}"


# ----------------------------------------------------------------------------------------------
# The flags given, the ones a checkpoint supplies, and the seeds derived from --seed
# ----------------------------------------------------------------------------------------------
def given_flags(args) -> set[str]:
    """The flags this run was given: those its command line names, and any whose value is not its default."""
    defaults = {**asdict(type(args)()), **getattr(args, "_settings", {})}  # a named set's values are defaults
    given = {f.name for f in fields(args) if getattr(args, f.name) != defaults[f.name]}
    return given | getattr(args, "_command_line", set())


def from_command_line(args) -> bool:
    """Whether `args` was parsed from a command line, not built in code."""
    return hasattr(args, "_command_line")


def take_flags_from(run, checkpoint: dict) -> None:
    """The flags of the run `checkpoint` continues, for every one the command line left alone but those of one
    sitting (SITTING_FLAGS), said in a shell fragment, and the ones the command line changes. Another env id or named
    set is an error (a network shape that does not fit is restore's)."""
    args, saved = run.args, checkpoint.get("args", {})
    if "env_id" in run.given and saved.get("env_id", args.env_id) != args.env_id:
        raise SystemExit(
            f"error: {run.resume_path} was trained on env {saved['env_id']!r}, not {args.env_id!r}: drop "
            f"--env-id (the checkpoint's is used) or pass --env-id {saved['env_id']}"
        )
    if "settings" in run.given and saved.get("settings") not in (None, args.settings) and not args.eval_only:
        raise SystemExit(
            f"error: {run.resume_path} is a run of --settings {saved['settings']}, not {args.settings}: a resume keeps "
            f"the run's values; drop --settings (give the flags to change one by one), or start a new run with "
            f"--init-from {run.resume_path}"
        )
    run.foreign_flags = {name: value for name, value in saved.items() if not hasattr(args, name)}
    if run.foreign_flags:  # another script's run (--resume-other-script): its flags stay in its config and checkpoints
        kept = " ".join(as_flag(k, v) for k, v in run.foreign_flags.items())
        run.say(
            f"notice: the run's flags that {run.algo}.py does not have are kept in its config.json and checkpoints, "
            f"unused: {kept}"
        )
    own = SITTING_FLAGS | (EVAL_ONLY_OWN_FLAGS if args.eval_only else set())
    taken, changed = [], []
    for name, value in saved.items():
        if name in own or not hasattr(args, name) or (name == "settings" and value is None):
            continue  # (a run built in code names no set)
        value = tuple(value) if isinstance(getattr(args, name), tuple) and isinstance(value, list) else value
        if value == getattr(args, name):
            continue
        if name in run.given:
            changed.append(f"{as_flag(name, getattr(args, name))} (the run's: {as_flag(name, value)})")
            continue
        setattr(args, name, value)
        taken.append((name, as_flag(name, value)))
        if name == "settings":
            args._settings_origin = ("the run's, its values from its checkpoint", [])
    command = run_command(run, saved, own)
    if command:
        run.say(f"from the checkpoint: {command}")
    if changed and not args.eval_only:
        run.say(f"notice: given again with other values than the run's: {', '.join(changed)}")


def run_command(run, saved: dict, own: set[str]) -> str:
    """The flags that start the run `saved` holds the values of: each one whose value is not the default of the set it
    was started with (that set's values over Args's defaults, for its env id), whatever this command line repeats, and
    --settings wherever the env id alone would not choose that set. Pasted into a new run, it starts the same run."""
    args = run.args
    env_id, name = saved.get("env_id", args.env_id), saved.get("settings")
    script_fields = {f.name: f for f in fields(type(args))}
    module = sys.modules.get(type(args).__module__)
    sets = getattr(module, "SETTINGS", None) or {}
    set_values = {}
    if name is not None:
        _, set_values, _, _ = resolve_settings(sets, run.algo, env_id, name, set(script_fields))
    words = []
    if env_id != type(args).env_id:
        words.append(as_flag("env_id", env_id))
    if name is not None and (
        name != BUILTIN or resolve_settings(sets, run.algo, env_id, None, set(script_fields))[0] != name
    ):
        words.append(as_flag("settings", name))
    for flag, value in saved.items():
        if flag in own or flag in ("env_id", "settings") or flag not in script_fields:
            continue
        f = script_fields[flag]
        default = f.default if f.default is not MISSING else f.default_factory()
        default = set_values.get(flag, default)
        if isinstance(default, tuple) and isinstance(value, list):
            value = tuple(value)
        if isinstance(value, tuple) and isinstance(default, list):
            default = tuple(default)
        if value != default:
            words.append(as_flag(flag, value))
    return " ".join(words)


def derive_seed(run, stream: str) -> int:
    """A 62-bit seed for one random stream of this rank, hashed from (--seed, rank, stream).

    Env i of a batch seeded s gets seed s + i, so with seeds like `seed + rank * num_envs` the
    runs --seed 1 and --seed 2 would share all but one env stream, and ranks would overlap the
    same way. Hashed bases put every (seed, rank, stream) at an unrelated place in a 2**62
    range: two runs, two ranks, or the training and eval envs share a stream only if their bases
    fall within num_envs of each other (probability about num_envs / 2**62).
    """
    digest = hashlib.blake2b(f"{run.args.seed}/{run.rank}/{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def env_seed(run) -> int:
    """Seed of this rank's training envs (env i gets env_seed + i)."""
    return derive_seed(run, "envs")


def eval_seed(run, iteration: int) -> int:
    """Seed of this rank's eval envs for the evaluation at `iteration`: each evaluation sees new
    episodes, and --eval-only of a checkpoint replays the evaluation of its iteration."""
    return derive_seed(run, f"eval/{iteration}")
