import torch

from lit_prunedpo.rng import SamplerRNG


def _draws(rng: SamplerRNG, n: int) -> list[torch.Tensor]:
    return [torch.rand(3, generator=rng.next()) for _ in range(n)]


def test_resume_draws_what_an_uninterrupted_run_draws_on_every_rank():
    for rank in (0, 1):
        full = _draws(SamplerRNG(seed=5, rank=rank), 4)
        first = SamplerRNG(seed=5, rank=0)
        _draws(first, 2)
        state = first.state_dict()  # rank 0 writes the checkpoint
        resumed = SamplerRNG(seed=0, rank=rank)
        resumed.load_state_dict(state)
        assert (resumed.seed, resumed.rank, resumed.step) == (5, rank, 2)
        for a, b in zip(_draws(resumed, 2), full[2:], strict=True):
            assert torch.equal(a, b)
