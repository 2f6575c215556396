"""An exponential moving average of a model's weights, validated and kept as the model.

Late in training the validation curve wobbles by a few thousandths from one evaluation to the
next while the loss barely moves: each epoch's weights are the last few steps' noise on top of
what the model learned. The average over the last ~1 / (1 - decay) steps keeps what they share.
It is plain PyTorch and rank-local: every rank holds the same weights after every step, so every
rank's average is the same without any communication.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn


class WeightAverage:
    """shadow = d * shadow + (1 - d) * weights after each optimizer step of `rows` rows, with
    d = decay ** (rows / unit_rows): `decay` is per `unit_rows` rows, so that the average spans
    the same share of an epoch whatever the effective batch (more workers, fewer steps).

    d ramps up as (1 + n) / (10 + n) over the first updates (n of them so far), so the average
    of a young model is not dominated by its random initialisation.
    """

    def __init__(self, model: nn.Module, decay: float, unit_rows: int = 1):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.decay, self.unit_rows = decay, unit_rows
        self.restart(model)

    def restart(self, model: nn.Module, saved: dict | None = None) -> None:
        """Start the average over from the model's weights now (a warm start's, say), or
        continue a `saved` one (state_dict(): a resumed or re-formed run's)."""
        self.updates = 0
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if saved:
            self.load_state_dict(saved)

    @torch.no_grad()
    def update(self, model: nn.Module, rows: int | None = None) -> None:
        """After an optimizer step over `rows` rows (None: unit_rows)."""
        self.updates += 1
        per_step = self.decay ** ((rows or self.unit_rows) / self.unit_rows)
        decay = min(per_step, (1 + self.updates) / (10 + self.updates))
        for name, value in model.state_dict().items():
            average = self.shadow[name]
            if average.is_floating_point():
                average.lerp_(value.detach(), 1.0 - decay)
            else:
                average.copy_(value)

    @contextmanager
    def applied(self, model: nn.Module):
        """The averaged weights in `model` inside the block, its own weights back after it."""
        own = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.load_state_dict(self.shadow)
        try:
            yield model
        finally:
            model.load_state_dict(own)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "updates": self.updates, "weights": self.shadow}

    def load_state_dict(self, state: dict) -> None:
        self.updates = int(state["updates"])
        for name, value in state["weights"].items():
            self.shadow[name].copy_(value)
