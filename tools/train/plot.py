"""Loss curves as a PNG without plotting libraries: polylines on a white canvas, written with zlib."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

COLORS = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189))


def _png(pixels: bytearray, width: int, height: int) -> bytes:
    def chunk(tag: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
        )

    rows = b"".join(b"\x00" + bytes(pixels[y * width * 3 : (y + 1) * width * 3]) for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows, 9))
        + chunk(b"IEND", b"")
    )


def plot_curves(
    curves: Sequence[Sequence[tuple[float, float]]], path: str | Path, width: int = 640, height: int = 400
) -> None:
    """Each curve a list of (x, y) points; shared axes spanning all points, grey frame and y gridlines
    at integer values. Colours in order: blue, red, green, purple."""
    pixels = bytearray(b"\xff" * (width * height * 3))
    pts = [p for c in curves for p in c]
    if not pts:
        raise ValueError("nothing to plot")
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
    pad = 20

    def put(x: int, y: int, rgb: tuple[int, int, int]) -> None:
        if 0 <= x < width and 0 <= y < height:
            i = (y * width + x) * 3
            pixels[i : i + 3] = bytes(rgb)

    def to_px(x: float, y: float) -> tuple[int, int]:
        px = pad + (x - x0) / (x1 - x0) * (width - 2 * pad)
        py = height - pad - (y - y0) / (y1 - y0) * (height - 2 * pad)
        return round(px), round(py)

    for level in range(int(y0) + 1, int(y1) + 1):
        _, gy = to_px(x0, level)
        for x in range(pad, width - pad):
            put(x, gy, (225, 225, 225))
    for x in range(pad, width - pad + 1):
        put(x, pad, (128, 128, 128))
        put(x, height - pad, (128, 128, 128))
    for y in range(pad, height - pad + 1):
        put(pad, y, (128, 128, 128))
        put(width - pad, y, (128, 128, 128))
    for curve, rgb in zip(curves, COLORS):
        prev = None
        for x, y in curve:
            cur = to_px(x, y)
            if prev is not None:
                steps = max(abs(cur[0] - prev[0]), abs(cur[1] - prev[1]), 1)
                for s in range(steps + 1):
                    put(
                        round(prev[0] + (cur[0] - prev[0]) * s / steps),
                        round(prev[1] + (cur[1] - prev[1]) * s / steps),
                        rgb,
                    )
            prev = cur
    Path(path).write_bytes(_png(pixels, width, height))
