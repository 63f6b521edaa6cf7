"""Checkpoints written by speculators 0.9.0's own trainer, served by vLLM through vllm-specx on
CPU: every draft pass equals our reference model on the same prefix (which equals speculators'
own forward, `tests/test_speculators_interop.py`), greedy output equals no-spec, and the trained
default checkpoint gets drafts accepted (vLLM's own spec-decode counters).

Three variants cover what vLLM runs differently: `default` (sliding-window layers, causal inside
the block, confidence head, anchor layout: a full block of 8 drafts), `gated-noncausal`
(bidirectional, gated head) and `rnn-fillin` (recurrent head in the fill-in layout, which also
reads the anchor slot's state). `reduced-vocab` adds a draft vocabulary speculators' trainer built
(`--draft-vocab-size 256`): vLLM drafts target ids through the checkpoint's `d2t`. The e2e tier
runs `default`, the full tier all four.
"""

import pytest

from vllm_specx.methods.dspark.checkpoint import load_draft

from .. import helpers as T
from ..helpers import embed_and_head, reference_drafts
from ..test_speculators_interop import FIXTURES
from .conftest import GREEDY  # target, prompts, nospec_outputs: fixtures of conftest.py

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("variant", ["default", pytest.param("gated-noncausal", marks=pytest.mark.full),
                                     pytest.param("rnn-fillin", marks=pytest.mark.full),
                                     pytest.param("reduced-vocab", marks=pytest.mark.full)])
def test_speculators_checkpoint_drafts_equal_reference_in_vllm(target, prompts, nospec_outputs, variant):
    path = FIXTURES / variant
    draft = load_draft(path, *embed_and_head(target))
    n = draft.cfg.max_drafts
    spec = {"method": "dspark", "model": str(path)}  # num_speculative_tokens: the checkpoint's full block
    with T.cpu_llm(T.REF_TARGET, speculative_config=spec) as llm:
        assert llm.collective_rpc(T.drafter_class) == ["vllm_specx.methods.dspark.proposer.DSparkProposer"]
        llm.collective_rpc(T.record_drafts)
        out = llm.generate([prompts[0]], GREEDY)[0]
        records = llm.collective_rpc(T.read_drafts)[0]
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
        metrics = T.spec_metrics(llm)
    seq = list(out.prompt_token_ids) + list(out.outputs[0].token_ids)
    pos, checked = len(out.prompt_token_ids), 0
    for anchors, drafts in records:
        if pos + n >= len(seq) or checked == 6:
            break
        assert anchors == [seq[pos]], f"pass {checked}"
        assert len(drafts[0]) == n
        assert drafts[0] == reference_drafts(target, draft, seq[:pos], seq[pos], n), f"pass {checked}"
        accepted = 0  # greedy: the emitted tokens continue the accepted drafts
        while accepted < n and seq[pos + 1 + accepted] == drafts[0][accepted]:
            accepted += 1
        pos += accepted + 1
        checked += 1
    assert checked >= 3, checked
    assert outs == nospec_outputs
    assert metrics["num_drafts"] > 0
    if variant == "default":  # trained for real: drafts get accepted
        assert metrics["tau"] > 2.0, metrics
