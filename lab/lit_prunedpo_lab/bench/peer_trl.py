"""TRL's ``DPOTrainer`` as a peer in the benchmark: its loss on the same weights, rows, batches and beta.

``lit-prunedpo-bench --peer trl,trl-online`` (``pip install -e ".[peer]"``) times, in every round, one step of TRL's
own DPO loss (``DPOTrainer.compute_loss``: the concatenated forward of chosen and rejected rows, log-probs of the
completion tokens, sigmoid loss), then ``backward`` and an AdamW step: the same work as this project's training step.
The Trainer's loop, logging and dataloader are not timed (this project's Lightning loop is not timed either). The
peers (:data:`PEERS`) differ in their reference:

* ``trl``: a **precomputed reference** (``precompute_ref_log_probs=True``, TRL's cheapest), computed in
  ``DPOTrainer.__init__`` (not timed);
* ``trl-online``: an **online reference** (``precompute_ref_log_probs=False``, ``ref_model`` a frozen copy of the
  same initial weights in the same dtype): TRL's no-grad reference forward runs inside every timed step, as in real
  TRL training;
* ``trl-online-checkpointing``: ``trl-online`` with activation checkpointing on, as a stock ``DPOConfig`` trains
  (its ``gradient_checkpointing`` defaults to ``True``; ``Trainer.train`` then calls the policy's
  ``activation_checkpointing_enable`` with the config's kwargs, and this peer makes the same call, since the bench
  never runs ``Trainer.train``): every decoder layer's forward runs again in backward. The other two peers leave it
  off, as a user who turns it off to trade memory for speed would.

Matched: the initial weights (the same ``FromConfig`` seed), every pair's tokens (TRL gets them pre-tokenized, so
its tokenizer and truncation never run: ``max_length=None``; both sides see exactly the same prompt and response
tokens, BOS included), the batches in the same order, ``beta`` and the learning rate. Departures from a stock
``DPOTrainer``: ``_prepare_dataset`` is bypassed for the pre-tokenized rows (TRL 1.16 re-tokenizes text columns
only), the rows are padded with the batches' pad id (TRL's collator given it: the pad id of ``--data``'s
tokenizer, or the synthetic batches'), which the masks leave out of every sum either way, and ``bf16=False``:
``DPOConfig`` defaults to bf16 mixed precision, under which accelerate wraps the reference (the precompute, and
``trl-online``'s ``ref_model``) in a bf16 autocast while the timed policy forward, called outside ``Trainer.train``,
runs without one. Off, the bench's ``--precision`` (:mod:`lit_prunedpo_lab.bench.precision`) applies to the peer
exactly as to this project's steps: parameters in its dtype; under ``bf16-mixed`` / ``16-mixed`` the peer's
``compute_loss`` (the policy's forward, ``trl-online``'s reference forward and the loss) runs under the same
``torch.autocast`` as this project's ``training_step``, backward and AdamW outside it (``16-mixed`` through a loss
scaler of the peer's own), and ``DPOTrainer.__init__`` (the ``trl`` peer's precompute) runs under that autocast
too, as this project's cached reference is built. ``Trainer.train`` would also cast the policy's outputs to float32
(accelerate's ``convert_outputs_to_fp32``); Lightning does not, and neither does the bench, on either side.

Every forward TRL runs in a step is recorded by a hook on its policy and reference (:class:`PeerForward`: the
``input_ids`` shape, padding included, and the positions its fused LM head scores), for the FLOP count of
:func:`lit_prunedpo_lab.bench.utilisation.peer_step_flops`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo_lab.bench.precision import Precision, resolve_precision

@dataclass(frozen=True)
class PeerKind:
    """What one ``--peer`` name runs: its reference (``online``: a frozen model in every step, else precomputed)
    and whether the policy's activations are checkpointed; ``description`` is what the report says of it."""

    description: str
    online: bool
    checkpointing: bool = False


_ONLINE = "an online reference (a frozen copy of the initial weights, whose forward runs in every timed step)"
#: The peers ``--peer`` names.
PEER_KINDS: dict[str, PeerKind] = {
    "trl": PeerKind("a precomputed reference (its log-probs computed once, before the rounds, untimed)", online=False),
    "trl-online": PeerKind(_ONLINE, online=True),
    "trl-online-checkpointing": PeerKind(
        f"{_ONLINE} and activation checkpointing, DPOConfig's default (gradient_checkpointing=True)",
        online=True, checkpointing=True),
}
#: Each peer's name and what the report says of it.
PEERS: dict[str, str] = {name: kind.description for name, kind in PEER_KINDS.items()}


@dataclass(frozen=True)
class PeerForward:
    """One forward TRL ran: ``rows x width`` tokens (its ``input_ids``, padding included), ``positions`` rows
    through the LM head; ``grad`` whether it built a graph, ``reference`` whether the reference model ran it,
    ``checkpointed`` whether its layers run again in backward (activation checkpointing)."""

    rows: int
    width: int
    positions: int
    grad: bool
    reference: bool
    checkpointed: bool = False


def _rows(batch: PreferenceBatch) -> list[dict[str, Any]]:
    rows = []
    for i in range(batch.num_pairs):
        prompt = batch.prompt_ids[i][batch.prompt_mask[i]].tolist()
        chosen, rejected = (batch.response_ids[i, b][batch.response_mask[i, b]].tolist() for b in (0, 1))
        rows.append({"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected})
    return rows


def _head_positions(labels: torch.Tensor, device: torch.device) -> int:
    """The positions TRL 1.16's fused LM head (``add_fused_lm_head``) projects: with Triton on CUDA only the scored
    (completion) ones; elsewhere every shifted position, prompt and padding included."""
    from transformers.utils import is_triton_available

    shifted = labels[:, 1:]
    if is_triton_available() and device.type in ("cuda", "xpu"):
        return int((shifted != -100).sum())
    return shifted.numel()


class TRLPeer:
    """One TRL DPO step per call of :meth:`step`, on the benchmark's batch ``r``.

    Args:
        model: the policy, with the same initial weights as the benchmarked module's.
        batches: the benchmark's batches.
        beta: DPO's beta.
        lr: AdamW learning rate.
        pad_id: the batches' pad token id, which TRL pads its rows with.
        reference: a frozen model TRL runs online as its ``ref_model``; ``None`` precomputes the reference
            log-probs (from ``model``, before any step).
        name: the peer's name (:data:`PEERS`), for errors.
        precision: the bench's precision (``None``: ``32-true``); ``model`` and ``reference`` are in its parameter
            dtype already.
        checkpointing: activation checkpointing on the policy, switched on as ``Trainer.train`` does for a
            ``DPOConfig`` with ``gradient_checkpointing=True`` (its default).

    Raises:
        RuntimeError: if ``trl`` is not installed, naming the extra that installs it.
    """

    def __init__(self, model: torch.nn.Module, batches: Sequence[PreferenceBatch], beta: float, lr: float,
                 pad_id: int, reference: torch.nn.Module | None = None, name: str = "trl",
                 precision: Precision | None = None, checkpointing: bool = False) -> None:
        try:
            import datasets
            import transformers
            from trl import DPOConfig, DPOTrainer
            from trl.trainer.dpo_trainer import DataCollatorForPreference
        except ImportError as err:
            raise RuntimeError(f"--peer {name} needs TRL: pip install -e '.[peer]' ({err})") from err

        class PreTokenized(DPOTrainer):
            def _prepare_dataset(self, dataset, *args, **kwargs):  # rows are token ids already
                return dataset

        rows = [row for batch in batches for row in _rows(batch.to("cpu"))]
        self.offsets = [0]
        for batch in batches:
            self.offsets.append(self.offsets[-1] + batch.num_pairs)
        tokenizer = transformers.ByT5Tokenizer()  # needs no files; never runs (the rows are token ids already)
        device = next(model.parameters()).device
        self.stepper = (precision or resolve_precision(None, None)).stepper(device)
        # the precompute's cache file is named by the rows and the weights: the precision names it too
        dataset = datasets.Dataset.from_list(rows)
        dataset = datasets.Dataset(dataset.data, fingerprint=f"{dataset._fingerprint}-{self.stepper.precision.name}")
        args = DPOConfig(
            output_dir="/tmp/lit-prunedpo-bench-trl", per_device_train_batch_size=batches[0].num_pairs, beta=beta,
            precompute_ref_log_probs=reference is None, max_length=None, learning_rate=lr, report_to=[],
            save_strategy="no", use_cpu=device.type == "cpu", disable_tqdm=True, dataloader_num_workers=0,
            logging_steps=10**9, bf16=False, activation_checkpointing=checkpointing,
        )
        if reference is not None:
            reference.requires_grad_(False).eval()
        with self.stepper.forward():  # the precompute under the step's autocast
            self.trainer = PreTokenized(model=model, ref_model=reference, args=args, train_dataset=dataset,
                                        processing_class=tokenizer, data_collator=DataCollatorForPreference(pad_id))
        self.dataset = self.trainer.train_dataset  # with the precomputed peer's reference log-probs, from __init__
        self.model = model.train()
        self.checkpointing = checkpointing
        if args.activation_checkpointing:  # what Trainer.train does before its first step
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=args.activation_checkpointing_kwargs
                                                  or None)
        self.reference = self.trainer.ref_model  # None for the precomputed reference
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        self.device = device
        self._seen: list[tuple[torch.Size, torch.Tensor | None, bool, bool]] = []
        self._watch(self.model, reference=False)
        if self.reference is not None:
            self._watch(self.reference, reference=True)

    def _watch(self, model: torch.nn.Module, reference: bool) -> None:
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
            # kept as they are: reading the labels' mask now would synchronise a GPU inside the timed step
            ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
            self._seen.append((ids.shape, kwargs.get("labels"), torch.is_grad_enabled(), reference))

        model.register_forward_pre_hook(hook, with_kwargs=True)

    @property
    def forwards(self) -> list[PeerForward]:
        """The forwards of the last :meth:`step` (the hooks came after ``__init__``: the precompute is not one)."""
        return [PeerForward(int(shape[0]), int(shape[1]),
                            _head_positions(labels, self.device) if labels is not None else int(shape.numel()),
                            grad, reference, checkpointed=self.checkpointing and not reference)
                for shape, labels, grad, reference in self._seen]

    def inputs(self, r: int) -> dict[str, torch.Tensor]:
        """TRL's collated inputs of batch ``r``: chosen and rejected rows of prompt + response, right-padded."""
        examples = [self.dataset[i] for i in range(self.offsets[r], self.offsets[r + 1])]
        return {k: v.to(self.device) for k, v in self.trainer.data_collator(examples).items()}

    def step(self, inputs: dict[str, torch.Tensor]) -> float:
        """One step (loss under the precision's autocast, then backward and AdamW outside it) on ``inputs``;
        returns its loss. :attr:`forwards` holds its forwards."""
        self._seen = []
        with self.stepper.forward():  # as Lightning's precision plugin wraps training_step
            loss = self.trainer.compute_loss(self.model, inputs)
        self.stepper.backward(loss)
        self.stepper.step(self.optimizer)
        return float(loss.detach())


def make_peers(names: Sequence[str], policy: torch.nn.Module, batches: Sequence[PreferenceBatch], beta: float,
               lr: float, pad_id: int, precision: Precision | None = None) -> dict[str, TRLPeer]:
    """Each named peer, on its own copy of ``policy`` as it is now (the initial weights, dtype and device), its
    steps at ``precision`` (``None``: ``32-true``); an online peer's reference is one more frozen copy.

    Raises:
        ValueError: on a name not in :data:`PEERS`, naming the argument.
    """
    bad = [n for n in names if n not in PEERS]
    if bad:
        raise ValueError(f"peer: unknown {bad}; choose from {list(PEERS)}")
    return {
        name: TRLPeer(copy.deepcopy(policy), batches, beta, lr, pad_id, name=name, precision=precision,
                      reference=copy.deepcopy(policy) if PEER_KINDS[name].online else None,
                      checkpointing=PEER_KINDS[name].checkpointing)
        for name in names
    }
