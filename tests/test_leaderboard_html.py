"""The HTML board in a real headless Chromium: a screenshot that is not blank, and the inline JS
sorting the table (the page's #sort=N hash clicks a header on load; --dump-dom shows the result)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from attune.leaderboard import best_rows, render_html
from attune.leaderboard.rows import Board
from test_store import make_entry

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (CI installs it in .ci/run; "
                                "locally: apt-get install -y chromium)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def demo_board() -> Board:
    torch12 = {"torch": "2.12.0", "torchtitan": "0.3.0"}
    entries = [
        make_entry(8450, levers={"parallelism.tensor_parallel_degree": 1, "training.local_batch_size": 4,
                                 "activation_checkpoint.mode": "selective"}),
        make_entry(9710, gpus=64, simulated=False, mfu=0.47, mlflow_run_id="6f1d2c9e0b7a4d3e8c5f1a2b3c4d5e6f"),
        make_entry(3120, model="llama3.1-70b", gpus=64, mfu=0.52, step_time_s=9.8, peak_memory_gib=71.3,
                   levers={"parallelism.tensor_parallel_degree": 8, "parallelism.pipeline_parallel_degree": 2}),
        make_entry(2875, model="llama3.1-70b", accelerator="h200", gpus=64, stack=torch12, simulated=False),
        make_entry(5230, model="qwen3-30b-a3b", accelerator="b200", mfu=None, step_time_s=None,
                   levers={"parallelism.expert_parallel_degree": 8}),
        make_entry(1890, model="deepseek-v3-16b", accelerator="a100", gpus=16, mfu=0.33),
    ]
    return Board(generated_at="2026-12-01T09:00:00+00:00", sources=["demo"],
                 rows=best_rows([(e, "store") for e in entries]))


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    profile.mkdir()
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120)


def test_board_page_screenshot_in_headless_chromium(tmp_path):
    page = tmp_path / "index.html"
    page.write_text(render_html(demo_board()))
    shot = tmp_path / "leaderboard.png"
    proc = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,800", page.as_uri())
    assert shot.is_file() and shot.stat().st_size > 10_000, proc.stderr[-2000:]
    image = pytest.importorskip("PIL.Image").open(shot).convert("RGB")
    assert image.size == (1200, 800)
    pixels = [image.getpixel((x, y)) for x in range(0, 1200, 2) for y in range(0, 800, 2)]
    ink = sum(1 for r, g, b in pixels if r + g + b < 200) / len(pixels)
    amber = sum(1 for r, g, b in pixels if abs(r - 0xfd) < 6 and abs(g - 0xe8) < 6 and abs(b - 0xc4) < 6)
    assert ink > 0.005, "the screenshot has (almost) no text"
    assert amber > 50, "no 'simulated' badge visible"


def test_inline_js_sorts_the_table(tmp_path):
    page = tmp_path / "index.html"
    page.write_text(render_html(demo_board()))
    # column 3 is tokens/s/GPU; "-" sorts it descending
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri() + "#sort=-3").stdout
    rows = re.findall(r'<tr class="(?:sim|hw)"[^>]*>(.*?)</tr>', dom)
    # cells carrying data-v: rank, cluster, tokens/s/GPU, ...: the third is the throughput
    shown = [float(re.findall(r'data-v="([^"]*)"', row)[2]) for row in rows]
    assert shown == sorted(shown, reverse=True) and len(shown) == 6, dom[-3000:]
    assert 'aria-sort="descending"' in dom
