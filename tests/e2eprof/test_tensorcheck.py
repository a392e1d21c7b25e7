"""Known-answer tests for the relative-norm comparison rule shared by op-level and model-level checks."""

import math

import pytest
import torch

from e2eprof.checks.tensorcheck import (
    compare_to_reference, error_norms, reference_facts, relative_error, same_special_values,
)

INF, NAN = math.inf, math.nan


class TestRelativeError:
    def test_known_value(self):
        reference = torch.tensor([3.0, 4.0], dtype=torch.float64)  # norm 5
        value = torch.tensor([3.0, 4.5])  # difference norm 0.5
        assert relative_error(value, reference) == pytest.approx(0.1, rel=1e-12)

    def test_identical_is_zero(self):
        x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
        assert relative_error(x, x.double()) == 0.0

    def test_computed_in_float64(self):
        # 1 + 1e-12 is 1.0 in fp32; the error must come from the fp64 values, not a float32 subtraction.
        reference = torch.tensor([1.0], dtype=torch.float64)
        value = torch.tensor([1.0 + 1e-12], dtype=torch.float64)
        assert relative_error(value, reference) == pytest.approx(1e-12, rel=1e-3)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_low_precision_value_is_subtracted_in_float64(self, dtype):
        # The reference differs from 1.0 by less than fp32 can hold: a difference taken in the value's dtype is 0.
        reference = torch.tensor([1.0 + 1e-12, 1.0], dtype=torch.float64)
        value = torch.ones(2, dtype=dtype)
        assert relative_error(value, reference) == pytest.approx(1e-12 / math.sqrt(2), rel=1e-3)
        assert relative_error(value[0], reference[0]) == pytest.approx(1e-12, rel=1e-3)  # 0-d tensors too

    def test_known_reference_facts_give_the_same_norms(self):
        g = torch.Generator().manual_seed(1)
        reference = torch.randn(7, 5, generator=g, dtype=torch.float64)
        value = (reference + 1e-3 * torch.randn(7, 5, generator=g, dtype=torch.float64)).float()
        assert error_norms(value, reference, reference_facts(reference)) == error_norms(value, reference)
        with_inf = reference.clone()
        with_inf[0, 0] = INF
        assert reference_facts(with_inf) == (False, pytest.approx(float((reference.reshape(-1)[1:] ** 2).sum())))

    @pytest.mark.parametrize("bad", [NAN, INF, -INF])
    def test_non_finite_where_reference_is_finite_is_inf(self, bad):
        reference = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
        value = torch.tensor([1.0, bad, 3.0])
        assert relative_error(value, reference) == INF  # inf, not NaN: NaN would slip past `error > tol` checks

    def test_positions_where_reference_is_not_finite_are_ignored(self):
        reference = torch.tensor([1.0, INF, NAN, 2.0], dtype=torch.float64)
        value = torch.tensor([1.0, 0.0, 5.0, 2.0])
        assert relative_error(value, reference) == 0.0

    def test_zero_reference(self):
        zero = torch.zeros(3, dtype=torch.float64)
        assert relative_error(torch.zeros(3), zero) == 0.0
        assert relative_error(torch.tensor([0.0, 1e-30, 0.0]), zero) == INF

    def test_does_not_need_grad_or_same_device_dtype(self):
        value = torch.ones(3, requires_grad=True)
        assert relative_error(value, torch.ones(3, dtype=torch.bfloat16)) == 0.0


class TestSameSpecialValues:
    def test_same_positions(self):
        a = torch.tensor([1.0, NAN, INF, -INF])
        b = torch.tensor([7.0, NAN, INF, -INF], dtype=torch.float64)
        assert same_special_values(a, b)

    @pytest.mark.parametrize(
        "b",
        [
            [1.0, NAN, INF, 0.0],  # -inf missing
            [1.0, 0.0, INF, -INF],  # NaN missing
            [NAN, NAN, INF, -INF],  # extra NaN
            [1.0, NAN, -INF, INF],  # signs swapped
            [1.0, INF, NAN, -INF],  # NaN and +inf swapped
        ],
    )
    def test_different_positions(self, b):
        assert not same_special_values(torch.tensor([1.0, NAN, INF, -INF]), torch.tensor(b))

    def test_all_finite(self):
        assert same_special_values(torch.randn(5), torch.randn(5))


def compare(out, stock, reference, floor=1e-5, factor=2.0):
    return compare_to_reference(out, stock, reference, floor=floor, factor=factor)


class TestCompareToReference:
    reference = torch.linspace(1.0, 2.0, 100, dtype=torch.float64)

    def with_error(self, rel: float) -> torch.Tensor:
        """A float32 tensor whose relative error against `reference` is (almost exactly) rel."""
        return (self.reference * (1 + rel)).float()

    def test_identical_passes(self):
        stock = self.reference.float()
        result = compare(stock.clone(), stock, self.reference)
        assert result.passed and result.problems == []
        assert result.patched_error == result.stock_error

    def test_tolerance_is_k_times_stock_when_above_floor(self):
        stock = self.with_error(1e-3)
        result = compare(self.with_error(1.9e-3), stock, self.reference, floor=1e-5, factor=2.0)
        assert result.tolerance == pytest.approx(2e-3, rel=1e-3)
        assert result.passed
        result = compare(self.with_error(2.1e-3), stock, self.reference, floor=1e-5, factor=2.0)
        assert result.tolerance == pytest.approx(2e-3, rel=1e-3)
        assert not result.passed
        assert any("relative error" in p and "tolerance" in p for p in result.problems)

    def test_factor_is_used(self):
        stock = self.with_error(1e-3)
        assert compare(self.with_error(2.9e-3), stock, self.reference, factor=3.0).passed
        assert not compare(self.with_error(2.9e-3), stock, self.reference, factor=2.0).passed

    def test_tolerance_is_floor_when_stock_is_better(self):
        stock = self.reference.float()  # stock error ~ fp32 rounding, far under the floor
        result = compare(self.with_error(0.9e-2), stock, self.reference, floor=1e-2)
        assert result.tolerance == 1e-2 and result.passed
        result = compare(self.with_error(1.1e-2), stock, self.reference, floor=1e-2)
        assert result.tolerance == 1e-2 and not result.passed

    def test_infinite_stock_error_falls_back_to_floor(self):
        stock = self.reference.float().clone()
        stock[3] = NAN  # stock is broken here: it must not widen the tolerance to infinity
        out = stock.clone()
        out[10] += 1.0  # ... and the candidate is far off elsewhere
        result = compare(out, stock, self.reference, floor=1e-5)
        assert math.isinf(result.stock_error)
        assert result.tolerance == 1e-5
        assert not result.passed

    def test_a_zero_exact_result_holds_the_kernel_to_the_stock_residue(self):
        # A saturated softmax's gradient is exactly zero in fp64; bf16/fp32 paths leave a residue. Both relative errors
        # are infinite, so the relative rule would fail any kernel the stock path matches (seen on the H100: a decode
        # stress point at logits x1e6). The kernel is held to the stock path's own absolute residue instead.
        reference = torch.zeros(64, dtype=torch.float64)
        stock = torch.full((64,), 1e-7)
        assert compare(torch.full((64,), 1.9e-7), stock, reference, factor=2.0).passed
        assert compare(torch.zeros(64), stock, reference, factor=2.0).passed  # the exact answer
        result = compare(torch.full((64,), 1e-3), stock, reference, factor=2.0)
        assert not result.passed and any("absolute error" in p and "exact result is zero" in p for p in result.problems)
        assert not compare(torch.full((64,), INF), stock, reference).passed

    def test_a_zero_exact_result_the_stock_path_meets_exactly_admits_no_residue(self):
        reference = torch.zeros(8, dtype=torch.float64)
        result = compare(torch.full((8,), 1e-30), torch.zeros(8), reference, floor=1e-2)
        assert not result.passed and math.isinf(result.patched_error)

    def test_low_magnitude_garbage_is_caught(self):
        # All values ~1e-6: zeros are within any absolute tolerance like 1e-5, but 100% off in relative norm.
        reference = torch.rand(64, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 1e-6 + 1e-6
        stock = reference.float()
        result = compare(torch.zeros_like(stock), stock, reference)
        assert not result.passed
        assert result.patched_error == pytest.approx(1.0)
        assert torch.allclose(torch.zeros_like(stock), stock, atol=1e-5)  # what an absolute check would say

    def test_nan_where_stock_is_finite_fails(self):
        stock = self.reference.float()
        out = stock.clone()
        out[0] = NAN
        result = compare(out, stock, self.reference)
        assert not result.passed
        assert result.patched_error == INF
        assert any("NaN/Inf positions" in p for p in result.problems)

    def test_nan_where_stock_is_nan_passes(self):
        reference = self.reference.clone()
        reference[5] = NAN
        stock = reference.float()
        assert compare(stock.clone(), stock, reference).passed

    def test_dtype_mismatch(self):
        stock = self.reference.float()
        result = compare(self.reference.clone(), stock, self.reference)
        assert not result.passed
        assert "dtype float64 != stock float32" in result.problems

    def test_shape_mismatch(self):
        stock = self.reference.float()
        result = compare(stock[:-1].clone(), stock, self.reference)
        assert not result.passed and result.patched_error == INF
        assert "shape (99,) != stock (100,)" in result.problems[0]

    def test_stride_mismatch(self):
        reference = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        stock = reference.float()
        out = stock.t().contiguous().t()  # same values, column-major
        result = compare(out, stock, reference)
        assert not result.passed
        assert any(p.startswith("strides") for p in result.problems)

    def test_tensor_subclass_is_rejected(self):
        class Lazy(torch.Tensor):
            pass

        stock = self.reference.float()
        result = compare(stock.clone().as_subclass(Lazy), stock, self.reference)
        assert not result.passed
        assert result.problems == ["output is Lazy, not a plain torch.Tensor"]

    def test_non_tensor_is_rejected(self):
        stock = self.reference.float()
        result = compare(stock.tolist(), stock, self.reference)
        assert not result.passed and "not a plain torch.Tensor" in result.problems[0]
