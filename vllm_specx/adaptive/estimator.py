"""Online acceptance estimator: the confidence of a draft slot when the draft has no confidence
head (vLLM's `OnlineAcceptanceEstimator`, V2 runner, rebuilt here for V1).

    c[r, i] = sigmoid(a * f[r, i] + b_i),   f = logit(q_max)  (clamped to [-8, 8])

q_max is the top probability of the distribution draft i was taken from, i the draft slot. The
prior a = 1, b = 0 is c = q_max. Every verified draft slot is an observation: label 1 when it was
accepted, 0 for the first rejected slot of its request (slots after it are not observed). The
parameters are refit every `refit_every` (64) observations on the last `capacity` ones by three Newton
steps of L2-regularised logistic regression pulled towards the prior (weight `l2`).
"""

from __future__ import annotations

import torch

_CLAMP = 8.0


def feature(q_max: torch.Tensor) -> torch.Tensor:
    """logit(q_max), clamped."""
    q = q_max.double().clamp(1e-6, 1 - 1e-6)
    return (q.log() - (-q).log1p()).clamp(-_CLAMP, _CLAMP)


class OnlineAcceptanceEstimator:
    def __init__(self, num_slots: int, capacity: int = 4096, refit_every: int = 64, l2: float = 1.0):
        self.k = num_slots
        self.capacity, self.refit_every, self.l2 = capacity, refit_every, l2
        self.prior = torch.zeros(1 + num_slots, dtype=torch.float64)
        self.prior[0] = 1.0
        self.theta = self.prior.clone()
        self._f = torch.empty(0, dtype=torch.float64)
        self._slot = torch.empty(0, dtype=torch.long)
        self._y = torch.empty(0, dtype=torch.float64)
        self._pending = 0

    def confidences(self, feats: torch.Tensor) -> torch.Tensor:
        """feats [R, m] (from `feature`) -> confidences [R, m] (float64)."""
        m = feats.shape[-1]
        return torch.sigmoid(self.theta[0] * feats.double() + self.theta[1:1 + m])

    def observe(self, feats: torch.Tensor, slots: torch.Tensor, labels: torch.Tensor) -> None:
        """feats, slots, labels [n]: verified draft slots and whether each was accepted."""
        if feats.numel() == 0:
            return
        self._f = torch.cat([self._f, feats.double().flatten()])[-self.capacity:]
        self._slot = torch.cat([self._slot, slots.long().flatten()])[-self.capacity:]
        self._y = torch.cat([self._y, labels.double().flatten()])[-self.capacity:]
        self._pending += feats.numel()
        if self._pending >= self.refit_every:
            self._pending = 0
            self.refit()

    def refit(self, steps: int = 3) -> None:
        n = self._f.numel()
        if n == 0:
            return
        x = torch.zeros(n, 1 + self.k, dtype=torch.float64)
        x[:, 0] = self._f
        x[torch.arange(n), 1 + self._slot.clamp(0, self.k - 1)] = 1.0
        theta = self.theta.clone()
        eye = torch.eye(1 + self.k, dtype=torch.float64)
        for _ in range(steps):
            p = torch.sigmoid(x @ theta)
            g = x.t() @ (p - self._y) + self.l2 * (theta - self.prior)
            h = (x * (p * (1 - p)).unsqueeze(1)).t() @ x + self.l2 * eye
            theta = theta - torch.linalg.solve(h, g)
        if torch.isfinite(theta).all():
            self.theta = theta
