"""Greedy decoding as serving stacks run it: a static KV cache, and the one-token step replayed from a CUDA graph.

Hugging Face's dynamic-cache decoding (the `generate` workload) spends most of each token in Python: on the H200 a
gpt2 batch of 8 left the GPU idle 90% of every step, and steps swung by +-30%. Nobody deploys a decoder like that.
vLLM, SGLang and gpt-fast keep the cache at a fixed address and capture the one-token forward in a CUDA graph, so a
token costs what its kernels cost; a kernel's effect on decoding is only visible there.

Each step: the cache is rewound, the prompt is prefilled eagerly (time to first token), then new_tokens - 1 replays
of one captured graph, each of which runs the model on the last token, takes the argmax and writes it back as the
next step's input. The graph is captured once, on the first step (the cold step); capturing again is counted
(`captures`), since a re-capture inside timed steps would be compile time, not decode time.

- Stock and patched arms capture the eager model: the same kernels as eager mode, without Python between them.
- The torch.compile arm compiles the one-token step with mode="reduce-overhead" (Inductor's kernels inside its own
  CUDA graphs): the strongest stock decoder.
- On a CPU there are no graphs: the same static-cache loop runs eagerly.
- A patched kernel that cannot be captured (it synchronises with the host, allocates outside the graph's pool, or
  launches on another stream) makes the capture fail; the step raises NotCapturable saying so.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch

from .loops import _Decoding, _eval_mode

# One-token steps run on a side stream before capture: cuBLAS creates its workspaces and handles there, which a
# capture may not do.
WARMUP_STEPS = 2


class NotCapturable(RuntimeError):
    """The one-token decode step could not be captured in a CUDA graph; the message says why, in one line."""


class DecodeWorkload(_Decoding):
    """Static-cache greedy decoding with the one-token step in a CUDA graph (see the module docstring).

    Options: new_tokens (default 16, >= 2), graphs (default True; False runs the same loop eagerly, as on a CPU).
    Step metrics: ttft_ms (copy and prefill, to the first token), tpot_ms (mean per later token).
    """

    name = "decode"
    defaults = {"new_tokens": 16, "graphs": True}

    def __init__(self, model: torch.nn.Module, device: torch.device | str, precision: str, **options: Any):
        super().__init__(model, device, precision, **options)
        self.compiled = hasattr(model, "_orig_mod")  # the torch.compile arm's wrapper
        self.eager_model = model._orig_mod if self.compiled else model
        self.use_graphs = bool(self.options["graphs"]) and self.device.type == "cuda"
        self.captures = 0  # CUDA graph captures of the one-token step (explicit ones; Inductor counts its own)
        self._state: SimpleNamespace | None = None
        self._graph: torch.cuda.CUDAGraph | None = None
        self._compiled_step = None

    # ---- the loop ---------------------------------------------------------------------------------------------
    def step(self, host_batch: torch.Tensor) -> dict[str, float]:
        _, _, (t0, t1, t2) = self._decode(host_batch, replay=self.use_graphs or self.compiled)
        return {"ttft_ms": (t1 - t0) / 1e6, "tpot_ms": (t2 - t1) / 1e6 / (self.new_tokens - 1)}

    def capture(self, host_batch: torch.Tensor) -> dict[str, torch.Tensor]:
        """{"tokens": (B, new_tokens), "prefill_logits": (B, V)}. Decoded eagerly, so every call of a patched op is
        seen by the per-call checks (a graph replay runs no Python), except in the compile arm, whose compiled
        decoder is what must be right."""
        with _eval_mode(self.model):
            tokens, prefill_logits, _ = self._decode(host_batch, replay=self.compiled)
        return {"tokens": tokens, "prefill_logits": self._out(prefill_logits)}

    @contextlib.contextmanager
    def eager(self) -> Iterator[None]:
        """Steps run without graphs inside: the profiler attributes ops to modules through Python ranges, which
        replays do not run; the kernels are the same."""
        saved, self.use_graphs = self.use_graphs, False
        try:
            yield
        finally:
            self.use_graphs = saved

    @torch.no_grad()
    def _decode(self, host_batch: torch.Tensor, replay: bool):
        t0 = time.perf_counter_ns()  # the request arrives: copying the prompt counts toward the first token
        ids = self._prompt(host_batch)  # (B, P)
        fresh = self._state is None
        state = self._state_for(ids.shape)
        if fresh and self.compiled:
            self.initialize_cache(ids)
        prefill_logits = self._prefill(ids, state)  # (B, V)
        self._sync()
        t1 = time.perf_counter_ns()
        if replay:
            self._replays(state)
        else:
            for _ in range(self.new_tokens - 1):
                self._one_token(state)
        generated = state.tokens.to("cpu")  # (B, new_tokens); waits for the decode loop
        self._sync()
        t2 = time.perf_counter_ns()
        return generated, prefill_logits, (t0, t1, t2)

    def _prefill(self, ids: torch.Tensor, state: SimpleNamespace) -> torch.Tensor:
        state.cache.reset()  # rewind: zeroes keys, values and their length in place (the graph keeps their addresses)
        with self._autocast(cache_enabled=False):
            out = self.model(input_ids=ids, use_cache=True, **{self._cache_kwarg: state.cache})
        logits = out.logits[:, -1, :]  # (B, V)
        first = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        state.token.copy_(first)
        state.tokens[:, :1].copy_(first)
        state.index.fill_(1)
        return logits

    def _one_token(self, state: SimpleNamespace) -> None:
        """One decode forward on the last token; its argmax becomes the next input and joins `tokens`. Only tensor
        operations on fixed buffers, so a CUDA graph can capture it and every replay advances the decode by one."""
        with self._autocast(cache_enabled=False):
            out = self.eager_model(input_ids=state.token, attention_mask=self._step_mask(state), use_cache=True,
                                   **{self._cache_kwarg: state.cache})
        nxt = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)  # (B, 1)
        state.tokens.index_copy_(1, state.index, nxt)
        state.token.copy_(nxt)
        state.index.add_(1)

    def _replays(self, state: SimpleNamespace) -> None:
        if self.compiled:
            step = self._compiled()
            for _ in range(self.new_tokens - 1):
                step(state)
            return
        if self._graph is None:
            self._graph = self._capture_graph(state)
        for _ in range(self.new_tokens - 1):
            self._graph.replay()

    def _compiled(self):
        """The torch.compile arm's decoder: the one-token step under mode="reduce-overhead" (CUDA graphs made by
        Inductor's cudagraph trees), compiled on first use."""
        if self._compiled_step is None:
            self._compiled_step = torch.compile(self._one_token, mode="reduce-overhead")
        return self._compiled_step

    def _capture_graph(self, state: SimpleNamespace) -> torch.cuda.CUDAGraph:
        """Capture one decode step. The warm-up steps and the capture leave the cache ahead by a few tokens, so the
        caller's decode starts over from the prefill it just ran: captured graphs record, they do not run."""
        snapshot = (state.cache_lengths(), state.token.clone(), state.tokens.clone(), state.index.clone())
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(min(WARMUP_STEPS, self.new_tokens - 1)):
                self._one_token(state)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self._one_token(state)
        except Exception as exc:  # noqa: BLE001 - any failure inside a capture means the same thing
            reason = " ".join(str(exc).split())[:300] or type(exc).__name__
            raise NotCapturable(f"the one-token decode step cannot be captured in a CUDA graph: "
                                f"{type(exc).__name__}: {reason}") from None
        self.captures += 1
        state.restore(snapshot)
        return graph

    def _step_mask(self, state: SimpleNamespace) -> torch.Tensor | None:
        """The one-token step's 4D attention mask (B, 1, 1, max_cache_len), made on the device from the cache's
        length: the new token sees every cached position and its own. Hugging Face builds the same mask itself, but
        for eager attention with a host-to-device copy of a scalar (masking_utils.eager_mask), which a CUDA graph
        cannot capture. Additive (0 / dtype's min, in the weights' dtype) for eager attention, boolean otherwise,
        as Hugging Face's own masks are; a 4D mask is passed through by the model unchanged."""
        kind = getattr(self.eager_model.config, "_attn_implementation", None)
        if kind not in ("eager", "sdpa"):
            return None  # other implementations build their own (e.g. flash attention needs none)
        length = state.cache.layers[0].cumulative_length  # (): tokens cached so far = the new token's position
        visible = (state.positions <= length).view(1, 1, 1, -1).expand(state.shape[0], 1, 1, -1)
        if kind == "sdpa":
            return visible
        zero, lowest = state.mask_values  # device scalars in the weights' dtype (fp64's min overflows a float32)
        return torch.where(visible, zero, lowest)

    # ---- buffers ----------------------------------------------------------------------------------------------
    def _state_for(self, shape: torch.Size) -> SimpleNamespace:
        """The static cache and token buffers for a (B, P) prompt, made once: a graph replays on these addresses."""
        if self._state is not None:
            if self._state.shape != tuple(shape):
                raise ValueError(f"decode: prompt shape {tuple(shape)} differs from the captured {self._state.shape}")
            return self._state
        from transformers import StaticCache

        batch, prompt = shape
        cache = StaticCache(config=self.eager_model.config, max_cache_len=prompt + self.new_tokens)
        device = self.device
        state = SimpleNamespace(
            shape=tuple(shape), cache=cache,
            token=torch.zeros(batch, 1, dtype=torch.long, device=device),  # (B, 1): the next step's input
            tokens=torch.zeros(batch, self.new_tokens, dtype=torch.long, device=device),  # (B, new_tokens)
            index=torch.zeros(1, dtype=torch.long, device=device),  # where the next token goes in `tokens`
            positions=torch.arange(prompt + self.new_tokens, device=device),  # (max_cache_len,): the cache's slots
        )
        dtype = next(self.eager_model.parameters()).dtype
        state.mask_values = (torch.zeros((), dtype=dtype, device=device),
                             torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device))
        if self.compiled:  # fixed addresses, so Inductor's graphs need not copy them in on every replay
            for buffer in (state.token, state.tokens, state.index, state.positions, *state.mask_values):
                torch._dynamo.mark_static_address(buffer)

        def cache_lengths():
            return [layer.cumulative_length.clone() for layer in cache.layers if hasattr(layer, "cumulative_length")
                    and torch.is_tensor(layer.cumulative_length)]

        def restore(snapshot):
            lengths, token, tokens, index = snapshot
            layers = [layer for layer in cache.layers if hasattr(layer, "cumulative_length")
                      and torch.is_tensor(layer.cumulative_length)]
            for layer, length in zip(layers, lengths):
                layer.cumulative_length.copy_(length)
            state.token.copy_(token)
            state.tokens.copy_(tokens)
            state.index.copy_(index)

        state.cache_lengths, state.restore = cache_lengths, restore
        self._state = state
        return state

    def initialize_cache(self, ids: torch.Tensor) -> None:
        """The compile arm: fill the static cache's tensors with one eager prefill before anything is compiled.
        Hugging Face allocates them on first use and marks their addresses static only outside a trace; allocated
        inside the compiled prefill they count as mutated inputs, and Inductor then skips its CUDA graphs (seen on
        the H200: 'skipping cudagraphs due to mutated inputs (36 instances)' for gpt2's 12 layers)."""
        with torch.no_grad(), self._autocast(cache_enabled=False):
            self.eager_model(input_ids=ids, use_cache=True, **{self._cache_kwarg: self._state.cache})
