"""Nothing is trained on an evaluation set: the held-out prompt files (`assets/prompts/code.jsonl`,
`prose.jsonl`) share no prompt and no long token run with the training prompts
(`assets/prompts/train.jsonl`, which the committed head's and the speculators fixtures' data come
from), nor with the token sequences stored in the speculators fixtures."""

from pathlib import Path

import pytest
from safetensors.torch import load_file
from transformers import AutoTokenizer

from .helpers import ASSETS, REF_TARGET, load_prompts

N = 32  # a shared run of 32 tokens is shared text (scripts/make_train_prompts.py --no-overlap)
EVAL = ("code", "prose")
FIXTURES = Path(__file__).parent / "fixtures" / "speculators"


def _grams(ids: list[int]) -> set[tuple[int, ...]]:
    return {tuple(ids[i:i + N]) for i in range(len(ids) - N + 1)}


@pytest.fixture(scope="module")
def eval_grams():
    tok = AutoTokenizer.from_pretrained(str(REF_TARGET))
    grams = set()
    for name in EVAL:
        for p in load_prompts(name):
            grams |= _grams(tok(p)["input_ids"])
    assert len(grams) > 1000
    return tok, grams


def test_training_prompts_share_nothing_with_eval_prompts(eval_grams):
    tok, grams = eval_grams
    train = load_prompts("train")
    assert len(train) > 100
    evals = {p for name in EVAL for p in load_prompts(name)}
    assert not evals & set(train)
    hits = [i for i, p in enumerate(train) if _grams(tok(p)["input_ids"]) & grams]
    assert not hits, f"training prompts {hits[:10]} share a {N}-token run with an eval prompt"


def test_speculators_fixture_sequences_share_nothing_with_eval_prompts(eval_grams):
    _, grams = eval_grams
    refs = sorted(FIXTURES.glob("*.reference.safetensors"))
    assert refs
    for ref in refs:
        t = load_file(ref)
        for key in (k for k in t if k.endswith(".input_ids")):
            assert not _grams(t[key].tolist()) & grams, f"{ref.name} {key}"


def test_the_check_can_fail(eval_grams):
    tok, grams = eval_grams
    leaked = "x = 1\n" + load_prompts("code", limit=1)[0]
    assert _grams(tok(leaked)["input_ids"]) & grams
    assert (ASSETS / "prompts" / "train.jsonl").exists()
