"""Synthetic batches are the same in every process for a seed, and the digest tells batches apart."""

import pytest
import torch

from e2eprof.workloads.batches import digest, synthetic_token_batches


def test_shape_dtype_range():
    batches = synthetic_token_batches(3, batch=2, seq=16, vocab_size=50, seed=0, pin=False)
    assert len(batches) == 3
    for b in batches:
        assert b.shape == (2, 16) and b.dtype == torch.int64 and b.device.type == "cpu"
        assert int(b.min()) >= 0 and int(b.max()) < 50
    assert not torch.equal(batches[0], batches[1])  # one generator stream, not the same batch n times


def test_deterministic_by_seed_and_global_rng_untouched():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = synthetic_token_batches(2, 4, 8, 512, seed=7, pin=False)
    assert torch.equal(torch.get_rng_state(), before)
    b = synthetic_token_batches(2, 4, 8, 512, seed=7, pin=False)
    c = synthetic_token_batches(2, 4, 8, 512, seed=8, pin=False)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])


def test_digest_stable_and_sensitive():
    a = synthetic_token_batches(2, 4, 8, 512, seed=7, pin=False)
    d = digest(a)
    assert len(d) == 64 and d == digest(synthetic_token_batches(2, 4, 8, 512, seed=7, pin=False))
    assert d != digest(synthetic_token_batches(2, 4, 8, 512, seed=8, pin=False))
    assert d != digest(a[::-1])
    assert digest([a[0]]) != digest([a[0].reshape(8, 4)])  # same bytes, different shape
    changed = [a[0].clone(), a[1]]
    changed[0][0, 0] += 1
    assert d != digest(changed)


@pytest.mark.parametrize("arg", ["n", "batch", "seq", "vocab_size"])
def test_rejects_non_positive_sizes(arg):
    kwargs = dict(n=1, batch=1, seq=1, vocab_size=1, seed=0, pin=False)
    kwargs[arg] = 0
    with pytest.raises(ValueError, match=arg):
        synthetic_token_batches(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_pin_without_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="CUDA"):
        synthetic_token_batches(1, 1, 4, 10, seed=0, pin=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_batches_are_pinned_and_digest_ignores_pinning():
    pinned = synthetic_token_batches(2, 2, 8, 100, seed=3, pin=True)
    plain = synthetic_token_batches(2, 2, 8, 100, seed=3, pin=False)
    assert all(b.is_pinned() for b in pinned)
    assert digest(pinned) == digest(plain)
