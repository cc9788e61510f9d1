"""`make screenshots`: each rendered report (reports/html/*.html) to a full-page PNG in
headless Chromium, offline, to look at a run's reports as a reader will without opening
a browser. No stage imports this module, so editing it reruns nothing.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from loopscope.base import paths

SCREENSHOT_WIDTH = 1400  # px: the reports' widest figures (about 1300 px) fit unscaled
# The viewport is this tall, then the blank rows below the page are cut off: headless
# Chromium's --screenshot captures the viewport, not the page, and has no full-page
# option. 20000 px holds the longest report with room to spare (convergence: ~10000).
SCREENSHOT_MAX_HEIGHT = 20000
CHROMIUM_PACKAGE = "chromium"  # Debian's package, and the command it installs


def screenshot(page: Path, png: Path, width: int = SCREENSHOT_WIDTH,
               max_height: int = SCREENSHOT_MAX_HEIGHT) -> int:
    """Write a full-page PNG of an HTML page; returns its height in px.

    Chromium runs headless, offline (every host name resolves to nothing: the PNG shows
    the page as a reader without network sees it), with its own throwaway profile. A
    page taller than max_height raises, rather than being cut silently."""
    from PIL import Image  # matplotlib's dependency; only screenshots need it

    browser = shutil.which(CHROMIUM_PACKAGE)
    if browser is None:
        raise FileNotFoundError(f"screenshots need headless Chromium: apt-get install -y "
                                f"{CHROMIUM_PACKAGE} (Debian's package)")
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)  # a PNG left by an earlier run must not pass for this one
    with tempfile.TemporaryDirectory() as profile:
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--force-device-scale-factor=1", "--host-resolver-rules=MAP * ~NOTFOUND",
               f"--user-data-dir={profile}", f"--window-size={width},{max_height}",
               f"--screenshot={png.resolve()}", page.resolve().as_uri()]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0 or not png.is_file():
        raise RuntimeError(f"{browser} failed on {page} ({done.returncode}): "
                           f"{done.stderr.strip()[-2000:]}")
    with Image.open(png) as im:
        rgb = np.asarray(im.convert("RGB"))
    # the last row that differs from the page's background (the bottom-left pixel)
    drawn = np.nonzero((rgb != rgb[-1, 0]).any(axis=(1, 2)))[0]
    bottom = int(drawn[-1]) if len(drawn) else 0
    if bottom >= rgb.shape[0] - 1:
        raise ValueError(f"{page} is taller than {max_height} px: raise the height "
                         "(make screenshots SCREENSHOT_HEIGHT=...)")
    height = min(rgb.shape[0], bottom + 24)  # keep a margin below the page's last line
    Image.fromarray(rgb[:height]).save(png)
    return height


def main(argv: list[str] | None = None) -> None:
    """`python -m loopscope.render.screenshots [HTML_DIR] [PNG_DIR]`: one PNG per page."""
    parser = argparse.ArgumentParser(prog="python -m loopscope.render.screenshots")
    parser.add_argument("html_dir", nargs="?", type=Path, default=paths.REPORTS_HTML)
    parser.add_argument("png_dir", nargs="?", type=Path,
                        default=paths.REPORTS / "screenshots")
    parser.add_argument("--width", type=int, default=SCREENSHOT_WIDTH)
    parser.add_argument("--height", type=int, default=SCREENSHOT_MAX_HEIGHT,
                        help="the tallest page the viewport holds (px)")
    args = parser.parse_args(argv)
    pages = sorted(args.html_dir.glob("*.html"))
    if not pages:
        sys.exit(f"no *.html in {args.html_dir}: render the reports first (dvc repro)")
    for page in pages:
        png = args.png_dir / f"{page.stem}.png"
        height = screenshot(page, png, args.width, args.height)
        print(f"{png}: {args.width} x {height} px")


if __name__ == "__main__":
    main()
