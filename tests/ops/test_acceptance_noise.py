"""The race's far tail: `draw_exp_noise` + `acceptance_sample` draw tokens of probability far below
float32's resolution at the right rate.

Why: the race emits `argmax_v w(v) / E(v)`. A token whose weight is a fraction `f` of the winning
key's scale wins only when its noise is `E < f * (...)`, so with `f` around `2^-24` the race
depends on the noise's lower tail at `~6e-8`. `-log(U)` with float32 `U` (multiples of `2^-24`)
has no values below `d32 = -log(1 - 2^-24) = 5.96e-8`: such tokens are undersampled (a fixed row
with 10^4 tokens of probability 1e-7 summing to 1e-3 drew them 5.9e-4 of the time instead of 1e-3).
`draw_exp_noise` uses float64 `U`, exact far below that.

Statistic (exact, no approximation): each row has 4 head tokens and `n = 10^5` tail tokens, and
goes through the op's bonus draw (a zero-draft random request: `Sample(p_n)`), its noise from the
noise function under test. Given the head's noise, the head's best key `M = max_h w_h / E_h` is
fixed, and the tail's noise is still i.i.d. Exp(1) and independent of it, so the row's tail wins
(the emitted token is a tail token) with probability exactly `1 - exp(-W_tail / M)` (the best
tail key is `W_tail / Exp(1)`). The test sets each row's tail weight after seeing its head noise,
`w = 0.99 * d32 * M` (legitimate for that reason: the weights depend only on noise the tail's
event is independent of), so every row's tail wins with the same probability
`rho = 1 - exp(-0.99 n d32) = 5.9e-3`, and the number of tail wins over `R` rows is exactly
Binomial(R, rho). A float32 `-log(U)` noise cannot produce a single tail win: every tail key is
`w / E <= w / d32 = 0.99 M < M`.

Pass iff the count is inside the central Binomial(R, rho) interval with `1e-6` in total outside
it, so a correct sampler fails with probability < 1e-6 (seeds fixed: deterministic anyway). The
negative control runs the same statistic with a float32 `-log(U)` noise and must fail (0 wins).
"""

import math

import pytest
import torch

from vllm_specx.ops.acceptance import acceptance_sample, draw_exp_noise

HEAD = (0.4, 0.3, 0.2, 0.1)
N_TAIL = 100_000
V = len(HEAD) + N_TAIL
ROWS, CHUNK = 3000, 50  # 3e8 noise values, 50 x 100004 per call (~20 MB fp32)
ALPHA = 1e-6

pytestmark = pytest.mark.usefixtures("one_thread")


def float32_neglog_noise(batch, vocab, generators, device):
    """The old noise: `-log(U)` with float32 `U` (smallest value `d32`)."""
    return torch.rand(batch, vocab, device=device).log_().neg_()


D32 = torch.tensor(1 - 2.0**-24).log().neg().item()  # float32: the smallest float32 -log(U) value
RHO = -math.expm1(-0.99 * N_TAIL * D32)


def _binom_log_pmf(k: int, n: int, p: float) -> float:
    log_choose = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
    return log_choose + k * math.log(p) + (n - k) * math.log1p(-p)


def binomial_interval(n: int, p: float, alpha: float) -> tuple[int, int]:
    """Smallest `lo` and largest `hi` with P(X < lo) <= alpha/2 and P(X > hi) <= alpha/2."""
    pmf = [math.exp(_binom_log_pmf(k, n, p)) for k in range(n + 1)]
    lo, acc = 0, 0.0
    while acc + pmf[lo] <= alpha / 2:
        acc += pmf[lo]
        lo += 1
    hi, acc = n, 0.0
    while acc + pmf[hi] <= alpha / 2:
        acc += pmf[hi]
        hi -= 1
    return lo, hi


def tail_wins(noise_fn, rows=ROWS, seed=0) -> int:
    """Rows (each a zero-draft random request, bonus draw) whose emitted token is a tail token."""
    torch.manual_seed(seed)
    head = torch.tensor(HEAD)
    wins = 0
    empty_ids, empty_u = torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.float64)
    for start in range(0, rows, CHUNK):
        b = min(CHUNK, rows - start)
        noise = noise_fn(b, V, None, "cpu")
        best_head = (head / noise[:, :len(HEAD)]).amax(1)  # M, in the op's fp32 arithmetic
        probs = torch.empty(b, V)
        probs[:, :len(HEAD)] = head
        probs[:, len(HEAD):] = (0.99 * D32 * best_head)[:, None]
        out = acceptance_sample(empty_ids, torch.zeros(b, dtype=torch.long), torch.empty(0, V), probs,
                                None, torch.zeros(b, dtype=torch.bool), empty_u, noise,
                                impl="torch", max_num_draft_tokens=0, validate=False)
        wins += int((out[:, 0] >= len(HEAD)).sum())
    return wins


LO, HI = binomial_interval(ROWS, RHO, ALPHA)


def test_interval_is_meaningful():
    assert 1 <= LO < ROWS * RHO < HI, (LO, ROWS * RHO, HI)


def test_race_draws_the_far_tail_at_the_exact_rate():
    wins = tail_wins(draw_exp_noise)
    assert LO <= wins <= HI, f"{wins} tail wins in {ROWS} rows, expected {ROWS * RHO:.1f} in [{LO}, {HI}]"


def test_negative_control_float32_noise_is_detected():
    wins = tail_wins(float32_neglog_noise)
    assert not LO <= wins <= HI, f"float32 -log(U) noise passed with {wins} tail wins"
    assert wins == 0  # as derived: no float32 noise value is below d32
