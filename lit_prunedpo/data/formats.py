"""Preference-row formats (TRL's) and the checks that turn a raw row into a prompt and two responses.

Four formats are detected once from the dataset's column types (Arrow columns hold one type, so this is the
first row's shape, but a bad first row cannot mislead it), and a fifth is read when asked for:

* ``explicit``: ``{"prompt": str, "chosen": str, "rejected": str}``;
* ``implicit``: ``{"chosen": str, "rejected": str}`` full dialogues (Anthropic HH-RLHF style). The prompt
  is the shared prefix of both texts up to and including its last ``"\\n\\nAssistant:"``; a pair whose
  shared prefix holds no such marker is refused rather than guessed at;
* ``conversational``: ``prompt`` a list of ``{"role", "content"}`` messages, ``chosen``/``rejected``
  lists of messages that start with the assistant's, later rendered with the tokenizer's chat template.
  Every role is one of :data:`ROLES`; a response that starts with another role's message is a bad row, since
  the prompt is rendered up to the assistant's turn (the generation prompt);
* ``implicit_conversational``: ``{"chosen": [messages], "rejected": [messages]}`` whole conversations without a
  ``prompt`` column (TRL's implicit-prompt conversational format). As TRL's ``extract_prompt`` does, the prompt is
  the longest run of whole messages both conversations start with, and each response is the rest; then the rules
  of ``conversational`` apply: the two conversations must part at the assistant's answer. A pair whose
  conversations share no first message, or part at another role's message, is a bad row;
* ``dialogue_messages``: the ``implicit`` format's text dialogues read as chat messages, when the data module is
  asked to (``dialogues="messages"``; never detected): each ``"\\n\\nHuman:"`` turn a user message, each
  ``"\\n\\nAssistant:"`` turn an assistant one (:func:`dialogue_messages`); the last assistant turn is the
  response, the turns before it the prompt, which both dialogues must share (:func:`split_dialogues`). Then the
  rules of ``conversational`` apply.

A row that cannot be used raises :class:`BadRow` naming the field and one of :data:`BAD_ROW_KINDS`;
the data module decides whether that stops the run or skips the row (and counts it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence, Union

EXPLICIT, IMPLICIT, CONVERSATIONAL = "explicit", "implicit", "conversational"
IMPLICIT_CONVERSATIONAL = "implicit_conversational"
#: ``implicit`` text dialogues read as chat messages (``PreferenceDataModule(dialogues="messages")``).
DIALOGUE_MESSAGES = "dialogue_messages"
#: Formats of message lists, rendered with the tokenizer's chat template.
CHAT_FORMATS = (CONVERSATIONAL, IMPLICIT_CONVERSATIONAL, DIALOGUE_MESSAGES)
ASSISTANT_MARKER = "\n\nAssistant:"
HUMAN_MARKER = "\n\nHuman:"
#: The role each turn marker of a text dialogue becomes.
TURN_ROLES = {HUMAN_MARKER: "user", ASSISTANT_MARKER: "assistant"}
_TURN = re.compile("(" + "|".join(map(re.escape, TURN_ROLES)) + ")")

#: Every way a row can be bad, with the phrase an error message uses for it.
BAD_ROW_KINDS: dict[str, str] = {
    "missing": "is missing (absent or null)",
    "wrong_type": "has the wrong type",
    "empty": "is empty",
    "identical": "is identical to the other response, so the pair states no preference",
    "prompt_not_prefix": "does not share a prompt with the other response",
    "identical_tokens": "has the same token ids as the other response after tokenization and truncation, so the "
    "pair states no preference",
    "unreadable": "could not be read",
    "bad_role": "has a message whose role cannot be used there",
    "not_dialogue": "cannot be read as '\\n\\nHuman:'/'\\n\\nAssistant:' turns",
}

#: The roles a message may have: TRL's conversational format (system, user, assistant), tool results (TRL's
#: tool-calling format) and the developer role of OpenAI's Harmony format. Chat templates print any other name as
#: it is, or fail on it, so another role is a typo or another dataset's schema: a bad row, never trained on.
ROLES = ("system", "developer", "user", "assistant", "tool")
#: Roles of other schemas (ShareGPT, Gemma's turns) and the role that says the same thing here, for the message.
ROLE_SPELLINGS = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant"}

#: Column of the placeholder row that stands for an unreadable line (:mod:`lit_prunedpo.data.readable`).
UNREADABLE_COLUMN = "__lit_prunedpo_unreadable__"
ROW = "<row>"  # the field named when the whole row is at fault

Messages = list[dict[str, Any]]
Text = Union[str, Messages]


class BadRow(ValueError):
    """A row that cannot be used, with the field at fault and its kind (a key of :data:`BAD_ROW_KINDS`)."""

    def __init__(self, field: str, kind: str, detail: str = "") -> None:
        if kind not in BAD_ROW_KINDS:
            raise KeyError(f"unknown bad-row kind {kind!r}")
        self.field, self.kind, self.detail = field, kind, detail
        super().__init__(self.describe())

    def describe(self) -> str:
        text = f"field {self.field!r} {BAD_ROW_KINDS[self.kind]} (kind '{self.kind}')"
        return f"{text}: {self.detail}" if self.detail else text


@dataclass(frozen=True)
class Columns:
    """Names of the three columns a preference row is read from."""

    prompt: str = "prompt"
    chosen: str = "chosen"
    rejected: str = "rejected"


@dataclass(frozen=True)
class TextPair:
    """A prompt and its two responses: strings, or message lists in the conversational format."""

    prompt: Text
    chosen: Text
    rejected: Text


def _type_name(feature: Any) -> str:
    return type(feature).__name__


def _is_string_feature(feature: Any) -> bool:
    return getattr(feature, "dtype", None) in ("string", "large_string")


def _is_list_feature(feature: Any) -> bool:
    # datasets >= 4 calls it List/LargeList, older releases Sequence; a plain python list is the legacy spelling.
    return isinstance(feature, list) or _type_name(feature) in ("List", "LargeList", "Sequence")


def detect_format(features: Mapping[str, Any], columns: Columns, source: str) -> str:
    """Say which format a dataset is in from its column types.

    Args:
        features: the dataset's ``features`` (column name -> feature).
        columns: the configured column names.
        source: the file or dataset name, for error messages.

    Returns:
        One of ``"explicit"``, ``"implicit"``, ``"conversational"``, ``"implicit_conversational"``.

    Raises:
        ValueError: a response column is absent, or the columns have types no format uses.
    """
    available = sorted(features)
    for name, role in ((columns.chosen, "chosen_column"), (columns.rejected, "rejected_column")):
        if name not in features:
            raise ValueError(
                f"{source}: no column {name!r} (set by {role}); the columns are {available}"
            )
    if columns.prompt in features:
        prompt = features[columns.prompt]
        if _is_list_feature(prompt):
            return CONVERSATIONAL
        if _is_string_feature(prompt) or _type_name(prompt) == "Json":
            return EXPLICIT
        raise ValueError(
            f"{source}: column {columns.prompt!r} holds {prompt!r}; expected strings (explicit prompt) "
            "or lists of {'role', 'content'} messages (conversational)"
        )
    if _is_list_feature(features[columns.chosen]):
        return IMPLICIT_CONVERSATIONAL
    return IMPLICIT


def _require_str(row: Mapping[str, Any], column: str, allow_empty: bool = False) -> str:
    value = row.get(column)
    if value is None:
        raise BadRow(column, "missing")
    if not isinstance(value, str):
        raise BadRow(column, "wrong_type", f"expected a string, got {type(value).__name__}")
    if not value and not allow_empty:
        raise BadRow(column, "empty")
    return value


def _require_messages(row: Mapping[str, Any], column: str) -> Messages:
    value = row.get(column)
    if value is None:
        raise BadRow(column, "missing")
    if not isinstance(value, (list, tuple)):
        raise BadRow(column, "wrong_type", f"expected a list of messages, got {type(value).__name__}")
    if not value:
        raise BadRow(column, "empty", "no messages")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, Mapping):
            raise BadRow(column, "wrong_type", f"message {i} is a {type(message).__name__}, not a mapping")
        for key in ("role", "content"):
            if message.get(key) is None:
                raise BadRow(column, "missing", f"message {i} has no {key!r}")
            if not isinstance(message[key], str):
                raise BadRow(column, "wrong_type", f"message {i} {key!r} is a {type(message[key]).__name__}")
        role = message["role"]
        if role not in ROLES:
            same = ROLE_SPELLINGS.get(role.lower(), role.lower() if role.lower() in ROLES else None)
            hint = f" (write {same!r})" if same else ""
            allowed = ", ".join(repr(r) for r in ROLES)
            raise BadRow(column, "bad_role", f"message {i} has role {role!r}{hint}; the roles are {allowed}")
        messages.append(dict(message))
    return messages


def _require_response_turn(messages: Messages, column: str, prompt_column: str, first: int = 0) -> None:
    """A response starts the assistant's turn: the prompt is rendered up to it (the generation prompt), so a
    response opening with another role's message would teach the model to write that role's turn.

    ``first`` is the response's first message in the row: 0 with a prompt column, else the number of messages both
    conversations share (implicit prompt)."""
    role = messages[0]["role"]
    if role != "assistant":
        where = (f"messages before the assistant's answer belong in {prompt_column!r}" if first == 0 else
                 f"the two conversations share messages 0-{first - 1} (the prompt) and part at this one, so the "
                 "responses must start with the assistant's answer there")
        raise BadRow(
            column,
            "bad_role",
            f"message {first} has role {role!r}, but a response starts with the assistant's message; {where}",
        )


def split_implicit_messages(chosen: Messages, rejected: Messages, columns: Columns) -> TextPair:
    """Cut two whole conversations into their shared prompt and the two responses, as TRL's ``extract_prompt``:
    the prompt is the longest run of whole messages both start with.

    Raises:
        BadRow: the conversations share no first message, or one is the other's start (an empty response), or a
            response does not start with the assistant's message.
    """
    shared = 0
    for a, b in zip(chosen, rejected):
        if a != b:
            break
        shared += 1
    if shared == 0:
        raise BadRow(
            columns.rejected,
            "prompt_not_prefix",
            f"its message 0 differs from message 0 of {columns.chosen!r}, so the two conversations share no prompt "
            f"(without a {columns.prompt!r} column the prompt is the messages both start with)",
        )
    for column, messages, other in ((columns.chosen, chosen, columns.rejected),
                                    (columns.rejected, rejected, columns.chosen)):
        if shared == len(messages):
            raise BadRow(
                column,
                "empty",
                f"all its {shared} messages also start {other!r}, so nothing of it is left after the shared prompt",
            )
    for column, messages in ((columns.chosen, chosen), (columns.rejected, rejected)):
        _require_response_turn(messages[shared:], column, columns.prompt, first=shared)
    return TextPair(chosen[:shared], chosen[shared:], rejected[shared:])


def split_implicit_prompt(chosen: str, rejected: str, columns: Columns) -> TextPair:
    """Cut two full dialogues into their shared prompt and the two responses.

    The prompt is the longest common prefix of both texts, cut back to just after its last
    :data:`ASSISTANT_MARKER`, so a response that happens to begin with the same words stays whole.

    Raises:
        BadRow: the texts share no marker-delimited prefix, or a response is empty.
    """
    common = 0
    for a, b in zip(chosen, rejected):
        if a != b:
            break
        common += 1
    cut = chosen.rfind(ASSISTANT_MARKER, 0, common)
    if cut < 0:
        if ASSISTANT_MARKER not in chosen:
            raise BadRow(columns.chosen, "prompt_not_prefix", f"no {ASSISTANT_MARKER!r} marker in the text")
        raise BadRow(
            columns.rejected,
            "prompt_not_prefix",
            f"it does not start with the prompt of {columns.chosen!r} (the text up to its {ASSISTANT_MARKER!r})",
        )
    end = cut + len(ASSISTANT_MARKER)
    prompt, chosen_response, rejected_response = chosen[:end], chosen[end:], rejected[end:]
    for column, response in ((columns.chosen, chosen_response), (columns.rejected, rejected_response)):
        if not response:
            raise BadRow(column, "empty", f"nothing follows the last {ASSISTANT_MARKER!r}")
    return TextPair(prompt, chosen_response, rejected_response)


def dialogue_messages(text: str, column: str) -> Messages:
    """Read a text dialogue in HH-RLHF's form (``"\\n\\nHuman: ...\\n\\nAssistant: ..."``) as chat messages.

    Each ``"\\n\\nHuman:"`` turn becomes a user message and each ``"\\n\\nAssistant:"`` turn an assistant one,
    in order, whether or not the roles alternate. A message's content is the text up to the next marker, less the
    one space after the marker's colon (the separator, as in TRL's own conversion of HH-RLHF,
    ``trl-lib/hh-rlhf-helpful-base``); nothing else of the text is changed.

    Raises:
        BadRow: the text does not start with ``"\\n\\nHuman:"`` (kind ``not_dialogue``), or a turn holds nothing but
            whitespace (kind ``empty``).
    """
    parts = _TURN.split(text)
    if parts[0] or parts[1] != HUMAN_MARKER:
        raise BadRow(column, "not_dialogue", f"it starts with {text[:20]!r}, not with {HUMAN_MARKER!r}")
    messages = []
    for i, (marker, content) in enumerate(zip(parts[1::2], parts[2::2])):
        content = content[1:] if content.startswith(" ") else content
        if not content.strip():
            raise BadRow(column, "empty", f"its turn {i} ({marker!r}) holds no text")
        messages.append({"role": TURN_ROLES[marker], "content": content})
    return messages


def split_dialogues(chosen: str, rejected: str, columns: Columns) -> TextPair:
    """Cut two text dialogues (:func:`dialogue_messages`) into the prompt, the turns before each one's last, and the
    two responses, each dialogue's last turn: the assistant's.

    Raises:
        BadRow: a dialogue cannot be read, one ends with the human's turn (kind ``bad_role``), or the two prompts
            differ (kind ``prompt_not_prefix``, on the rejected dialogue).
    """
    turns = {column: dialogue_messages(text, column) for column, text in ((columns.chosen, chosen),
                                                                           (columns.rejected, rejected))}
    for column, messages in turns.items():
        if messages[-1]["role"] != "assistant":
            raise BadRow(column, "bad_role", f"its last turn (message {len(messages) - 1}) is a {HUMAN_MARKER!r} "
                         f"turn; the response is the dialogue's last turn, which must be an {ASSISTANT_MARKER!r} one")
    chosen_turns, rejected_turns = turns[columns.chosen], turns[columns.rejected]
    if chosen_turns[:-1] != rejected_turns[:-1]:
        pairs = zip(chosen_turns[:-1], rejected_turns[:-1])
        at = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(chosen_turns), len(rejected_turns)) - 1)
        raise BadRow(columns.rejected, "prompt_not_prefix",
                     f"its prompt (the turns before its last) differs from that of {columns.chosen!r} at message {at}")
    return TextPair(chosen_turns[:-1], chosen_turns[-1:], rejected_turns[-1:])


def extract_pair(row: Mapping[str, Any], fmt: str, columns: Columns) -> TextPair:
    """Check one raw row and return its prompt and responses.

    An empty explicit prompt is allowed (an unconditional preference): the tokenizer step gives every
    prompt at least one token.

    Raises:
        BadRow: the row is unusable; its ``field`` and ``kind`` say why.
    """
    if row.get(UNREADABLE_COLUMN) is not None:
        raise BadRow(ROW, "unreadable", row[UNREADABLE_COLUMN])
    if fmt in (CONVERSATIONAL, IMPLICIT_CONVERSATIONAL):
        if fmt == CONVERSATIONAL:
            prompt: Text = _require_messages(row, columns.prompt)
            chosen: Text = _require_messages(row, columns.chosen)
            rejected: Text = _require_messages(row, columns.rejected)
            for column, messages in ((columns.chosen, chosen), (columns.rejected, rejected)):
                _require_response_turn(messages, column, columns.prompt)
        else:
            whole_chosen = _require_messages(row, columns.chosen)
            whole_rejected = _require_messages(row, columns.rejected)
            if whole_chosen == whole_rejected:
                raise BadRow(columns.rejected, "identical")
            split = split_implicit_messages(whole_chosen, whole_rejected, columns)
            prompt, chosen, rejected = split.prompt, split.chosen, split.rejected
        for column, messages in ((columns.chosen, chosen), (columns.rejected, rejected)):
            if not any(m["content"] for m in messages):
                raise BadRow(column, "empty", "every message has empty content")
    elif fmt == EXPLICIT:
        prompt = _require_str(row, columns.prompt, allow_empty=True)
        chosen = _require_str(row, columns.chosen)
        rejected = _require_str(row, columns.rejected)
    elif fmt in (IMPLICIT, DIALOGUE_MESSAGES):
        chosen = _require_str(row, columns.chosen)
        rejected = _require_str(row, columns.rejected)
        if chosen == rejected:
            raise BadRow(columns.rejected, "identical")
        cut = split_implicit_prompt if fmt == IMPLICIT else split_dialogues
        return cut(chosen, rejected, columns)
    else:
        raise ValueError(f"unknown format {fmt!r}")
    if chosen == rejected:
        raise BadRow(columns.rejected, "identical")
    return TextPair(prompt, chosen, rejected)


def count_kinds(kinds: Sequence[str]) -> dict[str, int]:
    """Count bad-row kinds (empty strings mark good rows), listing every kind so zeros show too."""
    counts = dict.fromkeys(BAD_ROW_KINDS, 0)
    for kind in kinds:
        if kind:
            counts[kind] += 1
    return counts
