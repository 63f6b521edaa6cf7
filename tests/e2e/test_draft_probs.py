"""The draft distributions vLLM's rejection sampler receives (`draft_probs`) are the reference
DSpark head's Markov-corrected conditionals, token by token, for both checkpoint layouts.

For draft k of a pass, `q_k = softmax((base_k + markov(prev_k)) / T)` with `prev_0` the anchor and
`prev_k` the previously *sampled* draft (`vllm_specx.methods.dspark.model`: `DSparkDraft`, the
block states and `sequential_drafts`' recursion, recomputed here from the same prefix). Drafts see
only the request's temperature: top-p / top-k stay off the drafts (as in vLLM's
`compute_probs_and_sample_next_token`; verification against the truncated target keeps it
lossless), so the request uses both and q must be the untruncated softmax. One request, the first
passes, a random head (`random_draft`) written in the vllm-specx anchor layout and in the
speculators fill-in layout: 2 engines.

The trainer's per-slot q is checked against the same distributions: a training block
(`training.blocks.assemble` + `methods.dspark.train.forward`, teacher-forced) anchored at the
pass's anchor, whose continuation is the pass's drafts, gives the conditionals vLLM's sampler
received: what the trainer optimises is what serving samples from.
"""

import pytest
import torch
from vllm import SamplingParams

from vllm_specx.methods.dspark.config import RECIPE

from .. import helpers as T
from ..helpers import random_draft, target_taps, write  # `target`: a fixture of conftest.py

pytestmark = pytest.mark.e2e
TEMP, PASSES = 0.7, 4
NDRAFTS = {"specx": 8, "speculators": 7}  # a full block of 8 (anchor layout); 8 - 1 (fill-in)
PARAMS = SamplingParams(temperature=TEMP, top_p=0.9, top_k=50, seed=5, max_tokens=2 * 8 + PASSES,
                        ignore_eos=True)


@torch.no_grad()
def reference_conditionals(target, draft, prefix: list[int], anchor: int, drafts: list[int]) -> torch.Tensor:
    """[len(drafts), V]: q_k given the prefix (context), the anchor and the sampled drafts < k
    (the reference's own left-to-right loop, `DSparkDraft.draft`, made to pick the given drafts)."""
    taps = target_taps(target, torch.tensor([prefix]), draft.cfg.target_layer_ids)[0]
    picks = iter(drafts)

    def pick(logits):
        return torch.tensor([next(picks)]), (logits / TEMP).softmax(-1)

    return draft.draft(taps, anchor, len(drafts), pick)[1]


@torch.no_grad()
def trainer_conditionals(target, draft, prefix: list[int], anchor: int, drafts: list[int]) -> torch.Tensor:
    """[len(drafts), V]: the trainer's teacher-forced q for a block at the anchor whose targets
    (and Markov inputs) are the drafts."""
    from vllm_specx.methods.dspark import train as dspark_train
    from vllm_specx.training.blocks import assemble

    ids = torch.tensor(prefix + [anchor] + drafts)
    taps = target_taps(target, ids[None], draft.cfg.target_layer_ids)[0]
    b = assemble([{"ids": ids, "taps": taps}], [[len(prefix)]], len(ids), draft.cfg.max_drafts,
                 draft.cfg.mask_token_id, q=draft.cfg.block_size)
    logits = dspark_train.forward(draft, b).logits[0, 0, :len(drafts)]
    return (logits / TEMP).softmax(-1)


# "speculators" (the fill-in layout's 7 drafts) is full-tier: CI checks that layout's drafts in
# test_dspark_vllm.py[recipe-fill-in] and speculators checkpoints in test_speculators_vllm.py.
@pytest.mark.parametrize("fmt", ["specx", pytest.param("speculators", marks=pytest.mark.full), "recipe-block16"])
def test_draft_probs_equal_reference_conditionals(tmp_path, target, fmt):
    """"recipe-block16": the full recipe (final-layer tap, per-layer fusion, per-slot queries,
    recurrent head), anchor layout, a block of 16 slots drafting 16 tokens, 2 layers."""
    if fmt == "recipe-block16":
        draft, N = random_draft(target, seed=3, block_size=16, layers=2, **RECIPE), 16
        fmt = "specx"
    else:
        draft, N = random_draft(target, anchor=(fmt == "specx"), seed=3), NDRAFTS[fmt]
    spec = {"method": "dspark", "model": write(draft, tmp_path / fmt, fmt), "num_speculative_tokens": N,
            "draft_sample_method": "probabilistic"}
    prompt = T.load_prompts("code", limit=1)[0]
    with T.cpu_llm(T.REF_TARGET, speculative_config=spec) as llm:
        llm.collective_rpc(T.record_draft_passes)
        out = llm.generate([prompt], PARAMS, use_tqdm=False)[0]
        passes, verified = llm.collective_rpc(T.read_draft_passes)[0]
    seq = list(out.prompt_token_ids) + list(out.outputs[0].token_ids)
    # Every step of a speculative engine is verified, the prefill step too (zero drafts, no q).
    assert list(verified[0]) == [[], None], verified[0][0]
    verified = verified[1:]
    assert len(passes) >= PASSES and len(verified) >= PASSES, (len(passes), len(verified))
    pos = len(out.prompt_token_ids)  # pass 0's anchor: the first generated token
    worst, trainer_checked = 0.0, 0
    for j in range(PASSES):
        (anchors, drafts, probs), (ver_ids, ver_probs) = passes[j], verified[j]
        assert anchors == [seq[pos]], f"pass {j}: anchor {anchors} != generated token {seq[pos]}"
        drafts = drafts[0]
        assert probs is not None and ver_probs is not None, "no draft distributions"
        probs, ver_probs = torch.tensor(probs), torch.tensor(ver_probs)
        assert probs.shape == (N, 4096), probs.shape
        # What the sampler received is what the proposer produced (its first n rows if cut).
        n = len(ver_ids)
        assert 0 < n <= N and ver_ids == drafts[:n] and torch.equal(ver_probs, probs[:n]), f"pass {j}"
        ref = reference_conditionals(target, draft, seq[:pos], seq[pos], drafts)
        err = (probs - ref).abs().max().item()
        worst = max(worst, err)
        assert err < 1e-5, f"{fmt} pass {j}: max |q - reference| = {err:.3g}"
        if len(drafts) == draft.cfg.max_drafts:  # a full block: the trainer's shape
            terr = (probs - trainer_conditionals(target, draft, seq[:pos], seq[pos], drafts)).abs().max().item()
            assert terr < 1e-5, f"{fmt} pass {j}: max |q - trainer's q| = {terr:.3g}"
            trainer_checked += 1
        assert all(probs[k, x] > 0 for k, x in enumerate(drafts))  # sampled from q's support
        assert (probs > 0).sum(1).min() > 50  # top-k 50 / top-p 0.9 not applied to the drafts
        # Next anchor: the accepted drafts (the emitted tokens that continue the drafts), then
        # the resampled or bonus token; a rejected draft is never re-emitted (its residual is 0).
        a = 0
        while a < n and pos + 1 + a < len(seq) and seq[pos + 1 + a] == drafts[a]:
            a += 1
        pos += a + 1
    assert trainer_checked == PASSES
    print(f"{fmt}: max |q - reference| over {PASSES} passes = {worst:.2e}")
