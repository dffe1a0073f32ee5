"""Open a report in headless Chromium and look at it: console errors, images, DOM, screenshot.

Test tooling, not part of the package: the audit tests use it (does the page load cleanly, do the
embedded images decode, does a hostile key stay text), and ``python tests/cg_browser.py
REPORT.html [SCREENSHOT.png]`` takes a screenshot. Chromium is driven over the DevTools protocol through a pipe
(``--remote-debugging-pipe``: JSON messages ending in a NUL byte on file descriptors 3 and 4), so
no port, websocket library or webdriver is needed. Evaluation through the protocol is not subject
to the page's Content-Security-Policy, so the checks work on a page that forbids scripts.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from collapseguard.errors import CollapseguardError

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


class BrowserError(CollapseguardError, RuntimeError):
    """Chromium is missing, failed to start, or a protocol call failed or timed out."""


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome executable (``$CHROMIUM`` first), or None."""
    env = os.environ.get("CHROMIUM")
    if env and shutil.which(env):
        return shutil.which(env)
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class Chromium:
    """A headless Chromium process with one DevTools session on a page.

    Use as a context manager; ``open(path)`` loads a file and records console messages, uncaught
    exceptions and log entries in ``self.events``.
    """

    def __init__(self, executable: str | None = None, width: int = 1280, height: int = 900,
                 timeout: float = 60.0):
        self.executable = executable or find_chromium()
        if not self.executable:
            raise BrowserError("no chromium executable found (install Debian's `chromium`)")
        self.width, self.height, self.timeout = width, height, timeout
        self._id = 0
        self._buf = b""
        self.events: list[dict] = []
        self.session: str | None = None

    # -- process ------------------------------------------------------------------------------

    def __enter__(self):
        self._profile = tempfile.mkdtemp(prefix="cg-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        args = [self.executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--no-default-browser-check", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-extensions",
                "--disable-dev-shm-usage", "--mute-audio", "--hide-scrollbars",
                f"--user-data-dir={self._profile}", "--remote-debugging-pipe",
                f"--window-size={self.width},{self.height}", "about:blank"]

        # the protocol pipe must be fds 3 (chromium reads) and 4 (chromium writes) in chromium;
        # a tiny Python trampoline moves them there and execs it (no preexec_fn, no fd leaks)
        trampoline = ("import fcntl,os,sys\n"
                      "r,w=int(sys.argv[1]),int(sys.argv[2])\n"
                      "a=fcntl.fcntl(r,fcntl.F_DUPFD,10);b=fcntl.fcntl(w,fcntl.F_DUPFD,10)\n"
                      "os.close(r);os.close(w)\n"
                      "os.dup2(a,3);os.dup2(b,4);os.close(a);os.close(b)\n"
                      "os.execv(sys.argv[3],sys.argv[3:])")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", trampoline, str(to_chrome_r), str(from_chrome_w), *args],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(to_chrome_r, from_chrome_w))
        except OSError as exc:
            raise BrowserError(f"cannot start {self.executable}: {exc}") from None
        finally:
            os.close(to_chrome_r)
            os.close(from_chrome_w)
        try:
            target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
            self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                     session=False)["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                self.call(f"{domain}.enable")
            self.call("Emulation.setDeviceMetricsOverride", {
                "width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        try:
            if self.proc.poll() is None:
                try:
                    self._send("Browser.close", {}, session=False)
                except OSError:
                    pass
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
        finally:
            for fd in (self._to_chrome, self._from_chrome):
                try:
                    os.close(fd)
                except OSError:
                    pass
            shutil.rmtree(self._profile, ignore_errors=True)

    # -- protocol -----------------------------------------------------------------------------

    def _send(self, method: str, params: dict, session: bool = True) -> int:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        return self._id

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("timed out waiting for chromium")
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if ready:
                chunk = os.read(self._from_chrome, 1 << 20)
                if not chunk:
                    raise BrowserError(f"chromium exited (code {self.proc.poll()})")
                self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, session: bool = True) -> dict:
        """Send a command and return its result (events that arrive meanwhile are recorded)."""
        mid = self._send(method, params or {}, session)
        deadline = time.monotonic() + self.timeout
        while True:
            msg = self._read(deadline)
            if msg.get("id") == mid:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def wait_event(self, method: str) -> dict:
        deadline = time.monotonic() + self.timeout
        for ev in self.events:
            if ev["method"] == method:
                return ev
        while True:
            msg = self._read(deadline)
            if "method" in msg:
                self.events.append(msg)
                if msg["method"] == method:
                    return msg

    # -- page ---------------------------------------------------------------------------------

    def open(self, path: str | Path) -> None:
        """Load a local file and wait for its load event (images decoded by then)."""
        self.events.clear()
        url = Path(path).resolve().as_uri()
        res = self.call("Page.navigate", {"url": url})
        if res.get("errorText"):
            raise BrowserError(f"cannot open {url}: {res['errorText']}")
        self.wait_event("Page.loadEventFired")
        self.evaluate("1")  # drain events emitted during load

    def evaluate(self, expression: str):
        """Evaluate JavaScript in the page (not subject to its CSP) and return the value."""
        res = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True})
        if "exceptionDetails" in res:
            raise BrowserError(f"evaluation failed: {res['exceptionDetails'].get('text')}")
        return res.get("result", {}).get("value")

    def problems(self) -> list[str]:
        """Console errors/warnings, uncaught exceptions and error/warning log entries so far."""
        out = []
        for ev in self.events:
            m, p = ev["method"], ev.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:500])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
                out.append(f"console.{p.get('type')}: " + json.dumps(p.get("args", []))[:500])
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
                entry = p["entry"]
                out.append(f"log {entry.get('level')} ({entry.get('source')}): {entry.get('text')}")
        return out

    def screenshot(self, out: str | Path, full_page: bool = True, max_height: int = 16000) -> Path:
        """Save a PNG of the page (the whole page when ``full_page``)."""
        params: dict = {"format": "png"}
        if full_page:
            h = int(self.evaluate("Math.ceil(document.documentElement.scrollHeight)") or self.height)
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": self.width, "height": min(h, max_height),
                                "scale": 1})
        data = self.call("Page.captureScreenshot", params)["data"]
        out = Path(out)
        out.write_bytes(base64.b64decode(data))
        return out


#: what ``inspect_report`` evaluates in the page
INSPECT_JS = """(() => {
  const imgs = Array.from(document.images);
  return {
    title: document.title,
    images: imgs.length,
    broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt),
    scripts: document.scripts.length,
    handlers: Array.from(document.querySelectorAll('*')).filter(
        el => Array.from(el.attributes).some(a => a.name.startsWith('on'))).length,
    bodyData: Object.assign({}, document.body.dataset),
    text: document.body.innerText,
    height: document.documentElement.scrollHeight
  };
})()"""


def inspect_report(path: str | Path, screenshot: str | Path | None = None,
                   executable: str | None = None) -> dict:
    """Open ``path`` and return ``INSPECT_JS``'s findings plus ``problems`` (console/log errors)."""
    with Chromium(executable) as browser:
        browser.open(path)
        info = browser.evaluate(INSPECT_JS)
        if screenshot is not None:
            browser.screenshot(screenshot)
        info["problems"] = browser.problems()
    return info


def main(argv=None) -> int:  # pragma: no cover - a developer tool
    """``python tests/cg_browser.py REPORT.html [SCREENSHOT.png]``"""
    import sys
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(main.__doc__)
        return 2
    info = inspect_report(argv[0], argv[1] if len(argv) > 1 else None)
    info.pop("text")
    print(json.dumps(info, indent=1))
    return 1 if info["problems"] or info["broken"] else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
