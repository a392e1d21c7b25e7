"""The neighbouring shapes of the unseen-shape check (e2eprof.checks.unseen_shapes); the check itself is exercised on the
rogue that is right only on power-of-two rows (tests/e2eprof/test_rogues.py, seen_shapes_only.py)."""

import pytest
import torch

from e2eprof.checks.unseen_shapes import neighbour_shapes, neighbours, resized_arguments


def test_neighbours_keep_the_rank_batch_and_heads_and_change_rows_and_row_length():
    # GPT-2's attention scores: odd rows at the same length, an odd length (a tail), a doubled length (a block).
    assert neighbour_shapes((8, 12, 1024, 1024), True) == [(8, 12, 3, 1024), (8, 12, 3, 1025), (8, 12, 3, 2048)]
    assert neighbour_shapes((2, 7), True) == [(3, 7), (3, 9), (3, 14)]  # an odd length gets the next odd one
    assert neighbour_shapes((5,), True) == [(7,), (10,)]  # a vector: only its length can change
    assert neighbour_shapes((), True) == []


def test_weights_that_fix_the_row_length_leave_only_the_rows():
    assert neighbour_shapes((16, 768), False) == [(3, 768)]
    assert neighbour_shapes((3, 768), False) == []  # already the neighbour: nothing new to try


def test_tensors_shaped_like_the_first_get_fresh_values_and_the_rest_stay():
    x, same, other, module = torch.randn(4, 8), torch.randn(4, 8), torch.randn(5), torch.nn.Linear(8, 8)
    args, kwargs, made = resized_arguments((module, x, other), {"y": same, "dim": -1}, 1, (4, 8), (3, 8),
                                           torch.Generator().manual_seed(0))
    assert args[0] is module and args[2] is other  # the bound module and a tensor of unrelated sizes stay
    assert args[1].shape == kwargs["y"].shape == (3, 8) and kwargs["dim"] == -1
    assert len(made) == 2 and all(t.dtype == torch.float32 for t in made)
    assert not torch.equal(args[1], kwargs["y"])  # fresh values for each, not one tensor twice


def test_a_mask_over_the_rows_is_cut_to_them_and_keeps_its_meaning():
    # Attention: query (B, H, T, D) with T = 6 rows of D = 4; the causal mask (B, 1, T, T) shares T.
    query = torch.randn(2, 3, 6, 4)
    causal = torch.full((6, 6), -1e9).triu(1).expand(2, 1, 6, 6)
    args, _, _ = resized_arguments((query, causal), {}, 0, (2, 3, 6, 4), (2, 3, 3, 5), torch.Generator().manual_seed(0))
    assert args[0].shape == (2, 3, 3, 5) and args[1].shape == (2, 1, 3, 3)
    assert torch.equal(args[1], causal[:, :, :3, :3])  # still causal: the corner of the original
    # A mask that would have to grow (no values to give it), or rows as long as the row length (which size is
    # which?), cannot follow: the neighbour is left out.
    assert resized_arguments((query, torch.randn(4)), {}, 0, (2, 3, 6, 4), (2, 3, 3, 8), torch.Generator()) is None
    square = torch.randn(2, 3, 6, 6)
    assert resized_arguments((square, causal), {}, 0, (2, 3, 6, 6), (2, 3, 3, 6), torch.Generator()) is None
    assert list(neighbours((square, causal), {}, 0, True)) == []


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_neighbours_draw_the_same_values_every_time_in_the_calls_dtype(dtype):
    x = torch.randn(2, 4, dtype=dtype)
    first = [(s, a[0]) for s, a, _, _ in neighbours((x,), {}, 0, True)]
    again = [(s, a[0]) for s, a, _, _ in neighbours((x,), {}, 0, True)]
    assert [s for s, _ in first] == [(3, 4), (3, 5), (3, 8)]
    assert all(t.dtype == dtype and torch.equal(t, u) for (_, t), (_, u) in zip(first, again))


def test_no_neighbours_for_integer_inputs():
    assert list(neighbours((torch.arange(6),), {}, 0, True)) == []
