"""A minimal Chrome DevTools Protocol client over ``--remote-debugging-pipe`` (stdlib only):
enough to load a page, click at a point and evaluate an expression, so the browser tests can
follow a link as a person would. Chromium reads commands on fd 3 and answers on fd 4, one
JSON message per NUL-terminated frame."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any


def _high(fd: int) -> int:
    """``fd`` moved to a number above 9, close-on-exec."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class Browser:
    def __init__(self, chromium: str, profile: Path, timeout: float = 60) -> None:
        # pipe ends above 9, so that moving them onto fd 3 and 4 in the child never
        # overwrites one with the other
        to_child_r, self._w = (_high(fd) for fd in os.pipe())  # our commands -> fd 3
        self._r, from_child_w = (_high(fd) for fd in os.pipe())  # fd 4 -> our answers
        self.timeout, self._id, self._buf = timeout, 0, b""

        def fds() -> None:  # in the child: dup2 clears close-on-exec on 3 and 4 only
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--remote-debugging-pipe", "--window-size=1280,900",
             f"--user-data-dir={profile}", "about:blank"],
            close_fds=False, preexec_fn=fds,  # noqa: PLW1509
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(to_child_r)
        os.close(from_child_w)
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        attached = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)
        self.session = attached["sessionId"]
        self.call("Page.enable", session=True)

    def _read(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self._r, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the debugging pipe")
            self._buf += chunk
        frame, _, self._buf = self._buf.partition(b"\0")
        return json.loads(frame)

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            answer = self._read()
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})

    def wait_event(self, method: str) -> dict[str, Any]:
        while True:
            msg = self._read()
            if msg.get("method") == method:
                return msg.get("params", {})

    def load(self, url: str) -> None:
        self.call("Page.navigate", session=True, url=url)
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", session=True, expression=expression,
                           returnByValue=True)  # fmt: skip
        return result["result"].get("value")

    def click(self, x: float, y: float) -> None:
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", session=True, type=kind, x=x, y=y,
                      button="left", clickCount=1)  # fmt: skip

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
        os.close(self._w)
        os.close(self._r)
