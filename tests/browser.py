"""Headless Chromium for tests, driven over the DevTools protocol with aiohttp's websocket client (a dependency
already): no Selenium, no Playwright, no browser download. Debian's ``chromium`` package is what CI installs
(.ci/run); :func:`chromium_binary` finds it (or ``$LSQL_CHROMIUM``), and tests skip with a reason where none is.

    with Chromium() as browser:
        page = browser.open("file:///tmp/page.html")
        page.eval("document.title")           # a value, or the value of an awaited Promise
        page.problems()                       # console errors, warnings and uncaught exceptions so far
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path


def chromium_binary() -> str | None:
    """The Chromium (or Chrome) executable: ``$LSQL_CHROMIUM``, else the first of the usual names on PATH."""
    env = os.environ.get("LSQL_CHROMIUM")
    if env:
        return env if os.access(env, os.X_OK) else None
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Chromium:
    """One headless Chromium process with its own throw-away profile, and an event loop thread talking to it."""

    def __init__(self, binary: str | None = None, timeout_s: float = 30.0):
        binary = binary or chromium_binary()
        if binary is None:
            raise FileNotFoundError("no chromium binary (apt-get install chromium, or set LSQL_CHROMIUM)")
        self.profile = tempfile.mkdtemp(prefix="lsql-chromium-")
        args = [binary, "--headless=new", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                "--remote-debugging-port=0", f"--user-data-dir={self.profile}", "--mute-audio",
                "--autoplay-policy=no-user-gesture-required", "--window-size=1400,1000", "about:blank"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.timeout_s = timeout_s
        try:
            port_file = Path(self.profile) / "DevToolsActivePort"
            t0 = time.monotonic()
            while not (port_file.exists() and port_file.read_text().strip()):
                if self.proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                    raise RuntimeError(f"{binary} did not start (exit code {self.proc.poll()})")
                time.sleep(0.05)
            self.port = int(port_file.read_text().split()[0])
        except BaseException:
            self.close()
            raise

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(self.timeout_s * 4)

    def open(self, url: str) -> "Page":
        """A new tab at ``url``, once its load event fired."""
        return self.run(Page.connect(self, url))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Page:
    """One tab: :meth:`eval` runs JavaScript, :meth:`problems` lists what the console and the page reported."""

    def __init__(self, browser: Chromium, session, ws):
        self.browser, self.session, self.ws = browser, session, ws
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future] = {}
        self.events: list[dict] = []
        self.loaded = asyncio.Event()
        self.reader = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, browser: Chromium, url: str) -> "Page":
        import aiohttp

        session = aiohttp.ClientSession()
        async with session.put(f"http://127.0.0.1:{browser.port}/json/new?about:blank") as r:
            target = await r.json(content_type=None)
        ws = await session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
        page = cls(browser, session, ws)
        for domain in ("Runtime", "Log", "Page"):
            await page._call(f"{domain}.enable")
        await page._call("Page.navigate", url=url)
        await asyncio.wait_for(page.loaded.wait(), browser.timeout_s)
        return page

    async def _read(self) -> None:
        async for msg in self.ws:
            d = json.loads(msg.data)
            if "id" in d:
                fut = self.pending.pop(d["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(d)
            else:
                self.events.append(d)
                if d.get("method") == "Page.loadEventFired":
                    self.loaded.set()

    async def _call(self, method: str, **params) -> dict:
        i = next(self.ids)
        fut = asyncio.get_running_loop().create_future()
        self.pending[i] = fut
        await self.ws.send_str(json.dumps({"id": i, "method": method, "params": params}))
        d = await asyncio.wait_for(fut, self.browser.timeout_s)
        if "error" in d:
            raise RuntimeError(f"{method}: {d['error']}")
        return d["result"]

    def call(self, method: str, **params) -> dict:
        """A DevTools protocol command's result."""
        return self.browser.run(self._call(method, **params))

    def eval(self, expression: str):
        """The value of a JavaScript expression (a Promise is awaited), returned by value.

        Raises:
            RuntimeError: the expression threw (the exception's description).
        """
        r = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in r:
            ex = r["exceptionDetails"]
            raise RuntimeError(ex.get("exception", {}).get("description") or ex.get("text"))
        return r["result"].get("value")

    def problems(self) -> list[str]:
        """Console errors and warnings, failed loads and uncaught exceptions reported so far."""
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append("exception: " + (d.get("exception", {}).get("description") or d.get("text", "")))
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
                out.append(f"console.{p['type']}: " + " ".join(str(a.get("value", a.get("description")))
                                                               for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p["entry"].get("level") in ("error", "warning"):
                out.append(f"log {p['entry']['level']}: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        return out

    def close(self) -> None:
        async def shut():
            await self.ws.close()
            await self.session.close()
            self.reader.cancel()

        self.browser.run(shut())
