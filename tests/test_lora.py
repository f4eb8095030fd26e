"""LoRA (peft): the adapters-off reference scores exactly the base model, gradients reach only the adapters,
nothing of the policy is registered twice, the cached reference agrees with the online one, checkpoints hold
the adapters only, resume is exact, and every sampler, the chunked scorer and gradient checkpointing train; a base
folder replaced or moved since training is refused by export and resume, naming it and what to pass.
DDP and FSDP2 on 2 CPU processes run with the multi-process tests (tests/distributed)."""

from __future__ import annotations

import re

import pytest
import torch

from lit_prunedpo import PrunedDPO
from lit_prunedpo.batch import collate_pairs
from lit_prunedpo.chunked_scorer import ChunkedScorer
from lit_prunedpo.cli import build_cli
from lit_prunedpo.data import SyntheticPreferenceData
from lit_prunedpo.lora import LoRA, is_peft_model
from lit_prunedpo.step.plan import plan_step
from lit_prunedpo.reference import CachedReference, ReferenceRuntime
from lit_prunedpo.samplers import (AllPositions, AntitheticBranch, BothBranches, FullPrefix, SharedFractionPrefix,
                                  StratifiedPositions)
from lit_prunedpo.scoring import TokenScorer, group_inputs

from helpers import REPO, TINY_LLAMA, score_policy

EXACT = (FullPrefix(), AllPositions(), BothBranches())
PRUNED = (SharedFractionPrefix(0.5), StratifiedPositions(rate=0.5), AntitheticBranch())
FAST = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.log_every_n_steps=1",
        "--data.init_args.max_rows=64", "--data.init_args.val_fraction=0.25", "--data.init_args.batch_size=8",
        "--trainer.limit_val_batches=1"]


@pytest.fixture
def lora(tiny_source) -> LoRA:
    return LoRA(tiny_source, r=4, alpha=8, target_modules="all-linear")


def _perturb_adapters(policy, scale=0.1, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_" in name:
                p.add_(scale * torch.randn(p.shape, generator=g))


def _pairs():
    dm = SyntheticPreferenceData(vocab_size=32, num_train=40, num_val=8, batch_size=8, seed=3)
    dm.setup("fit")
    return dm, collate_pairs((dm.train_pairs + dm.val_pairs)[:6], pad_id=0)


def test_reference_is_the_base_model_with_no_copy(lora, tiny_source):
    module = PrunedDPO(policy=lora)
    assert is_peft_model(module.policy)
    assert module.reference.models() == [] and not list(module.reference.parameters())
    assert not any(k.startswith("reference.") for k in module.state_dict())  # no duplicate parameters
    _perturb_adapters(module.policy)
    _, batch = _pairs()
    plan = plan_step(batch, *EXACT, generator=torch.Generator())
    base = tiny_source.build().eval()
    with torch.no_grad():
        expected = TokenScorer()(base, group_inputs(batch, plan.groups[0]))
        adapted = score_policy(module, batch, plan.groups[0])
    (reference,) = module.reference.token_logps(batch, plan)
    torch.testing.assert_close(reference, expected, rtol=0, atol=1e-6)
    assert (adapted - expected).abs().max() > 1e-3  # the adapters do change the policy
    assert module.policy.training  # the reference's eval mode was put back


def test_gradients_reach_only_the_adapters_and_the_optimizer_holds_only_them(lora):
    module = PrunedDPO(policy=lora)
    _perturb_adapters(module.policy)  # lora_B starts at 0, where lora_A gets no gradient
    _, batch = _pairs()
    est = module.execute_and_estimate(batch, plan_step(batch, *PRUNED, generator=torch.Generator().manual_seed(1)))
    est.objective.backward()
    named = dict(module.policy.named_parameters())
    adapters = {n for n in named if "lora_" in n}
    assert adapters and all(named[n].grad is not None and named[n].grad.abs().sum() > 0 for n in adapters)
    assert all(p.grad is None and not p.requires_grad for n, p in named.items() if n not in adapters)
    optimizer = module.configure_optimizers()
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(named[n]) for n in adapters}


def test_cached_reference_built_from_a_lora_policy_agrees_with_the_adapters_off_reference(lora, tmp_path):
    dm, batch = _pairs()
    online = PrunedDPO(policy=lora)
    _perturb_adapters(online.policy)  # even with live adapters the cache must hold the base model's log-probs
    cached = PrunedDPO(policy=lora, reference=CachedReference(path=str(tmp_path / "ref.safetensors"), batch_size=5))
    cached.policy.load_state_dict(online.policy.state_dict())
    cached.reference.prepare(cached.policy, dm, ReferenceRuntime(root_dir=str(tmp_path)))
    plan = plan_step(batch, *PRUNED, generator=torch.Generator().manual_seed(2))
    for a, b in zip(online.reference.token_logps(batch, plan), cached.reference.token_logps(batch, plan), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)


def test_lora_arguments_are_checked(tiny_source):
    with pytest.raises(ValueError, match="r must be"):
        LoRA(tiny_source, r=0)
    with pytest.raises(ValueError, match="not peft.LoraConfig fields"):
        LoRA(tiny_source, options={"rank": 3}).build()


def _fit(root, steps, *extra):
    return build_cli(["fit", "--config", str(REPO / "configs/lora.yaml"), f"--trainer.default_root_dir={root}",
                      f"--trainer.max_steps={steps}", f"--trainer.val_check_interval={steps}", *FAST, *extra])


def test_checkpoint_holds_the_adapters_only_and_resume_is_exact(tmp_path):
    full = _fit(tmp_path / "full", 4)
    _fit(tmp_path / "half", 2)
    ckpt = tmp_path / "half/lightning_logs/version_0/checkpoints/last.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    trainable = {"policy." + n for n, p in full.model.policy.named_parameters() if p.requires_grad}
    assert set(state) == trainable
    resumed = _fit(tmp_path / "resumed", 4, f"--ckpt_path={ckpt}")
    for (name, a), b in zip(full.model.policy.state_dict().items(), resumed.model.policy.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name


def test_every_sampler_chunked_scorer_and_gradient_checkpointing_train_adapters(tmp_path):
    cli = _fit(tmp_path, 2, "--model.prefix_sampler=lit_prunedpo.samplers.SharedFractionPrefix",
               "--model.position_sampler=lit_prunedpo.samplers.StratifiedPositions",
               "--model.position_sampler.rate=0.5", "--model.branch_sampler=lit_prunedpo.samplers.AntitheticBranch",
               "--model.scorer=lit_prunedpo.chunked_scorer.ChunkedScorer", "--model.gradient_checkpointing=true")
    assert isinstance(cli.model.scorer, ChunkedScorer) and cli.trainer.global_step == 2
    initial = LoRA(cli.model.policy_source.base, r=8, alpha=16, target_modules="all-linear").build().state_dict()
    for name, tensor in cli.model.policy.state_dict().items():
        changed = not torch.equal(tensor, initial[name])
        assert changed == ("lora_B" in name or "lora_A" in name), name


def _saved_for_backward(layer, x):
    """The distinct tensors (by storage) that ``layer(x)`` saves for backward, parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    saved = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            saved.setdefault(t.untyped_storage().data_ptr(), t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x).sum().backward()
    return list(saved.values())


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_an_adapted_layer_saves_only_its_input_and_the_rank_r_projection(tiny_source, dropout):
    """Per adapted linear layer, LoRA's branch saves for backward the input the frozen layer needs anyway (the
    same storage, not a copy) and ``A x`` (r wide): nothing input-sized more. With ``lora_dropout`` > 0 set to 0
    by ``disable_dropout``, dropout must neither copy the input nor save a mask (a dropout that did would save
    an input-sized copy and a mask per layer: the test fails with ``disable_dropout=False``)."""
    from peft.tuners.lora import Linear as LoraLinear

    r = 4
    module = PrunedDPO(policy=LoRA(tiny_source, r=r, alpha=8, dropout=dropout, target_modules="all-linear")).train()
    layers = [m for m in module.policy.modules() if isinstance(m, LoraLinear)]
    assert len(layers) == 7 * TINY_LLAMA["num_hidden_layers"]  # q k v o gate up down
    for layer in layers:
        x = torch.randn(2, 5, layer.in_features, requires_grad=True)
        saved = _saved_for_backward(layer, x)
        assert any(t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for t in saved)
        others = [t for t in saved if t.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()]
        assert [(t.numel(), t.shape[-1]) for t in others] == [(2 * 5 * r, r)], [t.shape for t in others]


def _save_base(path, seed):
    """A base model folder: the quickstart's tiny Llama (ByT5 vocabulary) with the weights of ``seed``."""
    import shutil

    from lit_prunedpo.models import FromConfig

    shutil.rmtree(path, ignore_errors=True)
    FromConfig("llama", dict(TINY_LLAMA, vocab_size=384), seed=seed).build().save_pretrained(path)


def test_a_replaced_base_is_refused_by_resume_and_export(tmp_path):
    """A single-file LoRA checkpoint holds the adapters and the base's source (a folder); the folder replaced by a
    model of the same architecture with other weights must not be used silently, by a resume or an export (the
    same base resumes in test_checkpoint_holds_the_adapters_only_and_resume_is_exact)."""
    from lit_prunedpo.export import export

    base = tmp_path / "base"
    _save_base(base, seed=0)
    pretrained = (f'--model.policy.init_args.base={{"class_path": "lit_prunedpo.models.Pretrained", "init_args": '
                  f'{{"name_or_path": "{base}"}}}}')
    _fit(tmp_path / "run", 1, pretrained)
    ckpt = tmp_path / "run/lightning_logs/version_0/checkpoints/last.ckpt"
    saved = torch.load(ckpt, map_location="cpu", weights_only=False)["policy"]["base_digest"]
    assert re.fullmatch("[0-9a-f]{64}", saved)
    export(str(ckpt), str(tmp_path / "same"))  # the same base: accepted

    _save_base(base, seed=1)  # same architecture, other weights
    refused = (rf"^checkpoint {re.escape(str(ckpt))}: the LoRA base '{re.escape(str(base))}' is not the model the "
               rf"adapters were trained on: its weights' sha256 is [0-9a-f]{{64}}, the checkpoint was trained on "
               rf"{saved} ")
    with pytest.raises(ValueError, match=refused):
        export(str(ckpt), str(tmp_path / "other"))
    with pytest.raises(ValueError, match=refused):
        _fit(tmp_path / "resumed", 2, pretrained, f"--ckpt_path={ckpt}")


def test_a_checkpoint_without_a_base_digest_is_exported_with_a_warning(lora, tmp_path):
    from lit_prunedpo.export import export, policy_metadata

    policy = lora.build()
    info = policy_metadata(policy, lora)
    assert info["base_digest"] == lora.base_digest and len(lora.base_digest) == 64
    del info["base_digest"]  # as written before digests were stored
    adapters = {f"policy.{n}": p.detach() for n, p in policy.named_parameters() if p.requires_grad}
    torch.save({"state_dict": adapters, "policy": info}, tmp_path / "old.ckpt")
    with pytest.warns(UserWarning, match=r"cannot check that the LoRA base FromConfig\(model_type='llama', seed=0, "
                                         r"dtype=None\) is the model its adapters were trained on \(no digest"):
        export(str(tmp_path / "old.ckpt"), str(tmp_path / "hf"))


def test_the_base_digest_is_the_identity_of_the_weights(tiny_source):
    from lit_prunedpo.lora import base_weights_digest
    from lit_prunedpo.models import FromConfig

    digest = lambda model: base_weights_digest(model, tiny_source.spec())  # noqa: E731
    first, again = tiny_source.build(), tiny_source.build()
    assert digest(first) == digest(again) != digest(FromConfig("llama", TINY_LLAMA, seed=1).build())
    with torch.no_grad():
        next(again.parameters()).view(-1)[0] += 1e-6  # one value of one tensor
    assert digest(again) != digest(first) != digest(first.to(torch.bfloat16))


def test_a_moved_base_folder_is_named_by_export_and_resume(tmp_path, monkeypatch, capsys):
    """The base folder named ``./base`` at training time: an export from another working folder still finds it (the
    checkpoint records its absolute path); once moved, export and resume say the folder is gone and what to pass,
    instead of taking its path for a malformed hub name; ``export --base_model`` loads it from its new place."""
    from safetensors.torch import load_file

    from lit_prunedpo.cli import main

    monkeypatch.chdir(tmp_path)
    _save_base(tmp_path / "base", seed=0)
    pretrained = ('--model.policy.init_args.base={"class_path": "lit_prunedpo.models.Pretrained", '
                  '"init_args": {"name_or_path": "./base"}}')
    _fit(tmp_path / "run", 1, pretrained)
    ckpt = tmp_path / "run/lightning_logs/version_0/checkpoints/last.ckpt"
    assert torch.load(ckpt, map_location="cpu", weights_only=False)["policy"]["base_folder"] == str(tmp_path / "base")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    main(["export", f"--ckpt_path={ckpt}", f"--out={tmp_path / 'found'}"])  # ./base is not here: the recorded path is

    (tmp_path / "base").rename(tmp_path / "moved")
    gone = (rf"^the LoRA base model folder \./base \({re.escape(str(tmp_path / 'base'))} when trained\) named in "
            rf"checkpoint {re.escape(str(ckpt))} does not exist \(moved or deleted\?\): pass --base_model <new path>$")
    with pytest.raises(FileNotFoundError, match=gone):
        main(["export", f"--ckpt_path={ckpt}", f"--out={tmp_path / 'hf'}"])
    assert not (tmp_path / "hf").exists()
    nowhere = re.escape(str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=rf"^--base_model {nowhere}: no such folder"):
        main(["export", f"--ckpt_path={ckpt}", f"--out={tmp_path / 'hf'}", f"--base_model={tmp_path / 'nowhere'}"])
    main(["export", f"--ckpt_path={ckpt}", f"--out={tmp_path / 'hf'}", f"--base_model={tmp_path / 'moved'}"])
    found, moved = load_file(tmp_path / "found/model.safetensors"), load_file(tmp_path / "hf/model.safetensors")
    assert found.keys() == moved.keys() and all(torch.equal(found[k], moved[k]) for k in found)

    resume = (r"^the LoRA base model folder \./base named in the config \(model\.policy\.init_args\.base\.init_args\."
              r"name_or_path\) does not exist \(moved or deleted\?\): pass "
              r"--model\.policy\.init_args\.base\.init_args\.name_or_path=<new path>$")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=resume):
        main(["fit", "--config", str(REPO / "configs/lora.yaml"), f"--trainer.default_root_dir={tmp_path / 'resumed'}",
              "--trainer.max_steps=2", *FAST, pretrained, f"--ckpt_path={ckpt}"])
