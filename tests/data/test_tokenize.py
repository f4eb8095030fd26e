"""Layout rules of lit_prunedpo.data.tokenize: BOS, EOS, truncation, the one-token prompt floor."""

from __future__ import annotations

import pytest

from lit_prunedpo.data.tokenize import build_pair_ids, load_tokenizer, prompt_fallback_id

LIMITS = dict(max_length=10, max_prompt_length=4)


def test_long_prompt_keeps_its_end_and_bos() -> None:
    out = build_pair_ids([1, 2, 3, 4, 5, 6], [7], [8], bos_id=0, eos_id=99, fallback_id=0, **LIMITS)
    assert out.prompt_ids == [0, 4, 5, 6] and out.prompt_truncated
    assert out.chosen_ids == [7, 99] and out.rejected_ids == [8, 99]


def test_long_prompt_without_bos_keeps_its_end() -> None:
    out = build_pair_ids([1, 2, 3, 4, 5, 6], [7], [8], bos_id=None, eos_id=None, fallback_id=0, **LIMITS)
    assert out.prompt_ids == [3, 4, 5, 6]


def test_bos_not_doubled() -> None:
    out = build_pair_ids([0, 5], [7], [8], bos_id=0, eos_id=None, fallback_id=0, **LIMITS)
    assert out.prompt_ids == [0, 5]


def test_responses_keep_their_start_within_max_length() -> None:
    out = build_pair_ids([1, 2, 3], list(range(10, 20)), [30], bos_id=None, eos_id=99, fallback_id=0, **LIMITS)
    assert out.chosen_ids == [10, 11, 12, 13, 14, 15, 16] and out.response_truncated
    assert out.rejected_ids == [30, 99]
    assert len(out.prompt_ids) + len(out.chosen_ids) == LIMITS["max_length"]


def test_empty_prompt_gets_one_token() -> None:
    assert build_pair_ids([], [7], [8], bos_id=5, eos_id=None, fallback_id=5, **LIMITS).prompt_ids == [5]
    assert build_pair_ids([], [7], [8], bos_id=None, eos_id=None, fallback_id=1, **LIMITS).prompt_ids == [1]


def test_response_with_no_tokens_comes_back_empty() -> None:
    out = build_pair_ids([1], [], [8], bos_id=None, eos_id=None, fallback_id=0, **LIMITS)
    assert out.chosen_ids == [] and out.rejected_ids == [8]


def test_fallback_is_bos_else_eos() -> None:
    byt5 = load_tokenizer("byt5")
    assert byt5.bos_token_id is None
    assert prompt_fallback_id(byt5) == byt5.eos_token_id


def test_trl_layout_adds_no_bos() -> None:
    out = build_pair_ids([1, 2], [7], [8], bos_id=0, eos_id=99, fallback_id=0, add_bos=False, **LIMITS)
    assert out.prompt_ids == [1, 2]
    assert build_pair_ids([1, 2], [7], [8], bos_id=0, eos_id=99, fallback_id=0, **LIMITS).prompt_ids == [0, 1, 2]


def test_keep_end_cuts_the_prompt_start_before_the_responses() -> None:
    # prompt 4 tokens + longer response 7 (6 + EOS) = 11 > 10: the prompt loses its first token, responses stay whole
    out = build_pair_ids([1, 2, 3, 4], list(range(10, 16)), [30], bos_id=None, eos_id=99, fallback_id=0,
                         truncation="keep_end", **LIMITS)
    assert out.prompt_ids == [2, 3, 4] and out.prompt_truncated and not out.response_truncated
    assert out.chosen_ids == [10, 11, 12, 13, 14, 15, 99] and out.rejected_ids == [30, 99]
    # keep_start (the default) cuts the response instead
    default = build_pair_ids([1, 2, 3, 4], list(range(10, 16)), [30], bos_id=None, eos_id=99, fallback_id=0, **LIMITS)
    assert default.prompt_ids == [1, 2, 3, 4] and default.chosen_ids == [10, 11, 12, 13, 14, 15]


def test_keep_end_keeps_one_prompt_token_then_cuts_responses() -> None:
    out = build_pair_ids([1, 2, 3], list(range(10, 30)), [30], bos_id=None, eos_id=None, fallback_id=0,
                         truncation="keep_end", **LIMITS)
    assert out.prompt_ids == [3] and out.chosen_ids == list(range(10, 19)) and out.response_truncated


def test_lengths_before_the_cut_are_kept() -> None:
    out = build_pair_ids(list(range(1, 21)), list(range(10, 30)), [30], bos_id=0, eos_id=99, fallback_id=0, **LIMITS)
    assert out.prompt_truncated and out.response_truncated
    assert (out.prompt_length, out.response_length) == (21, 21)  # BOS + 20 prompt ids; 20 + EOS for the longer response


# -- hub names (lit_prunedpo.hub) --------------------------------------------------------------------


def _hub_silent(monkeypatch, cached: bool) -> list[dict]:
    """The hub does not answer (no probe leaves the machine), with or without a cached copy; returns the keyword
    arguments AutoTokenizer.from_pretrained gets."""
    from huggingface_hub import constants

    from lit_prunedpo import hub
    from lit_prunedpo.data import tokenize

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "probe_hub", lambda timeout=hub.PROBE_TIMEOUT_S: "ConnectError: no route")
    monkeypatch.setattr(tokenize, "in_hub_cache", lambda name, repo_type="model": cached)
    calls: list[dict] = []
    byt5 = load_tokenizer("byt5")

    def from_pretrained(name, **kwargs):
        calls.append(kwargs)
        return byt5

    monkeypatch.setattr(tokenize.AutoTokenizer, "from_pretrained", from_pretrained)
    return calls


def test_hub_tokenizer_fails_at_once_when_the_hub_is_silent_and_nothing_is_cached(monkeypatch) -> None:
    from lit_prunedpo.hub import HubUnreachable

    calls = _hub_silent(monkeypatch, cached=False)
    with pytest.raises(HubUnreachable, match=r"^'gpt2' \(data.init_args.tokenizer\) is not a local path, so it is a "
                                             r"Hugging Face Hub name, but the hub .* does not answer"):
        load_tokenizer("gpt2")
    assert calls == []  # transformers' retries never started


def test_hub_tokenizer_is_read_from_the_cache_when_the_hub_is_silent(monkeypatch) -> None:
    calls = _hub_silent(monkeypatch, cached=True)
    load_tokenizer("gpt2")
    assert calls == [{"local_files_only": True}]


def test_offline_hub_tokenizer_not_in_the_cache_says_so() -> None:
    # The tests run with HF_HUB_OFFLINE=1 (conftest): transformers' own error, with what offline mode did.
    with pytest.raises(ValueError, match=r"HF_HUB_OFFLINE=1 is set, so 'no-org/no-such-tokenizer' was looked up only "
                                         r"in the local cache"):
        load_tokenizer("no-org/no-such-tokenizer")
