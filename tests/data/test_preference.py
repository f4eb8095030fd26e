"""PreferenceDataModule end to end: every source and format, bad rows, truncation, caching, loaders, CLI."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
import torch

from lit_prunedpo.batch import PreferenceBatch
from lit_prunedpo.data import tokenize as tokenize_module
from lit_prunedpo.data.length_grouped import LengthGroupedSampler
from lit_prunedpo.data.preference import PreferenceDataModule

from .pairs_factory import (
    SIMPLE_TEMPLATE,
    conversational_rows,
    explicit_rows,
    implicit_conversational_rows,
    implicit_rows,
    write_rows,
)


def _module(path: Path | str, **kwargs) -> PreferenceDataModule:
    kwargs.setdefault("tokenizer", "byt5")
    kwargs.setdefault("batch_size", 4)
    dm = PreferenceDataModule(str(path), **kwargs)
    dm.setup("fit")
    return dm


def _decode(dm: PreferenceDataModule, ids: torch.Tensor, mask: torch.Tensor) -> str:
    return dm.tokenizer.decode(ids[mask].tolist(), skip_special_tokens=True)


def _all_batches(loader) -> list[PreferenceBatch]:
    batches = list(loader)
    for batch in batches:
        assert isinstance(batch, PreferenceBatch)
        batch.validate()
    return batches


# -- arguments --------------------------------------------------------------------------------------


def test_jsonargparse_resolves_the_signature() -> None:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(PreferenceDataModule, "data")
    cfg = parser.parse_args(["--data.path", "x.jsonl", "--data.tokenizer", "byt5", "--data.on_bad_row", "skip"])
    assert cfg.data.path == "x.jsonl" and cfg.data.on_bad_row == "skip" and cfg.data.val_split is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--data.path", "x", "--data.tokenizer", "byt5", "--data.on_bad_row", "ignore"])
    # The Google-style docstring is the --data.help text.
    assert "Keep only the first N rows" in parser.format_help()


def test_help_states_trls_current_truncation_default() -> None:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(PreferenceDataModule, "data")
    text = " ".join(parser.format_help().split())
    # TRL's DPOConfig defaults to truncation_mode="keep_start" since 0.29 and deprecates "keep_end" since 1.1.
    assert "also TRL's default ``truncation_mode`` since TRL 0.29" in text
    assert "TRL's default before 0.29, deprecated there since 1.1" in text


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"val_fraction": -0.1}, "val_fraction"),
        ({"truncation": "middle"}, "truncation"),
        ({"val_fraction": 1.0}, "val_fraction"),
        ({"max_prompt_length": 512, "max_length": 512}, "max_prompt_length"),
        ({"max_prompt_length": 0}, "max_prompt_length"),
        ({"batch_size": 0}, "batch_size"),
        ({"val_batch_size": 0}, "val_batch_size"),
        ({"on_bad_row": "ignore"}, "on_bad_row"),
        ({"num_proc": 0}, "num_proc"),
        ({"num_workers": -1}, "num_workers"),
        ({"max_rows": 0}, "max_rows"),
        ({"chosen_column": "prompt"}, "chosen_column"),
        ({"chat_template": "no-such-template-file.jinja"}, "chat_template"),
    ],
)
def test_out_of_range_arguments_name_the_argument(kwargs, name) -> None:
    with pytest.raises(ValueError, match=name):
        PreferenceDataModule("x.jsonl", "byt5", **kwargs)


def test_tokenizer_properties(gpt2_path: Path) -> None:
    byt5 = PreferenceDataModule("x.jsonl", "byt5")
    assert (byt5.pad_token_id, byt5.vocab_size) == (0, 384)
    gpt2 = PreferenceDataModule("x.jsonl", str(gpt2_path))
    # GPT-2 has no pad token: its EOS pads (the masks say which tokens are real).
    assert (gpt2.pad_token_id, gpt2.vocab_size) == (50256, 50257)


# -- sources and formats ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["pairs.json", "pairs.jsonl", "pairs.jsonl.gz", "pairs.parquet", "pairs.csv"])
@pytest.mark.parametrize("fmt", ["explicit", "implicit"])
def test_every_file_type_and_plain_format(tmp_path: Path, name: str, fmt: str) -> None:
    rows = explicit_rows(24) if fmt == "explicit" else implicit_rows(24)
    dm = _module(write_rows(tmp_path / name, rows), val_fraction=0.25)
    assert dm.stats["format"] == fmt
    assert dm.stats["train"]["pairs"] == 18 and dm.stats["val"]["pairs"] == 6
    batch = _all_batches(dm.val_dataloader())[0]
    row = rows[int(batch.index[0])]
    prompt = row["prompt"] if fmt == "explicit" else row["chosen"][: row["chosen"].rindex("Assistant:") + 10]
    chosen = row["chosen"] if fmt == "explicit" else row["chosen"][len(prompt):]
    assert _decode(dm, batch.prompt_ids[0], batch.prompt_mask[0]) == prompt
    assert _decode(dm, batch.response_ids[0, 0], batch.response_mask[0, 0]) == chosen
    # Plain-text responses end with EOS.
    last = batch.response_lengths[0, 0] - 1
    assert batch.response_ids[0, 0, last] == dm.tokenizer.eos_token_id


def test_save_to_disk_dataset_dict_with_val_split(tmp_path: Path) -> None:
    rows = explicit_rows(30)
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows[:20]), "test": datasets.Dataset.from_list(rows[20:])}
    ).save_to_disk(str(tmp_path / "dd"))
    dm = _module(tmp_path / "dd", val_split="test")
    assert dm.stats["train"]["rows"] == 20 and dm.stats["val"]["rows"] == 10
    val_index = torch.cat([b.index for b in _all_batches(dm.val_dataloader())])
    # Validation is not shuffled; its index is the row number in its own split after the 20 training rows,
    # so that train and val indices never collide.
    assert val_index.tolist() == list(range(20, 30))
    train_index = torch.cat([b.index for b in _all_batches(dm.train_dataloader())])
    assert sorted(train_index.tolist()) == list(range(20))


def test_single_file_val_split_is_a_held_out_share_with_a_warning(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "p.jsonl", explicit_rows(20))
    with pytest.warns(UserWarning, match=rf"^data.init_args.val_split is 'test', but {path} is a single file with no "
                                         r"named splits: validating on val_fraction 0.1 of its rows instead \(held out "
                                         r"of training, seeded\)\. Pass --data.init_args.val_split null to choose this "
                                         r"without the warning; to validate on a split of its own, give a DatasetDict"):
        dm = _module(path, val_split="test", val_fraction=0.1)
    assert (dm.stats["train"]["rows"], dm.stats["val"]["rows"]) == (18, 2)
    # The same pairs as asked for directly.
    assert dm.val_dataset["index"] == _module(path, val_fraction=0.1).val_dataset["index"]
    with pytest.warns(UserWarning, match="training on all of its rows without validation"):
        assert _module(path, val_split="test", val_fraction=0).stats["val"]["rows"] == 0


def test_hh_rlhf_config_reads_a_single_local_file(hh_rlhf_path: Path, gpt2_path: Path) -> None:
    import yaml

    config = Path(__file__).resolve().parents[2] / "configs" / "hh_rlhf.yaml"
    init = yaml.safe_load(config.read_text())["data"]["init_args"]
    assert init["val_split"] == "test"  # the hub dataset's split, which one file does not have
    init.update(tokenizer=str(gpt2_path), max_rows=100)
    del init["path"]
    with pytest.warns(UserWarning, match=r"val_split is 'test', but .*harmless-base-test.jsonl.gz is a single file"):
        dm = _module(hh_rlhf_path, **init)
    assert (dm.stats["train"]["rows"], dm.stats["val"]["rows"]) == (95, 5)


def test_missing_path_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nothing-here.jsonl: no such file"):
        _module(tmp_path / "nothing-here.jsonl")


def test_conversational_with_chat_template(tmp_path: Path) -> None:
    rows = conversational_rows(20)
    dm = _module(write_rows(tmp_path / "chat.jsonl", rows), chat_template=SIMPLE_TEMPLATE, val_fraction=0.2)
    assert dm.stats["format"] == "conversational"
    batch = _all_batches(dm.val_dataloader())[0]
    row = rows[int(batch.index[0])]
    prompt, rejected = row["prompt"][0]["content"], row["rejected"][0]["content"]
    assert _decode(dm, batch.prompt_ids[0], batch.prompt_mask[0]) == f"<user>{prompt}</user>\n<assistant>"
    # The template closes the turn itself, so no EOS is appended to conversational responses.
    assert _decode(dm, batch.response_ids[0, 1], batch.response_mask[0, 1]) == f"{rejected}</assistant>\n"


def test_implicit_prompt_conversations_read_as_their_explicit_form(tmp_path: Path) -> None:
    implicit = _module(write_rows(tmp_path / "whole.jsonl", implicit_conversational_rows(20)),
                       chat_template=SIMPLE_TEMPLATE)
    explicit = _module(write_rows(tmp_path / "split.jsonl", conversational_rows(20)), chat_template=SIMPLE_TEMPLATE)
    assert implicit.stats["format"] == "implicit_conversational"
    for split in ("train_dataset", "val_dataset"):
        ours, theirs = getattr(implicit, split), getattr(explicit, split)
        for column in ("prompt_ids", "chosen_ids", "rejected_ids", "index"):
            assert ours[column] == theirs[column]


def test_implicit_prompt_conversation_without_shared_prompt_names_row_and_field(tmp_path: Path) -> None:
    rows = implicit_conversational_rows(10)
    rows[3]["rejected"][0] = {"role": "user", "content": "another question"}
    path = write_rows(tmp_path / "whole.jsonl", rows)
    with pytest.raises(ValueError, match=rf"^{path}: row 3 \(0-based, line 4\): field 'rejected' does not share a "
                                         r"prompt with the other response \(kind 'prompt_not_prefix'\): its message 0 "
                                         r"differs from message 0 of 'chosen'"):
        _module(path, chat_template=SIMPLE_TEMPLATE)


def test_conversational_template_from_a_file(tmp_path: Path) -> None:
    template = tmp_path / "chat.jinja"
    template.write_text(SIMPLE_TEMPLATE)
    dm = _module(write_rows(tmp_path / "chat.parquet", conversational_rows(10)), chat_template=str(template))
    assert dm.stats["train"]["pairs"] + dm.stats["val"]["pairs"] == 10


def test_conversational_without_any_template_is_a_clear_error(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "chat.jsonl", conversational_rows(5))
    with pytest.raises(ValueError, match="conversational, but tokenizer .* has no chat template.*chat_template"):
        _module(path)


def test_unknown_role_stops_or_is_skipped_and_counted(tmp_path: Path) -> None:
    rows = conversational_rows(20)
    rows[4]["prompt"][0]["role"] = "wizard"
    rows[6]["chosen"][0]["role"] = "banana"
    path = write_rows(tmp_path / "chat.jsonl", rows)
    with pytest.raises(ValueError, match=rf"^{path}: row 4 \(0-based, line 5\): field 'prompt' has a message whose "
                                         r"role cannot be used there \(kind 'bad_role'\): message 0 has role 'wizard'; "
                                         r"the roles are 'system', 'developer', 'user', 'assistant', 'tool'; 1 more "
                                         r"bad rows follow\. Fix the data, or pass on_bad_row='skip'"):
        _module(path, chat_template=SIMPLE_TEMPLATE)
    dm = _module(path, chat_template=SIMPLE_TEMPLATE, on_bad_row="skip", val_fraction=0.2)
    assert dm.stats["train"]["bad_rows"]["bad_role"] + dm.stats["val"]["bad_rows"]["bad_role"] == 2
    assert dm.stats["train"]["pairs"] + dm.stats["val"]["pairs"] == 18


def test_hh_rlhf_with_gpt2(hh_rlhf_path: Path, gpt2_path: Path) -> None:
    dm = _module(hh_rlhf_path, tokenizer=str(gpt2_path), max_rows=300, max_length=384, max_prompt_length=192)
    stats = dm.stats
    assert stats["format"] == "implicit" and stats["train"]["rows"] + stats["val"]["rows"] == 300
    assert stats["train"]["pairs"] == 285 and stats["val"]["pairs"] == 15
    for split in ("train", "val"):
        for key in ("prompt_tokens", "response_tokens"):
            assert set(stats[split][key]) == {"mean", "p50", "p95", "max"}
        assert stats[split]["prompt_tokens"]["max"] <= 192
    with gzip.open(hh_rlhf_path, "rt") as f:
        raw = [json.loads(line) for _, line in zip(range(300), f)]
    batches = _all_batches(dm.train_dataloader())
    assert sum(b.num_pairs for b in batches) == 285
    batch = batches[1]
    assert batch.prompt_ids.shape[0] == 4 and batch.response_ids.shape[:2] == (4, 2)
    # Left-padded prompts: each row's real tokens are a suffix of the row.
    for mask in batch.prompt_mask:
        n = int(mask.sum())
        assert mask[-n:].all() and not mask[:-n].any()
    for i in range(batch.num_pairs):
        row = raw[int(batch.index[i])]
        prompt = dm.tokenizer.decode(batch.prompt_ids[i][batch.prompt_mask[i]].tolist())
        full_prompt = "<|endoftext|>" + row["chosen"][: row["chosen"].rindex("\n\nAssistant:") + 12]
        assert prompt.endswith("\n\nAssistant:")
        assert prompt == full_prompt or full_prompt.endswith(prompt.removeprefix("<|endoftext|>"))


# -- truncation --------------------------------------------------------------------------------------


def test_long_prompt_keeps_its_end_and_long_response_its_start(tmp_path: Path) -> None:
    rows = explicit_rows(10)
    rows[3] = {"prompt": "START " + "x" * 100 + " THE END", "chosen": "yes " * 40, "rejected": "no"}
    dm = _module(write_rows(tmp_path / "p.jsonl", rows), max_length=48, max_prompt_length=16, val_fraction=0.5)
    batches = _all_batches(dm.train_dataloader()) + _all_batches(dm.val_dataloader())
    (batch, i), = [(b, i) for b in batches for i in range(b.num_pairs) if b.index[i] == 3]
    assert _decode(dm, batch.prompt_ids[i], batch.prompt_mask[i]) == "x" * 8 + " THE END"
    assert _decode(dm, batch.response_ids[i, 0], batch.response_mask[i, 0]) == ("yes " * 40)[:32]
    total = dm.stats["train"]["truncated_prompts"] + dm.stats["val"]["truncated_prompts"]
    assert total == sum(len(r["prompt"].encode()) > 16 for r in rows)  # ByT5: one token per byte, no BOS


def test_conversational_prompts_mostly_cut_warn_with_their_lengths(tmp_path: Path) -> None:
    # The quickstart's limits (byte-level tokens, max_prompt_length 24) cut every chat-rendered prompt: the stats line
    # alone showed lengths after the cut; the warning says how long the prompts were and what to raise.
    rows = conversational_rows(20)
    for i, row in enumerate(rows):
        row["prompt"][0]["content"] = f"Question {i}: " + "tell me more " * (1 + i % 4)
    rendered = [f"<user>{r['prompt'][0]['content']}</user>\n<assistant>" for r in rows]  # ByT5: a token per byte
    lengths = sorted(len(text.encode()) for text in rendered)
    median = (lengths[9] + lengths[10]) / 2
    with pytest.warns(UserWarning, match=rf"^{tmp_path / 'chat.jsonl'}: 20 of 20 pairs \(100%\) had their prompt cut "
                                         rf"to max_prompt_length 24; prompt lengths before the cut: median "
                                         rf"{median:.0f}, max {lengths[-1]} tokens; raise "
                                         r"data.init_args.max_prompt_length"):
        dm = _module(write_rows(tmp_path / "chat.jsonl", rows), chat_template=SIMPLE_TEMPLATE, max_length=64,
                     max_prompt_length=24, val_fraction=0.2)
    assert dm.stats["train"]["truncated_prompts"] + dm.stats["val"]["truncated_prompts"] == 20
    # The cut keeps the prompt's end, the generation prompt included, once.
    batch = _all_batches(dm.val_dataloader())[0]
    assert _decode(dm, batch.prompt_ids[0], batch.prompt_mask[0]) == rendered[int(batch.index[0])][-24:]


def test_few_cut_prompts_are_no_warning(tmp_path: Path, recwarn: pytest.WarningsRecorder) -> None:
    dm = _module(write_rows(tmp_path / "p.jsonl", explicit_rows(20)), max_length=200, max_prompt_length=40)
    assert dm.stats["train"]["truncated_prompts"] + dm.stats["val"]["truncated_prompts"] == 2  # of 20: no warning
    assert dm.stats["warnings"] == [] and not [w for w in recwarn if "had their" in str(w.message)]


def test_pair_with_response_cut_to_nothing_is_dropped_and_counted(tmp_path: Path) -> None:
    # This template renders no assistant turn whose content starts with "SILENT": the response has no tokens.
    template = (
        "{% for m in messages %}{% if m['role'] != 'assistant' or not m['content'].startswith('SILENT') %}"
        "{{ m['content'] }}\n{% endif %}{% endfor %}"
    )
    rows = conversational_rows(12)
    rows[5]["chosen"][0]["content"] = "SILENT but different"
    dm = _module(write_rows(tmp_path / "chat.jsonl", rows), chat_template=template, val_fraction=0.25)
    dropped = dm.stats["train"]["dropped_empty_response"] + dm.stats["val"]["dropped_empty_response"]
    assert dropped == 1
    assert dm.stats["train"]["pairs"] + dm.stats["val"]["pairs"] == 11
    index = torch.cat([b.index for b in _all_batches(dm.train_dataloader()) + _all_batches(dm.val_dataloader())])
    assert sorted(index.tolist()) == [i for i in range(12) if i != 5]


# -- bad rows --------------------------------------------------------------------------------------


BAD_ROWS = {
    "missing": ({"prompt": "p", "chosen": None, "rejected": "r"}, "chosen"),
    "wrong_type": ({"prompt": "p", "chosen": 5, "rejected": "r"}, "chosen"),
    "empty": ({"prompt": "p", "chosen": "c", "rejected": ""}, "rejected"),
    "identical": ({"prompt": "p", "chosen": "same", "rejected": "same"}, "rejected"),
    "prompt_not_prefix": (
        {"chosen": "\n\nHuman: a\n\nAssistant: x", "rejected": "\n\nHuman: b\n\nAssistant: y"},
        "rejected",
    ),
    # Different texts that max_length (512) cuts to the same tokens.
    "identical_tokens": ({"prompt": "p", "chosen": "a" * 600 + "x", "rejected": "a" * 600 + "y"}, "rejected"),
    # A line with a byte that is not UTF-8 (written below, in place of this row).
    "unreadable": ({"prompt": "p", "chosen": "caf\u00e9", "rejected": "r"}, "<row>"),
}


def _with_bad_row(tmp_path: Path, kind: str) -> Path:
    rows = implicit_rows(20) if kind == "prompt_not_prefix" else explicit_rows(20)
    rows.insert(7, BAD_ROWS[kind][0])
    path = write_rows(tmp_path / f"{kind}.jsonl", rows)
    if kind == "unreadable":  # the same row in Latin-1: its e-acute is the lone byte 0xe9
        lines = path.read_bytes().splitlines(keepends=True)
        lines[7] = lines[7].decode("utf-8").replace("\\u00e9", "\u00e9").encode("latin-1")
        path.write_bytes(b"".join(lines))
    return path


@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
def test_bad_row_stops_with_one_message(tmp_path: Path, kind: str) -> None:
    path = _with_bad_row(tmp_path, kind)
    with pytest.raises(ValueError) as caught:
        _module(path)
    message = str(caught.value)
    assert str(path) in message and "row 7 (0-based" in message and "line 8" in message
    assert f"field '{BAD_ROWS[kind][1]}'" in message and f"kind '{kind}'" in message


def test_a_pair_cut_to_the_same_tokens_names_max_length_and_the_cli_flags(tmp_path: Path) -> None:
    # what the README's "your pairs" command met on HH-RLHF: its fixes are said as the CLI spells them
    with pytest.raises(ValueError) as caught:
        _module(_with_bad_row(tmp_path, "identical_tokens"))
    assert str(caught.value).endswith(
        "both responses are the same 511 tokens after truncation to max_length 512 (a larger data.init_args."
        "max_length keeps more of them). Fix the data, or pass on_bad_row='skip' (--data.init_args.on_bad_row skip) "
        "to drop such rows (they are counted in stats)")


@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
def test_bad_row_skipped_and_counted(tmp_path: Path, kind: str) -> None:
    dm = _module(_with_bad_row(tmp_path, kind), on_bad_row="skip", val_fraction=0.2)
    stats = dm.stats
    assert stats["train"]["bad_rows"][kind] + stats["val"]["bad_rows"][kind] == 1
    assert sum(stats["train"]["bad_rows"].values()) + sum(stats["val"]["bad_rows"].values()) == 1
    assert stats["train"]["pairs"] + stats["val"]["pairs"] == 20
    index = torch.cat([b.index for b in _all_batches(dm.train_dataloader()) + _all_batches(dm.val_dataloader())])
    assert sorted(index.tolist()) == [i for i in range(21) if i != 7]


def test_every_row_bad_is_an_error_even_when_skipping(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "p.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "a"}] * 4)
    with pytest.raises(ValueError, match="no usable pairs left"):
        _module(path, on_bad_row="skip")


# -- caching, loaders -------------------------------------------------------------------------------


def test_second_setup_reads_the_map_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    original = tokenize_module.PairEncoder.__call__

    def counting(self, batch, indices):
        calls.append(len(indices))
        return original(self, batch, indices)

    monkeypatch.setattr(tokenize_module.PairEncoder, "__call__", counting)
    path = write_rows(tmp_path / "p.jsonl", explicit_rows(40))
    first = _module(path)
    assert sum(calls) == 40
    files = [f["filename"] for f in first.train_dataset.cache_files]
    assert files and all("cache-" in Path(f).name for f in files)
    mtimes = [os.path.getmtime(f) for f in files]

    calls.clear()
    second = _module(path)
    assert calls == []
    assert [f["filename"] for f in second.train_dataset.cache_files] == files
    assert [os.path.getmtime(f) for f in files] == mtimes
    assert second.stats == first.stats

    _module(path, max_length=256, max_prompt_length=64)  # a setting that changes the ids: a new map
    assert sum(calls) == 40


def test_max_rows_takes_the_first_rows(tmp_path: Path) -> None:
    dm = _module(write_rows(tmp_path / "p.jsonl", explicit_rows(50)), max_rows=10)
    index = torch.cat([b.index for b in _all_batches(dm.train_dataloader()) + _all_batches(dm.val_dataloader())])
    assert sorted(index.tolist()) == list(range(10))


def test_train_loader_grouped_and_epoch_seeded(tmp_path: Path) -> None:
    dm = _module(write_rows(tmp_path / "p.jsonl", explicit_rows(60)), batch_size=5, val_batch_size=7)
    loader = dm.train_dataloader()
    assert isinstance(loader.sampler, LengthGroupedSampler)
    first = torch.cat([b.index for b in loader]).tolist()
    assert sorted(first) == sorted(dm.train_dataset["index"])
    assert torch.cat([b.index for b in dm.train_dataloader()]).tolist() == first
    loader.sampler.set_epoch(1)
    assert torch.cat([b.index for b in loader]).tolist() != first
    assert _all_batches(dm.val_dataloader())[0].num_pairs == 3  # 5% of 60 rows; validation batch size 7

    flat = _module(write_rows(tmp_path / "p.jsonl", explicit_rows(60)), group_by_length=False)
    assert sorted(torch.cat([b.index for b in flat.train_dataloader()]).tolist()) == sorted(flat.train_dataset["index"])


def test_train_loader_shards_itself_under_a_distributed_trainer(tmp_path: Path) -> None:
    dm = _module(write_rows(tmp_path / "p.jsonl", explicit_rows(60)))
    seen = []
    for rank in range(2):
        dm.trainer = SimpleNamespace(distributed_sampler_kwargs={"num_replicas": 2, "rank": rank})
        sampler = dm.train_dataloader().sampler
        assert (sampler.num_replicas, sampler.rank) == (2, rank)
        seen.append(list(sampler))
    assert len(seen[0]) == len(seen[1]) and set(seen[0]) | set(seen[1]) == set(range(len(dm.train_dataset)))


def test_runs_inside_a_lightning_trainer(tmp_path: Path) -> None:
    import lightning.pytorch as pl

    class Probe(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(()))
            self.epochs_seen: list[list[int]] = []

        def on_train_epoch_start(self) -> None:
            self.epochs_seen.append([])

        def training_step(self, batch: PreferenceBatch, _):
            batch.validate()
            self.epochs_seen[-1].extend(batch.index.tolist())
            return (self.weight - batch.response_lengths.float().mean()) ** 2

        def validation_step(self, batch: PreferenceBatch, _):
            batch.validate()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    dm = PreferenceDataModule(str(write_rows(tmp_path / "p.jsonl", explicit_rows(40))), "byt5", batch_size=4)
    probe = Probe()
    trainer = pl.Trainer(
        max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )
    trainer.fit(probe, datamodule=dm)
    assert dm.stats["train"]["pairs"] == 38
    assert [sorted(e) for e in probe.epochs_seen] == [sorted(dm.train_dataset["index"])] * 2
    assert probe.epochs_seen[0] != probe.epochs_seen[1]  # set_epoch reached the sampler


def test_val_fraction_zero_trains_on_every_row_and_validates_on_nothing(tmp_path):
    rows = [{"prompt": f"q{i}", "chosen": "yes", "rejected": "no"} for i in range(10)]
    dm = _module(write_rows(tmp_path / "p.jsonl", rows), val_fraction=0.0)
    assert len(dm.train_dataset) == 10 and dm.stats["val"]["pairs"] == 0
    assert dm.val_dataloader() == []


def test_trl_layout_option_drops_bos_and_keeps_the_end(tmp_path):
    from transformers import AutoTokenizer

    gpt2 = str(Path(__file__).resolve().parents[2].parent / "shared/tokenizers/gpt2")
    rows = [{"prompt": "one two three four five six", "chosen": " yes indeed it is", "rejected": " no"}] * 4
    path = write_rows(tmp_path / "p.jsonl", rows)
    tok = AutoTokenizer.from_pretrained(gpt2)
    prompt = tok(rows[0]["prompt"], add_special_tokens=False)["input_ids"]
    chosen = tok(rows[0]["chosen"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    dm = _module(path, tokenizer=gpt2, max_length=8, max_prompt_length=6, val_fraction=0.25,
                 add_bos=False, truncation="keep_end")
    pair = dm.train_dataset[0]
    assert pair["chosen_ids"] == chosen and pair["prompt_ids"] == prompt[len(prompt) + len(chosen) - 8:]
    default = _module(path, tokenizer=gpt2, max_length=8, max_prompt_length=6, val_fraction=0.25)
    assert default.train_dataset[0]["prompt_ids"][0] == tok.bos_token_id  # GPT-2's BOS (= EOS) in front
