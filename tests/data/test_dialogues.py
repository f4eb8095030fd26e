"""HH-RLHF's text dialogues read as chat messages (``dialogues="messages"``): the turns, the bad rows, the data
module with a chat template, and token-for-token agreement with TRL on SmolLM2's own tokenizer and template."""

from __future__ import annotations

import importlib.util

import gzip
import json
import re
from pathlib import Path

import pytest

from lit_prunedpo.data.formats import BadRow, Columns, DIALOGUE_MESSAGES, dialogue_messages, extract_pair
from lit_prunedpo.data.preference import PreferenceDataModule

from .conftest import shared_dir
from .pairs_factory import SIMPLE_TEMPLATE, explicit_rows, implicit_rows, write_rows

COLS = Columns()
SMOLLM2_GGUF = shared_dir() / "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"


def _user(content: str) -> dict:
    return {"role": "user", "content": content}


def _assistant(content: str) -> dict:
    return {"role": "assistant", "content": content}


def _module(path: Path, tokenizer: Path | str, **kwargs) -> PreferenceDataModule:
    kwargs.setdefault("chat_template", SIMPLE_TEMPLATE)
    dm = PreferenceDataModule(str(path), tokenizer=str(tokenizer), dialogues="messages", batch_size=4, **kwargs)
    dm.setup("fit")
    return dm


# -- the turns ------------------------------------------------------------------------------------------


def test_turns_become_user_and_assistant_messages_less_the_markers_space() -> None:
    text = "\n\nHuman: hi there\n\nAssistant: Hello!\n\nHuman:no space\n\nAssistant:  two spaces kept \n"
    assert dialogue_messages(text, "chosen") == [
        _user("hi there"), _assistant("Hello!"), _user("no space"), _assistant(" two spaces kept \n"),
    ]


def test_the_last_turn_is_the_response_and_the_turns_before_it_the_prompt() -> None:
    prompt = "\n\nHuman: q\n\nAssistant: a\n\nHuman: and?"
    row = {"chosen": prompt + "\n\nAssistant: Sure, yes", "rejected": prompt + "\n\nAssistant: Sure, no"}
    pair = extract_pair(row, DIALOGUE_MESSAGES, COLS)
    assert pair.prompt == [_user("q"), _assistant("a"), _user("and?")]
    assert pair.chosen == [_assistant("Sure, yes")] and pair.rejected == [_assistant("Sure, no")]


HUMAN_AND = "\n\nHuman: q\n\nAssistant: a\n\nHuman: and?\n\nAssistant: "


@pytest.mark.parametrize(
    "chosen, rejected, field, kind, detail",
    [
        ("Human: q\n\nAssistant: a", "\n\nHuman: q\n\nAssistant: b", "chosen", "not_dialogue",
         "it starts with 'Human: q\\n\\nAssistant:', not with '\\n\\nHuman:'"),
        ("\n\nHuman: q\n\nAssistant: a", "Hi\n\nHuman: q\n\nAssistant: b", "rejected", "not_dialogue", "'Hi"),
        ("\n\nAssistant: a", "\n\nHuman: q\n\nAssistant: b", "chosen", "not_dialogue", "not with '\\n\\nHuman:'"),
        ("\n\nHuman: q\n\nAssistant: ", "\n\nHuman: q\n\nAssistant: b", "chosen", "empty",
         "its turn 1 ('\\n\\nAssistant:') holds no text"),
        ("\n\nHuman:  \n\nAssistant: a", "\n\nHuman: q\n\nAssistant: b", "chosen", "empty", "its turn 0"),
        ("\n\nHuman: q\n\nAssistant: a\n\nHuman: more", "\n\nHuman: q\n\nAssistant: b", "chosen", "bad_role",
         "its last turn (message 2) is a '\\n\\nHuman:' turn"),
        (HUMAN_AND + "x", "\n\nHuman: q\n\nAssistant: a\n\nHuman: or?\n\nAssistant: y", "rejected",
         "prompt_not_prefix", "its prompt (the turns before its last) differs from that of 'chosen' at message 2"),
        (HUMAN_AND + "x", "\n\nHuman: q\n\nAssistant: y", "rejected", "prompt_not_prefix", "at message 1"),
        (HUMAN_AND + "x", HUMAN_AND + "x", "rejected", "identical", ""),
        (HUMAN_AND + "x", None, "rejected", "missing", ""),
        (HUMAN_AND + "x", ["\n\nHuman: q"], "rejected", "wrong_type", ""),
    ],
)
def test_dialogues_that_do_not_split_into_turns_are_bad_rows(chosen, rejected, field, kind, detail) -> None:
    with pytest.raises(BadRow) as caught:
        extract_pair({"chosen": chosen, "rejected": rejected}, DIALOGUE_MESSAGES, COLS)
    assert (caught.value.field, caught.value.kind) == (field, kind)
    assert detail in caught.value.detail


# -- the data module --------------------------------------------------------------------------------------


def test_the_chat_template_renders_the_turns_and_closes_the_responses(tmp_path: Path, gpt2_path: Path) -> None:
    path = write_rows(tmp_path / "hh.jsonl", implicit_rows(20))
    dm = _module(path, gpt2_path, val_fraction=0.2)
    assert dm.stats["format"] == "dialogue_messages"
    row = dm.train_dataset[0]
    decode = dm.tokenizer.decode
    # BOS, the user's turn, the generation prompt; each response the assistant's turn the template closes (no EOS)
    assert row["prompt_ids"][0] == dm.tokenizer.bos_token_id
    assert decode(row["prompt_ids"][1:]) == f"<user>Question {row['index']}: </user>\n<assistant>"
    assert decode(row["chosen_ids"]) == f"Good answer {row['index']}.</assistant>\n"
    assert dm.tokenizer.eos_token_id not in row["chosen_ids"] + row["rejected_ids"]
    # the default reads the same file as text, the prompt being the text up to the last "\n\nAssistant:"
    text = PreferenceDataModule(str(path), tokenizer=str(gpt2_path), val_fraction=0.2)
    text.setup("fit")
    first = text.train_dataset[0]
    assert text.stats["format"] == "implicit"
    assert text.tokenizer.decode(first["prompt_ids"][1:]) == f"\n\nHuman: Question {first['index']}: \n\nAssistant:"


def test_a_bad_dialogue_names_the_file_row_and_field_or_is_skipped_and_counted(tmp_path: Path,
                                                                              gpt2_path: Path) -> None:
    rows = implicit_rows(12)
    rows[5] = {"chosen": rows[5]["chosen"], "rejected": "Human: hi\n\nAssistant: no"}
    path = write_rows(tmp_path / "hh.jsonl", rows)
    with pytest.raises(ValueError, match=re.escape(
            f"{path}: row 5 (0-based, line 6): field 'rejected' cannot be read as '\\n\\nHuman:'/'\\n\\nAssistant:' "
            "turns (kind 'not_dialogue'): it starts with 'Human: hi")):
        _module(path, gpt2_path)
    dm = _module(path, gpt2_path, on_bad_row="skip", val_fraction=0.25)
    bad = dm.stats["train"]["bad_rows"]["not_dialogue"] + dm.stats["val"]["bad_rows"]["not_dialogue"]
    assert bad == 1 and len(dm.train_dataset) + len(dm.val_dataset) == 11


def test_messages_are_refused_for_other_formats_and_need_a_chat_template(tmp_path: Path, gpt2_path: Path) -> None:
    explicit = write_rows(tmp_path / "explicit.jsonl", explicit_rows(8))
    with pytest.raises(ValueError, match=r"explicit.jsonl is in the explicit format, but data.init_args.dialogues="
                                         r"'messages' reads text dialogues without a prompt column"):
        _module(explicit, gpt2_path)
    with pytest.raises(ValueError, match="is conversational, but tokenizer .* has no chat template"):
        _module(write_rows(tmp_path / "hh.jsonl", implicit_rows(8)), gpt2_path, chat_template=None)
    with pytest.raises(ValueError, match="dialogues must be 'text' or 'messages', got 'chat'"):
        PreferenceDataModule(str(explicit), dialogues="chat")  # type: ignore[arg-type]


def test_jsonargparse_offers_the_two_readings() -> None:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(PreferenceDataModule, "data")
    assert parser.parse_args(["--data.dialogues", "messages"]).data.dialogues == "messages"
    assert parser.parse_args([]).data.dialogues == "text"
    with pytest.raises(SystemExit):
        parser.parse_args(["--data.dialogues", "chat"])


def test_real_hh_rlhf_dialogues_as_messages(hh_rlhf_path: Path, gpt2_path: Path) -> None:
    """All 2,312 harmless-base test pairs: 9 do not split into turns (4 end with an empty assistant turn, 5 have
    prompts that differ), skipped and counted; every other pair renders."""
    dm = _module(hh_rlhf_path, gpt2_path, on_bad_row="skip", max_length=1024, max_prompt_length=768)
    bad = {kind: dm.stats["train"]["bad_rows"][kind] + dm.stats["val"]["bad_rows"][kind]
           for kind in ("empty", "prompt_not_prefix")}
    assert bad == {"empty": 4, "prompt_not_prefix": 5}
    assert len(dm.train_dataset) + len(dm.val_dataset) == 2312 - 9


# -- TRL, on SmolLM2's tokenizer and chat template -------------------------------------------------------------------


def _trl_messages(text: str) -> list[dict]:
    """HH text to messages as TRL's own conversion of HH-RLHF does (examples/datasets/hh-rlhf-helpful-base.py)."""
    parts = re.split(r"(\n\nAssistant: |\n\nHuman: )", text)[1:]
    return [{"role": "user" if marker == "\n\nHuman: " else "assistant", "content": content}
            for marker, content in zip(parts[::2], parts[1::2])]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the [peer] extra (trl)")
def test_smollm2_ids_equal_trls_chat_template_and_tokenizer(hh_rlhf_path: Path) -> None:
    """The tokenizer read from SmolLM2-135M-Instruct's GGUF file (its ChatML template adds a default system message):
    each pair's prompt + chosen ids are those of TRL's ``maybe_apply_chat_template`` and the same tokenizer."""
    from transformers import AutoTokenizer
    from trl.data_utils import maybe_apply_chat_template

    dm = PreferenceDataModule(str(hh_rlhf_path), tokenizer=str(SMOLLM2_GGUF), dialogues="messages", max_rows=64,
                              on_bad_row="skip", val_fraction=0.0, max_length=4096, max_prompt_length=3072)
    dm.setup("fit")
    reference = AutoTokenizer.from_pretrained(SMOLLM2_GGUF.parent, gguf_file=SMOLLM2_GGUF.name)
    with gzip.open(hh_rlhf_path, "rt") as f:
        raw = [json.loads(line) for line, _ in zip(f, range(64))]
    assert dm.stats["train"]["truncated_prompts"] == dm.stats["train"]["truncated_responses"] == 0
    assert len(dm.train_dataset) == 64
    for pair in dm.train_dataset:
        chosen, rejected = (_trl_messages(raw[pair["index"]][column]) for column in ("chosen", "rejected"))
        rendered = maybe_apply_chat_template({"prompt": chosen[:-1], "chosen": chosen[-1:], "rejected": rejected[-1:]},
                                             reference)
        assert rendered["prompt"].startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
        for response in ("chosen", "rejected"):
            expected = reference(rendered["prompt"] + rendered[response], add_special_tokens=False)["input_ids"]
            assert pair["prompt_ids"] + pair[f"{response}_ids"] == expected, (pair["index"], response)
        assert pair["prompt_ids"] == reference(rendered["prompt"], add_special_tokens=False)["input_ids"]
