"""Open a page in real headless Chromium over the DevTools protocol: console errors, exceptions,
failed loads, image state and a full-page screenshot. Flags as this machine needs them (no
background networking: the network is closed)."""
from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-port=0", "--remote-allow-origins=*"]


def layout_problems(layout: dict) -> list[str]:
    """What a reader would see wrong: the page wider than the window (cut off or a sideways
    scroll), blocks drawn over each other, an image squeezed or past the window's edge, a "nan"."""
    out = []
    if layout["page_width"] > layout["viewport"]:
        out.append(f"page is {layout['page_width']} px wide in a {layout['viewport']} px window")
    out += [f"overlap: {o}" for o in layout["overlaps"]]
    for i in layout["images"]:
        if not i["natural"]:
            out.append(f"image {i['alt']!r} did not load")
        elif abs(i["shown"] / i["natural"] - 1) > 0.02:
            out.append(f"image {i['alt']!r} drawn at aspect {i['shown']:.2f}, made at {i['natural']:.2f}")
        if i["left"] < 0 or i["right"] > layout["viewport"]:
            out.append(f"image {i['alt']!r} runs past the window ({i['left']:.0f}-{i['right']:.0f} px)")
    if re.search(r"\bnan\b", layout["text"], re.IGNORECASE):
        out.append("the page says 'nan'")
    return out


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    raise RuntimeError("no chromium on PATH (the Makefile installs Debian's chromium)")


class Page:
    def __init__(self, ws):
        self.ws, self.next_id, self.events = ws, 0, []

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, method: str, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(e.get("method") == method for e in self.events):
                return
            self.ws.settimeout(max(0.1, end - time.monotonic()))
            self.events.append(json.loads(self.ws.recv()))
        raise TimeoutError(method)


LAYOUT_JS = """JSON.stringify((() => {
  const box = e => { const r = e.getBoundingClientRect();
                     return {x0: r.left, x1: r.right, y0: r.top + scrollY, y1: r.bottom + scrollY}; };
  const name = e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + ' "' + e.textContent.trim().slice(0, 40) + '"';
  const blocks = Array.from(document.querySelectorAll('h1, h2, p, ul, div.scroll, figure, .plots'))
                      .filter(e => e.getClientRects().length);
  const overlaps = [];
  for (let i = 0; i < blocks.length; i++) for (let j = i + 1; j < blocks.length; j++) {
    const a = blocks[i], b = blocks[j];
    if (a.contains(b) || b.contains(a)) continue;
    const p = box(a), q = box(b);
    if (p.x0 < q.x1 - 1 && q.x0 < p.x1 - 1 && p.y0 < q.y1 - 1 && q.y0 < p.y1 - 1)
      overlaps.push(name(a) + ' / ' + name(b));
  }
  const images = Array.from(document.images).map(i => { const r = i.getBoundingClientRect();
    return {alt: i.alt, natural: i.naturalWidth / Math.max(1, i.naturalHeight), shown: r.width / Math.max(1, r.height),
            right: r.right, left: r.left}; });
  return {headings: Array.from(document.querySelectorAll('h2')).map(h => h.textContent.trim()),
          page_width: document.documentElement.scrollWidth, viewport: innerWidth, overlaps: overlaps,
          images: images, text: document.body.innerText};
})())"""


def inspect_page(path: Path, screenshot: Path, width: int = 1280) -> dict:
    """{'errors': [...], 'images': [{complete, width, height}], 'title': str, 'layout': {headings,
    page_width, viewport, overlaps (pairs of blocks drawn over each other), images (aspect as
    drawn vs as made, edges), text}}; writes the PNG."""
    import websocket

    profile = tempfile.mkdtemp(prefix="chromium-")
    proc = subprocess.Popen([chromium(), *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        for _ in range(300):
            if port_file.exists() and port_file.read_text().strip():
                break
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        page = Page(ws)
        for domain in ("Page", "Runtime", "Log", "Network"):
            page.call(f"{domain}.enable")
        page.call("Emulation.setDeviceMetricsOverride", width=width, height=900, deviceScaleFactor=1, mobile=False)
        page.call("Page.navigate", url=Path(path).resolve().as_uri())
        page.wait_for("Page.loadEventFired")
        images = json.loads(page.call("Runtime.evaluate", returnByValue=True, expression=(
            "JSON.stringify(Array.from(document.images).map(i => ({complete: i.complete, "
            "width: i.naturalWidth, height: i.naturalHeight})))"))["result"]["value"])
        title = page.call("Runtime.evaluate", expression="document.title", returnByValue=True)["result"]["value"]
        layout = json.loads(page.call("Runtime.evaluate", returnByValue=True, expression=LAYOUT_JS)["result"]["value"])
        metrics = page.call("Page.getLayoutMetrics")["cssContentSize"]
        shot = page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": width, "height": min(metrics["height"], 16000), "scale": 1})
        Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
        errors = []
        for e in page.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                errors.append(f'{d.get("text")} {(d.get("exception") or {}).get("description", "")}')
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append(str(p.get("args")))
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                errors.append(p["entry"].get("text"))
            elif m == "Network.loadingFailed":
                errors.append(f"load failed: {p.get('errorText')}")
        ws.close()
        return {"errors": errors, "images": images, "title": title, "layout": layout,
                "requests": [e["params"]["request"]["url"][:60] for e in page.events
                             if e.get("method") == "Network.requestWillBeSent"]}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)
