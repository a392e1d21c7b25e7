"""Which model a run measures: named presets built from configs, or a local folder of safetensors weights.

Nothing is ever downloaded. Presets are built from a config in code with seeded random weights, so two processes
(one per arm) that pass the same seed get bit-identical weights. Folders are loaded with `local_files_only=True` and
`use_safetensors=True`, so a pickle checkpoint (`*.bin`) is never unpickled.

`resolve_model` only validates (cheap, no weights); `build_model` does the expensive part. The split lets a CLI reject
a typo before it spawns worker processes.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from e2eprof.suggest import suggest

from .presets import PRESETS

if TYPE_CHECKING:
    import torch

# Encoder-only families: built with their masked-LM head and measured with a masked-LM objective (see loops.py);
# they have no causal LM, so no generate workload. Every other family is measured as a causal LM.
ENCODER_ARCHITECTURES = ("bert",)


def objective(architecture: str) -> Literal["causal-lm", "masked-lm"]:
    """The training objective a model of this `model_type` is measured with."""
    return "masked-lm" if architecture in ENCODER_ARCHITECTURES else "causal-lm"


class ModelLoadError(ValueError):
    """A model name, folder or attention implementation that cannot be used. The message is one line."""


@dataclass(frozen=True)
class ModelSource:
    """What `resolve_model` found: a preset name or a validated local folder (plain data, picklable, JSON-friendly)."""

    kind: Literal["preset", "folder"]
    name: str  # preset name, or the folder's base name
    path: str | None  # absolute folder path; None for presets
    architecture: str  # config.model_type, e.g. "gpt2"


def resolve_model(name_or_path: str) -> ModelSource:
    """Validate a preset name or a local model folder without loading any weights.

    An exact preset name wins over a same-named folder in the working directory; pass "./gpt2" for the folder.
    A folder must hold config.json (a JSON object with a model_type that transformers has a causal-LM class for,
    or a masked-LM class for encoder families) and at least one *.safetensors file. Raises ModelLoadError naming
    what is missing.
    """
    if name_or_path in PRESETS:
        return ModelSource(kind="preset", name=name_or_path, path=None,
                           architecture=PRESETS[name_or_path]["model_type"])
    path = Path(name_or_path).expanduser()
    if not _looks_like_path(name_or_path) and not path.exists():
        raise ModelLoadError(_unknown_model_message(name_or_path))
    return _resolve_folder(path)


def declared_architecture(name_or_path: str) -> str | None:
    """The model_type a preset or a folder's config.json names, without validating anything (None where none can be
    read): what a worker process may import before the checks, which refuse a model that does not resolve."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]["model_type"]
    try:
        config = json.loads((Path(name_or_path).expanduser() / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    declared = config.get("model_type") if isinstance(config, dict) else None
    return declared if isinstance(declared, str) and declared.isidentifier() else None


def build_model(source: ModelSource, *, attn_implementation: str, seed: int,
                device: torch.device | str | None = None) -> torch.nn.Module:
    """Build the model in fp32, in eval mode, with the requested attention implementation, on the CPU or `device`.

    Presets get weights drawn from torch's generator of the device they are built on, seeded with `seed`; the caller's
    global RNG state is left as it was (the draw happens inside `torch.random.fork_rng`). A preset built on a CUDA
    device draws its weights there: GPT-2's 124M parameters are initialised twice (torch's module defaults, then
    transformers' own init): seconds of a GPU host's CPU per worker, milliseconds on the GPU. Every arm
    of a run builds on the same kind of device with the same seed, so all arms hold the same weights (the CPU and a
    GPU draw different ones). Folders are read on the CPU and moved; for them the seed only matters if transformers
    had to initialise something, which we refuse anyway (missing weights raise ModelLoadError).
    """
    if "/" in attn_implementation:
        # transformers treats "org/repo" as a kernel to fetch from the Hub; we never download.
        raise ModelLoadError(f"attn_implementation {attn_implementation!r} names a Hub kernel; downloads are disabled")
    # Imported here, as transformers is: resolving a model needs neither, and the command line resolves its model
    # before the parent imports either, so that its workers start first (e2eprof/harness/prestart.py).
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    auto_class = AutoModelForMaskedLM if objective(source.architecture) == "masked-lm" else AutoModelForCausalLM
    on_gpu = device is not None and torch.device(device).type == "cuda" and source.kind == "preset"
    # Parameters created, and drawn, on the GPU; a CPU build needs no device context, which would route every torch
    # call of the construction through a TorchFunctionMode.
    built_on = torch.device(device) if on_gpu else contextlib.nullcontext()
    # manual_seed seeds every CUDA device: fork them all, so no caller's generator changes.
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if on_gpu else []):
        torch.manual_seed(seed)  # every device's generator
        try:
            if source.kind == "preset":
                # A fresh config per build: from_config stores the config object on the model and writes
                # _attn_implementation into it, so a shared config would switch an earlier model's attention too.
                config = AutoConfig.for_model(**PRESETS[source.name])
                with built_on:
                    model = auto_class.from_config(
                        config, attn_implementation=attn_implementation, dtype=torch.float32
                    )
            else:
                # transformers 5.x: `dtype` (torch_dtype is deprecated). Without it the default is "auto",
                # i.e. whatever dtype the checkpoint was saved in.
                model, info = auto_class.from_pretrained(
                    source.path,
                    local_files_only=True,
                    use_safetensors=True,
                    attn_implementation=attn_implementation,
                    dtype=torch.float32,
                    output_loading_info=True,
                )
                missing = sorted(info.get("missing_keys") or [])
                if missing:
                    # transformers would silently fill these with random values; measuring that is not measuring
                    # the checkpoint.
                    shown = ", ".join(missing[:3]) + (f" (+{len(missing) - 3} more)" if len(missing) > 3 else "")
                    hint = (f" ({source.architecture} is measured with its masked-LM head, which a bare encoder "
                            f"checkpoint lacks)" if auto_class is AutoModelForMaskedLM else "")
                    raise ModelLoadError(f"weights in {source.path!r} do not cover the model; missing: {shown}{hint}")
        except (ValueError, ImportError, OSError) as e:
            if isinstance(e, ModelLoadError):
                raise
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ModelLoadError(f"cannot build {source.name!r} with attn_implementation={attn_implementation!r}: "
                                 f"{first_line}") from e

    got = getattr(model.config, "_attn_implementation", None)
    if got != attn_implementation:
        raise ModelLoadError(
            f"asked for attn_implementation={attn_implementation!r} but {source.name!r} was built with {got!r}"
        )
    model.to(dtype=torch.float32)  # a no-op unless a checkpoint kept some buffers in another dtype
    if getattr(model, "loss_type", "") is None:
        # transformers derives the loss from the class name, finds none for e.g. "GPT2LMHeadModel", falls back to
        # the same loss and logs a warning on every forward with labels: name the loss it falls back to.
        model.loss_type = {"causal-lm": "ForCausalLM", "masked-lm": "ForMaskedLM"}[objective(source.architecture)]
    return model.eval()


def describe(model: torch.nn.Module) -> dict[str, Any]:
    """Facts about a built model for reports: n_params (tied weights counted once), architecture, vocab_size,
    max_positions, n_layer. Fields the config does not define are None."""
    config = model.config
    return {
        "n_params": sum(p.numel() for p in model.parameters()),  # parameters() already de-duplicates tied weights
        "architecture": config.model_type,
        "vocab_size": getattr(config, "vocab_size", None),
        # GPT2Config maps these standard names onto n_positions / n_layer through its attribute_map.
        "max_positions": getattr(config, "max_position_embeddings", None),
        "n_layer": getattr(config, "num_hidden_layers", None),
    }


def _looks_like_path(s: str) -> bool:
    return "/" in s or "\\" in s or s.startswith((".", "~"))


def _unknown_model_message(name: str) -> str:
    known = ", ".join(PRESETS)
    return (f"unknown model {name!r}{suggest(name, PRESETS)}; known: {known}, "
            "or a local folder with config.json and *.safetensors")


def _resolve_folder(path: Path) -> ModelSource:
    if not path.exists():
        raise ModelLoadError(f"model folder {str(path)!r} does not exist")
    if not path.is_dir():
        raise ModelLoadError(f"{str(path)!r} is not a folder; expected a folder with config.json and *.safetensors")
    path = path.resolve()
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"model folder {str(path)!r} has no config.json")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{str(config_file)!r} is not readable JSON: {e}") from e
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ModelLoadError(f"{str(config_file)!r} has no \"model_type\" string")
    if not any(path.glob("*.safetensors")):
        pickles = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt*"))
        found = f" (found {', '.join(pickles[:3])}; pickle checkpoints are never loaded, convert to safetensors)" \
            if pickles else ""
        raise ModelLoadError(f"model folder {str(path)!r} has no *.safetensors weights{found}")
    _check_weight_files(path)

    architecture = config["model_type"]
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    kind, mapping = (("masked-LM", MODEL_FOR_MASKED_LM_MAPPING_NAMES) if objective(architecture) == "masked-lm"
                     else ("causal-LM", MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))
    if architecture not in mapping:
        # Remote-code models (auto_map) land here too: we never run code shipped inside a model folder.
        raise ModelLoadError(f"model_type {architecture!r} in {str(config_file)!r} has no {kind} class in "
                             f"this transformers version")
    return ModelSource(kind="folder", name=path.name, path=str(path), architecture=architecture)


def _check_weight_files(path: Path) -> None:
    """Read every safetensors header (not the tensors) so a truncated or corrupt file is refused before any worker
    process starts: otherwise each arm's worker finds it only while building its model, a minute into the run.
    A sharded checkpoint's index must name only files that are there."""
    from safetensors import SafetensorError, safe_open

    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map") or {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
            raise ModelLoadError(f"{str(index)!r} is not a readable safetensors index: {e}") from None
        missing = sorted({name for name in weight_map.values() if not (path / name).is_file()})
        if missing:
            raise ModelLoadError(f"{str(index)!r} names weight files that are not there: {', '.join(missing[:3])}")
    for weights in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(weights), framework="pt") as handle:
                handle.keys()
        except (SafetensorError, OSError, ValueError) as e:
            reason = " ".join(str(e).split()) or type(e).__name__
            raise ModelLoadError(f"weights file {str(weights)!r} is not valid safetensors: {reason}") from None


def max_positions(source: ModelSource) -> int | None:
    """Longest sequence the model's position table covers (None if the config names none), without any weights.

    Read from the config alone, so a run can refuse a too-long --seq before it spawns workers.
    """
    if source.kind == "preset":
        # Every preset names its position table (GPT-2 as n_positions): read without building a config, because a
        # transformers config class imports the modeling and distributed code with it (its docstring decorator
        # loads modeling_auto): seconds of the parent's start-up on a GPU host, and the --seq default reads this
        # before the workers are prestarted (reports/2026-12-07-h100-run-time/).
        preset = PRESETS[source.name]
        for key in ("max_position_embeddings", "n_positions"):
            if key in preset:
                return int(preset[key])
    from transformers import AutoConfig

    if source.kind == "preset":
        config = AutoConfig.for_model(**PRESETS[source.name])
    else:
        config = AutoConfig.from_pretrained(source.path, local_files_only=True)
    # GPT2Config maps max_position_embeddings onto n_positions through its attribute_map.
    return getattr(config, "max_position_embeddings", None)
