"""Taps by vLLM itself (`gen-data --taps-via vllm`): the target's hidden states exported by
vLLM's `extract_hidden_states` drafter through a KV connector, instead of a second forward of
the target in transformers.

Contract (the same as `taps.target_taps`, which is the reference):
    vLLM's aux hidden state id k is the residual stream after decoder layer k - 1
    (`hidden_states + residual`, before the final norm), so our tap of layer i is aux id i + 1,
    the final layer included (id = num_layers). Each stored sequence (prompt + response ids, T
    tokens) is prefilled once with max_tokens=1; the connector saves the cache-only layer's rows
    for its T tokens, [T, n_taps, hidden] in ascending layer order -> [T, n_taps * hidden].
    With top-k: row t (t < T - 1) is vLLM's prompt log-probabilities at position t + 1 (the
    distribution of token t + 1), row T - 1 the one generated position's log-probabilities;
    both raw (temperature 1, full softmax), the k largest, largest first.

vLLM ships `ExampleHiddenStatesConnector` for this, written for CUDA (pinned host buffers, a
copy stream and events); on vLLM's CPU build it fails. `HiddenStatesConnector` copies
synchronously when the cache lives on the CPU and defers to vLLM's code on any other device.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    extract_from_kv_cache,
)

from vllm_specx.engine import CPU_ENGINE_ARGS, cpu_llm, spawned_core

VLLM_INTERNALS = (
    "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector:ExampleHiddenStatesConnector",
    "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector:extract_from_kv_cache",
    "vllm.transformers_utils.configs.extract_hidden_states:ExtractHiddenStatesConfig",
)
WAIT_S = 600  # longest wait for one sequence's file once its request has finished


class _Copied:
    """A finished copy, in place of the CUDA event vLLM's connector polls."""

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class HiddenStatesConnector(ExampleHiddenStatesConnector):
    """vLLM's hidden-state connector with a CPU copy path (see the module docstring)."""

    def _submit_async_write(self, pending) -> None:
        if self._kv_cache is None or self._kv_cache.device.type != "cpu":
            return super()._submit_async_write(pending)
        if not self._is_tp_rank_zero:
            return
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (torch.arange(self._block_size).view(1, -1) + blocks.view(-1, 1) * self._block_size).flatten()
        hidden = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        try:
            save_file({"hidden_states": hidden, "token_ids": pending.token_ids.clone()}, pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases the reader's wait
        self._req_copy_events[pending.req_id] = _Copied()


def speculative_config(layer_ids: tuple[int, ...]) -> dict:
    """vLLM's `extract_hidden_states` drafter capturing our taps `layer_ids` (aux ids i + 1)."""
    return {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [i + 1 for i in layer_ids]}}}


def kv_transfer_config(store: Path) -> dict:
    return {"kv_connector": HiddenStatesConnector.__name__, "kv_connector_module_path": __name__,
            "kv_role": "kv_producer", "kv_connector_extra_config": {"shared_storage_path": str(store)}}


def _read(path: str, wait_s: float = WAIT_S) -> dict[str, torch.Tensor]:
    """The connector's file for one request: waits (at most `wait_s`) for the writer's lock."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(path + ".lock") as lock:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return load_file(path, device="cpu")
        except (BlockingIOError, FileNotFoundError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"vLLM's hidden-state connector did not write {path} within {wait_s:.0f} s")
            time.sleep(0.01)


def _top(entries: dict, k: int) -> tuple[list[float], list[int]]:
    """The k largest of one position's vLLM log-probabilities (which also hold the actual
    token's, ranked or not), largest first."""
    best = sorted(entries.items(), key=lambda e: (e[1].rank, -e[1].logprob))[:k]
    if len(best) < k:
        raise RuntimeError(f"vLLM returned {len(best)} log-probabilities at a position, not {k}")
    return [e[1].logprob for e in best], [e[0] for e in best]


class VllmTaps:
    """An engine exporting taps; `__call__(seqs)` -> (taps, top_logp, top_ids), lists with one
    entry per sequence: taps [T, n * H] float32, and with topk logp [T, k] float32 and ids [T, k]
    int64 (None without topk). `close()` shuts the engine down."""

    def __init__(self, target: str, layer_ids: tuple[int, ...], topk: int = 0, dtype: str = "float32",
                 engine_args: dict | None = None, max_len: int = 0):
        taken = sorted({"speculative_config", "kv_transfer_config"} & set(engine_args or {}))
        if taken:
            raise ValueError(f"--engine-args {taken}: the hidden-state export sets these itself "
                             "(vLLM's extract_hidden_states drafter and its KV connector)")
        self.layer_ids, self.topk = tuple(layer_ids), topk
        self.store = Path(tempfile.mkdtemp(prefix="vllm-specx-hidden-"))
        args = {"dtype": dtype, **(engine_args or {})}
        if topk:
            args.setdefault("max_logprobs", max(topk, 20))
        if max_len:  # every sequence is prefilled whole, plus the one generated position
            args.setdefault("max_model_len", max(CPU_ENGINE_ARGS["max_model_len"], max_len + 1))
        self._stack = contextlib.ExitStack()
        # with the engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) the connector's
        # file was still locked when `generate` returned and the reader waited out WAIT_S
        # (tests/e2e/test_vllm_taps.py, 2026-12-07); a core in its own process releases it
        with spawned_core():
            self.llm = self._stack.enter_context(cpu_llm(
                target, speculative_config=speculative_config(self.layer_ids),
                kv_transfer_config=kv_transfer_config(self.store), **args))

    def __call__(self, seqs: list[list[int]]):
        from vllm import SamplingParams

        k = self.topk or None
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k, logprobs=k, detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": s} for s in seqs], params, use_tqdm=False)
        taps, top_logp, top_ids = [], [], []
        for seq, o in zip(seqs, outs):
            path = (o.kv_transfer_params or {}).get("hidden_states_path")
            if path is None:
                raise RuntimeError("vLLM's engine returned no hidden_states_path: is its KV connector set?")
            data = _read(path)
            for f in (path, path + ".lock"):
                Path(f).unlink(missing_ok=True)
            hidden, ids = data["hidden_states"], data["token_ids"]
            if ids.tolist() != list(seq) or hidden.shape[:2] != (len(seq), len(self.layer_ids)):
                raise RuntimeError(f"vLLM saved hidden states {tuple(hidden.shape)} for {len(ids)} tokens; "
                                   f"expected ({len(seq)}, {len(self.layer_ids)}, hidden) for the sequence")
            taps.append(hidden.reshape(len(seq), -1).float())
            if self.topk:
                rows = [_top(p, self.topk) for p in o.prompt_logprobs[1:]] + [_top(o.outputs[0].logprobs[0], self.topk)]
                top_logp.append(torch.tensor([r[0] for r in rows], dtype=torch.float32))
                top_ids.append(torch.tensor([r[1] for r in rows], dtype=torch.long))
        return (taps, top_logp, top_ids) if self.topk else (taps, None, None)

    def close(self) -> None:
        self._stack.close()
        shutil.rmtree(self.store, ignore_errors=True)
