"""op_diff arithmetic, Amdahl values and the choice of cause in explain, on hand-made inputs."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from e2eprof.config import CompareConfig
from e2eprof.analysis.explain import amdahl, amdahl_bound, explain, op_diff
from e2eprof.analysis.judge import _flag_implausible
from e2eprof.analysis.verdict import FAIL, FASTER, IMPLAUSIBLE_GAIN, INCONCLUSIVE, PASS, Verdict


def _ops_frame(rows):
    keys = ["workload", "arm", "module", "op", "direction", "self_device_us", "self_cpu_us"]
    return pd.DataFrame([dict(zip(keys, r)) for r in rows])


def test_op_diff_added_removed_changed_and_sorted_by_abs_delta():
    ops = _ops_frame([
        ("train", "baseline", "e2eprof.replaced::x", "aten::_softmax", "fwd", 100.0, 5.0),
        ("train", "patched", "e2eprof.replaced::x", "e2eprof::fastsoftmax", "fwd", 30.0, 6.0),
        ("train", "baseline", "transformer.h.0.attn", "aten::copy_", "fwd", 4.0, 1.0),
        ("train", "baseline", "transformer.h.0.attn", "aten::copy_", "fwd", 6.0, 1.0),  # another shape: summed
        ("train", "patched", "transformer.h.0.attn", "aten::copy_", "fwd", 25.0, 1.0),
        ("train", "baseline", "transformer.h.0.attn", "aten::copy_", "bwd", 7.0, 1.0),
        ("train", "patched", "transformer.h.0.attn", "aten::copy_", "bwd", 7.0, 1.0),
        ("train", "sdpa", "transformer.h.0.attn", "aten::copy_", "fwd", 999.0, 1.0),  # other arms are ignored
    ])
    diff = op_diff(ops)
    assert list(diff["op"]) == ["aten::_softmax", "e2eprof::fastsoftmax", "aten::copy_", "aten::copy_"]
    by = {(r.op, r.direction): r for r in diff.itertuples()}
    removed = by[("aten::_softmax", "fwd")]
    assert removed.status == "removed" and removed.baseline_us == 100.0 and math.isnan(removed.patched_us)
    assert removed.delta_us == -100.0
    added = by[("e2eprof::fastsoftmax", "fwd")]
    assert added.status == "added" and added.delta_us == 30.0 and math.isnan(added.baseline_us)
    grown = by[("aten::copy_", "fwd")]
    assert grown.status == "changed" and grown.baseline_us == 10.0 and grown.patched_us == 25.0
    assert grown.delta_us == 15.0
    same = by[("aten::copy_", "bwd")]
    assert same.status == "changed" and same.delta_us == 0.0
    assert set(diff["time_basis"]) == {"device"}


def test_op_diff_uses_cpu_time_when_device_time_is_absent():
    ops = _ops_frame([
        ("infer", "baseline", "m", "aten::_softmax", "fwd", 0.0, 40.0),
        ("infer", "patched", "m", "aten::_softmax", "fwd", math.nan, 10.0),
        ("train", "baseline", "m", "aten::_softmax", "fwd", 8.0, 40.0),
        ("train", "patched", "m", "aten::_softmax", "fwd", 2.0, 10.0),
    ])
    diff = op_diff(ops).set_index("workload")
    assert diff.loc["infer", "time_basis"] == "cpu" and diff.loc["infer", "delta_us"] == -30.0
    assert diff.loc["train", "time_basis"] == "device" and diff.loc["train", "delta_us"] == -6.0


def test_op_diff_of_nothing_is_an_empty_frame_with_the_columns():
    diff = op_diff(_ops_frame([("train", "sdpa", "m", "op", "fwd", 1.0, 1.0)]))
    assert diff.empty and {"baseline_us", "patched_us", "delta_us", "status", "time_basis"} <= set(diff.columns)


def test_amdahl_known_values_and_guards():
    assert amdahl(0.066, 3) == pytest.approx(1.0460, abs=5e-5)  # GUIDE §5: softmax is 6.6% of the GPT-2 step
    assert amdahl(0.0, 10) == 1.0
    assert amdahl(0.5, 1.0) == 1.0
    assert amdahl(1.0, 2.0) == pytest.approx(2.0)
    assert amdahl(0.5, math.inf) == pytest.approx(2.0)
    assert amdahl_bound(0.5) == pytest.approx(2.0)
    assert amdahl_bound(0.066) == pytest.approx(1 / 0.934)
    assert math.isinf(amdahl_bound(1.0))
    assert math.isnan(amdahl(math.nan, 2.0))
    with pytest.raises(ValueError, match="f must"):
        amdahl(1.5, 2.0)
    with pytest.raises(ValueError, match="s must"):
        amdahl(0.5, 0.0)


def _profile(total, fwd, bwd, *, idle=math.nan, ops=(), device=True):
    """A ProfileResult-like dict; per-step microseconds on the device (or the CPU when device=False)."""
    basis, other = ("device", "cpu") if device else ("cpu", "device")
    return {
        f"total_{basis}_us": total, f"replaced_{basis}_us": fwd + bwd,
        f"replaced_fwd_{basis}_us": fwd, f"replaced_bwd_{basis}_us": bwd,
        f"total_{other}_us": 0.0, f"replaced_{other}_us": 0.0,
        "idle_share": idle, "ops": list(ops),
    }


def _op(module, op, us, direction="fwd", in_replaced=False):
    return {"module": module, "op": op, "input_shapes": "[]", "in_replaced": in_replaced, "direction": direction,
            "count": 1.0, "self_device_us": us, "self_cpu_us": 1.0, "kernels": ""}


BASE = _profile(1000.0, 120.0, 80.0)  # f = 0.2


def test_explain_survives():
    result = explain("train", BASE, _profile(900.0, 60.0, 40.0), 1.10)
    assert result["f"] == pytest.approx(0.2) and result["s"] == pytest.approx(2.0)
    assert result["predicted"] == pytest.approx(1 / 0.9) and result["bound"] == pytest.approx(1.25)
    assert result["cause"] == "survives" and result["causes"] == ["survives"]
    assert "predicts 1.111x" in result["detail"]


def test_explain_dilution():
    result = explain("train", _profile(1000.0, 20.0, 10.0), _profile(980.0, 5.0, 5.0), 1.02)
    assert result["f"] == pytest.approx(0.03) and result["cause"] == "dilution"
    assert "dilution" in result["detail"]


def test_explain_launch_bound():
    result = explain("train", BASE, _profile(900.0, 60.0, 40.0, idle=0.5), 1.0)
    assert result["cause"] == "launch-bound"
    assert "idle 50%" in result["detail"]


def test_explain_side_effects_names_the_ops_that_grew():
    base = _profile(1000.0, 120.0, 80.0, ops=[_op("transformer.h.0.attn", "aten::copy_", 50.0),
                                                _op("e2eprof.replaced::x", "aten::_softmax", 120.0, in_replaced=True)])
    patched = _profile(1000.0, 60.0, 40.0, ops=[_op("transformer.h.0.attn", "aten::copy_", 150.0),
                                                  _op("e2eprof.replaced::x", "e2eprof::fastsoftmax", 60.0,
                                                      in_replaced=True)])
    result = explain("train", base, patched, 1.0)
    assert result["cause"] == "side effects"
    assert result["outside_growth_us"] == pytest.approx(100.0)
    assert [g["op"] for g in result["grown_ops"]] == ["aten::copy_"]  # the replaced region's ops are not side effects
    assert "aten::copy_" in result["detail"]


def test_explain_backward_loss():
    result = explain("train", BASE, _profile(960.0, 40.0, 120.0), 0.99)
    assert result["s"] == pytest.approx(1.25)
    assert result["cause"] == "backward loss"
    assert "backward" in result["detail"]


def test_explain_implausible_beats_everything():
    result = explain("train", BASE, _profile(900.0, 60.0, 40.0), 1.4)
    assert result["cause"] == "implausible" and result["bound"] == pytest.approx(1.25)


def test_explain_unexplained_gap():
    result = explain("train", BASE, _profile(900.0, 60.0, 40.0), 0.9)
    assert result["cause"] == "unexplained"


def test_explain_uses_cpu_time_on_cpu_runs():
    result = explain("train", _profile(1000.0, 120.0, 80.0, device=False), _profile(900.0, 60.0, 40.0, device=False),
                     1.11)
    assert result["time_basis"] == "cpu" and result["cause"] == "survives"


def test_explain_without_a_baseline_region_says_so():
    result = explain("train", _profile(1000.0, 0.0, 0.0), _profile(1000.0, 0.0, 0.0), 1.0)
    assert result["f"] == 0.0 and result["cause"] == "dilution"
    assert "no time in the replaced region" in result["detail"]


def test_explain_implausible_needs_the_whole_interval_beyond_the_bound():
    patched = _profile(900.0, 60.0, 40.0)  # bound 1.25
    assert explain("train", BASE, patched, 1.4, measured_low=1.2)["cause"] != "implausible"  # noise may explain it
    assert explain("train", BASE, patched, 1.4, measured_low=1.3)["cause"] == "implausible"


@pytest.mark.parametrize("before, after", [
    (Verdict(PASS, [FASTER]), INCONCLUSIVE),  # a gain the region cannot hold is never signed off
    (Verdict(INCONCLUSIVE, ["BELOW_MARGIN"]), INCONCLUSIVE),
    (Verdict(FAIL, ["INCORRECT"]), FAIL),
])
def test_an_implausible_gain_reaches_the_verdict_as_a_reason_code(before, after):
    config = CompareConfig(model="gpt2-tiny", patch="fastsoftmax", device="cpu", workloads=("train", "infer"))
    point = config.points[0]
    result = explain("train", BASE, _profile(900.0, 60.0, 40.0), 1.4, measured_low=1.3)
    fine = explain("infer", BASE, _profile(900.0, 60.0, 40.0), 1.10, measured_low=1.08)

    def row(workload, measured, low, result):
        return {"point": point.id, "workload": workload, "arm": "patched", "speedup_vs_baseline": measured,
                "ci_low": low, "verdict": before.verdict, "reasons": ",".join(before.reasons), "advice": "",
                "replaced_share": result["f"], "amdahl_bound": result["bound"], "cause": result["cause"]}

    summary = [row("train", 1.4, 1.3, result), row("infer", 1.10, 1.08, fine)]
    verdicts = {"train": before, "infer": before}
    _flag_implausible(summary, verdicts, config)
    assert verdicts["train"].verdict == after and IMPLAUSIBLE_GAIN in verdicts["train"].reasons
    assert summary[0]["verdict"] == after and IMPLAUSIBLE_GAIN in summary[0]["reasons"].split(",")
    assert "at most 1.250x" in verdicts["train"].advice
    assert verdicts["infer"] is before and summary[1]["reasons"] == ",".join(before.reasons)
