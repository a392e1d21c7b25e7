"""A trained-like model for the correctness gate: random-init weights moved so the model's own calls meet the values
real checkpoints hand a kernel.

A seeded random-init model gives a kernel small, centred activations, attention logits near zero and no padding.
Trained checkpoints differ where kernels break:
- a few feature channels 20-100x the typical magnitude, carried by the residual stream into every norm and
  projection (LLM.int8(), Dettmers et al. 2022);
- rows with a large common offset (the mean of a row far from zero next to its spread);
- attention logits in the tens, not near zero;
- padded batches, where a left-padded row's pad queries see no key at all (fully masked attention rows).

`transform` moves the weights in place (the worker restores its pristine weights afterwards), in this order:
1. outlier channels: OUTLIER_FRACTION of the embedding's channels (at least 2, seeded) scaled so their spread over
   tokens is OUTLIER_RATIO x the median channel's;
2. row offset: ROW_MEAN_RATIO x a token row's spread added to every embedding entry (a common offset per row);
3. attention logits: each layer's query and key projections (weights and biases) scaled by
   sqrt(LOGIT_STD / estimated std), the std estimated per layer as rms(q) * rms(k) from one forward pass: for
   random-init directions q.k / sqrt(d) has that spread, so the scaled logits have about LOGIT_STD's.
`padded` gives the batch a pad prefix over PAD_FRACTION of the sequence in its first half of rows.
`statistics` measures what that produces (benchmarks/trained_like_stats.py prints it for real model sizes).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

OUTLIER_FRACTION = 1 / 256  # hidden 768 -> 3 channels, 2048 -> 8
OUTLIER_RATIO = 60.0  # LLM.int8()'s outliers: 20-100x the typical magnitude
ROW_MEAN_RATIO = 10.0
LOGIT_STD = 6.0  # largest logits of a 1024-key row then land in the twenties
PAD_FRACTION = 0.25
MASKED = 0.5  # an attention score at or below this fraction of its dtype's lowest value is a masked one


class NotTransformable(ValueError):
    """The model has no part the transform knows (no input embedding, or no query and key projections)."""


@dataclass
class Transform:
    """What `transform` did, for the gate's report row."""

    outlier_channels: list[int]
    row_offset: float
    logit_gains: list[float] = field(default_factory=list)  # per attention layer, applied to logits (q and k: sqrt)

    def describe(self) -> str:
        gains = f"{min(self.logit_gains):.3g}-{max(self.logit_gains):.3g}" if self.logit_gains else "none"
        return (f"{len(self.outlier_channels)} outlier channels at {OUTLIER_RATIO:g}x, row offset "
                f"{ROW_MEAN_RATIO:g}x a row's spread, attention logits scaled {gains}x to ~{LOGIT_STD:g} std")


# ---- where the query and key projections are ------------------------------------------------------------------


@dataclass(frozen=True)
class _Projection:
    """One projection's output columns: a Linear (weight rows) or GPT-2's Conv1D (weight columns), maybe a slice."""

    module: torch.nn.Module
    part: slice | None = None
    transposed: bool = False  # Conv1D stores weight as (in, out)

    def output(self, out: torch.Tensor) -> torch.Tensor:
        return out if self.part is None else out[..., self.part]

    @torch.no_grad()
    def scale(self, factor: float) -> None:
        weight, bias = self.module.weight, getattr(self.module, "bias", None)
        part = slice(None) if self.part is None else self.part
        if self.transposed:
            weight[:, part] *= factor
        else:
            weight[part] *= factor
        if bias is not None:
            bias[part] *= factor


def _query_key_pairs(model: torch.nn.Module) -> list[tuple[_Projection, _Projection]]:
    """(query, key) projections of every attention layer: q_proj/k_proj (Llama and its kin), query/key (BERT),
    or the first and second thirds of GPT-2's fused c_attn."""
    pairs = []
    for module in model.modules():
        if hasattr(module, "q_proj") and hasattr(module, "k_proj"):
            pairs.append((_Projection(module.q_proj), _Projection(module.k_proj)))
        elif hasattr(module, "query") and hasattr(module, "key") and isinstance(module.query, torch.nn.Linear):
            pairs.append((_Projection(module.query), _Projection(module.key)))
        elif hasattr(module, "c_attn") and hasattr(module, "split_size") and not getattr(module, "is_cross_attention", False):
            d = module.split_size
            pairs.append((_Projection(module.c_attn, slice(0, d), True), _Projection(module.c_attn, slice(d, 2 * d), True)))
    return pairs


# ---- the transform ----------------------------------------------------------------------------------------------


@torch.no_grad()
def transform(model: torch.nn.Module, ids: torch.Tensor, attention_mask: torch.Tensor, seed: int) -> Transform:
    """Move `model`'s weights in place to trained-like statistics (see the module docstring); `ids` and
    `attention_mask` (on the model's device) are the batch the logit scales are estimated on."""
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embedding is None or not isinstance(getattr(embedding, "weight", None), torch.Tensor):
        raise NotTransformable(f"{type(model).__name__} has no input embedding to move")
    pairs = _query_key_pairs(model)
    if not pairs:
        raise NotTransformable(f"no query and key projections found in {type(model).__name__}")

    weight = embedding.weight  # (vocab, hidden)
    hidden = weight.shape[1]
    generator = torch.Generator().manual_seed(seed)
    count = max(2, round(hidden * OUTLIER_FRACTION))
    channels = sorted(torch.randperm(hidden, generator=generator)[:count].tolist())
    spread = weight.std(dim=0)  # each channel's spread over the vocabulary
    typical = spread.median()
    for c in channels:
        weight[:, c] *= OUTLIER_RATIO * typical / spread[c]
    # A row's spread over its channels, outliers included: the offset is ROW_MEAN_RATIO of it.
    row_spread = weight[: min(len(weight), 4096)].std(dim=1).median().item()
    offset = ROW_MEAN_RATIO * row_spread
    weight += offset

    gains = []
    estimates = _logit_spread_estimates(model, pairs, ids, attention_mask)
    for (query, key), estimate in zip(pairs, estimates):
        gain = LOGIT_STD / max(estimate, 1e-12)
        query.scale(math.sqrt(gain))
        key.scale(math.sqrt(gain))
        gains.append(gain)
    return Transform(outlier_channels=channels, row_offset=offset, logit_gains=gains)


def _logit_spread_estimates(model, pairs, ids, attention_mask) -> list[float]:
    """rms(q) * rms(k) per attention layer over the batch's real (unpadded) tokens, from one forward pass."""
    seen: dict[int, torch.Tensor] = {}
    keep = attention_mask.bool()

    def recorder(targets):
        def hook(module, args, out):
            for index, projection in targets:
                seen[index] = projection.output(out).float()[keep].pow(2).mean().sqrt()
        return hook

    handles = []
    for i, (query, key) in enumerate(pairs):
        if key.module is query.module:  # GPT-2's fused projection: one hook reads both slices
            handles.append(query.module.register_forward_hook(recorder(((2 * i, query), (2 * i + 1, key)))))
        else:
            handles.append(query.module.register_forward_hook(recorder(((2 * i, query),))))
            handles.append(key.module.register_forward_hook(recorder(((2 * i + 1, key),))))
    try:
        with eval_mode(model):
            model(input_ids=ids, attention_mask=attention_mask, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return [(seen[2 * i] * seen[2 * i + 1]).item() for i in range(len(pairs))]


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


# ---- the padded batch -------------------------------------------------------------------------------------------


def padded(ids: torch.Tensor, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention_mask): the first half of the rows (at least one) left-padded over PAD_FRACTION of the
    sequence (at least one position), as a tokenizer pads a batch of shorter prompts for a decoder."""
    ids = ids.clone()
    mask = torch.ones_like(ids)
    rows = max(1, ids.shape[0] // 2)
    pad = max(1, int(ids.shape[1] * PAD_FRACTION))
    ids[:rows, :pad] = pad_token_id
    mask[:rows, :pad] = 0
    return ids, mask


def pad_token_id(config) -> int:
    """The config's pad token, else its end-of-sequence token (what GPT-2's users pad with), else 0."""
    vocab = getattr(config, "vocab_size", None)
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, list):
            value = value[0] if value else None
        if value is not None and (vocab is None or 0 <= int(value) < vocab):
            return int(value)
    return 0


# ---- what it produces -------------------------------------------------------------------------------------------


@torch.no_grad()
def statistics(model: torch.nn.Module, ids: torch.Tensor, attention_mask: torch.Tensor | None) -> dict[str, float]:
    """What a model's kernels meet on this batch, measured in one forward pass of an eager-attention model:

    logit_max, logit_std: largest |score| and spread of the attention scores that are not masked (every layer);
    masked_rows: attention rows with every score masked (a query that sees no key);
    outlier_ratio: at the norms' inputs, the largest channel spread over tokens / the median channel's (largest
        over norms); row_mean_ratio: |mean| / spread of a token's row (median over tokens, largest over norms).
    """
    scores = {"max": 0.0, "sum": 0.0, "sumsq": 0.0, "n": 0, "masked_rows": 0}
    norms = {"outlier_ratio": 0.0, "row_mean_ratio": 0.0}
    softmax = torch.nn.functional.softmax

    def recording_softmax(input, dim=None, *args, **kwargs):
        x = input.detach().float()
        masked = x <= MASKED * torch.finfo(input.dtype).min
        visible = x[~masked & torch.isfinite(x)]
        if visible.numel():
            scores["max"] = max(scores["max"], visible.abs().max().item())
            scores["sum"] += visible.sum().item()
            scores["sumsq"] += visible.pow(2).sum().item()
            scores["n"] += visible.numel()
        scores["masked_rows"] += int((masked | ~torch.isfinite(x)).all(dim=-1 if dim is None else dim).sum())
        return softmax(input, dim, *args, **kwargs)

    def norm_hook(module, args):
        x = args[0].detach().float().reshape(-1, args[0].shape[-1])
        channel = x.std(dim=0)
        norms["outlier_ratio"] = max(norms["outlier_ratio"], (channel.max() / channel.median()).item())
        row = (x.mean(dim=1).abs() / x.std(dim=1)).median().item()
        norms["row_mean_ratio"] = max(norms["row_mean_ratio"], row)

    handles = [m.register_forward_pre_hook(norm_hook) for m in model.modules()
               if type(m).__name__.endswith(("LayerNorm", "RMSNorm"))]
    torch.nn.functional.softmax = recording_softmax
    try:
        with eval_mode(model):
            model(input_ids=ids, attention_mask=attention_mask, use_cache=False)
    finally:
        torch.nn.functional.softmax = softmax
        for handle in handles:
            handle.remove()
    n = max(scores["n"], 1)
    mean = scores["sum"] / n
    return {"logit_max": scores["max"], "logit_std": math.sqrt(max(scores["sumsq"] / n - mean * mean, 0.0)),
            "masked_rows": scores["masked_rows"], **norms}
