"""Training data survives a new machine: `gen-data --export-tokens` writes a data folder's token
ids compactly, `--from-tokens` rebuilds the folder (the same tokens.jsonl rows and meta) and its
taps, equal to the taps the original folder gets."""

import json

import pytest
import torch
from safetensors.torch import load_file

from vllm_specx.training.data import export_tokens, import_tokens, main

from ..helpers import REF_TARGET
from ..helpers import data_folder as _folder


ROWS = [{"id": 3, "prompt_ids": [5, 6, 7], "output_ids": [8, 9, 10, 11]},
        {"id": 0, "prompt_ids": [1], "output_ids": [4095, 2, 0]}]


def test_export_then_import_gives_the_same_rows_and_meta(tmp_path):
    _folder(tmp_path / "a", ROWS, stop_at_eos=True)
    info = export_tokens(tmp_path / "a", tmp_path / "t.npz")
    assert info == {"samples": 2, "response_tokens": 7, "bytes": (tmp_path / "t.npz").stat().st_size}
    meta = import_tokens(tmp_path / "t.npz", tmp_path / "b")
    assert meta["stop_at_eos"] is True and meta["prompts"] == "train"
    got = [json.loads(x) for x in (tmp_path / "b" / "tokens.jsonl").read_text().splitlines()]
    assert got == ROWS
    import_tokens(tmp_path / "t.npz", tmp_path / "b")  # resumable: nothing appended twice
    assert len((tmp_path / "b" / "tokens.jsonl").read_text().splitlines()) == 2
    # a folder holding other data is refused
    _folder(tmp_path / "c", ROWS, max_tokens=9)
    with pytest.raises(ValueError, match="existing data was made with"):
        import_tokens(tmp_path / "t.npz", tmp_path / "c")


def test_from_tokens_rebuilds_the_taps(tmp_path):
    _folder(tmp_path / "a", ROWS)
    main(["--target", str(REF_TARGET), "--prompts", "train", "--out", str(tmp_path / "a"), "--taps", "1,4",
          "--max-tokens", "8", "--taps-only"])
    main(["--out", str(tmp_path / "a"), "--export-tokens", str(tmp_path / "t.npz")])
    main(["--from-tokens", str(tmp_path / "t.npz"), "--out", str(tmp_path / "b"), "--taps", "1,4"])
    a, b = (load_file(next((tmp_path / d / "taps").glob("*.safetensors"))) for d in "ab")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(SystemExit):
        main(["--from-tokens", str(tmp_path / "t.npz"), "--target", "x", "--out", str(tmp_path / "c")])


def test_from_tokens_resumes_a_stopped_taps_pass(tmp_path):
    """The same `--from-tokens` command continues a taps pass that stopped part way (shards already
    stored); other taps flags on that folder are still refused."""
    rows = [{"id": i, "prompt_ids": [1 + i, 2], "output_ids": [3, 4 + i]} for i in range(40)]  # 2 shards
    _folder(tmp_path / "a", rows)
    export_tokens(tmp_path / "a", tmp_path / "t.npz")
    cmd = ["--from-tokens", str(tmp_path / "t.npz"), "--out", str(tmp_path / "b"), "--taps", "1,4"]
    main(cmd)
    shards = sorted((tmp_path / "b" / "taps").glob("*.safetensors"))
    assert len(shards) == 2
    meta = (tmp_path / "b" / "meta.json").read_text()
    shards[1].unlink()  # as if stopped before its last shard
    main(cmd)
    assert sorted((tmp_path / "b" / "taps").glob("*.safetensors")) == shards
    assert (tmp_path / "b" / "meta.json").read_text() == meta
    with pytest.raises(ValueError, match="existing data was made with"):
        main(cmd[:-1] + ["1,3"])


def test_more_data_on_top_of_a_token_file(tmp_path, capsys):
    """`--from-tokens FILE --prompts A+B` (FILE answering A): the folder records the join, A's answers
    keep their ids, and gen-data then answers B's prompts; any other set is refused, naming why."""
    from vllm_specx.training.data import extension_refusal

    _folder(tmp_path / "a", ROWS, prompts="chat-mix", stop_at_eos=True, limit=7150)
    export_tokens(tmp_path / "a", tmp_path / "t.npz")
    meta = import_tokens(tmp_path / "t.npz", tmp_path / "b", prompts="chat-mix+chat-mix2")
    assert meta["prompts"] == "chat-mix+chat-mix2" and "limit" not in meta and meta["stop_at_eos"] is True
    assert json.loads((tmp_path / "b" / "meta.json").read_text()) == meta
    assert [json.loads(x) for x in (tmp_path / "b" / "tokens.jsonl").read_text().splitlines()] == ROWS
    saved = {"prompts": "chat-mix"}
    assert extension_refusal(saved, "chat-mix+chat-mix2") is None
    for prompts, why in (("chat-mix2", "name that set, or a join that starts with it"),
                         ("chat-mix2+chat-mix", "a join that starts with it"),
                         ("chat-mix+humaneval", "only training sets"),
                         ("chat-mix+nope", "unknown prompt set 'nope'")):
        assert why in extension_refusal(saved, prompts), prompts
    assert "spread" in extension_refusal({"prompts": "chat-mix", "spread": 100}, "chat-mix+chat-mix2")
    with pytest.raises(SystemExit):
        main(["--from-tokens", str(tmp_path / "t.npz"), "--prompts", "chat-mix2", "--out", str(tmp_path / "c")])
    assert "--prompts chat-mix2 with --from-tokens" in capsys.readouterr().err
