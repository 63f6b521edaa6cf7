"""Nothing is trained on an evaluation set: the held-out prompt files (`assets/prompts/code.jsonl`,
`prose.jsonl`) share no prompt and no long token run with the training prompts
(`assets/prompts/train.jsonl`, which the committed head's and the speculators fixtures' data come
from), nor with the token sequences stored in the speculators fixtures; the chat target's training
prompts (`chat-train`) share no prompt, no 8-word run and no function name with HumanEval, and
nothing with the held-out chat sets (`chat-code`, `chat-prose`); the second large chat set
(`chat-mix2`) repeats no prompt and no function of `chat-mix`."""

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file
from transformers import AutoTokenizer

from vllm_specx import assets

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


# ---- the chat target's prompt sets (SmolLM2-135M-Instruct): HumanEval is never trained on ----

WORDS = 8  # a shared run of 8 words is shared text (scripts/make_chat_prompts.py --no-overlap)
CHAT_HELDOUT = ("chat-code", "chat-prose")


def _word_grams(text: str) -> set[tuple[str, ...]]:
    w = text.lower().split()
    return {tuple(w[i:i + WORDS]) for i in range(len(w) - WORDS + 1)}


@pytest.fixture(scope="module")
def humaneval():
    probs = assets.humaneval_problems()
    assert len(probs) == 164
    grams = set()
    for p in probs:
        grams |= _word_grams(p["prompt"]) | _word_grams(p["canonical_solution"])
    return probs, grams


CHAT_TRAIN = [n for n, (form, role, _) in assets.PROMPT_SETS.items() if form == "chat" and role == "train"]


def test_every_chat_training_set_is_checked():
    assert {"chat-train", "chat-mix", "chat-mix2"} <= set(CHAT_TRAIN)


@pytest.mark.parametrize("train_set", CHAT_TRAIN)
def test_chat_training_prompts_share_nothing_with_humaneval(humaneval, train_set):
    probs, grams = humaneval
    train = [assets.prompt_text(p) for p in load_prompts(train_set)]
    assert len(train) > 1000
    evals = {assets.prompt_text(p) for name in ("humaneval", "humaneval-raw") for p in load_prompts(name)}
    assert not evals & set(train)
    hits = [t for t in train if _word_grams(t) & grams]
    assert not hits, f"{len(hits)} {train_set} prompts share a {WORDS}-word run with HumanEval: {hits[:3]}"
    names = {p["entry_point"] for p in probs}
    # A prompt's own function never has a HumanEval entry point's name: the function its source
    # names (every code prompt's), or a `def name(` it asks to complete.
    rows = [json.loads(x) for x in (ASSETS / "prompts" / f"{train_set}.jsonl").read_text().splitlines()]
    assert all(r.get("source") for r in rows)
    own = [r["source"].rsplit(".", 1)[-1] for r in rows if not r["source"].startswith("topic:")]
    named = [n for n in own if n in names] + [t for t in train for n in names if f"def {n}(" in t]
    assert not named, f"{train_set} prompts name a HumanEval entry point: {named[:3]}"


@pytest.mark.parametrize("train_set", CHAT_TRAIN)
def test_chat_training_prompts_share_nothing_with_the_heldout_chat_sets(train_set):
    train = [assets.prompt_text(p) for p in load_prompts(train_set)]
    grams = set().union(*(_word_grams(t) for t in train))
    for name in CHAT_HELDOUT:
        held = [assets.prompt_text(p) for p in load_prompts(name)]
        assert len(held) > 50 and not set(held) & set(train)
        # held-out code prompts come from modules the training set never draws from
        rows = [json.loads(x) for x in (ASSETS / "prompts" / f"{name}.jsonl").read_text().splitlines()]
        train_rows = [json.loads(x) for x in (ASSETS / "prompts" / f"{train_set}.jsonl").read_text().splitlines()]
        src = lambda r: r["source"].split(":", 1)[1].split(".")[0]  # noqa: E731 - module or topic
        assert not {src(r) for r in rows} & {src(r) for r in train_rows}, name
    assert grams


def _rows(name: str) -> list[dict]:
    return [json.loads(x) for x in (ASSETS / "prompts" / f"{name}.jsonl").read_text().splitlines()]


def _functions(rows: list[dict]) -> set[str]:
    """The functions ("module.name") a chat set's code prompts ask about."""
    return {r["source"].split(":", 1)[1] for r in rows if not r["source"].startswith("topic:")}


def test_chat_mix2_repeats_nothing_of_chat_mix():
    """chat-mix2 (more on-policy data: scripts/make_mix_prompts.py --more --exclude ...) shares no
    prompt with chat-mix or chat-train, asks about no function they ask about, and shares no
    8-word run with the reference target's evaluation windows (`code`, `prose`) either."""
    new = _rows("chat-mix2")
    assert len(new) >= 7200 and len({r["id"] for r in new}) == len(new)
    texts = {assets.prompt_text(r["messages"]) for r in new}
    assert len(texts) == len(new)
    for name in ("chat-mix", "chat-train"):
        old = _rows(name)
        assert not texts & {assets.prompt_text(r["messages"]) for r in old}, name
        assert not _functions(new) & _functions(old), name
    grams = set().union(*(_word_grams(p) for name in EVAL for p in load_prompts(name)))
    hits = [t for t in texts if _word_grams(t) & grams]
    assert not hits, f"{len(hits)} chat-mix2 prompts share a {WORDS}-word run with code/prose: {hits[:3]}"
    completions = sum(t.startswith("Complete this Python function.") for t in texts)
    prose = sum(r["source"].startswith("topic:") for r in new)
    assert completions and prose and len(new) - completions - prose  # chat-mix's three kinds


def test_the_humaneval_check_can_fail(humaneval):
    probs, grams = humaneval
    leaked = "Please help: " + probs[0]["prompt"]
    assert _word_grams(leaked) & grams


def _draft_data_sets() -> dict[str, str]:
    """{committed draft: the prompt set or file its training data was generated from}, for every
    committed draft whose training record names it."""
    out = {}
    for rec in sorted((ASSETS / "drafts").glob("*/training.json")):
        prompts = json.loads(rec.read_text()).get("data", {}).get("prompts")
        if prompts is not None:
            out[rec.parent.name] = prompts
    return out


def _is_training_set(prompts: str) -> bool:
    name = Path(prompts).stem if prompts.endswith(".jsonl") else prompts
    try:
        return assets.prompt_set(name)[1] == "train"  # a registered set, or training sets joined "A+B"
    except ValueError:
        return False


def test_committed_drafts_were_trained_on_training_sets_only():
    found = _draft_data_sets()
    assert found, "no committed draft records its data's prompt set"
    bad = {d: p for d, p in found.items() if not _is_training_set(p)}
    assert not bad, f"drafts trained on non-training prompt sets: {bad}"


def test_the_draft_record_check_can_fail():
    assert not _is_training_set("humaneval") and not _is_training_set("assets/prompts/code.jsonl")
    assert _is_training_set("chat-train") and _is_training_set("assets/prompts/train.jsonl")
    assert _is_training_set("chat-mix+chat-mix2") and not _is_training_set("chat-mix+humaneval")


def test_joined_training_sets_keep_their_ids_and_refuse_evaluation_sets():
    """"A+B" (more data on top of A's: gen-data --from-tokens FILE --prompts A+B) is A's prompts
    with their ids, then B's; an evaluation set cannot be joined in, even by gen-data --for-eval."""
    from vllm_specx.training.data import read_prompts

    a, b = assets.load_prompts("chat-mix"), assets.load_prompts("chat-mix2", limit=5)
    joined = read_prompts("chat-mix+chat-mix2", limit=len(a) + 5)
    assert [r["id"] for r in joined] == list(range(len(a) + 5))
    assert [r["prompt"] for r in joined] == a + b
    for bad, why in (("chat-mix+humaneval", "only training sets"), ("chat-mix+chat-mix", "joined twice"),
                     ("chat-mix+train", "joins raw and chat"), ("chat-mix+nope", "unknown prompt set 'nope'")):
        for evaluation in (False, True):
            with pytest.raises(ValueError, match=why):
                read_prompts(bad, evaluation=evaluation)


def test_gen_data_refuses_an_evaluation_set():
    from vllm_specx.training.data import read_prompts

    with pytest.raises(ValueError, match="--prompts humaneval: an evaluation set"):
        read_prompts("humaneval")
    assert len(read_prompts("chat-train", limit=3)) == 3


def test_evaluation_data_is_for_measuring_only():
    """`gen-data --for-eval` may read an evaluation set (its data is marked "purpose":
    "evaluation"); the trainer refuses such data as --data (tests/test_training.py)."""
    from vllm_specx.training.data import EVALUATION, read_prompts

    assert len(read_prompts("humaneval", limit=2, evaluation=True)) == 2
    assert EVALUATION == "evaluation"


def test_committed_token_files_of_evaluation_sets_are_marked_and_disjoint_from_training_ones():
    """`assets/data/*.tokens.npz` (answers rebuilt by `gen-data --from-tokens` where no vLLM runs):
    one of an evaluation set is marked "purpose": "evaluation" (so `train --data` refuses its
    folder), one of a training set is not, and no prompt of an evaluation file is a prompt of a
    training file."""
    import numpy as np

    from vllm_specx.training.data import EVALUATION

    def prompts_of(z):
        ids, plen, olen = z["ids"], z["prompt_len"], z["output_len"]  # each read decompresses: once
        ends = np.cumsum(plen + olen)
        return {tuple(ids[e - n - o: e - o].tolist()) for n, o, e in zip(plen, olen, ends)}

    evals, trains = set(), set()
    files = sorted((ASSETS / "data").glob("*.tokens.npz"))
    for f in files:
        with np.load(f) as z:
            meta = json.loads(str(z["meta"]))
            if _is_training_set(meta["prompts"]):
                assert meta.get("purpose") != EVALUATION, f.name
                trains |= prompts_of(z)
            else:
                assert meta.get("purpose") == EVALUATION, f"{f.name}: prompts {meta['prompts']} not marked for evaluation"
                evals |= prompts_of(z)
    assert len(evals) >= 400 and len(trains) >= 7000, (len(evals), len(trains))
    assert not evals & trains
