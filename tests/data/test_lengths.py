"""Length statistics and the warning a large share of cut prompts or responses gets (lit_prunedpo.data.lengths)."""

from __future__ import annotations

import numpy as np

from lit_prunedpo.data.lengths import truncation_warnings


def _warnings(prompt_cut, prompt_length, response_cut=(False,) * 10, response_length=(1,) * 10, **kwargs):
    kwargs = {"max_length": 64, "max_prompt_length": 24, **kwargs}
    return truncation_warnings("pairs.jsonl", np.array(prompt_cut), np.array(prompt_length), np.array(response_cut),
                               np.array(response_length), **kwargs)


def test_a_fifth_cut_is_no_warning_more_is() -> None:
    lengths = [10] * 7 + [30, 40, 500]
    assert _warnings([False] * 8 + [True] * 2, lengths) == []
    (message,) = _warnings([False] * 7 + [True] * 3, lengths)
    assert message == (
        "pairs.jsonl: 3 of 10 pairs (30%) had their prompt cut to max_prompt_length 24; prompt lengths before the cut: "
        "median 10, max 500 tokens; raise data.init_args.max_prompt_length (it must stay below max_length: raise that "
        "too if needed) to keep more of it"
    )


def test_cut_responses_name_max_length() -> None:
    (message,) = _warnings([False] * 10, [5] * 10, [True] * 10, [100] * 9 + [900])
    assert message.startswith("pairs.jsonl: 10 of 10 pairs (100%) had their longer response cut to fit max_length 64 "
                              "together with its prompt; longer response lengths before the cut: median 100, max 900")
    assert message.endswith("raise data.init_args.max_length to keep more of it")


def test_keep_end_names_max_length_for_prompts_too() -> None:
    (message,) = _warnings([True] * 10, [50] * 10, truncation="keep_end")
    assert "or, under truncation keep_end, to fit max_length 64 with the longer response" in message
    assert message.endswith("raise data.init_args.max_length, and max_prompt_length where the prompts pass it to keep "
                            "more of it")


def test_no_pairs_no_warning() -> None:
    assert _warnings([], [], [], []) == []
