"""Several candidate kernels in one run: their specs and arm names, stacked patches ("a+b" in one arm), the run's
verdict over candidates and their ranking.

One --patch is one candidate, its arm named "patched" as always. Several --patch options make each spec a candidate
arm of its own, "patched:<label>" (label: the patch names, "a+b" for a stack), timed in the same interleaved rounds as
the baseline and the stock reference arms; the summary judges each against the one baseline and compares candidates
pairwise (e2eprof.analysis.summary), and `rank` orders them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from e2eprof.errors import UsageError

CANDIDATE = "patched"  # the arm of a run's only candidate
PREFIX = "patched:"  # several candidates: "patched:<label>"
STACK = "+"  # "--patch a+b": both patches installed in one arm
# A candidate with one of these reasons is broken, not merely slow: the run fails even when another candidate passes.
BROKEN = ("INCORRECT", "KERNEL_NOT_RUN", "BASELINE_CONTAMINATED", "ARM_FAILED", "NOT_CAPTURABLE")


def members(spec: str) -> list[str]:
    """The patches of one candidate spec: "a+b" -> ["a", "b"] (an existing file named with a "+" is one patch)."""
    return [spec] if Path(spec).is_file() else spec.split(STACK)


def label(spec: str) -> str:
    """A candidate's short name from its spec alone: built-in or entry-point names as given, "file.py:NAME" and
    "module:NAME" as NAME, "dir/my_patch.py" as its stem; a stack joins its members' labels with "+"."""
    def one(part: str) -> str:
        if ":" in part:
            return part.rsplit(":", 1)[1]
        return Path(part).stem if part.endswith(".py") else part
    return STACK.join(one(p) for p in members(spec))


def check_specs(specs: Iterable[str], *, aa: bool = False) -> tuple[str, ...]:
    """--patch values as given, refused (UsageError) when empty, repeated, or a stack names a patch twice."""
    specs = tuple(str(s).strip() for s in specs)
    if not specs or any(not s for s in specs):
        raise UsageError("--patch: must name a patch")
    for spec in specs:
        parts = members(spec)
        if any(not p for p in parts):
            raise UsageError(f"--patch: '{spec}': a stack names patches joined by '+', e.g. fastgelu+fastlayernorm")
        if len(set(parts)) != len(parts):
            raise UsageError(f"--patch: '{spec}' stacks the same patch twice")
    labels = [label(s) for s in specs]
    for name in labels:
        if labels.count(name) > 1:
            raise UsageError(f"--patch: two candidates are both named '{name}'; give each patch once")
        if "#" in name or "/" in name:
            raise UsageError(f"--patch: candidate name '{name}' may not contain '#' or '/'")
    if aa and len(specs) > 1:
        raise UsageError("--aa: an A/A run calibrates one baseline; give one --patch")
    return specs


def specs_of(config) -> tuple[str, ...]:
    return tuple(config.candidates) or (config.patch,)


def is_multi(config) -> bool:
    return len(specs_of(config)) > 1


def arm_of_spec(config, spec: str) -> str:
    return PREFIX + label(spec) if is_multi(config) else CANDIDATE


def arm_names(config) -> list[str]:
    """The candidate arms, in --patch order (the second baseline in an A/A run)."""
    from e2eprof.config import AA_ARM
    if config.aa:
        return [AA_ARM]
    return [arm_of_spec(config, s) for s in specs_of(config)]


def is_candidate(arm: str) -> bool:
    """Whether an arm (not a process key) runs a candidate kernel."""
    return arm == CANDIDATE or arm.startswith(PREFIX)


def label_of_arm(arm: str) -> str:
    return arm[len(PREFIX):] if arm.startswith(PREFIX) else arm


def stock_spec(config) -> str:
    """What the stock arms load (never apply) to report the kernels' counters: every candidate's patches."""
    return STACK.join(dict.fromkeys(p for s in specs_of(config) for p in members(s)))


# ---- a stack of patches in one arm ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StackedPatch:
    """Several patches installed together in one arm; stands in for a Patch where an arm needs its counters, kernel
    names, tolerances and attention."""

    patches: tuple = field(default_factory=tuple)
    name: str = ""

    @property
    def kernel_names(self) -> tuple[str, ...]:
        return tuple(k for p in self.patches for k in p.kernel_names)

    @property
    def implementations(self):
        declared = [p for p in self.patches if p.implementations is not None]
        if not declared:
            return None
        # Prefixed by patch, so two kernels' "triton.fwd" counters stay apart.
        return lambda: {f"{p.name}.{k}": v for p in declared for k, v in dict(p.implementations()).items()}

    @property
    def model_attention(self) -> str:
        needs = {p.attn_implementation for p in self.patches if p.attn_implementation}
        return needs.pop() if len(needs) == 1 else "sdpa"

    @property
    def workloads(self) -> tuple[str, ...]:
        """The workloads every member applies to (a member that declares none applies to all)."""
        declared = [set(p.workloads) for p in self.patches if p.workloads]
        if not declared:
            return ()
        common = set.intersection(*declared)
        return tuple(w for w in next(p.workloads for p in self.patches if p.workloads) if w in common)

    @property
    def omitted_outputs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(o for p in self.patches for o in p.omitted_outputs))

    @property
    def requires_triton(self) -> bool:
        return any(p.requires_triton for p in self.patches)

    @property
    def error_factor(self) -> float:
        return max(p.error_factor for p in self.patches)

    def tolerance_for(self, dtype_name: str) -> float:
        return max(p.tolerance_for(dtype_name) for p in self.patches)

    def disjoint(self) -> bool:
        return shared_site(self.patches) is None


@dataclass(frozen=True)
class LoadedStack:
    """What load_candidate returns: .patch is the Patch itself for one member, a StackedPatch for several."""

    patch: object
    spec: str
    origin: str
    source_hash: str
    loaded: tuple = ()


def load_candidate(spec: str) -> LoadedStack:
    """Load every member of a spec; one member is returned as registry.load_patch gives it."""
    from e2eprof.registry import load_patch
    parts = [load_patch(p) for p in members(spec)]
    if len(parts) == 1:
        return parts[0]
    return LoadedStack(StackedPatch(tuple(p.patch for p in parts), STACK.join(p.patch.name for p in parts)), spec,
                       STACK.join(p.origin for p in parts), STACK.join(p.source_hash for p in parts), tuple(parts))


def _sites(patch) -> dict[int, str]:
    from e2eprof.patching.targets import resolve
    return {id(resolve(t)[2][-1]): t for t in patch.targets}


def shared_site(patches) -> str | None:
    """The first site two of the patches both replace ("a and b both replace X"), or None."""
    seen: dict[int, tuple[int, str]] = {}  # site -> (which patch, its name); one patch may reach a site twice
    for index, patch in enumerate(patches):
        for key, target in _sites(patch).items():
            if key in seen and seen[key][0] != index:
                return f"{seen[key][1]} and {patch.name} both replace {target.split(':', 1)[1]}"
            seen.setdefault(key, (index, patch.name))
    return None


def check_stack(loaded) -> None:
    """Refuse, before anything is measured, a stack whose patches replace the same site or need different attention."""
    patch = loaded.patch
    if not isinstance(patch, StackedPatch):
        return
    clash = shared_site(patch.patches)
    if clash:
        raise UsageError(f"--patch {loaded.spec}: {clash}; patches on the same site cannot share an arm "
                         f"(give each its own --patch to compare them)")
    needs = {p.attn_implementation for p in patch.patches if p.attn_implementation}
    if len(needs) > 1:
        raise UsageError(f"--patch {loaded.spec}: its patches need different attention implementations ({', '.join(sorted(needs))})")


def apply_any(patch, model, *, passthrough: bool = False):
    """apply_patch for a Patch or a StackedPatch: one AppliedPatch holding every member's recorders and changes."""
    from e2eprof.patching import AppliedPatch, apply_patch
    if not isinstance(patch, StackedPatch):
        return apply_patch(patch, model, passthrough=passthrough)
    done = []
    try:
        for member in patch.patches:
            done.append(apply_patch(member, model, passthrough=passthrough))
    except Exception:
        for applied in reversed(done):
            applied.revert()
        raise
    return AppliedPatch(patch, [r for a in done for r in a.recorders], [s for a in done for s in a.sites],
                        [c for a in done for c in a._changes], [c for a in done for c in a._class_swaps])


def load_all(config, architecture: str) -> tuple[list, str]:
    """Every candidate loaded and checked against the model, and the attention implementation all arms share
    (one baseline serves every candidate, so they must agree on it)."""
    from e2eprof.patching import check_model_fits
    loaded, attention = [], {}
    for spec in specs_of(config):
        one = load_candidate(spec)
        check_stack(one)
        for member in getattr(one.patch, "patches", (one.patch,)):
            check_model_fits(member, architecture, one.patch.model_attention)
        loaded.append(one)
        attention[label(spec)] = one.patch.model_attention
    if len(set(attention.values())) > 1:
        raise UsageError("--patch: the candidates need different attention implementations ("
                         + ", ".join(f"{k}: {v}" for k, v in attention.items())
                         + "), so no one baseline serves them all; compare them in separate runs")
    return loaded, next(iter(attention.values()))


# ---- the run's verdict and the ranking ------------------------------------------------------------------------------


def run_verdict(config, verdicts: dict) -> str:
    """One candidate: the worst verdict over (point, workload), as always. Several: FAIL when any candidate is broken
    (BROKEN reasons), else the best candidate's own verdict (each candidate's is its worst over its units)."""
    from e2eprof.analysis.verdict import SEVERITY, worst
    if not is_multi(config):
        return worst([v.verdict for v in verdicts.values()])
    if any(set(v.reasons) & set(BROKEN) for v in verdicts.values()):
        return "FAIL"
    per = {}
    for key, v in verdicts.items():
        per.setdefault(key.split("/", 1)[0], []).append(v.verdict)
    return min((worst(v) for v in per.values()), key=SEVERITY.__getitem__)


def rank(summary: list[dict], pairwise: list[dict], config) -> dict:
    """Rank the candidates by their speedup over the baseline (geometric mean over (point, workload)), among those
    whose gate passed; the best is the highest-ranked one that PASSes everywhere. Writes rank and best into the
    candidates' summary rows and returns {"ranking": [...], "best": label or None, "lead": text}."""
    arms = arm_names(config)
    rows = {a: [r for r in summary if r.get("arm") == a and r.get("verdict") is not None] for a in arms}

    def gmean(a):
        ratios = [r.get("speedup_vs_baseline", math.nan) for r in rows[a]]
        ratios = [x for x in ratios if isinstance(x, float) and math.isfinite(x) and x > 0]
        return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else math.nan

    gated = [a for a in arms if rows[a] and all(r.get("correct") and not set(str(r.get("reasons") or "").split(","))
                                                & set(BROKEN) for r in rows[a])]
    order = sorted(gated, key=lambda a: -gmean(a) if math.isfinite(gmean(a)) else math.inf)
    passing = [a for a in order if all(r["verdict"] == "PASS" for r in rows[a])]
    best = passing[0] if passing else None
    for r in summary:
        if r.get("arm") in arms:
            r["candidate"] = label_of_arm(r["arm"])
            r["rank"] = float(order.index(r["arm"]) + 1) if r["arm"] in order else math.nan
            r["best"] = r["arm"] == best
    lead = ""
    if best is not None:
        others = [a for a in order if a != best]
        if not others:
            lead = "the only candidate that passed its gate"
        else:
            runner = others[0]
            pairs = [p for p in pairwise if {p["arm_a"], p["arm_b"]} == {best, runner}]
            clear = bool(pairs) and all(p["significant"] and (p["speedup"] > 1) == (p["arm_a"] == best) for p in pairs)
            lead = (f"ahead of {label_of_arm(runner)} significantly in every workload" if clear else
                    f"its lead over {label_of_arm(runner)} is not significant (pairwise interval includes 1 or "
                    f"not significant after correction)")
    return {"ranking": [label_of_arm(a) for a in order], "best": label_of_arm(best) if best else None, "lead": lead,
            "gmean": {label_of_arm(a): gmean(a) for a in arms}}


# ---- what the runner asks of the candidates ---------------------------------------------------------------------------


def patches_by_arm(config, loaded) -> dict:
    """Candidate arm -> the patch it runs, from what check_before_measuring loaded."""
    each = getattr(loaded, "loaded", ()) or (loaded,)
    return {arm_of_spec(config, spec): one.patch for spec, one in zip(specs_of(config), each)}


def spec_of_arm(config, arm: str) -> str:
    """The patch spec an arm's worker loads: its candidate's, or (a stock arm) every candidate's patches."""
    for spec in specs_of(config):
        if arm_of_spec(config, spec) == arm:
            return spec
    return stock_spec(config) if is_multi(config) else config.patch


def sites(config, builds: dict):
    """run.parquet's sites_json: the patched arm's sites, or per candidate with several."""
    if not is_multi(config):
        return builds.get(CANDIDATE, {}).get("sites")
    return {label_of_arm(a): builds.get(a, {}).get("sites") for a in arm_names(config)}
