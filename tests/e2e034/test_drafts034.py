"""DSpark in vLLM 0.34's engine drafts exactly what the PyTorch reference drafts, pass by pass.

Greedy identity cannot see a draft that is merely worse (verification repairs every wrong token);
this can. One request at a time on the reference target, every pass's drafts (read by
`vllm_specx.testing.propose_probe` in the worker) against `DSparkDraft.greedy_drafts` for the same
context and anchor. Drafts of two layers, each with its own K-norm, the case vLLM's CPU `rms_norm`
got wrong (it read only layer 0's row of the stacked K-norm weights, `SpecxDSparkBackbone.
_normalize_context_k`): the committed `ref-dspark`, and a random draft with the next-token stream
(every context row's next token built by our speculator on the V2 path).

Negative control: vLLM's own `_normalize_context_k` put back in the worker; the same comparison fails.
"""

import pytest
from vllm import SamplingParams

from vllm_specx.testing.propose_probe import greedy_walk, propose_probe

from .. import helpers as T

pytestmark = pytest.mark.e2e034
K = 7
TOKENS = 24


@pytest.fixture(scope="module")
def target():
    return T.load_target(T.REF_TARGET)


def _walk(llm, prompt: str, k: int) -> tuple[list[int], list[tuple[int, list[int]]]]:
    """Serve `prompt` alone; (prompt ids + output ids, [(anchor position, drafts)] of every pass but
    the last, whose anchor can lie beyond the output: `greedy_walk`)."""
    llm.collective_rpc(propose_probe)
    o = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True), use_tqdm=False)[0]
    p, out = len(o.prompt_token_ids), list(o.outputs[0].token_ids)
    passes = [call["drafts"][0] for call in llm.collective_rpc(propose_probe)[0]]
    assert passes and all(len(d) == k for d in passes), passes
    return list(o.prompt_token_ids) + out, [(p + pos, d) for pos, d, _ in greedy_walk(passes, out, k)[:-1]]


def _mismatches(llm, target, draft, prompts, k: int) -> tuple[int, list]:
    """(passes compared, [(position, engine drafts, reference drafts)] where they differ)."""
    n, bad = 0, []
    for prompt in prompts:
        seq, walk = _walk(llm, prompt, k)
        for at, d in walk:
            ref = T.reference_drafts(target, draft, seq[:at], seq[at], k)
            n += 1
            if ref != d:
                bad.append((at, d, ref))
    return n, bad


def _two_k_norms(draft):
    w = [layer.self_attn.k_norm.weight for layer in draft.layers]
    assert len(w) == 2 and not w[0].allclose(w[1]), "the check needs two layers with different K-norms"


def _committed(target):
    from vllm_specx.methods.dspark.checkpoint import load_draft

    embed, head = T.embed_and_head(target)
    path = T.ASSETS / "drafts" / "ref-dspark"
    return str(path), load_draft(path, embed, head).float().eval()


def _vllms_k_norm(worker) -> None:
    """In the worker: vLLM's own `_normalize_context_k` (one CPU rms_norm call over all layers)."""
    from vllm.model_executor.models.qwen3_dspark import Qwen3DSparkModel

    backbone = worker.model_runner.speculator.model.model
    backbone._normalize_context_k = Qwen3DSparkModel._normalize_context_k.__get__(backbone)


@pytest.mark.e2e034_ci
def test_committed_dspark_drafts_equal_the_reference(target):
    path, draft = _committed(target)
    _two_k_norms(draft)
    with T.cpu_llm(T.REF_TARGET, {"method": "dspark", "model": path, "num_speculative_tokens": K},
                   max_num_seqs=1) as llm:
        n, bad = _mismatches(llm, target, draft, T.load_prompts("code", limit=2), K)
    assert n >= 8 and not bad, (n, bad[:3])


def test_next_token_stream_drafts_equal_the_reference(target, tmp_path):
    draft = T.random_draft(target, layers=2, seed=3, next_token_stream="added").eval()
    with T.cpu_llm(T.REF_TARGET, {"method": "dspark", "model": T.write(draft, tmp_path / "d"),
                                  "num_speculative_tokens": K}, max_num_seqs=1) as llm:
        n, bad = _mismatches(llm, target, draft, T.load_prompts("code", limit=1), K)
    assert n >= 8 and not bad, (n, bad[:3])


def test_negative_control_vllms_cpu_k_norm_is_caught(target):
    path, draft = _committed(target)
    with T.cpu_llm(T.REF_TARGET, {"method": "dspark", "model": path, "num_speculative_tokens": K},
                   max_num_seqs=1) as llm:
        llm.collective_rpc(_vllms_k_norm)
        n, bad = _mismatches(llm, target, draft, T.load_prompts("code", limit=2), K)
    assert bad, f"all {n} passes equal the reference with vLLM's CPU K-norm: the check cannot fail"
