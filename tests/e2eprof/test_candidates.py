"""Several candidates in one run (e2eprof.candidates): real CPU runs of two built-ins and a file patch beside one
baseline, a stack and a deliberately broken candidate; the refusals before measuring; ranking, pairwise intervals in
the correction family and the run's verdict over candidates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from e2eprof import candidates as cand
from e2eprof.analysis import stats
from e2eprof.analysis.summary import summarize
from e2eprof.analysis.verdict import EXIT_CODES, FAIL, INCONCLUSIVE, PASS, Verdict
from e2eprof.config import CompareConfig
from e2eprof.harness.arm_plan import planned_arms, with_replicas
from e2eprof.tables import reports, schema

from tests.e2eprof.test_summary import clean_checks, steps_for

ROGUES = Path(__file__).resolve().parents[1] / "rogues"
# GPT-2's tanh GELU in plain torch ops: a correct candidate from a file, on the same site as fastgelu.
MY_GELU = '''
import math
from collections import Counter
import torch
from transformers.activations import NewGELUActivation
from e2eprof.kernels.fastgelu.patch import gelu_reference
from e2eprof.patch import Patch

CALLS = Counter()

class TorchTanhGELU(NewGELUActivation):
    def forward(self, input):
        CALLS[f"{input.device.type}.fwd"] += 1
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))

PATCH = Patch(name="mygelu", targets=("transformers.activations:NewGELUActivation",), replacement=TorchTanhGELU,
              reference=gelu_reference, architectures=("gpt2",), implementations=lambda: dict(CALLS))
'''
FAST = ("--model", "gpt2-tiny", "--workload", "infer", "--reference", "none", "--steps", "6", "--block-steps", "2",
        "--budget", "0", "--no-profile")


def compare(*args: str, out: Path) -> subprocess.CompletedProcess:
    env = os.environ | {reports.STRICT_ENV: "1", "TRITON_INTERPRET": "1"}  # strict: every table as declared
    return subprocess.run([sys.executable, "-m", "e2eprof", "compare", *args, "--out", str(out)], capture_output=True,
                          text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def my_gelu(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("patches") / "my_gelu.py"
    path.write_text(MY_GELU)
    return path


@pytest.fixture(scope="module")
def three(tmp_path_factory, my_gelu):
    """Two built-ins on different sites of gpt2 and a file patch, one run."""
    out = tmp_path_factory.mktemp("three") / "report"
    result = compare("--patch", "fastgelu", "--patch", "fastlayernorm", "--patch", str(my_gelu), *FAST, out=out)
    return result, out


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """A stack of two built-ins against a rogue GELU that only the gate's stress check catches."""
    out = tmp_path_factory.mktemp("broken") / "report"
    result = compare("--patch", "fastgelu+fastlayernorm", "--patch", str(ROGUES / "gelu_tanh_through_exp.py"), *FAST, out=out)
    return result, out


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """Two built-ins on different sites, profiled: the op diff must compare each candidate's arm with the baseline."""
    out = tmp_path_factory.mktemp("profiled") / "report"
    fast = tuple(a for a in FAST if a != "--no-profile")
    result = compare("--patch", "fastgelu", "--patch", "fastlayernorm", *fast, out=out)
    return result, out


def table(out: Path, name: str) -> pd.DataFrame:
    frame = pd.read_parquet(out / f"{name}.parquet")
    assert schema.problems(frame, name) == [], name
    return frame


THREE_ARMS = ["patched:fastgelu", "patched:fastlayernorm", "patched:my_gelu"]


def test_one_baseline_and_each_candidate_its_own_interleaved_arm(three):
    result, out = three
    assert result.returncode in (0, 1, 3), result.stderr[-3000:]
    steps = table(out, "steps")
    assert list(dict.fromkeys(steps.arm)) == ["baseline", *THREE_ARMS]
    warm = steps[steps.phase == "warm"]
    blocks = {arm: set(g.block) for arm, g in warm.groupby("arm")}
    assert len({frozenset(b) for b in blocks.values()}) == 1  # every arm timed in the same rounds
    # Round robin: within each block every arm's steps come one arm after another, in alternating order.
    first = warm.sort_values("start_unix_ns").groupby("block", sort=True).arm.apply(lambda a: list(dict.fromkeys(a)))
    assert first.iloc[0] == ["baseline", *THREE_ARMS] and first.iloc[1] == [*THREE_ARMS[::-1], "baseline"]


def test_each_candidate_has_its_gate_proof_and_verdict(three):
    result, out = three
    checks = table(out, "correctness")
    for arm in THREE_ARMS:
        mine = checks[checks.arm == arm]
        for metric in ("patched_calls", "custom_kernel_calls", "op_rel_error_vs_fp64", "trained_like", "revalidation",
                       "rel_error_vs_fp64"):
            assert (mine.metric == metric).any(), (arm, metric)
        assert mine[mine.metric.isin(["patched_calls", "custom_kernel_calls"])].passed.all(), arm
    stock = checks[(checks.arm == "baseline") & (checks.metric == "custom_kernel_calls")]
    assert len(stock) == 1 and stock.passed.all() and stock.value.iloc[0] == 0
    summary = table(out, "summary")
    judged = summary[summary.verdict.notna()]
    assert list(judged.arm) == THREE_ARMS and list(judged.candidate) == ["fastgelu", "fastlayernorm", "my_gelu"]
    for label in ("fastgelu", "fastlayernorm", "my_gelu"):
        verdict = judged[judged.candidate == label].verdict.iloc[0]
        assert f"verdict {label}: {verdict}" in result.stdout


def test_pairwise_intervals_share_the_correction_family(three):
    _, out = three
    pairs = table(out, "pairwise")
    assert {(a, b) for a, b in zip(pairs.candidate_a, pairs.candidate_b)} == {
        ("fastgelu", "fastlayernorm"), ("fastgelu", "my_gelu"), ("fastlayernorm", "my_gelu")}
    judged = table(out, "summary").dropna(subset=["verdict"])
    raw = list(judged.mw_p) + list(pairs.mw_p)
    adjusted = stats.holm(raw)
    assert list(judged.mw_p_adjusted) + list(pairs.mw_p_adjusted) == pytest.approx(adjusted)
    for row in pairs.itertuples():
        assert row.ci_low <= row.speedup <= row.ci_high
        assert row.significant == ((row.ci_low > 1 or row.ci_high < 1) and row.mw_p_adjusted < 0.05)


def test_the_summary_ranks_candidates_and_names_the_best_passing_one(three):
    result, out = three
    judged = table(out, "summary").dropna(subset=["verdict"])
    ranked = judged[judged.correct].sort_values("speedup_vs_baseline", ascending=False)
    assert list(ranked["rank"]) == list(range(1, len(ranked) + 1))
    ranking = json.loads(table(out, "run").candidates_json.iloc[0])
    assert ranking["ranking"] == list(ranked.candidate)
    passing = [c for c, v in zip(ranked.candidate, ranked.verdict) if v == PASS]
    assert ranking["best"] == (passing[0] if passing else None)
    assert list(judged[judged.best].candidate) == passing[:1]
    assert (f"best candidate: {passing[0]}" if passing else "best candidate: none passes") in result.stdout
    # The exit code follows the best candidate (no candidate here is broken).
    best_verdict = min(judged.verdict, key={PASS: 0, INCONCLUSIVE: 1, FAIL: 2}.__getitem__)
    assert result.returncode == EXIT_CODES[best_verdict]
    assert result.stdout.rstrip().splitlines()[-1] == f"e2eprof: {best_verdict} (exit code {EXIT_CODES[best_verdict]})"


def test_a_broken_candidate_fails_the_run_beside_a_stack(broken):
    result, out = broken
    assert result.returncode == 1, result.stderr[-3000:]
    summary = table(out, "summary").dropna(subset=["verdict"])
    rogue = summary[summary.candidate == "gelu_tanh_through_exp"].iloc[0]
    assert rogue.verdict == FAIL and "INCORRECT" in rogue.reasons and pd.isna(rogue["rank"])
    stack = summary[summary.candidate == "fastgelu+fastlayernorm"].iloc[0]
    assert stack.arm == "patched:fastgelu+fastlayernorm" and stack.correct and stack["rank"] == 1
    checks = table(out, "correctness")
    counted = checks[(checks.arm == stack.arm) & (checks.metric == "custom_kernel_calls")].detail.iloc[0]
    assert "fastgelu." in counted and "fastlayernorm." in counted  # both kernels of the stack ran in its one arm
    sites = json.loads(table(out, "run").sites_json.iloc[0])["fastgelu+fastlayernorm"]
    assert {"transformers.activations:NewGELUActivation", "transformers.models.gpt2.modeling_gpt2:nn.LayerNorm"} <= {
        s["target"] for s in sites if s["count"]}
    assert "not ranked (a correctness, proof or arm failure): gelu_tanh_through_exp" in result.stdout
    assert result.stdout.rstrip().splitlines()[-1] == "e2eprof: FAIL (exit code 1)"


@pytest.mark.parametrize("patches, message", [
    (["fastgelu+MY_GELU"], "both replace NewGELUActivation"),
    (["fastgelu+fastgelu"], "stacks the same patch twice"),
    (["fastgelu", "fastgelu"], "two candidates are both named 'fastgelu'"),
    (["fastsoftmax", "fastgelu"], "different attention implementations"),
    (["fastgelu", "nosuchpatch"], "unknown patch 'nosuchpatch'"),
])
def test_refused_before_any_measurement(tmp_path, my_gelu, patches, message):
    out = tmp_path / "report"
    args = [a for p in patches for a in ("--patch", p.replace("MY_GELU", str(my_gelu)))]
    result = compare(*args, *FAST, out=out)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()  # nothing was measured, not even a report directory


# ---- the same logic on known inputs --------------------------------------------------------------------------------


def config(*patches, **changes):
    return CompareConfig(**({"model": "gpt2-tiny", "patch": patches[0], "candidates": patches if len(patches) > 1 else (),
                             "device": "cpu", "workloads": ("train",), "reference_arms": (), "process_noise": 0.0}
                            | changes))


def test_one_patch_keeps_the_patched_arm_and_several_name_theirs():
    # (attention "eager" so the stock SDPA reference arm runs: reference arms follow the candidates)
    assert [a.name for a in planned_arms(config("fastgelu", reference_arms=("sdpa",)), "eager")] == ["baseline", "patched", "sdpa"]
    assert [a.name for a in planned_arms(config("fastgelu+fastlayernorm"), "sdpa")] == ["baseline", "patched"]
    several = config("fastgelu", "fastlayernorm", replicas=2, reference_arms=("sdpa",))
    assert [a.key for a in with_replicas(several, planned_arms(several, "eager"))] == [
        "baseline", "patched:fastgelu", "patched:fastlayernorm", "sdpa",
        "patched:fastlayernorm#1", "patched:fastgelu#1", "baseline#1"]
    assert "candidates" not in config("fastgelu").to_record()  # a one-patch run records what it always did


def candidate_rows(speedups: dict[str, float], seed: int = 0):
    arms = {f"patched:{k}": v for k, v in speedups.items()}
    steps = steps_for("train", "baseline", 100, seed=seed)
    checks = clean_checks("train", ["baseline", *arms], candidate=None)
    for arm, speedup in arms.items():
        steps += steps_for("train", arm, 100 / speedup, seed=seed)
        checks += [{"workload": "train", "arm": arm, "tensor": "-", "metric": m, "value": 12, "tolerance": 1,
                    "passed": True, "detail": ""} for m in ("patched_calls", "custom_kernel_calls")]
    return steps, checks


def test_ranking_names_the_best_and_says_when_its_lead_is_not_significant():
    cfg = config("fast", "faster", "same")
    steps, checks = candidate_rows({"fast": 1.10, "faster": 1.25, "same": 1.0})
    pairwise: list[dict] = []
    rows, verdicts = summarize(steps, checks, cfg, set(), pairwise=pairwise)
    assert {k: v.verdict for k, v in verdicts.items()} == {"fast/train": PASS, "faster/train": PASS, "same/train": INCONCLUSIVE}
    ranking = cand.rank(rows, pairwise, cfg)
    assert ranking["ranking"] == ["faster", "fast", "same"] and ranking["best"] == "faster"
    assert ranking["lead"] == "ahead of fast significantly in every workload"
    assert cand.run_verdict(cfg, verdicts) == PASS
    # Two candidates within noise of each other: the best is named, its lead is said not to be significant.
    tied = config("one", "two")
    steps, checks = candidate_rows({"one": 1.20, "two": 1.2001})
    pairwise = []
    rows, verdicts = summarize(steps, checks, tied, set(), pairwise=pairwise)
    ranking = cand.rank(rows, pairwise, tied)
    assert ranking["best"] in ("one", "two") and "not significant" in ranking["lead"]
    assert len(pairwise) == 1 and not pairwise[0]["significant"]


def v(verdict: str, *reasons: str) -> Verdict:
    return Verdict(verdict, list(reasons), "")


@pytest.mark.parametrize("verdicts, expected", [
    ({"a/train": v(PASS, "FASTER"), "b/train": v(INCONCLUSIVE, "BELOW_MARGIN")}, PASS),
    ({"a/train": v(PASS, "FASTER"), "b/train": v(FAIL, "SLOWER")}, PASS),  # a losing candidate is no defect
    ({"a/train": v(PASS, "FASTER"), "b/train": v(FAIL, "INCORRECT")}, FAIL),  # a wrong one is
    ({"a/train": v(PASS, "FASTER"), "b/train": v(FAIL, "KERNEL_NOT_RUN")}, FAIL),
    ({"a/train": v(INCONCLUSIVE, "NO_SIGNIFICANT_DIFFERENCE"), "b/train": v(FAIL, "SLOWER")}, INCONCLUSIVE),
    ({"a/train": v(FAIL, "SLOWER"), "b/train": v(FAIL, "SLOWER")}, FAIL),
    # A candidate's own verdict is its worst over workloads: a PASS in train and SLOWER in infer is no PASS.
    ({"a/train": v(PASS, "FASTER"), "a/infer": v(FAIL, "SLOWER"), "b/train": v(INCONCLUSIVE), "b/infer": v(PASS)},
     INCONCLUSIVE),
])
def test_the_run_verdict_over_candidates(verdicts, expected):
    assert cand.run_verdict(config("a", "b"), verdicts) == expected


def test_one_candidate_keeps_the_worst_verdict():
    assert cand.run_verdict(config("fastgelu"), {"train": v(PASS), "infer": v(FAIL, "SLOWER")}) == FAIL


def test_the_report_shows_each_candidate_and_the_ranking(three):
    _, out = three
    result = subprocess.run([sys.executable, "-m", "e2eprof", "report", str(out)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    text = (out / "report.md").read_text()
    judged = table(out, "summary").dropna(subset=["verdict"])
    for arm, verdict in zip(judged.arm, judged.verdict):
        assert f"| infer ({arm}) | **{verdict}** |" in text
    assert "## Candidates" in text and text.count(" vs ") >= len(table(out, "pairwise"))
    code = EXIT_CODES[table(out, "run").verdict.iloc[0]]
    assert f"(exit code {code}; FAIL if any candidate is broken, else the best candidate's)" in text


H200_CANDIDATES = Path(__file__).resolve().parents[1] / "data" / "h200-runs" / "2026-12-04-h200-llama-1b-candidates"


def test_a_candidates_verdict_weighs_only_its_own_arms_clocks(tmp_path):
    """H200, llama-1b infer, four candidates: liger-swiglu's arm ran at a 2.02% higher SM clock than the baseline's
    (over the 2% limit), the others within 1%. Only liger-swiglu's verdict may carry CLOCK_IMBALANCE; the run as
    recorded (before the fix) called rmsnorm and swiglu INCONCLUSIVE for it."""
    import shutil

    from e2eprof.signoff.regate import regate

    run = tmp_path / "run"
    shutil.copytree(H200_CANDIDATES, run)
    balance = pd.read_parquet(run / "balance.parquet").set_index("arm")
    assert balance.loc["patched:liger-swiglu", "clock_imbalance"]
    assert not balance.drop("patched:liger-swiglu").clock_imbalance.any()
    judged = regate(run, None).judgement
    reasons = {r["candidate"]: str(r["reasons"]) for r in judged.summary if r.get("verdict") is not None}
    assert "CLOCK_IMBALANCE" not in reasons["rmsnorm"] and "CLOCK_IMBALANCE" not in reasons["swiglu"], reasons
    assert judged.ranking["best"] == "rmsnorm" and "liger-rmsnorm" not in judged.ranking["ranking"]


def test_the_op_diff_compares_each_candidate_with_the_baseline(profiled):
    # Before: the diff looked for an arm named "patched", found none, and listed every baseline op as removed
    # (seen on the H100: "-8.8 ms aten::mm in lm_head (removed)" under a softmax candidate).
    result, out = profiled
    assert result.returncode in (0, 1, 3), result.stderr[-3000:]
    diff = table(out, "opdiff")
    assert set(diff.candidate) == {"fastgelu", "fastlayernorm"}
    for candidate, rows in diff.groupby("candidate"):
        lm_head = rows[(rows.module == "lm_head") & (rows.op == "aten::mm")]
        assert len(lm_head) and set(lm_head.status) == {"changed"}, candidate  # in both arms, not removed
        added = rows[rows.status == "added"]
        assert added.op.str.contains(f"e2eprof::{candidate}").any(), candidate  # the candidate's own op appears
    assert "where the time went (fastgelu - baseline" in result.stdout
    assert "where the time went (fastlayernorm - baseline" in result.stdout
    # No Amdahl prediction for several candidates (the baseline's profile marks one patch's region only).
    assert not (out / "explain.parquet").exists() or table(out, "explain").empty
