"""The docs' screenshots, made small enough to commit: `make screenshots` runs the real-browser test with
MINILLM_SCREENSHOTS set, then this on its pictures.

    python docs/shrink_screenshots.py SOURCE_DIR docs/images/app

Each page is a 1500-pixel-wide capture; what a reader needs is its top (the page's controls and first
charts), legible. So each picture is cut below its last non-blank row and at most MAX_HEIGHT rows of the
capture, scaled to WIDTH pixels, and stored as a PNG of COLOURS palette colours (Streamlit's flat colours survive
that): a few tens of KB instead of a few hundred.
"""
import sys
from pathlib import Path

from PIL import Image, ImageChops

WIDTH = 880
MAX_HEIGHT = 1300  # rows of the 1500-pixel-wide capture kept, at most, unless a page keeps more
COLOURS = 48
# The pictures the docs show (docs/visualizer.md, one a page): picture -> (capture under SOURCE_DIR, rows kept).
# The chat is the real model's (the README's picture), taken in a run of its own; every other page runs tiny.
PAGES = {
    "live_mid_run": ("live_mid_run", MAX_HEIGHT), "timeline": ("timeline", MAX_HEIGHT),
    "memory": ("memory", MAX_HEIGHT), "chat_smollm2": ("smollm2/chat", 1450),
    "speculative": ("speculative", MAX_HEIGHT), "quantization": ("quantization", MAX_HEIGHT),
    "kernels_paged_decode": ("kernels_paged_decode", MAX_HEIGHT), "serving": ("serving", MAX_HEIGHT),
    "cluster": ("cluster", MAX_HEIGHT), "roofline": ("roofline", MAX_HEIGHT),
    "my_notebook_switch": ("my_notebook_switch", MAX_HEIGHT),
}


def shrink(source: Path, target: Path, max_height: int = MAX_HEIGHT) -> int:
    """Crop, scale and quantize one capture; -> the bytes written."""
    image = Image.open(source).convert("RGB")
    background = Image.new("RGB", image.size, image.getpixel((image.width - 1, image.height - 1)))
    content = ImageChops.difference(image, background).getbbox()  # the box holding everything not blank
    bottom = min(content[3] + 16 if content else image.height, max_height, image.height)
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
    missing = [capture for capture, _ in PAGES.values() if not (source / f"{capture}.png").is_file()]
    if missing:
        print(f"{source} lacks the screenshots {', '.join(missing)}: did the browser test pass?", file=sys.stderr)
        return 1
    target.mkdir(parents=True, exist_ok=True)
    total = 0
    for name, (capture, rows) in PAGES.items():
        size = shrink(source / f"{capture}.png", target / f"{name}.png", rows)
        total += size
        print(f"{target / name}.png: {size / 1024:.0f} KB")
    print(f"{len(PAGES)} pictures, {total / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
