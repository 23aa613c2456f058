"""A report as headless Chromium renders it, the whole page in one PNG.

    python3 benchmarks/study/screenshot_report.py runs/study-cpu/report.html runs/study-cpu/report.png

Chromium (Debian: `apt-get install -y chromium`) draws the page into a tall window; the PNG is
cropped below the last line of the page and reduced to a 256-colour palette (text and plots stay sharp,
the file a fraction of the size). Pillow comes with matplotlib.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", "--hide-scrollbars", "--virtual-time-budget=5000"]
WIDTH, TALLEST = 1280, 30000
"""The window: the page's width, and a height above any report's."""
MARGIN = 30
"""Pixels kept below the page's last line."""


def screenshot(html: Path, png: Path) -> Path:
    """Render `html` and write the cropped, 256-colour PNG to `png`."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("chromium is not installed (Debian: apt-get install -y chromium)")
    with tempfile.TemporaryDirectory() as folder:
        raw = Path(folder) / "page.png"
        subprocess.run([browser, *FLAGS, f"--window-size={WIDTH},{TALLEST}", f"--screenshot={raw}",
                        html.resolve().as_uri()], check=True, capture_output=True, timeout=300)
        page = Image.open(raw).convert("RGB")
    ink = np.where((np.asarray(page.convert("L")) < 245).any(axis=1))[0]
    bottom = min(page.height, int(ink.max()) + MARGIN) if len(ink) else page.height
    page.crop((0, 0, page.width, bottom)).quantize(colors=256).save(png, optimize=True)
    return png


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: screenshot_report.py REPORT.html OUT.png")
    print(f"wrote {screenshot(Path(sys.argv[1]), Path(sys.argv[2]))}")
