"""The trained roles' optimiser: learning-rate schedules against the formula written out with
`math`, and a constant rate that keeps the optimiser state (and so old checkpoints) as it was."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrubric.config import base_config
from jaxrubric.roles import Role
from jaxrubric.train import learning_rate, make_optimizer


def _config(**optim):
    config = base_config()
    config.rounds = 10
    config.round.num_updates = 2
    config.optim.generator_lr = 1e-3
    config.optim.update(optim)
    return config


def _reference(step: int, total: int, peak: float, warmup: int, final: float, kind: str
               ) -> float:
    if step < warmup:
        return peak * step / warmup
    if kind == "constant":
        return peak
    progress = min(step - warmup, total - warmup) / (total - warmup)
    return final * peak + (peak - final * peak) * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize("kind, warmup", [("constant", 0), ("constant", 4), ("cosine", 0),
                                          ("cosine", 3)])
def test_schedules_follow_the_formula_over_the_runs_optimiser_steps(kind, warmup):
    config = _config(lr_schedule=kind, warmup_steps=warmup, final_lr_fraction=0.1)
    rate = learning_rate(config, Role.GENERATOR, steps=20)  # 10 rounds x 2 updates
    for step in range(0, 25):
        expected = _reference(step, 20, 1e-3, warmup, 0.1, kind)
        got = rate(step) if callable(rate) else rate
        assert float(got) == pytest.approx(expected, rel=1e-5, abs=1e-12), step


def test_a_constant_rate_keeps_the_optimiser_state_it_always_had():
    params = {"w": jnp.ones((3,))}
    ours = make_optimizer(_config(), Role.GENERATOR)
    before = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.0))
    assert (jax.tree.structure(ours.init(params)) == jax.tree.structure(before.init(params)))


def test_the_cosine_rate_decays_the_steps_a_run_takes():
    """Same gradient every step: Adam's step is then about the rate, so the updates shrink as
    the schedule says, ending at a tenth."""
    optimizer = make_optimizer(_config(lr_schedule="cosine"), Role.GENERATOR)
    params = {"w": jnp.zeros((2,))}
    state = optimizer.init(params)
    sizes = []
    for _ in range(20):
        updates, state = optimizer.update({"w": jnp.full((2,), 0.1)}, state, params)
        sizes.append(float(jnp.abs(updates["w"]).mean()))
    np.testing.assert_allclose(sizes[0], 1e-3, rtol=1e-3)
    assert all(a > b for a, b in zip(sizes, sizes[1:]))
    np.testing.assert_allclose(sizes[-1], _reference(19, 20, 1e-3, 0, 0.1, "cosine"), rtol=1e-3)
