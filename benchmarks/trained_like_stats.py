"""What the gate's trained-like model (workloads/trained_like.py) hands a kernel, against the random-init model.

For each model: one forward pass of the seeded random-init model on an unpadded batch, then of the same model after
`trained_like.transform` on the padded batch the gate uses, with eager attention (so the attention scores pass
through softmax where they can be read). Writes OUT/trained_like_stats.parquet (one row per model and state) and
OUT/trained_like_stats.md (the table, date, versions, command). The statistics are properties of the weights and
the batch, so a CPU measures them as well as a GPU does.

Usage: PYTHONPATH=$PWD python3 benchmarks/trained_like_stats.py OUT [--model gpt2:8x1024 --model llama-1b:2x1024 ...]
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
from pathlib import Path

import pandas as pd
import torch
import transformers

from e2eprof.workloads import trained_like
from e2eprof.workloads.models import build_model, resolve_model

DEFAULT_MODELS = ("gpt2:8x1024", "bert-base:8x512", "llama-1b:2x1024")
COLUMNS = {
    "logit_max": "largest abs. attention score (unmasked)",
    "logit_std": "attention scores' std",
    "masked_rows": "fully masked attention rows",
    "outlier_ratio": "largest / median channel spread at a norm's input",
    "row_mean_ratio": "abs. row mean / row spread at a norm's input (median row)",
}


def measure(spec: str) -> list[dict]:
    name, _, shape = spec.partition(":")
    batch, seq = (int(x) for x in (shape or "2x256").split("x"))
    model = build_model(resolve_model(name), attn_implementation="eager", seed=0)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))
    rows = [{"model": name, "batch": batch, "seq": seq, "state": "random init, unpadded"}
            | trained_like.statistics(model, ids, None)]
    padded, mask = trained_like.padded(ids, trained_like.pad_token_id(model.config))
    moved = trained_like.transform(model, padded, mask, seed=0)
    rows.append({"model": name, "batch": batch, "seq": seq, "state": "trained-like, padded",
                 "transform": moved.describe()} | trained_like.statistics(model, padded, mask))
    return rows


def markdown(table: pd.DataFrame, command: str) -> str:
    lines = ["# The gate's trained-like model: what it hands a kernel", "",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}; torch {torch.__version__}; "
             f"transformers {transformers.__version__}; fp32, eager attention, seeded random init",
             f"- command: `{command}`", "",
             "| model | batch x seq | state | " + " | ".join(COLUMNS.values()) + " |",
             "|---|---|---|" + "---|" * len(COLUMNS)]
    for r in table.itertuples():
        cells = [f"{getattr(r, c):.3g}" if c != "masked_rows" else f"{int(r.masked_rows)}" for c in COLUMNS]
        lines.append(f"| {r.model} | {r.batch}x{r.seq} | {r.state} | " + " | ".join(cells) + " |")
    transforms = table.dropna(subset=["transform"]) if "transform" in table else table.iloc[:0]
    lines += ["", *(f"- {r.model}: {r.transform}" for r in transforms.itertuples())]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--model", action="append", help="NAME[:BATCHxSEQ], repeatable (default: %(default)s)")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    rows = [row for spec in (a.model or DEFAULT_MODELS) for row in measure(spec)]
    table = pd.DataFrame(rows)
    table.to_parquet(a.out / "trained_like_stats.parquet", index=False)
    text = markdown(table, "python3 benchmarks/trained_like_stats.py " + shlex.join(argv))
    (a.out / "trained_like_stats.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
