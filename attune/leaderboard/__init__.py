"""TrainingThroughputBench: rows from the recipe store (plus the committed seed board), rendered as
Markdown, JSON or one static HTML page."""

from attune.leaderboard.html import render_html
from attune.leaderboard.render import render_json, render_md
from attune.leaderboard.rows import SEED_DIR, TITLE, Board, BoardRow, best_rows, board_json, load_board

RENDERERS = {"md": render_md, "html": render_html, "json": render_json}
# Where `attune leaderboard publish` puts the board inside a store.
PUBLISHED = {"html": "leaderboard/index.html", "json": "leaderboard/leaderboard.json",
             "md": "leaderboard/leaderboard.md"}


def render(board: Board, fmt: str) -> str:
    return RENDERERS[fmt](board)


def publish(board: Board, store) -> list[str]:
    """Write the board in every format into `store` (a RecipeStore); returns where each went."""
    return [store.put_blob(key, render(board, fmt).encode()) for fmt, key in PUBLISHED.items()]


__all__ = ["Board", "BoardRow", "PUBLISHED", "RENDERERS", "SEED_DIR", "TITLE", "best_rows", "board_json",
           "load_board", "publish", "render", "render_html", "render_json", "render_md"]
