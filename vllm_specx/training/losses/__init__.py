"""Training losses for draft heads: one function per loss, its formula and why it matters for
acceptance in its docstring, tested for value and gradient in `tests/training/test_losses.py`.

Every loss takes a `DraftOutput` and per-position weights and returns a scalar. Notation:
position k = 0..N-1 of a block (draft k), `z_k` the draft logits, `q_k = softmax(z_k)` the draft
distribution over the full vocabulary, `y_k` the target token (on-policy: what the target
generated; at temperature 0 its argmax), `w_k` the position weight, `valid_k` 0 where `y_k` is
`IGNORE` (-100: past the end of the sequence), which carries neither loss nor gradient.

The target's distribution (`DraftOutput.target_ids` / `target_logp`, from the data command's
top-k, `vllm_specx.training.data`): the S = k most likely tokens of the target at temperature 1
and their log-probabilities under the full softmax. Losses read it renormalised over S,

    p_k(v) = exp(target_logp_k(v)) / sum_{u in S_k} exp(target_logp_k(u))   for v in S_k, 0 else,

which is exactly the target's top-k-sampling distribution, and q is never renormalised: its mass
outside S_k is counted (it is where `min(p, q) = 0`). So `alpha_k = sum_{v in S_k} min(p_k(v),
q_k(v)) = sum_v min(p_k(v), q_k(v))` and `1 - alpha_k = TV(p_k, q_k)` exactly; against the
untruncated target p*, |TV(p*, q) - TV(p, q)| <= 1 - sum_S p*(v) (the stored top-k miss).

`alpha_k` is the probability that draft k is accepted by token-wise rejection sampling (Leviathan
et al. 2023) when it is reached, so `1 + sum_j prod_{i<=j} alpha_i` is the expected number of
tokens per target pass (tau) if the positions were independent (`analytic_tau`).

`LOSSES` maps the trainer's `--loss` names to the functions. The confidence head's loss
(`confidence_bce`, on per-slot acceptance logits rather than on the draft logits) is separate:
the trainer adds it to the draft loss with `--confidence-weight`, or trains it alone
(`--train-only confidence`); its labels are `confidence_labels`.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

IGNORE = -100
ALPHA_FLOOR = 1e-6  # -log(alpha) is clamped here (alpha = 0 when q has no mass on the top-k)


@dataclasses.dataclass
class DraftOutput:
    """What a method's training forward returns.

    Attributes:
        logits: [..., N, V] draft logits at each of the N draft positions of every block.
        targets: [..., N] int64 token each position should predict, IGNORE for no loss.
        target_ids: [..., N, k] int64 the target's top-k tokens there (None: not stored).
        target_logp: [..., N, k] their log-probabilities under the target's full softmax.
        confidence: [..., N] the draft's confidence-head logits (the predicted probability that
            draft k is accepted given drafts < k were), or None when the draft has no such head.
    """

    logits: torch.Tensor
    targets: torch.Tensor
    target_ids: torch.Tensor | None = None
    target_logp: torch.Tensor | None = None
    confidence: torch.Tensor | None = None


def to_draft_vocab(out: DraftOutput, t2d: torch.Tensor) -> DraftOutput:
    """`out` with its targets in a reduced draft vocabulary's ids (`vllm_specx.vocab`): logits are
    already [..., N, Vd]; a target token outside the draft vocabulary becomes IGNORE (the draft
    can never propose it: it carries no loss or gradient, only lost acceptance, which
    `vocab.coverage` reports), and the target's top-k keeps its in-vocabulary tokens (the others
    get log-probability -inf, so p is renormalised over the draft vocabulary's part of S).
    Positions none of whose top-k tokens is in the vocabulary become IGNORE too."""
    from vllm_specx.vocab import from_target

    targets = from_target(out.targets, t2d)
    ids, logp = out.target_ids, out.target_logp
    if ids is not None:
        mapped = from_target(ids, t2d)
        inside = mapped >= 0
        targets = torch.where(inside.any(-1), targets, -1)
        logp = torch.where(inside, logp, float("-inf"))
        empty = ~inside.any(-1, keepdim=True)  # ignored rows: a harmless one-hot, never NaN
        logp = torch.where(empty & (torch.arange(ids.shape[-1], device=ids.device) == 0), 0.0, logp)
        ids = mapped.clamp(min=0)
    targets = torch.where(targets < 0, IGNORE, targets)
    return dataclasses.replace(out, targets=targets, target_ids=ids, target_logp=logp)


def first_positions(out: DraftOutput, k: int) -> DraftOutput:
    """A DraftOutput cut to its first k draft positions (targets [..., n], logits [..., n, V]):
    what a pass of K = k drafts is measured on (`--eval-drafts`, `training.serving_count`)."""
    cut = lambda t, dim: None if t is None else t.narrow(dim, 0, min(k, t.shape[dim]))  # noqa: E731
    n = out.targets.dim() - 1
    return dataclasses.replace(out, logits=cut(out.logits, n), targets=cut(out.targets, n),
                               target_ids=cut(out.target_ids, n), target_logp=cut(out.target_logp, n),
                               confidence=cut(out.confidence, n))


def position_weights(n: int, gamma: float, device: torch.device | str | None = None) -> torch.Tensor:
    """w_k = exp(-k / gamma), k = 0..n-1.

    Why: draft k is only ever used if drafts 0..k-1 were all accepted, so its contribution to the
    accepted length is discounted by the chance of getting that far; an exponential decay is the
    usual stand-in for that product (published block-drafter recipes use gamma ~ 4-7 for blocks
    of 8-16). The chain loss needs none: its products are that chance. `device`: where the
    weights are made (the logits' device; default the CPU).
    """
    return torch.exp(-torch.arange(n, device=device) / gamma)


def _flat(out: DraftOutput) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(logits [R, N, V], valid [R, N] float, N)."""
    n = out.targets.shape[-1]
    return (out.logits.reshape(-1, n, out.logits.shape[-1]),
            (out.targets.reshape(-1, n) != IGNORE).to(out.logits.dtype), n)


def _weighted_mean(per: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    w = valid * weights.to(per.dtype)
    return (per * w).sum() / w.sum().clamp(min=1e-12)


def target_distribution(out: DraftOutput) -> tuple[torch.Tensor, torch.Tensor]:
    """(S ids [R, N, k], p over S renormalised [R, N, k]) — the module docstring's p."""
    if out.target_ids is None or out.target_logp is None:
        raise ValueError("this loss needs the target's distribution: make the data with "
                         "`vllm-specx gen-data ... --topk K` (K > 0)")
    n, k = out.targets.shape[-1], out.target_ids.shape[-1]
    p = torch.softmax(out.target_logp.reshape(-1, n, k).to(out.logits.dtype), -1)
    return out.target_ids.reshape(-1, n, k), p


def acceptance_rate(out: DraftOutput) -> torch.Tensor:
    """alpha [R, N]: sum_v min(p_k(v), q_k(v)) with q the full-vocabulary softmax (differentiable
    in the draft logits; the target side is data, so it carries no gradient)."""
    logits, _, _ = _flat(out)
    ids, p = target_distribution(out)
    q_s = torch.softmax(logits, -1).gather(-1, ids)
    return torch.minimum(p, q_s).sum(-1)


def analytic_tau(alpha: torch.Tensor) -> torch.Tensor:
    """Expected tokens per target pass of a chain with per-position acceptance alpha [..., N]:
    1 + sum_j prod_{i<=j} alpha_i."""
    return 1 + torch.cumprod(alpha, -1).sum(-1)


def cross_entropy(out: DraftOutput, weights: torch.Tensor) -> torch.Tensor:
    """Weighted cross-entropy on the target's tokens (its samples, or its argmax at T = 0):

        L = sum_{r,k} w_k * valid_{r,k} * (-log q_k(y_{r,k})) / sum_{r,k} w_k * valid_{r,k}

    Why: with greedy verification a draft is accepted iff its argmax equals the target's token,
    and CE on on-policy tokens pushes the draft's mode onto them; it is the standard first-stage
    objective of published draft heads, though it ignores how much mass the target puts elsewhere,
    which matters at temperature > 0 (where TV-type losses fit acceptance better).
    """
    logits, valid, n = _flat(out)
    ce = F.cross_entropy(logits.flatten(0, 1), out.targets.reshape(-1).clamp(min=0),
                         reduction="none").view(-1, n)
    return _weighted_mean(ce, valid, weights)


def cross_entropy_argmax(out: DraftOutput, weights: torch.Tensor) -> torch.Tensor:
    """Weighted cross-entropy on the target's argmax g_k = the first of its stored top-k:

        L = sum w_k valid_k (-log q_k(g_k)) / sum w_k valid_k

    Why: greedy verification accepts exactly the argmax; with data sampled at T > 0 the stored
    token y_k is a sample, and this is the loss that still aims at what T = 0 serving checks.
    """
    ids, _ = target_distribution(out)
    return cross_entropy(DraftOutput(out.logits, torch.where(
        out.targets.reshape(ids.shape[:-1]) == IGNORE, IGNORE, ids[..., 0]).view_as(out.targets)), weights)


def forward_kl(out: DraftOutput, weights: torch.Tensor) -> torch.Tensor:
    """Weighted forward KL from the target (p over its top-k, renormalised):

        L = sum w_k valid_k sum_{v in S_k} p_k(v) (log p_k(v) - log q_k(v)) / sum w_k valid_k

    Why: mass-covering distillation, the default of speculators' trainers; its minimiser q = p
    also maximises acceptance, but away from it KL spends capacity on the target's tail, which
    TV (below) does not pay for.
    """
    logits, valid, _ = _flat(out)
    ids, p = target_distribution(out)
    logq = torch.log_softmax(logits, -1).gather(-1, ids)
    kl = (p * (torch.log(p.clamp(min=1e-30)) - logq)).sum(-1)
    return _weighted_mean(kl, valid, weights)


def total_variation(out: DraftOutput, weights: torch.Tensor) -> torch.Tensor:
    """Weighted total variation, one minus the per-token acceptance probability:

        L = sum w_k valid_k (1 - alpha_k) / sum w_k valid_k,   alpha_k = sum_v min(p_k(v), q_k(v))

    Why: 1 - alpha_k is exactly the rejection probability of draft k under lossless token-wise
    verification, so this loss is what sampled (T > 0) serving pays for, position by position
    (the main term of the published block-drafter recipe). Its gradient vanishes where q > p on a token: it never pushes mass the
    target does not want.
    """
    _, valid, _ = _flat(out)
    return _weighted_mean(1 - acceptance_rate(out), valid, weights)


def neg_log_acceptance(out: DraftOutput, weights: torch.Tensor) -> torch.Tensor:
    """Weighted negative log acceptance probability (Kimi K3's draft loss):

        L = sum w_k valid_k (-log max(alpha_k, 1e-6)) / sum w_k valid_k

    Why: the expected accepted length is a product of alphas, and -log turns the product into a
    sum, so a position with low acceptance gets a gradient 1 / alpha_k times larger than TV gives
    it: the weakest link of the chain is fixed first.
    """
    _, valid, _ = _flat(out)
    return _weighted_mean(-torch.log(acceptance_rate(out).clamp(min=ALPHA_FLOOR)), valid, weights)


def chain_tv(out: DraftOutput, weights: torch.Tensor) -> torch.Tensor:
    """End-to-end chain TV (GLM-5.2's MTP loss) over each block's N drafts:

        L = 1 - (1 / K) sum_{j<K} prod_{i<=j} alpha_i       per block, K = its valid positions,

    averaged over blocks weighted by K (so it is the mean of `1 - prod_{i<=j} alpha_i` over the
    valid (block, j) pairs). `weights` are not used: the products already discount later drafts.
    The target side carries no gradient (data).

    Why: prod_{i<=j} alpha_i is the probability that the first j + 1 drafts are all accepted, so
    1 - L is the expected accepted-prefix fraction (tau - 1 = K (1 - L)): the one number serving
    pays for, including how an early position's error wastes every later one.
    """
    _, valid, _ = _flat(out)
    prefix = torch.cumprod(acceptance_rate(out), -1)
    return (valid * (1 - prefix)).sum() / valid.sum().clamp(min=1)


def ce_tv_mix(out: DraftOutput, weights: torch.Tensor) -> torch.Tensor:
    """The block-drafter recipe's mixture (seed 003, without its confidence-head BCE):

        L = 0.1 * CE(y) + 0.9 * TV      (both weighted by w_k as above)

    Why: TV is the acceptance objective, but its gradient is zero on every token where q >= p
    and flat where q ~ 0; the small CE term keeps the draft's mode anchored on the target's
    token early in training.
    """
    return 0.1 * cross_entropy(out, weights) + 0.9 * total_variation(out, weights)


def per_position_accuracy(out: DraftOutput) -> torch.Tensor:
    """[N] fraction of valid rows whose draft argmax equals the target, per draft position (the
    teacher-forced greedy acceptance rate of each position)."""
    logits, valid, _ = _flat(out)
    hit = (logits.argmax(-1) == out.targets.reshape(valid.shape)).to(valid.dtype)
    return (hit * valid).sum(0) / valid.sum(0).clamp(min=1)


def per_position_acceptance(out: DraftOutput) -> torch.Tensor:
    """[N] mean alpha_k over valid rows (the sampled-serving acceptance rate of each position)."""
    _, valid, _ = _flat(out)
    return (acceptance_rate(out) * valid).sum(0) / valid.sum(0).clamp(min=1)


# ---- the confidence head ---------------------------------------------------------------------------

CONFIDENCE_LABELS = ("greedy", "soft")
CONFIDENCE_SLOTS = ("reached", "all")


def greedy_target(out: DraftOutput) -> torch.Tensor:
    """[R, N] the target's greedy token g_k at each position: the first of its stored top-k when the
    data has one, else the data's token y_k (the same token when the data was generated at
    temperature 0, as the committed data is), IGNORE where y_k is."""
    _, _, n = _flat(out)
    targets = out.targets.reshape(-1, n)
    if out.target_ids is None:
        return targets
    return torch.where(targets == IGNORE, IGNORE, out.target_ids.reshape(-1, n, out.target_ids.shape[-1])[..., 0])


@torch.no_grad()
def confidence_labels(out: DraftOutput, kind: str = "greedy") -> torch.Tensor:
    """[R, N] the realised acceptance of each draft slot, the confidence head's label (no gradient):

        greedy:  c_k = [argmax_v z_k(v) == g_k]      g_k = the target's greedy token (`greedy_target`)
        soft:    c_k = alpha_k = sum_v min(p_k(v), q_k(v))      (needs the data's top-k)

    z_k are the draft's logits at slot k of the trainer's teacher-forced block (the sequential head
    read the true previous tokens x_{a+1..a+k}), so c_k is the acceptance of draft k *given drafts
    < k were accepted*: at temperature 0 those drafts then were x_{a+1..a+k}, which is what the
    block conditions on. `greedy` is what greedy verification does (accept iff the draft is the
    target's argmax); `soft` is the probability that token-wise rejection sampling accepts a draft
    sampled from q_k. Which slots the head learns from is `confidence_weights`'.
    """
    if kind == "greedy":
        logits, _, n = _flat(out)
        return (logits.argmax(-1) == greedy_target(out)).to(logits.dtype)
    if kind == "soft":
        return acceptance_rate(out)
    raise ValueError(f"confidence label {kind!r} not one of {CONFIDENCE_LABELS}")


def confidence_weights(labels: torch.Tensor, valid: torch.Tensor, slots: str = "reached") -> torch.Tensor:
    """[R, N] each slot's weight in the confidence BCE:

        reached:  m_k = valid_k * prod_{i<k} c_i      (1 for slot 0)
        all:      m_k = valid_k

    Why `reached`: the head's p_k is read as P(draft k accepted | drafts < k accepted), and the
    survival prod_{i<=k} p_i is only the chance that drafts 0..k all pass if every factor is that
    conditional. The teacher-forced label c_k has the right *inputs* (the previous tokens are the
    ones an accepted prefix has), but over all blocks it is the acceptance of slot k in every
    block, also those whose earlier drafts failed; acceptance runs in streaks (easy text is easy at
    every slot), so that rate is lower than the rate among the blocks that reach slot k, and the
    product of such p's under-predicts the accepted length. Weighting slot k by whether drafts
    < k were accepted (greedy labels: 0/1; soft: the chance of reaching it) makes the BCE's
    minimiser the conditional rate among blocks that reach k, which is what serving meets.
    """
    v = valid.to(labels.dtype)
    if slots == "all":
        return v
    if slots != "reached":
        raise ValueError(f"confidence slots {slots!r} not one of {CONFIDENCE_SLOTS}")
    reach = torch.cumprod(torch.cat([torch.ones_like(labels[..., :1]), labels[..., :-1] * v[..., :-1]], -1), -1)
    return v * reach


def confidence_bce(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of the confidence head, p_k = sigmoid(s_k) against the realised
    acceptance c_k in [0, 1] (`confidence_labels`), weighted by m (`confidence_weights`):

        L = sum_{r,k} m_{r,k} * (-c_{r,k} log p_{r,k} - (1 - c_{r,k}) log(1 - p_{r,k})) / sum m_{r,k}

    with s [..., N] the head's logits, c [..., N] and m [..., N] >= 0 (0 for a slot past the end of
    the sequence, or one the block does not reach: it carries neither loss nor gradient). No
    position decay: every reached slot's probability should be right, the late ones included (they
    decide where a block is cut).

    Why: serving reads p_k as the probability that draft k is accepted given drafts < k were, and
    verifies drafts while the survival prod_{i<=k} p_i is worth it. BCE is a proper scoring rule, so
    its minimiser is the true acceptance rate given the head's inputs: a calibrated p, hence a
    calibrated survival, which is what the number of drafts to verify is chosen from. Its gradient
    is m (p - c) / sum m per slot (sigmoid folded into the loss, stable for large |s|).
    """
    m = mask.to(logits.dtype)
    per = F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="none")
    return (per * m).sum() / m.sum().clamp(min=1e-12)


def brier_score(probs: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Weighted mean squared error of predicted acceptance probabilities: sum m (p - c)^2 / sum m
    (0 is perfect; the constant p = the mean of c scores its variance)."""
    m = mask.to(probs.dtype)
    return (((probs - labels.to(probs.dtype)) ** 2) * m).sum() / m.sum().clamp(min=1e-12)


LOSSES = {"ce": cross_entropy, "ce-argmax": cross_entropy_argmax, "kl": forward_kl,
          "tv": total_variation, "nla": neg_log_acceptance, "chain-tv": chain_tv,
          "ce-tv": ce_tv_mix}
NEEDS_TARGET_DISTRIBUTION = frozenset(LOSSES) - {"ce"}
