"""Mirror symmetry (rsl_rl's symmetry_cfg; Mittal et al. 2024). One contract for every env kind: an env's mirror is
`data_augmentation(obs=None, actions=None) -> (obs, actions)`, rsl_rl's data_augmentation_func less its `env`. It sees
flat rows (`obs` of batch [B], `actions` [B, A] or [B]) and returns k * B rows of each (k >= 2): the B given, then each
mirror image of all B (image j of row i at j * B + i), None left None. The functions here flatten any leading shape."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import torch
from tensordict import TensorDict


def env_mirror(envs, obs: TensorDict, args) -> Callable | None:
    """The env's mirror for `--symmetry`, tried once: an env without one, or breaking the contract, stops the run."""
    if args.symmetry == "none":
        return None
    data_augmentation = getattr(envs, "data_augmentation", None)
    fault = f"error: --symmetry {args.symmetry}: {args.env_id}"
    if data_augmentation is None:
        raise SystemExit(f"{fault} has no mirror (data_augmentation) to use")
    space, n = envs.single_action_space, obs.shape[0]
    actions = torch.zeros(n, *space.shape, dtype=torch.long if space.shape == () else torch.float32, device=obs.device)
    aug_obs, aug_actions = data_augmentation(obs=obs, actions=actions)
    for what, given, rows in (("observations", obs, aug_obs), ("actions", actions, aug_actions)):
        if rows is None or rows.shape[0] < 2 * n or rows.shape[0] % n or rows.shape[1:] != given.shape[1:]:
            shape = None if rows is None else list(rows.shape)
            raise SystemExit(
                f"{fault}: its mirror (data_augmentation) returned {what} of shape {shape} for {list(given.shape)}; "
                f"it must return the {n} rows given, then their mirror images (common/symmetry.py)"
            )
    if set(aug_obs.keys()) != set(obs.keys()):
        raise SystemExit(f"{fault}: its mirror returned the groups {sorted(aug_obs.keys())} for {sorted(obs.keys())}")
    return data_augmentation


def mirror_images(data_augmentation: Callable, obs: TensorDict, actions: torch.Tensor) -> TensorDict:
    """The mirror images of a batch of any leading shape `lead`: {"obs", "actions"} with batch [*lead, k-1]."""
    lead, n = obs.batch_size, obs.batch_size.numel()
    aug_obs, aug_actions = data_augmentation(obs=obs.reshape(n), actions=actions.reshape(n, *actions.shape[obs.ndim :]))
    images = TensorDict({"obs": aug_obs[n:], "actions": aug_actions[n:]}, batch_size=[aug_obs.shape[0] - n])
    return images.reshape(-1, *lead).permute(*range(1, len(lead) + 1), 0)  # [k-1, *lead] -> [*lead, k-1]


def in_rsl_rl_order(batch: TensorDict, images: TensorDict) -> TensorDict:
    """A minibatch [B] and its mirror images [B, k-1] as rsl_rl's augmented minibatch [k * B]; an image takes what it
    lacks (old log-probs, values, advantages, returns) from its original."""
    images = batch.exclude(*images.keys()).unsqueeze(1).expand(images.shape).update(images)
    return torch.cat([batch, images.transpose(0, 1).reshape(-1)])


def output_mirror(data_augmentation: Callable, action_space: gym.Space, device) -> Callable:
    """The mirror of the actor's outputs: `out` [B, A] -> [(k-1) * B, A], in_rsl_rl_order's order. Logits: column j
    of an image is the logit of the action whose mirror image is j."""
    if not isinstance(action_space, gym.spaces.Discrete):
        return lambda out: data_augmentation(actions=out)[1][out.shape[0] :]
    n = int(action_space.n)
    columns = data_augmentation(actions=torch.arange(n, device=device))[1][n:].view(-1, n).argsort(-1)  # [k-1, n]
    return lambda out: out[:, columns].transpose(0, 1).flatten(0, 1)


def mirrors(envs, obs: TensorDict, args, device) -> tuple[Callable | None, Callable | None]:
    """(env_mirror, output_mirror); (None, None) with --symmetry none."""
    data_augmentation = env_mirror(envs, obs, args)
    if data_augmentation is None:
        return None, None
    return data_augmentation, output_mirror(data_augmentation, envs.single_action_space, device)


def normalized_images(data_augmentation: Callable, obs: TensorDict, actions: torch.Tensor, normalize) -> TensorDict:
    """mirror_images, then normalized (after mirroring: a normalizer's mean is not symmetric): {"obs_n", "actions"}."""
    images = mirror_images(data_augmentation, obs, actions)
    return TensorDict({"obs_n": normalize(images["obs"]), "actions": images["actions"]}, images.shape)


def rollout_images(args, data_augmentation: Callable | None, obs: TensorDict, actions: torch.Tensor, normalize) -> dict:
    """{"mirrored": [T, N, k-1] images} with any --symmetry ("log" measures the mirror loss on them), {} without."""
    if args.symmetry == "none":
        return {}
    return {"mirrored": normalized_images(data_augmentation, obs, actions, normalize)}


def with_mirror_images(mb: TensorDict, args) -> tuple[TensorDict, TensorDict]:
    """(the actor's observations, the losses' minibatch): augmented [k * B] for the actor with any --symmetry, for
    the losses with augmentation (or both)."""
    if args.symmetry == "none":
        return mb["obs_n"], mb
    augmented = in_rsl_rl_order(mb.exclude("mirrored"), mb["mirrored"])
    return augmented["obs_n"], augmented if args.symmetry in ("augmentation", "both") else mb


def mirror_loss(agent, out: torch.Tensor, b: int, output_mirror: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    """rsl_rl's mirror loss and the symmetry error of the actor's outputs `out` [k * B, A]. Logits less their mean (a
    constant added to every logit is the same policy). The error, without gradient: mean |pi(m(s)) - m(pi(s))|."""
    out = out - out.mean(-1, keepdim=True) if agent.discrete else out
    loss = torch.nn.functional.mse_loss(out[b:], output_mirror(out[:b].detach()))
    with torch.no_grad():
        act = out if agent.discrete else agent.to_env(out)
        return loss, (act[b:] - output_mirror(act[:b])).abs().mean()
