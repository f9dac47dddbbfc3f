"""The board as one static HTML file: inline CSS and JS (no CDN, works from file:// and from S3),
a table sortable by any column, a model filter, simulated rows labelled in every row."""

from __future__ import annotations

from html import escape

from attune.leaderboard.render import COST_NOTE, EMPTY_NOTE, SIM_NOTE, fmt_cost, fmt_levers, fmt_mfu, fmt_tps
from attune.leaderboard.rows import Board, BoardRow

# (header, numeric?) in column order; the cells come from _cells in the same order.
COLUMNS = [("#", True), ("Model", False), ("Cluster", False), ("Tokens/s/GPU", True), ("MFU", True),
           ("$/M tokens", True), ("Step", True), ("Memory", True), ("Measured", False),
           ("Levers", False), ("Stack", False), ("Date", False), ("MLflow", False)]

CSS = """
:root { --ink:#1d2330; --muted:#5b6473; --line:#dde2ea; --head:#f3f5f9; --accent:#2d5bd7; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 20px; font: 13px/1.45 system-ui, -apple-system, "Segoe UI", Roboto,
       "DejaVu Sans", sans-serif; color: var(--ink); background: #fff; }
h1 { margin: 0 0 4px; font-size: 24px; }
p { margin: 4px 0; color: var(--muted); }
.bar { display: flex; gap: 16px; align-items: center; margin: 16px 0 10px; }
.bar input { padding: 6px 10px; border: 1px solid var(--line); border-radius: 6px; font: inherit; width: 320px; }
.scroll { overflow-x: auto; }
.count { color: var(--muted); }
table { border-collapse: collapse; width: 100%; }
th, td { padding: 6px 7px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { background: var(--head); position: sticky; top: 0; font-weight: 600; white-space: nowrap; }
th button { all: unset; cursor: pointer; }
th button:focus-visible { outline: 2px solid var(--accent); }
th[aria-sort=ascending] button::after { content: " \\25B2"; font-size: 10px; }
th[aria-sort=descending] button::after { content: " \\25BC"; font-size: 10px; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tbody tr:nth-child(even) { background: #fafbfd; }
tr.sim td { background: #fffaf0; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600; }
.badge.sim { background: #fde8c4; color: #7a4a00; }
.badge.hw { background: #d7f2df; color: #14532d; }
.small { font-size: 12px; color: var(--muted); max-width: 180px; }
.nowrap { white-space: nowrap; }
.empty { padding: 28px; text-align: center; color: var(--muted); }
footer { margin-top: 18px; font-size: 12px; color: var(--muted); }
"""

JS = r"""
(function () {
  var table = document.getElementById("board");
  var body = table.tBodies[0];
  var heads = table.tHead.rows[0].cells;
  function value(row, col, numeric) {
    var cell = row.cells[col];
    var raw = cell.getAttribute("data-v");
    if (raw === null) raw = cell.textContent;
    return numeric ? parseFloat(raw) : raw.toLowerCase();
  }
  Array.prototype.forEach.call(heads, function (th, col) {
    th.querySelector("button").addEventListener("click", function () {
      var ascending = th.getAttribute("aria-sort") !== "ascending";
      var numeric = th.classList.contains("num");
      Array.prototype.forEach.call(heads, function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
      var rows = Array.prototype.slice.call(body.rows).filter(function (r) { return !r.classList.contains("none"); });
      rows.sort(function (a, b) {
        var x = value(a, col, numeric), y = value(b, col, numeric);
        if (numeric && isNaN(x) !== isNaN(y)) return isNaN(x) ? 1 : -1;  // blanks last either way
        return (x < y ? -1 : x > y ? 1 : 0) * (ascending ? 1 : -1);
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
  var filter = document.getElementById("filter");
  var count = document.getElementById("count");
  function apply() {
    var needle = filter.value.trim().toLowerCase(), shown = 0;
    Array.prototype.forEach.call(body.rows, function (r) {
      if (r.classList.contains("none")) return;
      var hit = r.textContent.toLowerCase().indexOf(needle) >= 0;
      r.hidden = !hit; if (hit) shown += 1;
    });
    count.textContent = shown + " row" + (shown === 1 ? "" : "s");
  }
  filter.addEventListener("input", apply);
  apply();
  // index.html#sort=N sorts by column N ascending on load, #sort=-N descending (links, tests).
  var wanted = /^#sort=(-?)(\d+)$/.exec(window.location.hash);
  if (wanted && heads[+wanted[2]]) {
    var button = heads[+wanted[2]].querySelector("button");
    button.click();
    if (wanted[1]) button.click();
  }
})();
"""


def render_html(board: Board) -> str:
    head = "".join(f'<th scope="col" class="{"num" if numeric else "text"}"><button type="button">'
                   f'{escape(name)}</button></th>' for name, numeric in COLUMNS)
    if board.rows:
        body = "\n".join(_row_html(row) for row in board.rows)
    else:
        body = f'<tr class="none"><td class="empty" colspan="{len(COLUMNS)}">{escape(EMPTY_NOTE)}</td></tr>'
    simulated = sum(row.simulated for row in board.rows)
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(board.title)}</title>
<style>{CSS}</style>
</head>
<body>
<h1>{escape(board.title)}</h1>
<p>Fastest recipe per model and cluster that passed ATTUNE's correctness gate
(# ranks the clusters of one model). Click a column header to sort.</p>
<p><span class="badge sim">simulated</span> {escape(SIM_NOTE)} ({simulated} of {len(board.rows)} rows)</p>
<div class="bar"><input id="filter" type="search" placeholder="Filter rows (model, cluster, lever…)"
 aria-label="Filter rows"><span id="count" class="count"></span></div>
<div class="scroll"><table id="board">
<thead><tr>{head}</tr></thead>
<tbody>
{body}
</tbody>
</table></div>
<footer>{escape(COST_NOTE)}<br>Generated {escape(board.generated_at)}.</footer>
<script>{JS}</script>
</body>
</html>
"""


def _row_html(row: BoardRow) -> str:
    cells = "".join(_cell(text, sort, numeric, cls) for text, sort, numeric, cls in _cells(row))
    return f'<tr class="{"sim" if row.simulated else "hw"}">{cells}</tr>'


def _cells(row: BoardRow) -> list[tuple[str, str | None, bool, str]]:
    """(shown text or HTML-safe markup, sort value, numeric, extra class) per column."""
    badge = ('<span class="badge sim">simulated</span>' if row.simulated
             else '<span class="badge hw">hardware</span>')
    return [
        (str(row.rank), str(row.rank), True, ""),
        (f"<strong>{escape(row.model)}</strong>", None, False, "nowrap"),
        (escape(f"{row.accelerator} × {row.gpus}"), f"{row.accelerator}:{row.gpus:06d}", False, "nowrap"),
        (fmt_tps(row.tokens_per_sec_per_gpu), repr(row.tokens_per_sec_per_gpu), True, ""),
        (fmt_mfu(row.mfu), "" if row.mfu is None else repr(row.mfu), True, ""),
        (fmt_cost(row.cost_per_million_tokens), repr(row.cost_per_million_tokens), True, ""),
        ("–" if row.step_time_s is None else f"{row.step_time_s:.2f} s",
         "" if row.step_time_s is None else repr(row.step_time_s), True, ""),
        ("–" if row.peak_memory_gib is None else f"{row.peak_memory_gib:.1f} GiB",
         "" if row.peak_memory_gib is None else repr(row.peak_memory_gib), True, ""),
        (badge, "simulated" if row.simulated else "hardware", False, ""),
        (escape(fmt_levers(row.levers)), None, False, "small"),
        ("<br>".join(escape(f"{k} {v}") for k, v in sorted(row.stack.items())), None, False, "small nowrap"),
        (f'<span title="{escape(row.measured_at)}">{escape(row.measured_at[:10])}</span>', row.measured_at,
         False, "small nowrap"),
        (_run_id(row.mlflow_run_id), row.mlflow_run_id or "", False, "small"),
    ]


def _run_id(run_id: str | None) -> str:
    """MLflow run ids are 32 hex digits: show 8, the whole id on hover."""
    if not run_id:
        return "–"
    short = run_id if len(run_id) <= 10 else run_id[:8] + "…"
    return f'<code title="{escape(run_id)}">{escape(short)}</code>'


def _cell(content: str, sort: str | None, numeric: bool, cls: str) -> str:
    classes = " ".join(c for c in ("num" if numeric else "", cls) if c)
    attrs = (f' class="{classes}"' if classes else "") + (f' data-v="{escape(sort)}"' if sort is not None else "")
    return f"<td{attrs}>{content}</td>"
