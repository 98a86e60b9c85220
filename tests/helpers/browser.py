"""Pages opened in a real browser (headless Chromium): the DOM after load, the console's complaints
and a screenshot; and a page's layout measured at a window width. Shared by every test of an HTML
page mlhpc writes (the check report, the compare page, the characterize pages)."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser") if shutil.which(name)), None)

CONSOLE = re.compile(r":CONSOLE[(:]|Uncaught|Failed to load resource|net::ERR_")
"""What Chromium writes to stderr (--enable-logging=stderr) for a console message, a script error
or a resource that would not load; its own start-up noise (D-Bus, GPU, sandbox) never matches."""


@dataclass(frozen=True)
class Rendered:
    dom: str
    """The document as the browser holds it after load (--dump-dom)."""
    console: list[str]
    """Console messages, script errors and failed loads, one stderr line each."""
    screenshot: Path


def render(page: Path, screenshot: Path, width: int = 1000, height: int = 1560) -> Rendered:
    """Open `page` in headless Chromium twice: once for the DOM and the console, once for a PNG."""
    assert CHROMIUM is not None
    # --no-sandbox: CI runs as root; --disable-dev-shm-usage: containers give /dev/shm 64 MiB.
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
    common += ["--hide-scrollbars", "--no-first-run"]
    common += [f"--user-data-dir={screenshot.parent / 'chromium-profile'}", "--virtual-time-budget=3000"]
    url = page.resolve().as_uri()
    dumped = subprocess.run(
        [*common, "--enable-logging=stderr", "--v=0", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    subprocess.run(
        [*common, f"--window-size={width},{height}", f"--screenshot={screenshot}", url],
        capture_output=True,
        timeout=120,
        check=True,
    )
    console = [line for line in dumped.stderr.splitlines() if CONSOLE.search(line)]
    return Rendered(dom=dumped.stdout, console=console, screenshot=screenshot)


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")


MEASURE = """<script>
addEventListener('load', () => {
  const width = document.documentElement.clientWidth;
  const over = [...document.querySelectorAll('body *')]
    .filter(e => !e.closest('.wide') || e.classList.contains('wide'))
    .filter(e => !(e.ownerSVGElement))  // an SVG's own viewport clips what is drawn in it
    .filter(e => e.getBoundingClientRect().right > width + 0.5
      || (!e.classList.contains('wide') && e.scrollWidth > e.clientWidth + 1 && e.clientWidth > 0))
    .map(e => e.tagName + (e.getAttribute('class') ? '.' + e.getAttribute('class') : ''));
  const out = document.createElement('pre');
  out.id = 'measured';
  out.textContent = JSON.stringify({scroll: document.documentElement.scrollWidth, width, over});
  document.body.appendChild(out);
});
</script>"""


def measured_layout(page: Path, scratch: Path, width: int = 1200) -> dict:
    """scrollWidth of the page in a `width` px window, and every element (outside a box that scrolls
    on its own) whose right edge passes the window: a copy of the page with a measuring script."""
    return script_result(page, MEASURE, "measured", scratch / f"measured_{page.parent.name}.html", width)


def script_result(page: Path, script: str, marker: str, copy: Path, width: int) -> Any:
    """The JSON that `script`, added to a copy of `page` and run after load in a `width` px window,
    leaves in `<pre id="{marker}">`."""
    assert CHROMIUM is not None
    copy.write_text(page.read_text(encoding="utf-8").replace("</body>", script + "</body>"), encoding="utf-8")
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
    common += ["--hide-scrollbars", "--no-first-run", f"--user-data-dir={copy.parent / 'chromium-profile'}"]
    common += ["--virtual-time-budget=3000", f"--window-size={width},900"]
    dumped = subprocess.run(
        [*common, "--dump-dom", copy.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = re.search(rf'<pre id="{marker}">(.*?)</pre>', dumped.stdout, re.S)
    assert found is not None, dumped.stdout[-2000:]
    return json.loads(html.unescape(found.group(1)))
