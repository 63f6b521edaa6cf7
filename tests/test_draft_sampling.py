"""DSparkProposer's probabilistic draft sampling on synthetic inputs (no engine): seeded requests
draw their drafts from their own generator, and the draft distributions are the Markov-corrected
`softmax((base_k + markov(prev_k)) / T)` with `prev_k` the previously sampled draft."""

from types import SimpleNamespace

import torch

from vllm_specx.methods.dspark.proposer import DSparkProposer

V, N, H = 50, 4, 8


class _Model:
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.head = torch.randn(H, V, generator=g)
        self.markov = 2.0 * torch.randn(V, V, generator=g)

    def compute_logits(self, hidden):
        return hidden @ self.head

    draft_logits = compute_logits  # the full vocabulary: draft ids are target ids
    draft_target_ids = None

    def markov_bias(self, prev):
        return self.markov[prev.long()]

    def markov_stepper(self, slot_hidden):
        return lambda prev, k, state: (self.markov_bias(prev), state)

    def initial_state(self, anchors, slot0):
        return None


def _proposer(anchors):
    return SimpleNamespace(num_speculative_tokens=N, _rows=N, model=_Model(), _enable_probabilistic_draft_probs=True,
                           stats={"propose_calls": 0, "probabilistic_calls": 0},
                           _anchor_ids=torch.tensor(anchors), use_fp64_gumbel=False,
                           _vocab_map=lambda: (None, V))


def _meta(temperature, generators):
    t = torch.tensor(temperature)
    return SimpleNamespace(all_greedy=bool((t == 0).all()), all_random=bool((t > 0).all()), temperature=t,
                           generators=generators, top_p=None, top_k=None)


def _draft(hidden, anchors, temperature, generators):
    meta = _meta(temperature, generators)
    return DSparkProposer._sample_draft_tokens(_proposer(anchors), hidden.reshape(-1, H), meta)


def test_seeded_drafts_do_not_depend_on_neighbours_or_global_rng():
    """Before: vLLM's compute_probs_and_sample_next_token drew every request's draft noise from
    the global RNG (its "TODO: Consider seeds"), so a seeded request's drafts, and so its output,
    changed with its batch and with whatever else had used the global RNG."""
    g = torch.Generator().manual_seed(1)
    mine = torch.randn(1, N, H, generator=g)
    drafts = []
    for neighbours, global_seed in ((0, 0), (2, 1), (5, 2)):
        torch.manual_seed(global_seed)
        hidden = torch.cat([mine, torch.randn(neighbours, N, H, generator=g)])
        ids, _ = _draft(hidden, [3] + [7] * neighbours, [0.8] + [1.0] * neighbours,
                        {0: torch.Generator().manual_seed(42)})
        drafts.append(ids.view(-1, N)[0].tolist())
    assert drafts[0] == drafts[1] == drafts[2], drafts


def test_draft_probs_are_the_markov_corrected_conditionals_of_the_sampled_drafts():
    torch.manual_seed(0)
    hidden = torch.randn(3, N, H)
    anchors, temps = [3, 9, 11], [0.7, 0.0, 1.3]  # request 1 greedy inside a random batch
    ids, probs = _draft(hidden, anchors, temps, {})
    ids, probs = ids.view(3, N), probs.view(3, N, V)
    model = _Model()
    base = model.compute_logits(hidden)
    for b in range(3):
        prev = anchors[b]
        for k in range(N):
            logits = base[b, k] + model.markov_bias(torch.tensor(prev))
            q = (logits / (temps[b] or 1.0)).softmax(-1)
            torch.testing.assert_close(probs[b, k], q, atol=1e-6, rtol=0)
            if temps[b] == 0:
                assert ids[b, k] == q.argmax()
            assert q[ids[b, k]] > 0
            prev = int(ids[b, k])
