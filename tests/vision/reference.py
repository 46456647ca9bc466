"""The reference for tests/vision_reference.rs: what transformers' Qwen-VL image processor
makes of images, written as JSON on stdout.

    python tests/vision/reference.py OUT_DIR

1. `smart_resize` over every size from 1x1 to 330x330 (108,900 sizes) for three processors:
   Qwen2-VL's (factor 28), Qwen3-VL's (factor 32), and one with a small `max_pixels`, so that
   every branch of the function runs.
2. Images written with Pillow into OUT_DIR in every format the proxy reads, with every EXIF
   orientation a JPEG, a PNG and a WebP can carry, each loaded as vLLM loads it
   (`ImageOps.exif_transpose`) and run through the real processor: its `image_grid_thw`.
"""

import io
import json
import os
import sys

from PIL import Image, ImageOps
from transformers import Qwen2VLImageProcessor
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

PROCESSORS = {
    "qwen2-vl": dict(patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=56 * 56,
                     max_pixels=28 * 28 * 16384),
    "qwen3-vl": dict(patch_size=16, merge_size=2, temporal_patch_size=2, min_pixels=65536,
                     max_pixels=16777216),
    "small-max": dict(patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=56 * 56,
                      max_pixels=28 * 28 * 40),
}
SIDE = 330
SIZES = [(57, 31), (100, 60), (640, 480), (31, 1000), (1, 150), (4, 5), (1300, 977)]


def resized_grid() -> dict:
    out = {}
    for name, p in PROCESSORS.items():
        factor = p["patch_size"] * p["merge_size"]
        rows = []
        for h in range(1, SIDE + 1):
            row = []
            for w in range(1, SIDE + 1):
                try:
                    row.append(list(smart_resize(h, w, factor, p["min_pixels"], p["max_pixels"])))
                except ValueError:
                    row.append(None)
            rows.append(row)
        out[name] = rows
    return out


def exif(orientation: int) -> bytes:
    data = Image.Exif()
    data[0x0112] = orientation
    return data.tobytes()


def images(out_dir: str) -> list:
    written = []
    for width, height in SIZES:
        base = Image.new("RGB", (width, height), (200, 30, 90))
        for fmt, ext, orientations in (("PNG", "png", range(1, 9)), ("JPEG", "jpg", range(1, 9)),
                                       ("WEBP", "webp", range(1, 9)), ("GIF", "gif", [None]),
                                       ("BMP", "bmp", [None])):
            for orientation in orientations:
                buffer = io.BytesIO()
                extra = {} if orientation is None else {"exif": exif(orientation)}
                base.save(buffer, fmt, **extra)
                name = f"{width}x{height}-{orientation or 0}.{ext}"
                with open(os.path.join(out_dir, name), "wb") as f:
                    f.write(buffer.getvalue())
                loaded = ImageOps.exif_transpose(Image.open(io.BytesIO(buffer.getvalue())))
                grids = {}
                for proc_name, p in PROCESSORS.items():
                    kwargs = {k: v for k, v in p.items() if k not in ("min_pixels", "max_pixels")}
                    processor = Qwen2VLImageProcessor(
                        size={"shortest_edge": p["min_pixels"], "longest_edge": p["max_pixels"]},
                        **kwargs)
                    try:
                        grid = processor(images=[loaded.convert("RGB")], return_tensors="pt")
                        grids[proc_name] = grid["image_grid_thw"][0].tolist()
                    except ValueError:
                        grids[proc_name] = None
                written.append({"file": name, "size": list(loaded.size), "grids": grids})
    return written


def main() -> None:
    out_dir = sys.argv[1]
    json.dump({"processors": PROCESSORS, "side": SIDE, "resized": resized_grid(),
               "images": images(out_dir)}, sys.stdout)


if __name__ == "__main__":
    main()
