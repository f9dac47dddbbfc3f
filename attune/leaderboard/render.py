"""Text renderings of the board: Markdown and JSON, and the cell formats the HTML page shares."""

from __future__ import annotations

import json

from attune.leaderboard.rows import Board, board_json

COST_NOTE = ("Cost per million tokens = price per GPU-hour × GPUs ÷ tokens per hour × 10⁶ "
             "(prices: attune/data/accelerators.toml, override with ATTUNE_PRICES or the recipe's "
             "[cluster] price_per_gpu_hour).")
SIM_NOTE = "Rows marked simulated were measured on ATTUNE's cluster simulator, not on real GPUs."
EMPTY_NOTE = "No verified recipes yet: a campaign that passes the correctness gate adds its recipe here."


# Short names for the board's lever column (JSON keeps the full keys): the usual abbreviations, and
# the parallelism./training. sections dropped where the field name alone is unambiguous.
SHORT = {"parallelism.tensor_parallel_degree": "tp", "parallelism.pipeline_parallel_degree": "pp",
         "parallelism.context_parallel_degree": "cp", "parallelism.expert_parallel_degree": "ep",
         "parallelism.data_parallel_shard_degree": "dp_shard",
         "parallelism.data_parallel_replicate_degree": "dp_replicate", "activation_checkpoint.mode": "ac_mode",
         "parallelism.pipeline_parallel_schedule": "pp_schedule",
         "parallelism.pipeline_parallel_microbatch_size": "pp_microbatch"}


def lever_name(key: str) -> str:
    return SHORT.get(key) or key.removeprefix("parallelism.").removeprefix("training.")


def fmt_levers(levers: dict) -> str:
    return ", ".join(f"{lever_name(key)}={value}" for key, value in sorted(levers.items())) or "defaults"


def fmt_stack(stack: dict) -> str:
    return " · ".join(f"{name} {version}" for name, version in sorted(stack.items()))


def fmt_mfu(mfu: float | None) -> str:
    return "–" if mfu is None else f"{mfu * 100:.1f}%"


def fmt_tps(tps: float) -> str:
    return f"{tps:,.0f}"


def fmt_cost(cost: float) -> str:
    return f"${cost:.4f}" if cost < 1 else f"${cost:,.2f}"


def render_json(board: Board) -> str:
    return json.dumps(board_json(board), indent=2) + "\n"


def render_md(board: Board) -> str:
    lines = [f"# {board.title}", "",
             "Fastest recipe per model and cluster that passed ATTUNE's correctness gate.", ""]
    if not board.rows:
        lines += [f"_{EMPTY_NOTE}_", ""]
    else:
        lines += ["| # | model | cluster | tokens/s/GPU | MFU | $/M tokens | measured on | levers | stack "
                  "| measured at | MLflow run |",
                  "|---:|---|---|---:|---:|---:|---|---|---|---|---|"]
        for row in board.rows:
            on = "**simulated**" if row.simulated else "hardware"
            cells = [str(row.rank), row.model, f"{row.accelerator} × {row.gpus}", fmt_tps(row.tokens_per_sec_per_gpu),
                     fmt_mfu(row.mfu), fmt_cost(row.cost_per_million_tokens), on, fmt_levers(row.levers),
                     fmt_stack(row.stack), row.measured_at, row.mlflow_run_id or "–"]
            lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
        lines.append("")
    lines += [SIM_NOTE, "", COST_NOTE, "", f"_Generated {board.generated_at}._", ""]
    return "\n".join(lines)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
