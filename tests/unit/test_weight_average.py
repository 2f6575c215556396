"""The moving average of the weights (optim.ema_decay): pure units on a small torch module."""

import pytest
import torch
from torch import nn

from hvd_ctsm.train.weight_average import WeightAverage


def set_weights(model: nn.Module, value: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)


def test_the_average_follows_the_ramped_decay():
    model = nn.Linear(3, 2)
    set_weights(model, 0.0)
    average = WeightAverage(model, decay=0.2)
    expected = 0.0
    for n, value in enumerate([1.0, 2.0, 3.0, 4.0], start=1):
        set_weights(model, value)
        average.update(model)
        decay = min(0.2, (1 + n) / (10 + n))  # the ramp's 2/11 first, then the cap 0.2
        expected = decay * expected + (1 - decay) * value
        assert torch.allclose(average.shadow["weight"], torch.full((2, 3), expected))
    assert average.updates == 4 and expected != pytest.approx(4.0)  # it lags the weights


def test_applied_swaps_the_average_in_and_restores_the_weights_even_on_error():
    model = nn.Linear(3, 2)
    set_weights(model, 0.0)
    average = WeightAverage(model, decay=0.9)
    set_weights(model, 1.0)
    average.update(model)
    inside = average.shadow["weight"].clone()
    with average.applied(model):
        assert torch.equal(model.weight, inside)
    assert torch.equal(model.weight, torch.ones(2, 3))
    with pytest.raises(RuntimeError), average.applied(model):
        raise RuntimeError("validation failed")
    assert torch.equal(model.weight, torch.ones(2, 3))


def test_state_round_trip_and_restart():
    model = nn.Linear(3, 2)
    average = WeightAverage(model, decay=0.9)
    for value in (1.0, 2.0):
        set_weights(model, value)
        average.update(model)
    other = WeightAverage(nn.Linear(3, 2), decay=0.9)
    other.load_state_dict(average.state_dict())
    assert other.updates == 2
    assert all(torch.equal(other.shadow[k], average.shadow[k]) for k in average.shadow)
    other.restart(model)
    assert other.updates == 0 and torch.equal(other.shadow["weight"], model.weight)


def test_a_decay_outside_zero_one_is_refused():
    with pytest.raises(ValueError, match="decay"):
        WeightAverage(nn.Linear(1, 1), decay=1.0)


def test_a_step_over_twice_the_rows_decays_twice_as_much():
    """Two workers take half the steps over an epoch: each step's decay is squared, so the
    average spans the same rows."""
    model = nn.Linear(3, 2)
    one, two = WeightAverage(model, 0.9, unit_rows=64), WeightAverage(model, 0.9, unit_rows=64)
    for _ in range(100):  # past the ramp: (1 + n) / (10 + n) >= 0.9 from n = 81
        one.update(model)
        two.update(model, rows=128)
    set_weights(model, 0.0)
    before_one, before_two = one.shadow["weight"].clone(), two.shadow["weight"].clone()
    one.update(model, rows=64)
    two.update(model, rows=128)
    assert torch.allclose(one.shadow["weight"], 0.9 * before_one)
    assert torch.allclose(two.shadow["weight"], 0.81 * before_two)
