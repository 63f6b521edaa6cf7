"""A real `vllm serve` subprocess for end-to-end tests: started, waited for, stopped
(`vllm_specx.bench.loadgen.vllm_serve`, with a failed start turned into a test failure)."""

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from vllm_specx.bench.loadgen import ServerExited, free_port, http_get, http_post, spawn_vllm_serve  # noqa: F401
from vllm_specx.bench.loadgen import vllm_serve as _vllm_serve

get, post = http_get, http_post


@contextlib.contextmanager
def vllm_serve(model, args: list[str], log: Path, timeout: float = 300):
    """`vllm serve model *args` on a free port; yields the base URL once /health answers."""
    cm = _vllm_serve(model, args, log, timeout)
    try:
        base, _ = cm.__enter__()
    except ServerExited as e:
        pytest.fail(str(e))
    try:
        yield base
    finally:
        cm.__exit__(None, None, None)


def expect_exit(proc: subprocess.Popen, base: str, log: Path, timeout: float = 120) -> tuple[int, str]:
    """Wait for a `vllm serve` that must refuse to start: (exit code, its output) once it exits.
    Fails the test when it answers /health (it started) or is still running after `timeout` s
    (a hang); either way it is killed."""
    deadline = time.time() + timeout
    try:
        while proc.poll() is None:
            try:
                get(base + "/health", timeout=1)
                pytest.fail(f"vllm serve started although it should have refused:\n{log.read_text()[-3000:]}")
            except OSError:
                pass
            if time.time() > deadline:
                pytest.fail(f"vllm serve still running after {timeout} s (should have exited):\n"
                            f"{log.read_text()[-3000:]}")
            time.sleep(1)
        return proc.returncode, log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
