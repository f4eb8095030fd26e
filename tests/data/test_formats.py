"""Format detection and row checks (lit_prunedpo.data.formats), on plain Python rows."""

from __future__ import annotations

import datasets
import pytest

from lit_prunedpo.data.formats import (
    CONVERSATIONAL,
    EXPLICIT,
    IMPLICIT,
    IMPLICIT_CONVERSATIONAL,
    BadRow,
    Columns,
    count_kinds,
    detect_format,
    extract_pair,
    split_implicit_prompt,
)

COLS = Columns()


def _msg(role: str, content: str | None = None) -> dict:
    return {"role": role} if content is None else {"role": role, "content": content}


IMPLICIT_EMPTY = {"chosen": "\n\nHuman: x\n\nAssistant:", "rejected": "\n\nHuman: x\n\nAssistant: b"}


def _features(rows):
    return datasets.Dataset.from_list(rows).features


def test_detects_each_format() -> None:
    assert detect_format(_features([{"prompt": "p", "chosen": "a", "rejected": "b"}]), COLS, "x") == EXPLICIT
    assert detect_format(_features([{"chosen": "a", "rejected": "b"}]), COLS, "x") == IMPLICIT
    msg = [{"role": "user", "content": "hi"}]
    assert detect_format(_features([{"prompt": msg, "chosen": msg, "rejected": msg}]), COLS, "x") == CONVERSATIONAL
    assert detect_format(_features([{"chosen": msg, "rejected": msg}]), COLS, "x") == IMPLICIT_CONVERSATIONAL


def test_detect_names_missing_column_and_source() -> None:
    with pytest.raises(ValueError, match=r"pairs\.jsonl: no column 'rejected'.*chosen_column|rejected_column"):
        detect_format(_features([{"chosen": "a", "other": "b"}]), COLS, "pairs.jsonl")


def test_custom_column_names() -> None:
    cols = Columns("q", "good", "bad")
    features = _features([{"q": "p", "good": "a", "bad": "b"}])
    assert detect_format(features, cols, "x") == EXPLICIT
    pair = extract_pair({"q": "p", "good": "a", "bad": "b"}, EXPLICIT, cols)
    assert (pair.prompt, pair.chosen, pair.rejected) == ("p", "a", "b")


def test_implicit_prompt_is_shared_prefix_up_to_last_marker() -> None:
    prompt = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: and?\n\nAssistant:"
    # Both responses start with " Sure", which must stay in the responses, not in the prompt.
    pair = split_implicit_prompt(prompt + " Sure, yes", prompt + " Sure, no", COLS)
    assert pair.prompt == prompt
    assert (pair.chosen, pair.rejected) == (" Sure, yes", " Sure, no")


def test_implicit_marker_inside_a_response_does_not_move_the_prompt() -> None:
    prompt = "\n\nHuman: hi\n\nAssistant:"
    pair = split_implicit_prompt(prompt + " a\n\nAssistant: b", prompt + " c", COLS)
    assert pair.prompt == prompt


@pytest.mark.parametrize(
    ("row", "fmt", "field", "kind"),
    [
        ({"prompt": "p", "rejected": "b"}, EXPLICIT, "chosen", "missing"),
        ({"prompt": "p", "chosen": None, "rejected": "b"}, EXPLICIT, "chosen", "missing"),
        ({"prompt": "p", "chosen": 3, "rejected": "b"}, EXPLICIT, "chosen", "wrong_type"),
        ({"prompt": 7, "chosen": "a", "rejected": "b"}, EXPLICIT, "prompt", "wrong_type"),
        ({"prompt": "p", "chosen": "a", "rejected": ""}, EXPLICIT, "rejected", "empty"),
        ({"prompt": "p", "chosen": "a", "rejected": "a"}, EXPLICIT, "rejected", "identical"),
        ({"chosen": "no marker a", "rejected": "no marker b"}, IMPLICIT, "chosen", "prompt_not_prefix"),
        (
            {"chosen": "\n\nHuman: x\n\nAssistant: a", "rejected": "\n\nHuman: y\n\nAssistant: b"},
            IMPLICIT,
            "rejected",
            "prompt_not_prefix",
        ),
        (IMPLICIT_EMPTY, IMPLICIT, "chosen", "empty"),
        ({"chosen": "same", "rejected": "same"}, IMPLICIT, "rejected", "identical"),
        ({"prompt": "p", "chosen": [], "rejected": [_msg("assistant", "b")]}, CONVERSATIONAL, "prompt", "wrong_type"),
        (
            {"prompt": [_msg("user", "q")], "chosen": [], "rejected": [_msg("assistant", "b")]},
            CONVERSATIONAL,
            "chosen",
            "empty",
        ),
        (
            {"prompt": [_msg("user")], "chosen": [_msg("assistant", "a")], "rejected": [_msg("assistant", "b")]},
            CONVERSATIONAL,
            "prompt",
            "missing",
        ),
        (
            {"prompt": [_msg("wizard", "q")], "chosen": [_msg("assistant", "a")], "rejected": [_msg("assistant", "b")]},
            CONVERSATIONAL,
            "prompt",
            "bad_role",
        ),
        (
            {"prompt": [_msg("user", "q")], "chosen": [_msg("assistant", "a")], "rejected": [_msg("banana", "b")]},
            CONVERSATIONAL,
            "rejected",
            "bad_role",
        ),
        (  # a known role, but a response that opens with the user's turn
            {"prompt": [_msg("user", "q")], "chosen": [_msg("user", "q"), _msg("assistant", "a")],
             "rejected": [_msg("assistant", "b")]},
            CONVERSATIONAL,
            "chosen",
            "bad_role",
        ),
    ],
)
def test_bad_rows_name_field_and_kind(row, fmt, field, kind) -> None:
    with pytest.raises(BadRow) as caught:
        extract_pair(row, fmt, COLS)
    assert (caught.value.field, caught.value.kind) == (field, kind)
    assert field in str(caught.value) and kind in str(caught.value)


def test_unknown_role_names_the_message_the_role_and_the_roles() -> None:
    row = {"prompt": [_msg("system", "s"), _msg("Human", "q")], "chosen": [_msg("assistant", "a")],
           "rejected": [_msg("assistant", "b")]}
    with pytest.raises(BadRow, match=r"field 'prompt' has a message whose role cannot be used there "
                                     r"\(kind 'bad_role'\): message 1 has role 'Human' \(write 'user'\); the roles "
                                     r"are 'system', 'developer', 'user', 'assistant', 'tool'$"):
        extract_pair(row, CONVERSATIONAL, COLS)
    row = {"prompt": [_msg("user", "q")], "chosen": [_msg("tool", "42")], "rejected": [_msg("assistant", "b")]}
    with pytest.raises(BadRow, match=r"message 0 has role 'tool', but a response starts with the assistant's message; "
                                     r"messages before the assistant's answer belong in 'prompt'"):
        extract_pair(row, CONVERSATIONAL, COLS)


def test_every_known_role_is_accepted() -> None:
    prompt = [_msg("system", "s"), _msg("developer", "d"), _msg("user", "q"), _msg("assistant", "call"),
              _msg("tool", "42")]
    chosen = [_msg("assistant", "call"), _msg("tool", "7"), _msg("assistant", "It is 7.")]
    pair = extract_pair({"prompt": prompt, "chosen": chosen, "rejected": [_msg("assistant", "No.")]}, CONVERSATIONAL,
                        COLS)
    assert [m["role"] for m in pair.prompt] == ["system", "developer", "user", "assistant", "tool"]
    assert len(pair.chosen) == 3


def test_empty_explicit_prompt_is_allowed() -> None:
    assert extract_pair({"prompt": "", "chosen": "a", "rejected": "b"}, EXPLICIT, COLS).prompt == ""


def test_count_kinds_lists_every_kind() -> None:
    counts = count_kinds(["", "empty", "empty", "missing"])
    assert counts["empty"] == 2 and counts["missing"] == 1 and counts["identical"] == 0


# -- implicit-prompt conversations (TRL's extract_prompt) ---------------------------------------------


def test_implicit_conversation_prompt_is_the_shared_messages() -> None:
    shared = [_msg("system", "s"), _msg("user", "q"), _msg("assistant", "a"), _msg("user", "and?")]
    chosen = shared + [_msg("assistant", "Yes."), _msg("user", "ok"), _msg("assistant", "Bye.")]
    rejected = shared + [_msg("assistant", "No.")]
    pair = extract_pair({"chosen": chosen, "rejected": rejected}, IMPLICIT_CONVERSATIONAL, COLS)
    assert pair.prompt == shared
    assert pair.chosen == chosen[4:] and pair.rejected == [_msg("assistant", "No.")]


def test_implicit_conversation_parting_inside_a_turn_keeps_whole_messages() -> None:
    # Both answers start with the same words: the prompt holds whole messages only, so "Sure" stays in both.
    user = [_msg("user", "q")]
    row = {"chosen": user + [_msg("assistant", "Sure, yes")], "rejected": user + [_msg("assistant", "Sure, no")]}
    pair = extract_pair(row, IMPLICIT_CONVERSATIONAL, COLS)
    assert pair.prompt == user
    assert pair.chosen[0]["content"] == "Sure, yes" and pair.rejected[0]["content"] == "Sure, no"


@pytest.mark.parametrize(
    "chosen, rejected, field, kind, detail",
    [
        ([_msg("user", "q1"), _msg("assistant", "a")], [_msg("user", "q2"), _msg("assistant", "b")], "rejected",
         "prompt_not_prefix", "its message 0 differs from message 0 of 'chosen', so the two conversations share no "
         "prompt"),
        ([_msg("user", "q"), _msg("assistant", "a")], [_msg("user", "q"), _msg("assistant", "a"), _msg("user", "more")],
         "chosen", "empty", "all its 2 messages also start 'rejected'"),
        ([_msg("user", "q"), _msg("assistant", "a"), _msg("user", "x"), _msg("assistant", "b")],
         [_msg("user", "q"), _msg("assistant", "a"), _msg("user", "y"), _msg("assistant", "c")], "chosen", "bad_role",
         "message 2 has role 'user', but a response starts with the assistant's message; the two conversations share "
         "messages 0-1 (the prompt) and part at this one"),
        ([_msg("user", "q"), _msg("assistant", "a")], [_msg("user", "q"), _msg("assistant", "a")], "rejected",
         "identical", ""),
        ([_msg("user", "q"), _msg("assistant", "")], [_msg("user", "q"), _msg("assistant", "b")], "chosen", "empty",
         "every message has empty content"),
        ([_msg("human", "q"), _msg("assistant", "a")], [_msg("user", "q"), _msg("assistant", "b")], "chosen",
         "bad_role", "message 0 has role 'human' (write 'user')"),
    ],
)
def test_implicit_conversation_bad_rows(chosen, rejected, field, kind, detail) -> None:
    with pytest.raises(BadRow) as caught:
        extract_pair({"chosen": chosen, "rejected": rejected}, IMPLICIT_CONVERSATIONAL, COLS)
    assert (caught.value.field, caught.value.kind) == (field, kind)
    assert detail in caught.value.detail
