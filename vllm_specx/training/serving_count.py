"""tau as serving counts it, from a draft's teacher-forced forward on greedy (T = 0) answers.

Validation's `tau_greedy` averages the accepted length over anchors placed at random, so every
position of an answer weighs the same. Serving does not: after a pass at anchor a (the last
verified token x_a) accepts m drafts, the next pass starts at a + m + 1, so the positions inside
an accepted run are never anchors, and easy stretches weigh less than they do in the average.
This module walks each answer as serving does:

    a = the answer's first generated token (the one prefill samples)
    while a is not the answer's last token:
        m = drafts of the pass at a that equal the answer's next tokens (at most K)
        one pass, m accepted; a += m + 1

and reports tau = 1 + accepted / passes (vLLM's mean acceptance length: 1 + num_accepted_tokens
/ num_drafts) and accepted / passes per position (vLLM's num_accepted_tokens_per_pos /
num_drafts). For greedy verification this is what vLLM counts on the same prompts: a greedy
chain's inputs equal the target's tokens wherever its drafts are accepted, so the teacher-forced
drafts at a are the served ones, and the answer is what the target generates with or without
speculation. The one difference is the last pass of an answer: vLLM counts the drafts it
accepts past the end (max_tokens, or the end of answer) before it cuts the output, while drafts
past the stored answer cannot be checked here and count as rejected, so this count is the lower
one by up to K per answer (about 2 % of the accepted tokens for 256-token answers at tau 3).
Given answers longer than what is served, `train --eval-max-tokens N` stops the walk after N
generated tokens and checks the last pass against the rest, which is vLLM's count exactly
(`tests/e2e/test_serving_count.py`: within 3 %).

The accepted length m(a) is computed for every anchor of an answer (`accepted_lengths`), blocks
of `--anchors` anchors (at most 24) at a time, `--batch` blocks per forward, with the method's own trainer
hooks (`batch(..., at=anchors)`, `forward`), so it needs nothing a method does not already have.
"""

from __future__ import annotations

import torch

from vllm_specx.training.blocks import to_device
from vllm_specx.training.losses import IGNORE, first_positions


def answer_anchors(prompt_len: int, length: int) -> list[int]:
    """The anchors a pass can start from: the first generated token (position prompt_len) up to
    the answer's second-to-last token (the last one has nothing after it to verify)."""
    return list(range(max(1, prompt_len), length - 1))


def accepted_lengths(h, model, samples, k: int, chunk: int, per_forward: int, device, autocast,
                     args) -> list[tuple[int, int, dict[int, int]]]:
    """Per sample, (prompt length, sequence length, {anchor a: drafts of a K-draft pass at a that
    equal the answer's next tokens}) (teacher-forced greedy: the longest prefix of argmax drafts
    equal to x_{a+1..a+K})."""
    out = []
    for lo in range(0, len(samples), per_forward):
        part = [samples[i] for i in range(lo, min(lo + per_forward, len(samples)))]
        jobs = []  # (sample in part, anchors padded to `chunk` by repeating the last, real count)
        for j, s in enumerate(part):
            anchors = answer_anchors(s["prompt_len"], len(s["ids"]))
            for c in range(0, len(anchors), chunk):
                piece = anchors[c:c + chunk]
                jobs.append((j, piece + [piece[-1]] * (chunk - len(piece)), len(piece)))
        got = [(s["prompt_len"], len(s["ids"]), {}) for s in part]
        for g in range(0, len(jobs), per_forward):
            group = jobs[g:g + per_forward]
            b = h.batch(model, [part[j] for j, _, _ in group], None, len(group), args,
                        at=[a for _, a, _ in group])
            with autocast:
                res = first_positions(h.forward(model, to_device(b, device)), k)
            n = res.targets.shape[-1]
            targets = res.targets.reshape(len(group), chunk, n)
            drafts = res.logits.reshape(len(group), chunk, n, -1).argmax(-1)
            hit = ((drafts == targets) & (targets != IGNORE)).long()
            m = hit.cumprod(-1).sum(-1).cpu().tolist()
            for (j, anchors, real), row in zip(group, m):
                got[j][2].update(zip(anchors[:real], row[:real]))
        out += got
    return out


def walk(prompt_len: int, length: int, accepted: dict[int, int], k: int,
         max_new: int | None = None) -> tuple[int, list[int]]:
    """(passes, accepted drafts per position) of serving one answer of `length` tokens (prompt
    included): a pass at the first generated token, then at a + m + 1 after each pass at a that
    accepted m, while a token is left to verify. With `max_new`, serving stops after that many
    generated tokens (vLLM's max_tokens) while the stored answer goes on: the last pass's drafts
    past the stop are still checked against it, as vLLM counts them before it cuts the output."""
    passes, per_pos = 0, [0] * k
    a = max(1, prompt_len)
    stop = length if max_new is None else min(length, prompt_len + max_new)
    while a < stop - 1:
        m = accepted[a]
        passes += 1
        for j in range(m):
            per_pos[j] += 1
        a += m + 1
    return passes, per_pos


@torch.no_grad()
def served_tau(h, model, samples, args, device, autocast, k: int, max_new: int | None = None) -> dict:
    """`tau_served` (1 + accepted / passes over every answer of `samples`, walked as serving
    walks it, serving stopped after `max_new` generated tokens when given), `served_acc_per_pos`
    (accepted / passes at each draft position) and the pass count."""
    # blocks of at most 24 anchors a forward, whatever the run trained with (--anchors 0: all)
    m = accepted_lengths(h, model, samples, k, min(args.anchors or 24, 24), args.batch, device, autocast, args)
    passes, per_pos = 0, [0] * k
    for prompt_len, length, acc in m:
        p, pos = walk(prompt_len, length, acc, k, max_new)
        passes += p
        per_pos = [x + y for x, y in zip(per_pos, pos)]
    split = [0, 0, 0, 0]  # copyable anchors, their first-draft hits, other anchors, their hits
    for i, (prompt_len, _, acc) in enumerate(m):
        for j, x in enumerate(copy_split(samples[i]["ids"].tolist(), acc)):
            split[j] += x
    return {"tau_served": round(1 + sum(per_pos) / max(1, passes), 4),
            "served_acc_per_pos": [round(x / max(1, passes), 4) for x in per_pos],
            "served_passes": passes,
            "first_hit_copyable": round(split[1] / max(1, split[0]), 4),
            "first_hit_other": round(split[3] / max(1, split[2]), 4),
            "copyable_anchors": split[0], "other_anchors": split[2]}


def copy_split(ids: list[int], accepted: dict[int, int]) -> tuple[int, int, int, int]:
    """The first draft's hits at every anchor a of `accepted` (teacher-forced: {a: drafts
    accepted}), split by whether the anchor is "copyable": the last earlier occurrence j < a of
    x_a was followed by x_{a+1} (x_{j+1} = x_{a+1}), so a copy from the context is right.
    Returns (copyable anchors, their hits, other anchors, their hits)."""
    last: dict[int, int] = {}
    out = [0, 0, 0, 0]
    for a in range(len(ids) - 1):
        if a in accepted:
            j = last.get(ids[a])
            k = 0 if j is not None and ids[j + 1] == ids[a + 1] else 2
            out[k] += 1
            out[k + 1] += int(accepted[a] >= 1)
        last[ids[a]] = a
    return tuple(out)
