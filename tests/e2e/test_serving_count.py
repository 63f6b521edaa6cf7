"""tau as the trainer counts it for serving (`train --eval-data`: `training.serving_count`) equals
vLLM's own count (1 + num_accepted_tokens / num_drafts) on the same prompts, for a committed
draft of each method on the reference target: greedy answers from `gen-data --for-eval` (vLLM,
no speculation), the trainer's evaluation of each draft (`train --steps 0 --init-from DRAFT`),
then the same prompts served with the draft (K = 7, T = 0). The answers run K + 1 tokens past
what is served (`--eval-max-tokens`): vLLM counts the drafts of the last pass it accepts past
max_tokens before it cuts the output, and those tokens check them. The issue's bound is 3 %; a
walk that forgets the bonus token (jumps m instead of m + 1 after a pass) misses it (the negative
control)."""

import json
import shutil

import pytest
from vllm_specx.bench.eval import serve_answers
from vllm_specx.training import data as gen_data
from vllm_specx.training import serving_count, trainer

from .. import helpers as T

pytestmark = pytest.mark.e2e
K, MAX_TOKENS, PROMPTS = 7, 64, 16
DRAFTS = ("ref-dspark", "ref-eagle3", "ref-mtp")  # one committed draft of each method


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    """(an evaluation folder of greedy answers with taps, a training-data copy of it for `--data`)."""
    root = tmp_path_factory.mktemp("serving-count")
    ev = root / "eval"
    gen_data.main(["--target", str(T.REF_TARGET), "--prompts", "code", "--limit", str(PROMPTS), "--for-eval",
                   "--max-tokens", str(MAX_TOKENS + K + 1), "--taps", "1,4,6,7", "--topk", "8", "--device", "cpu", "--out", str(ev)])
    data = root / "data"  # --data must not be evaluation data; this run trains nothing (--steps 0)
    shutil.copytree(ev, data)
    meta = json.loads((data / "meta.json").read_text())
    meta.pop("purpose")
    (data / "meta.json").write_text(json.dumps(meta))
    return ev, data


def counted(name: str, ev, data, out) -> dict:
    """The trainer's evaluation of the committed draft `name` on `ev` (its recorded flags)."""
    draft = T.ASSETS / "drafts" / name
    rec = json.loads((draft / "training.json").read_text())
    argv = ["--config", str(draft / "training.json"), "--target", str(T.REF_TARGET), "--data", str(data),
            "--out", str(out), "--steps", "0", "--init-from", str(draft), "--eval-data", str(ev),
            "--eval-drafts", str(K), "--eval-max-tokens", str(MAX_TOKENS), "--val-samples", "4", "--batch", "4"]
    if any("--taps" in a.option_strings for a in trainer.parser(rec["args"]["method"])._actions):
        argv += ["--taps", ",".join(map(str, rec["data"]["taps"]))]  # the layers it was trained on
    return trainer.train(trainer.parse_args(argv))["eval"][ev.name]


def served(name: str, ev) -> dict:
    """vLLM's counters serving the same prompts (their token ids) with the draft, and its outputs."""
    rows = [json.loads(line) for line in (ev / "tokens.jsonl").read_text().splitlines()]
    draft = T.ASSETS / "drafts" / name
    method = json.loads((draft / "training.json").read_text())["args"]["method"]  # its serving method too
    return serve_answers(T.REF_TARGET, method, draft, rows, K, MAX_TOKENS)


@pytest.mark.parametrize("name", DRAFTS)
def test_serving_count_equals_vllms_served_tau(answers, tmp_path, name):
    ev, data = answers
    ours = counted(name, ev, data, tmp_path / "o")
    vllm = served(name, ev)
    assert vllm["outputs"] == vllm["answers"]  # the same answers: greedy with the draft = without
    assert vllm["tau"] > 1.5, vllm["tau"]  # a draft that is accepted, or the comparison says little
    rel = abs(ours["tau_served"] - vllm["tau"]) / vllm["tau"]
    print(f"{name}: ours {ours['tau_served']} ({ours['served_passes']} passes), vLLM {vllm['tau']} "
          f"({vllm['num_drafts']} drafts), teacher-forced at random anchors {ours['tau_greedy']}")
    assert rel <= 0.03, (ours, {k: vllm[k] for k in ("tau", "num_drafts", "num_accepted_tokens")})
    assert ours["served_acc_per_pos"] == pytest.approx(vllm["acceptance_per_pos"], abs=0.03)


def test_a_walk_without_the_bonus_token_misses_the_bound(answers, tmp_path, monkeypatch):
    """Negative control: jumping m instead of m + 1 after a pass (the bonus token forgotten)."""
    ev, data = answers
    right = counted("ref-mtp", ev, data, tmp_path / "a")["tau_served"]

    def off_by_one(prompt_len, length, accepted, k, max_new=None):
        passes, per_pos, a = 0, [0] * k, max(1, prompt_len)
        while a < min(length, prompt_len + max_new) - 1:
            m = accepted[a]
            passes += 1
            for j in range(m):
                per_pos[j] += 1
            a += max(1, m)
        return passes, per_pos

    monkeypatch.setattr(serving_count, "walk", off_by_one)
    wrong = counted("ref-mtp", ev, data, tmp_path / "b")["tau_served"]
    assert abs(wrong - right) / right > 0.03, (wrong, right)
