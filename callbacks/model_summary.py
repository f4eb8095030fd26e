"""Lightning's model summary without a FLOPs column of zeros.

Lightning 2.6 counts FLOPs by running the model on ``example_input_array``; a module without one (``PrunedDPO``: its
batches are token pairs of varying length, and a step's cost depends on what the samplers drew) gets a ``FLOPs``
column of ``0`` and ``Total FLOPs: 0``, which read as a measurement. :class:`RichSummaryWithoutZeroFlops` and
:class:`SummaryWithoutZeroFlops` print the same summary without them when nothing was counted (and Lightning's own
when something was). The ``lit-prunedpo`` command puts them in place of Lightning's default summary (never of
one a config names); what a step costs is in ``time/step_s`` and the ``throughput/*`` metrics.
"""

from __future__ import annotations

import logging
from typing import Any

from lightning.pytorch.callbacks import ModelSummary, RichModelSummary
from lightning.pytorch.utilities.model_summary.model_summary import (
    _format_summary_table,
    get_formatted_model_size,
    get_human_readable_count,
)
from typing_extensions import override

log = logging.getLogger("lightning.pytorch.callbacks.model_summary")


def _without_flops(summary_data: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    return [(name, values) for name, values in summary_data if name != "FLOPs"]


class RichSummaryWithoutZeroFlops(RichModelSummary):
    """``RichModelSummary`` without the ``FLOPs`` column and total when no FLOPs were counted."""

    @staticmethod
    @override
    def summarize(summary_data: list[tuple[str, list[str]]], total_parameters: int, trainable_parameters: int,
                  model_size: float, total_training_modes: dict[str, int], total_flops: int,
                  **summarize_kwargs: Any) -> None:
        if total_flops:
            return RichModelSummary.summarize(summary_data, total_parameters, trainable_parameters, model_size,
                                              total_training_modes, total_flops, **summarize_kwargs)
        from rich import get_console
        from rich.table import Table

        summary_data = _without_flops(summary_data)
        console = get_console()
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        table.add_column(" ", style="dim")
        for name, _ in summary_data[1:]:  # the first column is the row index
            justify = "left" if name in ("Name", "Type", "Mode") else "right"
            table.add_column(name, justify=justify, no_wrap=name == "Name")
        for row in zip(*(values for _, values in summary_data)):
            table.add_row(*row)
        console.print(table)
        grid = Table.grid(expand=True)
        grid.add_column()
        rows = [("Trainable params", get_human_readable_count(int(trainable_parameters))),
                ("Non-trainable params", get_human_readable_count(int(total_parameters - trainable_parameters))),
                ("Total params", get_human_readable_count(int(total_parameters))),
                ("Total estimated model params size (MB)", get_formatted_model_size(model_size)),
                ("Modules in train mode", total_training_modes["train"]),
                ("Modules in eval mode", total_training_modes["eval"])]
        for name, value in rows:
            grid.add_row(f"[bold]{name}[/]: {value}")
        console.print(grid)
        return None


class SummaryWithoutZeroFlops(ModelSummary):
    """``ModelSummary`` (the plain-text one) without the ``FLOPs`` column and total when no FLOPs were counted."""

    @staticmethod
    @override
    def summarize(summary_data: list[tuple[str, list[str]]], total_parameters: int, trainable_parameters: int,
                  model_size: float, total_training_modes: dict[str, int], total_flops: int,
                  **summarize_kwargs: Any) -> None:
        if total_flops:
            return ModelSummary.summarize(summary_data, total_parameters, trainable_parameters, model_size,
                                          total_training_modes, total_flops, **summarize_kwargs)
        table = _format_summary_table(total_parameters, trainable_parameters, model_size, total_training_modes,
                                      total_flops, *_without_flops(summary_data))
        log.info("\n" + "\n".join(line for line in table.splitlines() if not line.rstrip().endswith("Total Flops")))
        return None
