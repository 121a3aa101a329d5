"""Open a page in headless Chromium and talk to it over the DevTools protocol (a pipe).

Used by the HTML report tests: load a file, collect console messages,
uncaught exceptions and network requests, evaluate JavaScript, take a
screenshot.  Chromium is started with ``--remote-debugging-pipe`` (the
protocol runs on file descriptors 3 and 4, NUL-separated JSON), so no port
is opened.

Run as a script to take a screenshot: ``python tests/headless_browser.py
page.html out.png [WIDTH HEIGHT] [--full-page]``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-default-apps", "--disable-extensions", "--mute-audio",
         "--remote-debugging-pipe")


def find_browser() -> str | None:
    """The path of a Chromium executable, or ``None``."""
    env = os.environ.get("CHROMIUM")
    if env and shutil.which(env):
        return shutil.which(env)
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class BrowserError(RuntimeError):
    pass


class Browser:
    """One headless Chromium with one page, driven over the DevTools pipe."""

    def __init__(self, width: int = 1280, height: int = 1600, timeout: float = 60) -> None:
        exe = find_browser()
        if exe is None:
            raise BrowserError("no chromium executable found")
        self.timeout = timeout
        self.width = width
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def attach_pipes() -> None:  # in the child: the pipe ends become fds 3 and 4
            read_end, write_end = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        self.proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={self.profile}",
             f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=attach_pipes, close_fds=False)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget",
                                 {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    # -- protocol ---------------------------------------------------------------
    def _send(self, message: dict[str, Any]) -> None:
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise BrowserError("timed out waiting for chromium")
            import select
            ready, _w, _x = select.select([self._from_browser], [], [], 0.5)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise BrowserError("chromium closed the pipe")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method,
                                   "params": params or {}}
        if self.session is not None and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        self._send(message)
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_for(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            reply = self._read_message(deadline)
            if "method" in reply:
                self.events.append(reply)
                if reply["method"] == method:
                    return reply

    # -- page -----------------------------------------------------------------------
    def open(self, path: Path) -> None:
        """Load ``path`` and wait for its load event."""
        self.events.clear()
        self.call("Page.navigate", {"url": Path(path).resolve().as_uri()})
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def problems(self) -> list[str]:
        """Console errors/warnings, uncaught exceptions and log errors seen so far."""
        self.call("Runtime.evaluate", {"expression": "0"})  # flush pending events
        out = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error",
                                                                              "warning",
                                                                              "assert"):
                out.append(f"console.{params['type']}: {params.get('args')}")
            elif method == "Runtime.exceptionThrown":
                out.append(f"exception: {params.get('exceptionDetails')}")
            elif method == "Log.entryAdded" and params["entry"].get("level") in ("error",
                                                                                "warning"):
                out.append(f"log: {params['entry'].get('text')}")
        return out

    def requests(self) -> list[str]:
        """URLs the page requested (the page itself included)."""
        return [e["params"]["request"]["url"] for e in self.events
                if e.get("method") == "Network.requestWillBeSent"]

    def screenshot(self, out: Path, full_page: bool = False) -> None:
        """A PNG of the viewport (or of the whole page, as tall as its content)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": max(size["width"], self.width),
                                "height": size["height"], "scale": 1})
        data = self.call("Page.captureScreenshot", params)["data"]
        Path(out).write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def main(argv: list[str]) -> int:
    full = "--full-page" in argv
    argv = [a for a in argv if a != "--full-page"]
    if len(argv) < 2:
        print(__doc__)
        return 2
    width, height = (int(argv[2]), int(argv[3])) if len(argv) >= 4 else (1280, 1600)
    with Browser(width, height) as browser:
        browser.open(Path(argv[0]))
        browser.screenshot(Path(argv[1]), full_page=full)
        for problem in browser.problems():
            print(problem)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
