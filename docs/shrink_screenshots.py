"""The docs' screenshots, made small enough to commit: `make screenshots` runs the real-browser test with
MINILLM_SCREENSHOTS set, then this on its pictures.

    python docs/shrink_screenshots.py SOURCE_DIR docs/images/app

Each page is a 1500-pixel-wide full-page capture; what a reader needs is its top (the page's controls and first
charts), legible. So each picture is cut below its last non-blank row and at most MAX_HEIGHT rows of the
capture, scaled to WIDTH pixels, and stored as a PNG of COLOURS palette colours (Streamlit's flat colours survive
that): a few tens of KB instead of a few hundred.
"""
import sys
from pathlib import Path

from PIL import Image, ImageChops

WIDTH = 880
MAX_HEIGHT = 1300  # rows of the 1500-pixel-wide capture kept, at most
COLOURS = 48
# The pictures the docs show, one a page of docs/visualizer.md (the live page mid-run is the README's too).
PAGES = ("live_mid_run", "timeline", "memory", "chat", "speculative", "quantization", "kernels_paged_decode",
         "serving", "cluster", "roofline", "my_notebook_switch")


def shrink(source: Path, target: Path) -> int:
    """Crop, scale and quantize one capture; -> the bytes written."""
    image = Image.open(source).convert("RGB")
    background = Image.new("RGB", image.size, image.getpixel((image.width - 1, image.height - 1)))
    content = ImageChops.difference(image, background).getbbox()  # the box holding everything not blank
    bottom = min(content[3] + 16 if content else image.height, MAX_HEIGHT, image.height)
    image = image.crop((0, 0, image.width, bottom))
    if image.width > WIDTH:
        image = image.resize((WIDTH, round(image.height * WIDTH / image.width)), Image.Resampling.LANCZOS)
    image.quantize(COLOURS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(target, optimize=True)
    return target.stat().st_size


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    source, target = Path(argv[0]), Path(argv[1])
    missing = [name for name in PAGES if not (source / f"{name}.png").is_file()]
    if missing:
        print(f"{source} lacks the screenshots {', '.join(missing)}: did the browser test pass?", file=sys.stderr)
        return 1
    target.mkdir(parents=True, exist_ok=True)
    total = 0
    for name in PAGES:
        size = shrink(source / f"{name}.png", target / f"{name}.png")
        total += size
        print(f"{target / name}.png: {size / 1024:.0f} KB")
    print(f"{len(PAGES)} pictures, {total / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
