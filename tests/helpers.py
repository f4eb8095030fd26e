"""Helpers shared by the tests: the repository root, a tiny Llama config and small preference batches."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from lightning.pytorch.callbacks import Callback

from lit_prunedpo.batch import PreferenceBatch, collate_pairs
from lit_prunedpo.models import ModelSource
from lit_prunedpo.samplers import PositionSampler, PrefixSampler

REPO = Path(__file__).resolve().parents[1]
#: Pruning modes: overlays in configs/modes/ composed after configs/quickstart.yaml.
MODES = ("vanilla", "branch", "sequence", "position", "position-bernoulli", "all")


def config_args(name: str) -> list[str]:
    """The ``--config`` arguments that run a shipped config: a mode overlay composes after the quickstart."""
    if name in MODES:
        return ["--config", str(REPO / "configs/quickstart.yaml"), "--config", str(REPO / f"configs/modes/{name}.yaml")]
    return ["--config", str(REPO / f"configs/{name}.yaml")]


def csv_logger(root) -> list[str]:
    """CLI arguments for a ``CSVLogger`` under ``root``, for a test that reads ``metrics.csv``.

    Lightning's default logger is TensorBoard's whenever ``tensorboard`` is installed, and that one writes no
    ``metrics.csv``: a test that names its logger passes whatever else is installed.
    """
    return ["--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.init_args.save_dir={root}"]


TINY_LLAMA = dict(
    vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
)


def make_batch(prompt_lengths, chosen_lengths, rejected_lengths, vocab=32, seed=0) -> PreferenceBatch:
    """Random pairs with the given lengths (tokens avoid the pad id 0)."""
    g = torch.Generator().manual_seed(seed)
    tok = lambda n: (torch.randint(1, vocab, (n,), generator=g)).tolist()  # noqa: E731
    examples = [
        {"prompt_ids": tok(p), "chosen_ids": tok(c), "rejected_ids": tok(r), "index": i}
        for i, (p, c, r) in enumerate(zip(prompt_lengths, chosen_lengths, rejected_lengths, strict=True))
    ]
    return collate_pairs(examples, pad_id=0)


class RecordWork(Callback):
    """Each training step's (branches back-propagated, unpruned branches, positions scored, unpruned positions)."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, int, int, int]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        s = pl_module.step_stats
        self.steps.append((s.branches_backpropagated, s.unpruned_branches, s.positions_scored, s.unpruned_positions))


class Built(ModelSource):
    """A model source that hands out copies of an already built model (a zoo architecture, a patched model)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def build(self) -> torch.nn.Module:
        return copy.deepcopy(self.model)


class KillAt(Callback):
    """Kills its own process with SIGKILL (no handler runs, as an out-of-memory kill) when training reaches ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        if trainer.global_step >= self.step:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGKILL)


def fill_disk(folder) -> None:
    """Fill the file system of ``folder`` to the last byte with one file, ``filler`` (unbuffered writes: nothing is
    left to flush once it is full)."""
    import errno
    import os

    fd = os.open(os.path.join(folder, "filler"), os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError as err:
        assert err.errno == errno.ENOSPC, err
    finally:
        os.close(fd)


class ForcedPrefix(PrefixSampler):
    """Draws fixed kept lengths, reports another sampler's survival (to enumerate that sampler's outcomes)."""

    def __init__(self, kept, like):
        self.kept, self.like = kept, like

    def draw(self, lengths, generator):
        return self.kept

    def survival(self, lengths, width):
        return self.like.survival(lengths, width)


class ForcedPositions(PositionSampler):
    """Draws a fixed mask, reports another sampler's inclusion probabilities."""

    def __init__(self, mask, like):
        self.mask, self.like = mask, like

    def inclusion(self, kept, width):
        return self.like.inclusion(kept, width)

    def draw(self, kept, width, generator):
        return self.mask


def score_groups(scorer, model, batch, groups, layout=None, reuse_keys_values=True):
    """The policy log-probs of a plan's ``groups``, in order, run by a ``StepExecutor`` with ``layout``: the step's
    policy forwards without the rest of the step."""
    from lit_prunedpo.step.execute import StepExecutor
    from lit_prunedpo.layout import PairLengths

    executor = StepExecutor(layout, reuse_keys_values)
    return executor.run_policy(model, scorer, batch, executor.forwards(groups, PairLengths.of(batch)))


def score_policy(module, batch, group):
    """The policy's log-probs of one group, alone in its forward, laid out as ``module`` lays its steps out."""
    return score_groups(module.scorer, module.policy, batch, [group], module.resolved_layout())[0]
