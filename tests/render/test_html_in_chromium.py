"""The pages ``--html`` writes, opened in a real headless Chromium (the distribution's package): plotly
draws every figure (its SVG in the DOM), the screenshot is not blank, no script error reaches the console,
and the page requests nothing from the network (Chromium's own net log, the page's requests only)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zerocalc.cli import app

pytest.importorskip("plotly", reason="the html extra (pip install 'zerocalc[html]') draws the figures")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium; .ci/run does)"
    ),
]

CHECKS = {
    name: line.split()[1:]
    for name, line in {
        "plan": "zerocalc plan --model llama-3-8b --gpu h100-80gb --gpus 16 --global-batch 1048576 "
        "--seq-len 8192",
        "memory": "zerocalc memory --model llama-3-8b --gpus 8 --framework fsdp2 --gpu h100-80gb",
        "comm": "zerocalc comm --model llama-3-8b --gpus 8 --framework fsdp2 --gpu h100-80gb",
    }.items()
}
"""The commands of the check (comm with memory's spelling)."""
FIGURES = {"plan": 1, "memory": 1, "comm": 1}
"""Figures on each page."""
QUIET = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
QUIET += ["--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]
QUIET += ["--host-resolver-rules=MAP * ~NOTFOUND"]  # nothing leaves the machine, whatever is requested


def _chromium(page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as profile:
        assert CHROMIUM is not None
        command = [CHROMIUM, *QUIET, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args]
        return subprocess.run([*command, page.as_uri()], capture_output=True, text=True, timeout=120)


def _console_errors(stderr: str) -> list[str]:
    """The page's console messages that are errors (Chromium logs each as ``CONSOLE…] "message"``)."""
    return [
        line for line in stderr.splitlines() if "CONSOLE" in line and ("Uncaught" in line or "rror" in line)
    ]


def _page_requests(net_log: Path) -> list[str]:
    """The URLs the page (origin file://) asked for, from Chromium's net log; Chromium's own service
    requests (update checks, accounts) have no page origin and are not the page's."""
    log = json.loads(net_log.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = []
    for event in log["events"]:
        params = event.get("params", {})
        if event["type"] == start and str(params.get("network_isolation_key", "")).startswith("file://"):
            urls.append(params["url"])
    return urls


def _distinct_colours(png: Path) -> int:
    """Distinct pixel colours of an 8-bit RGB or RGBA, non-interlaced PNG (Chromium's screenshots), read
    with the standard library (PNG specification, filters 0-4)."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks, header = 8, [], b""
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    width, height = int.from_bytes(header[0:4], "big"), int.from_bytes(header[4:8], "big")
    depth, colour, interlace = header[8], header[9], header[12]
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * channels
    previous = bytearray(stride)
    colours = set()
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        colours.update(bytes(line[i : i + 3]) for i in range(0, stride, channels * 4))  # every 4th pixel
        previous = line
    return len(colours)


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pages")
    written = {}
    for name, args in CHECKS.items():
        path = folder / f"{name}.html"
        result = CliRunner().invoke(app, [*args, "--html", str(path)])
        assert result.exit_code == 0, result.output
        written[name] = path
    return written


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_plotly_draws_every_figure_with_no_script_error(name: str, pages: dict[str, Path]) -> None:
    result = _chromium(pages[name], "--dump-dom", "--virtual-time-budget=5000")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count('class="main-svg"') >= 2 * FIGURES[name]  # plotly's two SVG layers per plot
    assert 'class="plot-container plotly"' in result.stdout
    assert _console_errors(result.stderr) == []


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_screenshot_is_a_picture_and_nothing_is_requested(
    name: str, pages: dict[str, Path], tmp_path: Path
) -> None:
    shot, net_log = tmp_path / "shot.png", tmp_path / "net.json"
    result = _chromium(
        pages[name], f"--screenshot={shot}", "--window-size=1000,600", f"--log-net-log={net_log}"
    )
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    assert _distinct_colours(shot) > 200  # a blank page has 1, a page of text a few dozen
    assert _page_requests(net_log) == []
    assert _console_errors(result.stderr) == []


def test_the_checks_see_a_script_error_a_request_and_a_blank_page(tmp_path: Path) -> None:
    """The same checks on a page that fails each: they are not blind."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><html><body><img src="http://example.invalid/x.png">'
        '<script>throw new Error("kaboom");</script></body></html>'
    )
    shot, net_log = tmp_path / "shot.png", tmp_path / "net.json"
    result = _chromium(
        bad,
        f"--screenshot={shot}",
        "--window-size=1000,600",
        f"--log-net-log={net_log}",
    )
    assert _page_requests(net_log) == ["http://example.invalid/x.png"]
    assert any("kaboom" in line for line in _console_errors(result.stderr))
    assert _distinct_colours(shot) < 50
