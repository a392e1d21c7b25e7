"""Launch-configuration sweep for fastsoftmax's Triton kernels on GPT-2's attention shape.

Times the raw kernels (no custom-op dispatch) with triton.testing.do_bench, which flushes L2 between calls, for
  - the shipped one-row-per-program kernels at several num_warps, and
  - a candidate that gives each program ROWS rows (fewer, fatter programs: more bytes in flight per program),
on fp32->fp32, bf16->fp32 and bf16->bf16, forward and backward; next to eager torch and a device copy of the same
bytes (the roofline measured in the same process). Prints one line per variant and writes a CSV to --out.

Every variant's output is checked against torch.softmax first (a fast wrong configuration is discarded, not timed).
Usage on the GPU machine: PYTHONPATH=$PWD python3 benchmarks/tune_fastsoftmax.py --out $OUT/tune.csv
"""

from __future__ import annotations

import argparse
import csv

import torch
import triton
import triton.language as tl
import triton.testing

from e2eprof.kernels.fastsoftmax import triton_kernels as shipped


@triton.jit
def _fwd_rows(x_ptr, y_ptr, n_rows, n_cols, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(x_ptr + offs, mask=mask, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=1)
    e = tl.exp(x - m[:, None])
    y = e / tl.sum(e, axis=1)[:, None]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_rows(dy_ptr, y_ptr, dx_ptr, n_rows, n_cols, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    dot = tl.sum(dy * y, axis=1)
    tl.store(dx_ptr + offs, (y * (dy - dot[:, None])).to(dx_ptr.dtype.element_ty), mask=mask)


def fwd_variant(rows_per_program: int, warps: int):
    def run(x, out_dtype):
        n_rows, n_cols = x.shape
        y = torch.empty((n_rows, n_cols), dtype=out_dtype, device=x.device)
        block = triton.next_power_of_2(n_cols)
        if rows_per_program == 0:  # the shipped kernel, num_warps overridden
            shipped._softmax_fwd_row_kernel[(n_rows,)](x, y, n_cols, BLOCK=block, num_warps=warps)
        else:
            grid = (triton.cdiv(n_rows, rows_per_program),)
            _fwd_rows[grid](x, y, n_rows, n_cols, ROWS=rows_per_program, BLOCK=block, num_warps=warps)
        return y
    return run


def bwd_variant(rows_per_program: int, warps: int):
    def run(dy, y, out_dtype):
        n_rows, n_cols = y.shape
        dx = torch.empty((n_rows, n_cols), dtype=out_dtype, device=y.device)
        block = triton.next_power_of_2(n_cols)
        if rows_per_program == 0:
            shipped._softmax_bwd_row_kernel[(n_rows,)](dy, y, dx, n_cols, BLOCK=block, num_warps=warps)
        else:
            grid = (triton.cdiv(n_rows, rows_per_program),)
            _bwd_rows[grid](dy, y, dx, n_rows, n_cols, ROWS=rows_per_program, BLOCK=block, num_warps=warps)
        return dx
    return run


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8 * 12 * 1024)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--out", default="tune_fastsoftmax.csv")
    args = ap.parse_args()
    dev = "cuda"
    rows, cols = args.rows, args.cols
    copy_src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    copy_dst = torch.empty_like(copy_src)
    copy_us = triton.testing.do_bench(lambda: copy_dst.copy_(copy_src), return_mode="median") * 1e3
    roofline = 2 * copy_src.numel() / (copy_us * 1e-6)  # bytes read + written per second
    print(f"copy roofline {roofline / 1e12:.3f} TB/s ({copy_us:.1f} us for 1 GiB)")

    # Each variant compiles once per dtype path (about a second each): keep the list short.
    variants = [(0, w) for w in (2, 4, 8, 16)] + [(2, 4), (2, 8), (4, 4), (4, 8), (8, 8)]
    paths = [(torch.float32, torch.float32), (torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16)]
    out_rows = []
    g = torch.Generator(device=dev).manual_seed(0)
    for in_dt, out_dt in paths:
        x = (torch.randn(rows, cols, device=dev, generator=g) * 3).to(in_dt)
        ref = torch.softmax(x.float(), -1).to(out_dt)
        dy = torch.randn(rows, cols, device=dev, generator=g).to(out_dt)
        y = ref
        ref_dx = torch._softmax_backward_data(dy.float(), y.float(), -1, torch.float32).to(in_dt)
        fwd_bytes = x.numel() * (x.element_size() + torch.empty((), dtype=out_dt).element_size())
        bwd_bytes = x.numel() * (dy.element_size() + y.element_size() + torch.empty((), dtype=in_dt).element_size())
        label = f"{str(in_dt)[6:]}->{str(out_dt)[6:]}"
        eager_fwd = lambda: torch.softmax(x, -1, dtype=out_dt) if in_dt != out_dt else torch.softmax(x, -1)  # noqa: E731
        eager_bwd = lambda: torch._softmax_backward_data(dy, y, -1, in_dt)  # noqa: E731
        candidates = [("fwd", "eager", eager_fwd, fwd_bytes, None), ("bwd", "eager", eager_bwd, bwd_bytes, None)]
        for r, w in variants:
            name = f"{'shipped' if r == 0 else f'rows{r}'} w{w}"
            f, b = fwd_variant(r, w), bwd_variant(r, w)
            candidates.append(("fwd", name, (lambda f=f: f(x, out_dt)), fwd_bytes, ref))
            candidates.append(("bwd", name, (lambda b=b: b(dy, y, in_dt)), bwd_bytes, ref_dx))
        for direction, name, fn, nbytes, expected in candidates:
            try:
                got = fn()
                err = rel_err(got, expected) if expected is not None else float("nan")
                if expected is not None and not err <= (1e-5 if got.dtype == torch.float32 else 1e-2):
                    print(f"{label} {direction} {name}: WRONG (rel err {err:.2e}), not timed")
                    continue
                us = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3
            except Exception as exc:  # a configuration the compiler rejects (registers, shared memory)
                print(f"{label} {direction} {name}: failed: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            share = nbytes / (us * 1e-6) / roofline
            print(f"{label} {direction} {name:14s} {us:8.1f} us  {nbytes / (us * 1e-6) / 1e12:5.2f} TB/s  {share:5.1%}")
            out_rows.append(dict(path=label, direction=direction, variant=name, us=us, bytes=nbytes,
                                 tbps=nbytes / (us * 1e-6) / 1e12, roofline_share=share, rel_err=err))
    with open(args.out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(out_rows[0]))
        writer.writeheader()
        writer.writerows(out_rows)


if __name__ == "__main__":
    main()
