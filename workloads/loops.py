"""The real loops a kernel has to speed up: one training step, one inference forward, one greedy generation.

Each workload owns one model and one precision. `step` runs exactly what a real loop runs, including the
host-to-device copy of the (pinned) batch and the optimizer step, and does not synchronize at the end unless the real
loop would: the runner synchronizes and times around it. `capture` runs the same computation deterministically
(eval mode, no dropout, no optimizer step) and returns CPU tensors that the correctness check compares across arms;
it leaves weights, gradients, optimizer state and every module's train/eval flag as it found them.

Precision strings:
  fp32  no autocast, fp32 weights.
  bf16  torch.autocast(device_type, torch.bfloat16) around forward and loss, fp32 weights (standard mixed precision).
  fp16  as bf16 with torch.float16; training scales the loss with torch.amp.GradScaler.
  fp64  no autocast; the caller has converted the model with .double(). Used for the reference run.

Objectives (models.objective): causal LMs (GPT-2, Llama) train on next-token loss with labels=input_ids and run all
three workloads. Encoders (BERT) train on a masked-LM loss: a fixed 15% of each row's positions is replaced by the
mask token and only those positions are labelled; `infer` is the masked-LM forward; they cannot `generate`.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import torch

from e2eprof.suggest import suggest

from .models import ModelSource, max_positions, objective

PRECISIONS = ("fp32", "bf16", "fp16", "fp64")
_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

# capture keeps at most this many logits (16 MiB in fp32): whole vocabulary rows of the first sequence, at evenly
# spaced positions, see logit_positions. Full logits of a GPT-2 batch are gigabytes.
MAX_CAPTURED_LOGITS = 4 * 1024 * 1024

# Masked-LM batches: BERT's masking rate. Every masked position gets the mask token (BERT's 80/10/10 replacement
# changes only token values, which no kernel's cost depends on), and the positions are the same for every batch of a
# shape and in every process, so all arms compute the same loss.
MLM_MASK_FRACTION = 0.15
MLM_MASK_SEED = 0
BERT_MASK_TOKEN_ID = 103  # [MASK] in BERT's WordPiece vocabularies; used when the config names no mask token
IGNORE_INDEX = -100  # label of an unmasked position: the loss skips it


def mlm_mask(batch: int, seq: int) -> torch.Tensor:
    """(batch, seq) bool: the positions a masked-LM step hides, max(1, round(0.15 * seq)) per row.

    Drawn from a private generator with a fixed seed, so it is the same in every process and call.
    """
    gen = torch.Generator(device="cpu").manual_seed(MLM_MASK_SEED)
    n = max(1, round(MLM_MASK_FRACTION * seq))
    mask = torch.zeros(batch, seq, dtype=torch.bool)
    for row in mask:
        row[torch.randperm(seq, generator=gen)[:n]] = True
    return mask


def logit_positions(seq_len: int, vocab_size: int) -> torch.Tensor:
    """Positions (int64, ascending, distinct) of the first sequence whose full logit rows `capture` keeps.

    As many rows as fit in MAX_CAPTURED_LOGITS (at most seq_len), evenly spaced from position 0 to seq_len - 1
    inclusive, so both the start and the end of the sequence are checked.
    """
    rows = max(1, min(seq_len, MAX_CAPTURED_LOGITS // vocab_size))
    if rows == 1:
        return torch.tensor([seq_len - 1])
    # Integer spacing (seq_len - 1) / (rows - 1) >= 1, so the positions are distinct.
    return torch.arange(rows) * (seq_len - 1) // (rows - 1)


class Workload:
    """One model, one device, one precision; `step` for timing and `capture` for correctness.

    Subclasses set `name`, declare their options with defaults in `defaults`, and implement `step` and `capture`.
    The model is moved to `device` here (a no-op if it is there already).
    """

    name: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    objectives: ClassVar[tuple[str, ...]] = ("causal-lm", "masked-lm")  # models.objective values it can run

    def __init__(self, model: torch.nn.Module, device: torch.device | str, precision: str, **options: Any):
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}{suggest(precision, PRECISIONS)}; "
                             f"known: {', '.join(PRECISIONS)}")
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            known = ", ".join(self.defaults) or "none"
            raise ValueError(f"workload {self.name!r} has no option {unknown[0]!r}"
                             f"{suggest(unknown[0], self.defaults)}; its options: {known}")
        _check_weight_dtype(model, precision)
        config = getattr(model, "config", None)
        self.objective = objective(getattr(config, "model_type", ""))
        if self.objective not in self.objectives:
            raise ValueError(f"workload {self.name!r} needs a causal LM; a {config.model_type!r} model is an encoder "
                             f"(it runs {', '.join(supported_workloads(config.model_type))})")
        self.options: dict[str, Any] = {**self.defaults, **options}
        self.device = torch.device(device)
        self.precision = precision
        self.model = model.to(self.device)
        self._masks: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}  # shape -> device (mask, ~mask)

    def step(self, host_batch: torch.Tensor) -> dict[str, float]:
        """Run one real step on a host (B, T) int64 batch; return extra metrics (may be empty)."""
        raise NotImplementedError

    def capture(self, host_batch: torch.Tensor) -> dict[str, torch.Tensor]:
        """Run the step's computation deterministically; return CPU float32 tensors (float64 for fp64)."""
        raise NotImplementedError

    # -- helpers for subclasses --

    def _autocast(self, cache_enabled: bool = True) -> contextlib.AbstractContextManager:
        """This precision's autocast; cache_enabled=False recomputes weight casts on every use (a CUDA graph must,
        since autocast's cast cache is emptied when the context exits)."""
        dtype = _AUTOCAST_DTYPES.get(self.precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype, cache_enabled=cache_enabled)

    def _to_device(self, host_batch: torch.Tensor) -> torch.Tensor:
        # non_blocking: from pinned memory this is an async DMA the real loop overlaps with queued work.
        return host_batch.to(self.device, non_blocking=True)

    def _model_inputs(self, ids: torch.Tensor, labels: bool) -> dict[str, torch.Tensor | bool]:
        """Forward keyword arguments for the model's objective, with labels or without."""
        if self.objective == "masked-lm":
            mask, keep = self._mask_for(ids.shape)
            inputs: dict[str, Any] = {"input_ids": ids.masked_fill(mask, _mask_token_id(self.model.config))}
            if labels:
                inputs["labels"] = ids.masked_fill(keep, IGNORE_INDEX)
            return inputs
        # labels=input_ids: the model shifts them internally. No KV cache: nothing here reads it.
        return {"input_ids": ids, "labels": ids, "use_cache": False} if labels else {"input_ids": ids, "use_cache": False}

    def _mask_for(self, shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
        # Moved to the device once per shape, like a tokenizer's constants; applying it is two elementwise ops.
        key = tuple(shape)
        if key not in self._masks:
            mask = mlm_mask(*key).to(self.device)  # (B, T)
            self._masks[key] = (mask, ~mask)
        return self._masks[key]

    def _out(self, t: torch.Tensor) -> torch.Tensor:
        """A captured value: detached, on the CPU, float64 for the fp64 reference and float32 otherwise."""
        return t.detach().to("cpu", torch.float64 if self.precision == "fp64" else torch.float32)

    def _logits_out(self, logits: torch.Tensor) -> torch.Tensor:
        # logits: (B, T, V) -> (R, V), rows of the first sequence at logit_positions(T, V)
        pos = logit_positions(logits.shape[1], logits.shape[2]).to(logits.device)
        return self._out(logits[0, pos, :])

    def _sync(self) -> None:
        # Device-wide, so work a kernel queued on another stream is waited for too. CPU ops are synchronous.
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class TrainWorkload(Workload):
    """One training step: zero_grad, copy, forward with labels under autocast, backward, AdamW step.

    Option `lr` (default 1e-4). AdamW keeps torch's default implementation choice (foreach on CUDA, a per-parameter
    loop on CPU; not fused) because that is what an unmodified Hugging Face loop gets.
    """

    name = "train"
    defaults = {"lr": 1e-4}

    def __init__(self, model: torch.nn.Module, device: torch.device | str, precision: str, **options: Any):
        super().__init__(model, device, precision, **options)
        self.model.train()
        # torch.compile's wrapper prefixes every name with "_orig_mod."; strip it so a compiled arm's gradients
        # carry the same keys as every other arm's.
        self.params = [(n.removeprefix("_orig_mod."), p) for n, p in self.model.named_parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW([p for _, p in self.params], lr=self.options["lr"])
        # Disabled (an identity) unless fp16, so every precision goes through one code path.
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=precision == "fp16")

    def step(self, host_batch: torch.Tensor) -> dict[str, float]:
        """One optimizer step. Synchronizes only inside GradScaler for fp16 (its inf check reads a device value)."""
        self.optimizer.zero_grad(set_to_none=True)
        ids = self._to_device(host_batch)  # (B, T)
        with self._autocast():
            loss = self._forward(**self._model_inputs(ids, labels=True)).loss
        self.scaler.scale(loss).backward()  # backward outside autocast, as the autocast docs prescribe
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return {}

    def _forward(self, **inputs):
        # The data-parallel workloads (distributed.py) call their wrapper here instead of the bare model.
        return self.model(**inputs)

    def capture(self, host_batch: torch.Tensor) -> dict[str, torch.Tensor]:
        """{"loss": scalar, "logits": (R, V) rows (see logit_positions), "grad/<name>": each trainable parameter's
        gradient}. In eval mode, with no optimizer step; the gradients present before the call are put back."""
        saved = [p.grad for _, p in self.params]
        for _, p in self.params:
            p.grad = None
        try:
            with _eval_mode(self.model):
                ids = self._to_device(host_batch)  # (B, T)
                with self._autocast():
                    out = self._forward(**self._model_inputs(ids, labels=True))
                # fp16: scale like the training step does, or small gradients flush to zero in half precision.
                scale = float(self.scaler.get_scale()) if self.scaler.is_enabled() else 1.0
                (out.loss * scale).backward()
                result = {"loss": self._out(out.loss)}
                if out.logits is not None:  # a fused loss head (liger-flce) returns the loss without any logits
                    result["logits"] = self._logits_out(out.logits)
                for n, p in self.params:
                    # A parameter the loss does not reach reports zeros, so every arm has the same keys.
                    g = p.grad if p.grad is not None else torch.zeros_like(p)
                    result[f"grad/{n}"] = self._out(g / scale)
                return result
        finally:
            for (_, p), g in zip(self.params, saved):
                p.grad = g


class InferWorkload(Workload):
    """One inference forward over the whole batch (scoring / prefill without a cache), eval mode, no_grad."""

    name = "infer"

    def __init__(self, model: torch.nn.Module, device: torch.device | str, precision: str, **options: Any):
        super().__init__(model, device, precision, **options)
        self.model.eval()

    def step(self, host_batch: torch.Tensor) -> dict[str, float]:
        """One forward; the logits stay on the device, nothing synchronizes."""
        ids = self._to_device(host_batch)  # (B, T)
        with torch.no_grad(), self._autocast():
            # Causal LMs: use_cache=False, the forward scores the full sequence and a cache would be thrown away.
            self.model(**self._model_inputs(ids, labels=False))
        return {}

    def capture(self, host_batch: torch.Tensor) -> dict[str, torch.Tensor]:
        """{"logits": (R, V) rows (see logit_positions), "loss": scalar loss of the model's objective}.

        The forward is called exactly as `step` calls it (no labels), and the loss is taken from its logits with the
        model's own loss function, as its forward would have: a compiled arm then reuses the graph its cold step
        built instead of compiling another one for the labels.
        """
        with torch.no_grad(), _eval_mode(self.model):
            ids = self._to_device(host_batch)  # (B, T)
            inputs = self._model_inputs(ids, labels=True)
            labels = inputs.pop("labels")
            with self._autocast():
                logits = self.model(**inputs).logits
                loss = self.model.loss_function(logits=logits, labels=labels, vocab_size=self.model.config.vocab_size)
            return {"logits": self._logits_out(logits), "loss": self._out(loss)}


class _Decoding(Workload):
    """What both decoding workloads share: new_tokens, the prompt's length, the cache keyword, eval mode."""

    objectives = ("causal-lm",)  # an encoder has no next-token head to decode with

    def __init__(self, model: torch.nn.Module, device: torch.device | str, precision: str, **options: Any):
        super().__init__(model, device, precision, **options)
        self.new_tokens = self.options["new_tokens"]
        if not isinstance(self.new_tokens, int) or self.new_tokens < 2:
            raise ValueError(f"new_tokens must be an int >= 2, got {self.new_tokens!r}")
        self.max_positions = getattr(self.model.config, "max_position_embeddings", None)
        if self.max_positions is not None and self.new_tokens >= self.max_positions:
            raise ValueError(f"new_tokens={self.new_tokens} leaves no room for a prompt "
                             f"(max_positions {self.max_positions})")
        self._cache_kwarg = _cache_kwarg(self.model)
        self.model.eval()

    def _prompt(self, host_batch: torch.Tensor) -> torch.Tensor:
        """The batch on the device, cut so prompt and generated tokens fit the position table: (B, P)."""
        ids = self._to_device(host_batch)  # copied whole then sliced, so the pinned copy stays async
        if self.max_positions is not None:
            ids = ids[:, : self.max_positions - self.new_tokens]
        return ids


class GenerateWorkload(_Decoding):
    """Greedy decoding with Hugging Face's dynamic KV cache, written out by hand so every forward is visible to the
    profiler: host-bound and jittery as HF's own generate() is, kept for comparison with what users run in notebooks.

    Prefill over the prompt (the batch truncated to max_positions - new_tokens tokens), argmax of the last position,
    then new_tokens - 1 single-token decode forwards that pass the cache back in. Option `new_tokens` (default 16, >= 2
    so that time per output token is defined).
    """

    name = "generate"
    defaults = {"new_tokens": 16}

    def step(self, host_batch: torch.Tensor) -> dict[str, float]:
        """Generate new_tokens tokens; return {"ttft_ms": prefill + first token, "tpot_ms": mean per later token}.

        Synchronizes twice, where a streaming server would: when the first token exists, and when the generated ids
        are copied to the host at the end.
        """
        _, _, (t0, t1, t2) = self._generate(host_batch)
        return {"ttft_ms": (t1 - t0) / 1e6, "tpot_ms": (t2 - t1) / 1e6 / (self.new_tokens - 1)}

    def capture(self, host_batch: torch.Tensor) -> dict[str, torch.Tensor]:
        """{"tokens": (B, new_tokens) int64 generated ids, "prefill_logits": (B, V) last prompt position's logits}."""
        with _eval_mode(self.model):
            tokens, prefill_logits, _ = self._generate(host_batch)
        return {"tokens": tokens, "prefill_logits": self._out(prefill_logits)}

    @torch.no_grad()
    def _generate(self, host_batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, int]]:
        t0 = time.perf_counter_ns()  # the request arrives: copying the prompt counts toward the first token
        ids = self._prompt(host_batch)  # (B, P)
        with self._autocast():
            out = self.model(input_ids=ids, use_cache=True)
        cache = _cache_of(out)
        prefill_logits = out.logits[:, -1, :]  # (B, V)
        token = prefill_logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        self._sync()
        t1 = time.perf_counter_ns()

        tokens = [token]
        for _ in range(self.new_tokens - 1):
            with self._autocast():
                # Position ids follow from the cache length; no padding, so no attention mask is needed.
                out = self.model(input_ids=token, use_cache=True, **{self._cache_kwarg: cache})
            cache = _cache_of(out)
            token = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)  # (B, 1)
            tokens.append(token)
        generated = torch.cat(tokens, dim=1).to("cpu")  # (B, new_tokens); waits for the decode loop
        self._sync()
        t2 = time.perf_counter_ns()
        return generated, prefill_logits, (t0, t1, t2)




def all_workloads() -> dict[str, type[Workload]]:
    """WORKLOADS (one process each) and the data-parallel ones (distributed.py: they need a process group)."""
    from .distributed import DISTRIBUTED_WORKLOADS  # imported here: they subclass TrainWorkload

    return {**WORKLOADS, **DISTRIBUTED_WORKLOADS}


def supported_workloads(architecture: str) -> tuple[str, ...]:
    """Names of the workloads a model of this `model_type` can run (all three for causal LMs)."""
    return tuple(name for name, cls in WORKLOADS.items() if objective(architecture) in cls.objectives)


def check_workloads(source: ModelSource, workloads: Sequence[str], seq: int) -> None:
    """Raise ValueError (one line, naming the option) if the model cannot run `workloads` on `seq`-token batches.

    Cheap (configs only, no weights), so a run can refuse before it starts any worker.
    """
    supported = supported_workloads(source.architecture)
    known = all_workloads()
    unsupported = [w for w in workloads if w not in known or objective(source.architecture) not in known[w].objectives]
    if unsupported:
        raise ValueError(f"--workload: {source.name!r} is an encoder ({source.architecture}, masked-LM objective) and "
                         f"runs {', '.join(supported)}; {', '.join(unsupported)} needs a causal LM")
    limit = max_positions(source)
    if limit is not None and seq > limit:
        raise ValueError(f"--seq: {seq} tokens is more than {source.name!r} has positions for ({limit})")


def make_workload(name: str, model: torch.nn.Module, device: torch.device | str, precision: str,
                  **options: Any) -> Workload:
    """Construct the workload registered under `name`; unknown names raise ValueError with a close match."""
    known = all_workloads()
    if name not in known:
        raise ValueError(f"unknown workload {name!r}{suggest(name, known)}; known: {', '.join(known)}")
    return known[name](model, device, precision, **options)


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode inside, then every module's own training flag restored (not just the root's)."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, was_training in flags:
            m.training = was_training


def _mask_token_id(config: Any) -> int:
    token = getattr(config, "mask_token_id", None)
    if token is not None:
        return int(token)
    # Synthetic ids make any id an equally good mask token; keep BERT's when the vocabulary has it.
    return BERT_MASK_TOKEN_ID if config.vocab_size > BERT_MASK_TOKEN_ID else config.vocab_size - 1


def _check_weight_dtype(model: torch.nn.Module, precision: str) -> None:
    # fp64 only means something on a .double() model, and an fp64 model under "fp32" would silently run in fp64.
    want = torch.float64 if precision == "fp64" else torch.float32
    found = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if found - {want}:
        got = ", ".join(sorted(str(d).removeprefix("torch.") for d in found))
        raise ValueError(f"precision {precision!r} needs {str(want).removeprefix('torch.')} weights, model has {got}"
                         + (" (call model.double() for the fp64 reference)" if precision == "fp64" else ""))


def _cache_kwarg(model: torch.nn.Module) -> str:
    """The forward keyword that takes the KV cache: `cache` in newer transformers 5.x, `past_key_values` before.

    Newer versions still accept `past_key_values` but log a deprecation warning, so ask the signature.
    """
    forward = getattr(model, "_orig_mod", model).forward  # look through torch.compile's wrapper
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _cache_of(out: Any) -> Any:
    # Read the key that exists; out.past_key_values on newer versions is a property that logs a deprecation warning.
    keys = out.keys()
    for key in ("cache", "past_key_values"):
        if key in keys and out[key] is not None:
            return out[key]
    raise RuntimeError("the model returned no KV cache with use_cache=True; it cannot run the generate workload")


# At the end: decode.py builds on _Decoding and the helpers above.
from .decode import DecodeWorkload  # noqa: E402

WORKLOADS: dict[str, type[Workload]] = {"train": TrainWorkload, "infer": InferWorkload, "decode": DecodeWorkload,
                                        "generate": GenerateWorkload}
