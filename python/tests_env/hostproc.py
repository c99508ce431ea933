"""Drives an environment host as a real subprocess over stdio, as petting does."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

PYTHON_DIR = Path(__file__).resolve().parent.parent  # python/: petting_env lives here
TESTS_DIR = Path(__file__).resolve().parent
FIXTURES = TESTS_DIR / "fixtures"
EXAMPLES = PYTHON_DIR / "petting_env" / "examples"
OFFLINE_HOST = [sys.executable, str(TESTS_DIR / "offline_host.py")]
HOST = [sys.executable, "-m", "petting_env.host"]
TIMEOUT_S = 30


class HostProcess:
    """One host process: send requests, read one response line each, check what stdout carried."""

    def __init__(self, command: list[str] | None = None, cwd: Path | None = None) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(PYTHON_DIR), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["PYTHONUNBUFFERED"] = "1"
        self.stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            command or OFFLINE_HOST,
            cwd=str(cwd or PYTHON_DIR),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(b"")

    def send_line(self, line: bytes) -> dict[str, Any]:
        """Send one raw line; the response must be exactly one JSON object on one line."""
        assert self.process.stdin is not None
        self.process.stdin.write(line + b"\n")
        self.process.stdin.flush()
        try:
            response = self.lines.get(timeout=TIMEOUT_S)
        except queue.Empty:
            raise AssertionError(f"no response in {TIMEOUT_S}s; stderr:\n{self.stderr_text()}") from None
        if not response:
            raise AssertionError(f"the host closed stdout; stderr:\n{self.stderr_text()}")
        try:
            decoded = json.loads(response)
        except json.JSONDecodeError:
            raise AssertionError(f"stdout carried a line that is not JSON: {response!r}") from None
        if not isinstance(decoded, dict) or not isinstance(decoded.get("ok"), bool):
            raise AssertionError(f"not a response: {response!r}")
        return decoded

    def request(self, **request: Any) -> dict[str, Any]:
        return self.send_line(json.dumps(request).encode())

    def ok(self, **request: Any) -> dict[str, Any]:
        """Send a request that must succeed."""
        response = self.request(**request)
        if not response["ok"]:
            raise AssertionError(f"{request.get('op')} failed: {response['error']}\nstderr:\n{self.stderr_text()}")
        return response

    def items(self, op: str, *items: dict[str, Any]) -> list[dict[str, Any]]:
        return self.ok(op=op, items=list(items))["items"]

    def stderr_text(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")

    def close(self) -> int:
        """Close stdin (EOF); the host must exit, and stdout must hold nothing more."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        code = self.process.wait(timeout=TIMEOUT_S)
        leftover = []
        while True:
            line = self.lines.get(timeout=TIMEOUT_S)
            if not line:
                break
            leftover.append(line)
        self.stderr.close()
        assert self.process.stdout is not None
        self.process.stdout.close()
        if leftover:
            raise AssertionError(f"stdout carried lines nobody asked for: {leftover!r}")
        return code


def hello(host: HostProcess, env: dict[str, Any], workdir: Path = PYTHON_DIR, **extra: Any) -> dict[str, Any]:
    return host.ok(op="hello", protocol=1, env=env, workdir=str(workdir), **extra)
