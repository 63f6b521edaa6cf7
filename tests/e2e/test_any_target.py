"""The README's "Train a draft for your model" commands, run as written on a model the project has
never used: a tiny random decoder of another architecture (Qwen2 in CI, Qwen3 in the full tier),
built here with 30 layers so the README's taps fit, the reference target's tokenizer with a chat
template and without a mask token (so the trainer must choose and record one).

The commands are read from README.md's code block, `$MODEL` replaced, each run in a scratch
directory with small counts appended (later flags win in argparse): gen-data (vLLM generation +
taps + top-k), DSpark training (the README's command) and MTP training (the same command with
`--method mtp`, as the README says), `vllm-specx check` of both drafts, and the README's
speculative config served offline in vLLM for each draft. Greedy output with each draft equals
the target's own greedy answers, which are gen-data's responses (the same prompts, rendered the
same way, greedy, no speculation), and vLLM's counters show drafts were verified."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .. import helpers as T

pytestmark = pytest.mark.e2e
README = Path(__file__).resolve().parents[2] / "README.md"
CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")
SMALL = {"gen-data": ["--limit", "8", "--max-tokens", "20", "--batch", "8"],
         "train": ["--steps", "4", "--batch", "2", "--seq-len", "40", "--anchors", "4", "--val-samples", "2",
                   "--val-every", "4", "--save-every", "4", "--dtype", "float32", "--threads", "2"]}


def readme_commands() -> list[str]:
    """The shell commands of the README's "Train a draft for your model" block, continuation
    lines joined, comments dropped."""
    text = README.read_text()
    section = text[text.index("## Train a draft for your model"):]
    block = section[section.index("```bash") + len("```bash"):]
    block = block[: block.index("```")]
    lines, cur = [], ""
    for raw in block.splitlines():
        line = re.sub(r"\s+#.*$", "", raw).rstrip()
        if not line.strip():
            continue
        cur = f"{cur} {line.strip()}" if cur else line.strip()
        if cur.endswith("\\"):
            cur = cur[:-1].rstrip()
            continue
        lines.append(cur)
        cur = ""
    return lines


def tiny_model(path: Path, arch: str) -> Path:
    """A random decoder of `arch` with 30 layers (hidden 128, head_dim 32), peaked logits, and the
    reference target's 4,096-token tokenizer with a chat template and no mask token."""
    import transformers

    common = dict(vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=30,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                  tie_word_embeddings=False, initializer_range=0.2, eos_token_id=0, pad_token_id=1,
                  bos_token_id=None)
    if arch == "qwen2":
        cfg = transformers.Qwen2Config(**common)
        model_cls = transformers.Qwen2ForCausalLM
    else:
        cfg = transformers.Qwen3Config(**common, head_dim=32)
        model_cls = transformers.Qwen3ForCausalLM
    torch.manual_seed(0)
    model = model_cls(cfg).float()
    model.save_pretrained(path)
    # no mask token (the trainer must choose one and say which): <|mask|> renamed
    (path / "tokenizer.json").write_text((T.REF_TARGET / "tokenizer.json").read_text().replace("<|mask|>", "<|rsvd|>"))
    tc = json.loads((T.REF_TARGET / "tokenizer_config.json").read_text().replace("<|mask|>", "<|rsvd|>"))
    tc.pop("mask_token", None)
    tc["chat_template"] = CHAT
    (path / "tokenizer_config.json").write_text(json.dumps(tc))
    return path


def run(cmd: str, model: Path, cwd: Path, extra: list[str] = ()) -> subprocess.CompletedProcess:
    argv = shlex.split(cmd.replace("$MODEL", str(model)))
    assert argv[0] == "vllm-specx", argv
    proc = subprocess.run([sys.executable, "-m", "vllm_specx.cli", *argv[1:], *extra], cwd=cwd,
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.parametrize("arch", ["qwen2", pytest.param("qwen3", marks=pytest.mark.full)])
def test_readme_train_commands_on_a_new_architecture(tmp_path, arch):
    from vllm import SamplingParams

    model = tiny_model(tmp_path / f"tiny-{arch}", arch)
    cmds = readme_commands()
    gen, train, check, serve = (next(c for c in cmds if c.startswith(p)) for p in
                                ("vllm-specx gen-data", "vllm-specx train", "vllm-specx check", "vllm serve"))
    run(gen, model, tmp_path, SMALL["gen-data"])
    data = tmp_path / shlex.split(gen)[shlex.split(gen).index("--out") + 1]
    assert json.loads((data / "meta.json").read_text())["taps"] == [1, 14, 26, 29]
    out = run(train, model, tmp_path, SMALL["train"])
    assert "mask token: the tokenizer has none; using the pad token, id 1" in out.stdout + out.stderr  # chosen, said
    dspark_dir = tmp_path / shlex.split(train)[shlex.split(train).index("--out") + 1]
    mtp_cmd = train.replace("--method dspark", "--method mtp").replace(str(dspark_dir.relative_to(tmp_path)), "drafts/my-mtp")
    mtp_cmd = re.sub(r"--mask-token-id \S+ ?", "", mtp_cmd)
    run(mtp_cmd, model, tmp_path, SMALL["train"])
    mtp_dir = tmp_path / "drafts" / "my-mtp"
    for d in (dspark_dir, mtp_dir):
        run(check.replace(str(dspark_dir.relative_to(tmp_path)), str(d)), model, tmp_path)
    spec = json.loads(re.search(r"'(\{.*\})'", serve).group(1))
    rows = [json.loads(line) for line in (data / "tokens.jsonl").read_text().splitlines()]
    want = [r["output_ids"] for r in rows]
    n = int(SMALL["gen-data"][SMALL["gen-data"].index("--max-tokens") + 1])
    for d, method in ((dspark_dir, "dspark"), (mtp_dir, "mtp")):
        cfg = {**spec, "method": method, "model": str(d)}
        with T.cpu_llm(model, speculative_config=cfg) as llm:
            outs = llm.generate([{"prompt_token_ids": r["prompt_ids"]} for r in rows],
                                SamplingParams(temperature=0, max_tokens=n), use_tqdm=False)
            metrics = T.spec_metrics(llm)
        got = [list(o.outputs[0].token_ids) for o in outs]
        assert got == want, f"{method} on {arch}: greedy output differs from the target's own answers"
        assert metrics["num_drafts"] > 0, f"{method} on {arch}: nothing was drafted"
