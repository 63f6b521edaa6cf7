"""Progress as users expect it (issue 55): `vllm-specx train` and `gen-data` show a bar with a rate
and an ETA and end on a one-line summary; in a log (stderr not a terminal) the bar is a few whole
lines, no carriage returns, and `--quiet` turns it off. Also the bars, heartbeats and lines of
`vllm_specx.progress` alone, and bench's per-run line and closing summary (no engine here)."""

import io
import re
import time

from vllm_specx import progress
from vllm_specx.bench import e2e as bench
from vllm_specx.bench.eval import result_line, versus
from vllm_specx.progress import LOG_STEPS, Reporter
from vllm_specx.training import trainer
from vllm_specx.training.data import export_tokens
from vllm_specx.training.data import main as gen_data

from .helpers import data_folder
from .test_training import _data, _train_argv

# tqdm's "[elapsed<remaining, rate]": an ETA and a measured rate (N unit/s, or N s/unit when slow)
RATE_AND_ETA = r"\[(\d+:)?\d\d:\d\d<(\d+:)?\d\d:\d\d, *[\d.]+({unit}/s|s/{unit})"


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _bar_lines(text: str, desc: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(f"{desc}:")]


def test_a_bar_in_a_log_is_a_line_each_tenth_with_its_rate_and_eta():
    log = io.StringIO()
    bar = Reporter(file=log).bar(total=1000, desc="steps", unit="step", mininterval=0)
    for _ in range(1000):
        bar.update()
    bar.close()
    text = log.getvalue()
    assert "\r" not in text
    lines = _bar_lines(text, "steps")
    assert len(lines) == LOG_STEPS + 1, lines  # the start, then each tenth
    assert re.search(RATE_AND_ETA.format(unit="step"), lines[-1]) and "1000/1000" in lines[-1], lines


def test_a_bar_on_a_terminal_redraws_and_quiet_shows_none():
    term = _Terminal()
    with Reporter(file=term).bar(total=50, desc="steps", unit="step", mininterval=0) as bar:
        for _ in range(50):
            bar.update()
    assert term.getvalue().count("\r") > 10 and re.search(RATE_AND_ETA.format(unit="step"), term.getvalue())
    quiet = _Terminal()
    with Reporter(file=quiet, quiet=True).bar(total=50, desc="steps", unit="step") as bar:
        for _ in range(50):
            bar.update()
    Reporter(file=quiet, quiet=True).line("done")
    assert quiet.getvalue() == "done\n"


def test_a_ticking_bar_shows_it_is_alive_while_nothing_finishes(monkeypatch):
    """vLLM's prompts may all finish at the end: its bar still moves (a terminal) or writes a
    line each LOG_EVERY_S (a log), and stops with the bar."""
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.1)
    log, term = io.StringIO(), _Terminal()
    bars = [Reporter(file=f).bar(total=16, desc="b16", unit="prompt", tick=0.02) for f in (log, term)]
    time.sleep(0.35)
    for bar in bars:
        bar.close()
    lines = _bar_lines(log.getvalue(), "b16")
    assert len(lines) >= 3 and all("0/16" in ln for ln in lines), lines
    assert term.getvalue().count("\r") >= 5
    shown = log.getvalue(), term.getvalue()
    time.sleep(0.15)
    assert (log.getvalue(), term.getvalue()) == shown  # closed: no redraw after the end


def test_a_heartbeat_says_what_runs_until_it_ends():
    log = io.StringIO()
    with Reporter(file=log).heartbeat("starting the engine", every=0.05):
        time.sleep(0.3)
    beats = log.getvalue().splitlines()
    assert len(beats) >= 2 and all(re.fullmatch(r"starting the engine \(\d+ s\)", b) for b in beats), beats
    time.sleep(0.15)
    assert log.getvalue().splitlines() == beats  # stopped with the body
    with Reporter(file=log, quiet=True).heartbeat("quiet", every=0.01):
        time.sleep(0.05)
    assert "quiet" not in log.getvalue()


def test_vllms_bar_is_the_reporters_and_its_rendering_pass_has_none():
    log = io.StringIO()
    make = Reporter(file=log).vllm_bar("dspark batch 1")
    assert Reporter(quiet=True).vllm_bar("x") is False  # vLLM's use_tqdm=False
    items = [1, 2, 3]
    assert make(items, desc="Rendering prompts") is items
    bar = make(total=2, desc="Processed prompts", dynamic_ncols=True, postfix="est. speed output: 0 toks/s")
    bar.update(2)
    bar.close()
    assert re.search(RATE_AND_ETA.format(unit="prompt"), _bar_lines(log.getvalue(), "dspark batch 1")[-1])


def test_train_shows_its_steps_with_rate_and_eta_and_ends_on_a_summary(tmp_path, capsys):
    data = _data(tmp_path, n=12)
    capsys.readouterr()
    trainer.main(_train_argv("dspark", data, tmp_path / "a", "--steps", "6"))
    out, err = capsys.readouterr()
    assert "\r" not in err  # stderr is not a terminal here: lines, not redraws
    lines = _bar_lines(err, "train dspark")
    assert 2 <= len(lines) <= LOG_STEPS + 2, err
    assert re.search(RATE_AND_ETA.format(unit="step"), lines[-1]) and "6/6" in lines[-1], lines
    summary = out.strip().splitlines()[-1]
    assert re.fullmatch(rf"train dspark: 6 steps in [\d.]+ s, [\d.]+ step/s; val_loss [\d.]+ -> [\d.]+, "
                        rf"tau_greedy [\d.]+ -> [\d.]+; saved {re.escape(str(tmp_path / 'a'))}", summary), summary

    trainer.main(_train_argv("dspark", data, tmp_path / "b", "--steps", "2", "--quiet"))
    out, err = capsys.readouterr()
    assert not _bar_lines(err, "train dspark") and out.strip().splitlines()[-1].startswith("train dspark: 2 steps")


def test_gen_data_shows_its_shards_with_rate_and_eta_and_ends_on_a_summary(tmp_path, capsys):
    rows = [{"id": i, "prompt_ids": [1 + i, 2], "output_ids": [3, 4 + i, 5]} for i in range(40)]  # 2 shards
    data_folder(tmp_path / "a", rows)
    export_tokens(tmp_path / "a", tmp_path / "t.npz")
    gen_data(["--from-tokens", str(tmp_path / "t.npz"), "--out", str(tmp_path / "b"), "--taps", "1,4"])
    out, err = capsys.readouterr()
    assert "\r" not in err
    lines = _bar_lines(err, "taps")
    assert 1 <= len(lines) <= 3 and re.search(RATE_AND_ETA.format(unit="shard"), lines[-1]) and "2/2" in lines[-1], err
    assert out.strip().splitlines()[-1].startswith(
        f"gen-data: {tmp_path / 'b'} holds 40 samples (120 response tokens), taps of 2 layers in 2 shards; this run ")

    gen_data(["--from-tokens", str(tmp_path / "t.npz"), "--out", str(tmp_path / "c"), "--taps", "1,4", "--quiet"])
    out, err = capsys.readouterr()
    assert not _bar_lines(err, "taps") and "holds 40 samples" in out.strip().splitlines()[-1]


def _row(provider, batch, outputs, tps, tau=None, temperature=0.0):
    return {"provider": provider, "method": "none" if provider == "no-spec" else provider, "batch_size": batch,
            "temperature": temperature, "tau": tau, "tokens_per_s": tps, "outputs": outputs,
            "output_tokens": 64, "wall_s": 3.2, "engine_start_s": 6.0}


def test_bench_lines_and_summary_name_speed_up_identity_and_time(tmp_path):
    base, fast, wrong = _row("no-spec", 1, [[1, 2]], 20.0), _row("mtp", 1, [[1, 2]], 28.0, 2.24), \
        _row("ngram", 1, [[1, 3]], 19.0, 3.47)
    assert bench._against_nospec(base, [base]) is base  # no-spec itself: no speed-up of its own
    assert result_line(bench._against_nospec(fast, [base, fast])) == \
        "τ 2.24, 28.0 tok/s, 1.40× no-spec, greedy = no-spec (64 tokens in 3.2 s, engine start 6.0 s)"
    assert "greedy output DIFFERS" in result_line(versus(dict(wrong), base))
    sampled = bench._against_nospec(_row("mtp", 1, [[9]], 25.0, 2.0, 1.0), [_row("no-spec", 1, [[1]], 20.0, None, 1.0)])
    assert "greedy" not in result_line(sampled)  # T > 0: nothing to compare token for token
    rows = [dict(r, speedup_vs_nospec=s, greedy_identical_to_nospec=g) for r, s, g in
            ((base, 1.0, None), (fast, 1.4, True), (wrong, 0.95, False), (_row("no-spec", 16, [[1]], 130.0), 1.0, None),
             (_row("dspark-adaptive", 16, [[1]], 131.0, 2.2), 1.01, True))]
    assert bench.summary(rows, 125.0, tmp_path) == (
        f"bench: 5 runs in 2 min 05 s; best speed-up at T=0: batch 1 mtp 1.40×, batch 16 dspark-adaptive 1.01×; "
        f"greedy output DIFFERS from no-spec: ngram batch 1; wrote {tmp_path}")
    assert "greedy = no-spec in all 2 T=0 runs" in bench.summary([r for r in rows if r is not rows[2]], 1, tmp_path)
