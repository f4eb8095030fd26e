"""Turn checked preference rows into token ids once, inside ``datasets.map``, never per training step.

Layout rules (what :func:`build_pair_ids` does):

* the prompt gets BOS in front when the tokenizer has one and the ids do not already start with it
  (ids are made with ``add_special_tokens=False``, so a tokenizer never adds it a second time);
* a prompt left with no tokens gets one: BOS, else EOS, else the pad id, because the first response
  token must be predicted from something;
* a prompt longer than ``max_prompt_length`` keeps its **end** (the turn being answered), and keeps its
  leading BOS;
* plain-text responses get EOS appended (if the tokenizer has one); conversational ones do not, since
  the chat template closes the turn itself;
* responses keep their **start**, cut so that prompt + response <= ``max_length``.

TRL adds no BOS to a decoder-only prompt (``add_bos=False`` here; the default spends one token of ``max_length``
more on the prompt than TRL does). TRL's default ``truncation_mode="keep_start"`` (since TRL 0.29) cuts each
prompt + response to ``max_length`` keeping its start, as ``truncation="keep_start"`` does here, except that TRL has
no ``max_prompt_length`` (it dropped it in 0.29, and drops a pair whose prompt alone fills ``max_length``).
TRL's former default ``truncation_mode="keep_end"`` (deprecated since TRL 1.1) is ``truncation="keep_end"``: prompt
+ response are cut jointly from the start, so the prompt loses its beginning before a response loses its end. TRL
cuts each sequence on its own; here a pair is cut by its own longer response (prompt and responses share one
prompt per pair).

The map writes every row, bad ones included (with empty ids and their ``bad_kind``/``bad_field``), so
the cached result does not depend on the bad-row policy; the data module filters afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import datasets
from datasets.fingerprint import Hasher
from transformers import AutoTokenizer, ByT5Tokenizer, PreTrainedTokenizerBase

from lit_prunedpo.data.formats import CHAT_FORMATS, BadRow, Columns, TextPair, extract_pair
from lit_prunedpo.gguf_files import is_gguf_path, load_gguf_tokenizer
from lit_prunedpo.hub import hub_or_cache, in_hub_cache, offline_hint

#: Bump when the map's output changes, so old caches are not reused.
ENCODING_VERSION = "4"  # 2: pairs identical after tokenization and truncation are bad rows; 3: message roles
# checked; 4: lengths before truncation recorded

OUTPUT_FEATURES = datasets.Features(
    {
        "index": datasets.Value("int64"),
        "prompt_ids": datasets.List(datasets.Value("int32")),
        "chosen_ids": datasets.List(datasets.Value("int32")),
        "rejected_ids": datasets.List(datasets.Value("int32")),
        "prompt_truncated": datasets.Value("bool"),
        "response_truncated": datasets.Value("bool"),
        # lengths before truncation (prompt with its BOS, the longer response with its EOS): what a too-small limit cut
        "prompt_length": datasets.Value("int32"),
        "response_length": datasets.Value("int32"),
        "bad_kind": datasets.Value("string"),
        "bad_field": datasets.Value("string"),
        "bad_detail": datasets.Value("string"),
    }
)


#: What a tokenizer folder holds, for the messages about one that lacks it.
TOKENIZER_FOLDER = (
    "a tokenizer folder needs tokenizer.json, or the vocabulary files of its tokenizer class (vocab.json and "
    "merges.txt for GPT-2's BPE, tokenizer.model for SentencePiece, vocab.txt for WordPiece), with "
    "tokenizer_config.json naming the class; tokenizer.save_pretrained(DIR) writes them"
)


def is_vocabulary_file(name: str) -> bool:
    """Whether a file named ``name`` holds a vocabulary a ``transformers`` tokenizer class reads: tokenizer.json
    (fast), BPE vocab/merges (GPT-2, BioGPT's bpe.codes), SentencePiece (.model, Marian's .spm), tiktoken ranks."""
    return (name == "tokenizer.json" or name.startswith(("vocab", "merges", "bpe"))
            or name.endswith((".model", ".spm", ".tiktoken")))


def _check_folder(name: str, folder: Path) -> None:
    """A folder without tokenizer files (empty, or a model's folder): ``AutoTokenizer`` then builds a one-token
    tokenizer from a ``config.json`` alone, or fails advising to install sentencepiece; neither says what is missing.
    A ``tokenizer_config.json`` without vocabulary files is left to load: byte-level tokenizers (ByT5) need none,
    and :func:`_check_vocabulary` catches the others."""
    files = sorted(p.name for p in folder.iterdir() if p.is_file())
    vocabulary = [f for f in files if is_vocabulary_file(f)]
    prefix = f"tokenizer {name!r} (argument data.init_args.tokenizer): the local directory"
    if not vocabulary and "tokenizer_config.json" not in files:
        holds = f"its files: {', '.join(files)}" if files else "it is empty"
        raise ValueError(f"{prefix} holds no tokenizer files ({holds}); {TOKENIZER_FOLDER}")
    if vocabulary and not {"tokenizer.json", "tokenizer_config.json", "config.json"} & set(files):
        raise ValueError(
            f"{prefix} holds vocabulary files ({', '.join(vocabulary)}) but no tokenizer_config.json (nor a "
            f"config.json) saying which tokenizer class reads them; {TOKENIZER_FOLDER}"
        )


def _check_vocabulary(name: str, tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """``tokenizer``, unless its every token is a special token: it read no vocabulary, and would turn all text into
    nothing."""
    specials = len(set(tokenizer.all_special_ids))
    if len(tokenizer) <= specials:
        needs = ", ".join(sorted(set(getattr(tokenizer, "vocab_files_names", {}).values()))) or "its vocabulary files"
        raise ValueError(
            f"tokenizer {name!r} (argument data.init_args.tokenizer): loaded as {type(tokenizer).__name__}, but its "
            f"vocabulary holds only its {specials} special token(s): the files its class reads ({needs}) are missing; "
            f"{TOKENIZER_FOLDER}"
        )
    return tokenizer


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """Load a tokenizer by hub name or local path (a folder, or a ``.gguf`` file's own tokenizer); ``"byt5"``
    builds the file-free byte-level ByT5 one.

    Raises:
        ValueError: nothing loads from ``name``, saying whether it was read as a local path or a hub name; a local
            folder holds no tokenizer files; or what loaded has no vocabulary beyond its special tokens.
        HubUnreachable: ``name`` is a hub name, the hub does not answer and the cache does not hold it
            (:mod:`lit_prunedpo.hub`).
    """
    if name == "byt5":
        return ByT5Tokenizer()
    if is_gguf_path(name):  # a GGUF file carries the model's tokenizer and chat template beside its weights
        return _check_vocabulary(name, load_gguf_tokenizer(name, "data.init_args.tokenizer"))
    local = Path(name).expanduser()
    looks_local = name.startswith(("/", "./", "../", "~")) or local.exists()
    if looks_local and not local.is_dir():
        what = "is a file, not a directory" if local.exists() else "does not exist"
        raise ValueError(
            f"tokenizer {name!r} (argument data.init_args.tokenizer): the local path {what}; give a directory "
            "written by save_pretrained, a .gguf file, a hub name such as 'gpt2', or 'byt5'"
        )
    if looks_local:
        _check_folder(name, local)
    # A hub that does not answer is said at once (HubUnreachable), not after transformers' retries.
    cache_only = not looks_local and hub_or_cache(name, "data.init_args.tokenizer", cached=lambda: in_hub_cache(name))
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=cache_only)
    except Exception as err:  # transformers raises OSError, ValueError, HFValidationError... name the argument once
        origin = (f"the local directory (its files: {', '.join(sorted(p.name for p in local.iterdir()))})"
                  if looks_local else "a hub name (no local directory has this path)")
        raise ValueError(
            f"tokenizer {name!r} (argument data.init_args.tokenizer): could not load it from {origin}: "
            f"{type(err).__name__}: {err}{'' if looks_local else offline_hint(name)}"
        ) from err
    return _check_vocabulary(name, tokenizer)


def read_chat_template(chat_template: str) -> str:
    """A Jinja chat template given as a path to an existing file is read; anything else is the template itself.

    Raises:
        ValueError: ``chat_template`` is neither a template (it has no ``{``) nor an existing file.
    """
    if "{" not in chat_template:
        path = Path(chat_template).expanduser()
        if path.is_file():
            return path.read_text()
        raise ValueError(f"chat_template {chat_template!r} is neither a Jinja template nor an existing file")
    return chat_template


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A stable hash of everything about the tokenizer that changes the ids (vocabulary, specials, template)."""
    return Hasher.hash(tokenizer)


def prompt_fallback_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The single token given to a prompt that tokenizes to nothing: BOS, else EOS, else pad."""
    for token_id in (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id):
        if token_id is not None:
            return int(token_id)
    raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no BOS, EOS or pad token to start an empty prompt")


@dataclass
class EncodedPair:
    """Token ids of one pair after the layout rules, and whether anything was cut."""

    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    prompt_truncated: bool
    response_truncated: bool
    prompt_length: int = 0  # before truncation, BOS included
    response_length: int = 0  # the longer response before truncation, EOS included


def build_pair_ids(
    prompt: Sequence[int],
    chosen: Sequence[int],
    rejected: Sequence[int],
    *,
    max_length: int,
    max_prompt_length: int,
    bos_id: int | None,
    eos_id: int | None,
    fallback_id: int,
    add_bos: bool = True,
    truncation: str = "keep_start",
) -> EncodedPair:
    """Apply the layout rules of this module to raw token ids.

    Args:
        prompt: prompt ids, without special tokens added by the tokenizer.
        chosen: chosen-response ids.
        rejected: rejected-response ids.
        max_length: most tokens of prompt + one response.
        max_prompt_length: most prompt tokens (BOS included).
        bos_id: put in front of the prompt when not None and not already there.
        eos_id: appended to each response when not None (pass None for chat-rendered responses).
        fallback_id: the single prompt token when the prompt is empty and there is no BOS.
        add_bos: put ``bos_id`` in front of the prompt (``False``: TRL's decoder-only layout).
        truncation: ``keep_start`` (TRL's default) cuts responses to fit ``max_length``; ``keep_end`` (TRL's
            former default, deprecated there) first cuts the prompt's beginning (down to one token) so that prompt +
            the longer response fit.

    Returns:
        The ids; a response may come back empty (the caller drops and counts such pairs).
    """
    prompt = list(prompt)
    if not add_bos:
        bos_id = None
    if bos_id is not None and (not prompt or prompt[0] != bos_id):
        prompt.insert(0, bos_id)
    if not prompt:
        prompt = [fallback_id]
    prompt_length = len(prompt)
    prompt_truncated = prompt_length > max_prompt_length
    if prompt_truncated:
        # Keep the end (the turn being answered) and a leading BOS, which models are trained to see first.
        head = prompt[:1] if bos_id is not None and prompt[0] == bos_id and max_prompt_length > 1 else []
        prompt = head + prompt[len(prompt) - (max_prompt_length - len(head)):]
    full = [list(r) + ([eos_id] if eos_id is not None else []) for r in (chosen, rejected)]
    if truncation == "keep_end":
        over = len(prompt) + max(len(r) for r in full) - max_length
        cut = min(max(over, 0), len(prompt) - 1)
        if cut:
            prompt = prompt[cut:]
            prompt_truncated = True
    room = max(max_length - len(prompt), 0)
    responses = []
    response_truncated = False
    for response in full:
        response_truncated |= len(response) > room
        responses.append(response[:room])
    return EncodedPair(prompt, responses[0], responses[1], prompt_truncated, response_truncated,
                       prompt_length, max(len(r) for r in full))


class PairEncoder:
    """The batched ``datasets.map`` function: check, render, tokenize and lay out rows.

    Args:
        tokenizer: the tokenizer (with a chat template for the conversational format).
        fmt: the detected format (:mod:`lit_prunedpo.data.formats`).
        columns: the column names rows are read from.
        max_length: most tokens of prompt + one response.
        max_prompt_length: most prompt tokens.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        fmt: str,
        columns: Columns,
        max_length: int,
        max_prompt_length: int,
        add_bos: bool = True,
        truncation: str = "keep_start",
    ) -> None:
        if truncation not in ("keep_start", "keep_end"):
            raise ValueError(f"truncation must be 'keep_start' or 'keep_end', got {truncation!r}")
        self.add_bos = add_bos
        self.truncation = truncation
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.columns = columns
        self.max_length = max_length
        self.max_prompt_length = max_prompt_length

    def fingerprint(self, parent: str) -> str:
        """The cache key of this map over a dataset whose fingerprint is ``parent``."""
        return Hasher.hash(
            [
                parent,
                ENCODING_VERSION,
                self.fmt,
                self.columns,
                self.max_length,
                self.max_prompt_length,
                tokenizer_fingerprint(self.tokenizer),
                # only when not the default, so that caches of default runs stay valid
                *([] if (self.add_bos, self.truncation) == (True, "keep_start") else [self.add_bos, self.truncation]),
            ]
        )

    def _render(self, pair: TextPair) -> tuple[str, str, str]:
        """Chat-render a conversational pair; each response is the text its turn adds after the prompt."""
        prompt = self.tokenizer.apply_chat_template(pair.prompt, tokenize=False, add_generation_prompt=True)
        responses = []
        for column, messages in ((self.columns.chosen, pair.chosen), (self.columns.rejected, pair.rejected)):
            full = self.tokenizer.apply_chat_template(pair.prompt + messages, tokenize=False)
            if not full.startswith(prompt):
                raise BadRow(
                    column,
                    "prompt_not_prefix",
                    "the chat template renders the prompt differently once this response follows it",
                )
            responses.append(full[len(prompt):])
        return prompt, responses[0], responses[1]

    def __call__(self, batch: dict[str, list[Any]], indices: list[int]) -> dict[str, list[Any]]:
        out, texts, good = self._check_rows(batch, indices)
        if not texts:
            return out
        # One tokenizer call per column and batch: fast tokenizers parallelize inside it.
        encoded = [
            self.tokenizer([t[k] for t in texts], add_special_tokens=False)["input_ids"] for k in range(3)
        ]
        tok = self.tokenizer
        eos = tok.eos_token_id if self.fmt not in CHAT_FORMATS else None
        fallback = prompt_fallback_id(tok)
        for j, position in enumerate(good):
            pair = build_pair_ids(
                encoded[0][j], encoded[1][j], encoded[2][j], max_length=self.max_length,
                max_prompt_length=self.max_prompt_length, bos_id=tok.bos_token_id, eos_id=eos, fallback_id=fallback,
                add_bos=self.add_bos, truncation=self.truncation,
            )
            if pair.chosen_ids and pair.chosen_ids == pair.rejected_ids:
                # Different texts, same ids: cut to the same prefix by max_length, or a tokenizer that maps them
                # to the same tokens. Such a pair has zero margin and zero gradient forever: a bad row.
                out["bad_kind"][position] = "identical_tokens"
                out["bad_field"][position] = self.columns.rejected
                cut = (f"truncation to max_length {self.max_length} (a larger data.init_args.max_length keeps more "
                       "of them)" if pair.response_truncated else "tokenization")
                out["bad_detail"][position] = f"both responses are the same {len(pair.chosen_ids)} tokens after {cut}"
                continue
            for name in ("prompt_ids", "chosen_ids", "rejected_ids", "prompt_truncated", "response_truncated",
                         "prompt_length", "response_length"):
                out[name][position] = getattr(pair, name)
        return out

    def _check_rows(self, batch: dict[str, list[Any]],
                    indices: list[int]) -> tuple[dict[str, list[Any]], list[tuple[str, str, str]], list[int]]:
        """Every row checked (and a chat pair rendered): the output with each row's index and bad-row fields and
        empty ids, the texts of the good rows, and their positions in the batch."""
        out: dict[str, list[Any]] = {name: [] for name in OUTPUT_FEATURES}
        texts: list[tuple[str, str, str]] = []
        good: list[int] = []
        names = list(batch)
        for position, index in enumerate(indices):
            row = {name: batch[name][position] for name in names}
            kind = field = detail = ""
            try:
                pair = extract_pair(row, self.fmt, self.columns)
                if self.fmt in CHAT_FORMATS:
                    texts.append(self._render(pair))
                else:
                    texts.append((pair.prompt, pair.chosen, pair.rejected))  # type: ignore[arg-type]
                good.append(position)
            except BadRow as bad:
                kind, field, detail = bad.kind, bad.field, bad.detail
            out["index"].append(index)
            out["bad_kind"].append(kind)
            out["bad_field"].append(field)
            out["bad_detail"].append(detail)
            for name in ("prompt_ids", "chosen_ids", "rejected_ids"):
                out[name].append([])
            out["prompt_truncated"].append(False)
            out["response_truncated"].append(False)
            out["prompt_length"].append(0)
            out["response_length"].append(0)
        return out, texts, good


def encode_split(
    raw: datasets.Dataset, encoder: PairEncoder, num_proc: int | None = None, desc: str = "Tokenizing pairs",
    parent: str | None = None,
) -> datasets.Dataset:
    """Run :class:`PairEncoder` over a split, cached under a fingerprint of the inputs and settings.

    ``parent`` replaces ``raw``'s own fingerprint in the cache key (e.g. joined with the source's content digest).
    """
    return raw.map(
        encoder,
        batched=True,
        batch_size=1000,
        with_indices=True,
        remove_columns=raw.column_names,
        features=OUTPUT_FEATURES,
        num_proc=num_proc,
        new_fingerprint=encoder.fingerprint(parent or raw._fingerprint),
        desc=desc,
    )
