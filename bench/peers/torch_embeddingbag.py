#!/usr/bin/python3
"""Peer benchmark: torch.nn.EmbeddingBag (CPU) replaying a Strata raw key trace.

Reads a trace written by strata::bench::write_batches_raw (format "STRKEYS1", documented in
toolkit/workload.hpp), builds one EmbeddingBag(rows, dim, mode='sum') per table in the trace, and
measures
  (a) forward only (under torch.no_grad): median wall time per step, cycling through the batches;
  (b) a training step with EmbeddingBag(sparse=True) + torch.optim.SGD(lr): forward,
      backward of a fixed random output gradient, opt.step(), opt.zero_grad(set_to_none=True).
Lookups per second = keys per step / median step time (keys summed over tables).

Runs with Debian's system python3 and its python3-torch (1.13) and python3-numpy:
  /usr/bin/python3 bench/peers/torch_embeddingbag.py --keys trace.bin --rows 2000000 --dim 128 \
      --steps 50 --threads 2 --json out.json
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch

MAGIC = b"STRKEYS1"
VERSION = 1
HEADER_BYTES = 8 + 4 + 4 + 4  # magic, version, num_batches, num_tables


class TraceError(Exception):
    """The trace file is malformed or does not match the command line."""


def read_trace(path, rows):
    """Parses a STRKEYS1 trace into batches[b][t] = (offsets int64 tensor, keys int64 tensor).

    Arrays in the file start 4 bytes off 8-byte alignment (the header is 20 bytes), so each one is
    copied into an aligned int64 array before it is handed to torch.
    """
    data = np.fromfile(path, dtype=np.uint8)
    if data.size < HEADER_BYTES or data[:8].tobytes() != MAGIC:
        raise TraceError(f"{path}: not a STRKEYS1 trace (bad magic or shorter than the header)")
    version, num_batches, num_tables = (int(x) for x in np.frombuffer(data, dtype="<u4", count=3, offset=8))
    if version != VERSION:
        raise TraceError(f"{path}: trace version {version} (expected {VERSION})")
    if num_batches == 0 or num_tables == 0:
        raise TraceError(f"{path}: {num_batches} batches of {num_tables} tables (expected at least one of each)")

    pos = HEADER_BYTES

    def take_array(what):
        nonlocal pos
        if pos + 8 > data.size:
            raise TraceError(f"{path}: truncated at byte {pos} reading the length of {what}")
        n = int(np.frombuffer(data, dtype="<u8", count=1, offset=pos)[0])
        pos += 8
        if n > (data.size - pos) // 8:
            raise TraceError(f"{path}: {what} claims {n} values but only {(data.size - pos) // 8} remain")
        arr = np.frombuffer(data, dtype="<i8", count=n, offset=pos).astype(np.int64, copy=True)
        pos += 8 * n
        return arr

    batches = []
    for b in range(num_batches):
        features = []
        for t in range(num_tables):
            who = f"batch {b} table {t}"
            offsets = take_array(f"{who} offsets")
            keys = take_array(f"{who} keys")
            if offsets.size < 1 or offsets[0] != 0 or offsets[-1] != keys.size:
                raise TraceError(f"{path}: {who}: offsets must start at 0 and end at the key count {keys.size}")
            if offsets.size > 1 and np.any(np.diff(offsets) < 0):
                raise TraceError(f"{path}: {who}: offsets are not non-decreasing")
            if keys.size and (keys.min() < 0 or keys.max() >= rows):
                raise TraceError(f"{path}: {who}: key range [{keys.min()}, {keys.max()}] is outside "
                                 f"[0, {rows}) (does --rows match the trace?)")
            features.append((torch.from_numpy(offsets), torch.from_numpy(keys)))
        batches.append(features)
    if pos != data.size:
        raise TraceError(f"{path}: {data.size - pos} unexpected bytes after the last batch")
    return batches


def mem_available_bytes():
    """MemAvailable from /proc/meminfo, or None where that is not readable."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def make_tables(num_tables, rows, dim, sparse, bound):
    """One EmbeddingBag per table, initialized uniform(-bound, bound) like Strata's tables."""
    tables = []
    for _ in range(num_tables):
        emb = torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=sparse, include_last_offset=True)
        with torch.no_grad():
            emb.weight.uniform_(-bound, bound)
        tables.append(emb)
    return tables


def summarize(times_s, keys_per_step):
    ms = sorted(t * 1e3 for t in times_s)
    med = statistics.median(ms)
    p10 = ms[int(0.1 * (len(ms) - 1))]
    p90 = ms[int(round(0.9 * (len(ms) - 1)))]
    return {
        "step_ms_median": med,
        "step_ms_p10": p10,
        "step_ms_p90": p90,
        "step_ms_mean": statistics.fmean(ms),
        "lookups_per_s": keys_per_step / (med / 1e3),
    }


def run_forward(tables, batches, steps, warmup):
    """Times forward passes (no autograd graph) over all tables; returns per-step seconds."""
    times = []
    with torch.no_grad():
        for i in range(warmup + steps):
            feats = batches[i % len(batches)]
            t0 = time.perf_counter()
            outs = [emb(keys, offsets) for emb, (offsets, keys) in zip(tables, feats)]
            t1 = time.perf_counter()
            del outs
            if i >= warmup:
                times.append(t1 - t0)
    return times


def run_train(tables, batches, steps, warmup, lr, dim, seed):
    """Times forward + backward + SGD step + zero_grad; returns per-step seconds."""
    opt = torch.optim.SGD([emb.weight for emb in tables], lr=lr)
    gen = torch.Generator().manual_seed(seed)
    grads = {}  # (table, batch size) -> fixed output gradient

    def grad_for(t, bags):
        key = (t, bags)
        if key not in grads:
            grads[key] = torch.randn(bags, dim, generator=gen)
        return grads[key]

    # Create every gradient before timing starts.
    for feats in batches:
        for t, (offsets, _) in enumerate(feats):
            grad_for(t, offsets.numel() - 1)

    times = []
    for i in range(warmup + steps):
        feats = batches[i % len(batches)]
        t0 = time.perf_counter()
        outs = [emb(keys, offsets) for emb, (offsets, keys) in zip(tables, feats)]
        torch.autograd.backward(outs, [grad_for(t, o.shape[0]) for t, o in enumerate(outs)])
        opt.step()
        opt.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        del outs
        if i >= warmup:
            times.append(t1 - t0)
    return times


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", required=True, help="STRKEYS1 trace written by strata::bench::write_batches_raw")
    ap.add_argument("--rows", type=int, required=True, help="rows per table (keys must be in [0, rows))")
    ap.add_argument("--dim", type=int, required=True, help="embedding dimension")
    ap.add_argument("--steps", type=int, default=50, help="timed steps per phase (default 50)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps per phase (default 3)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (default 0.01)")
    ap.add_argument("--phase", choices=["both", "forward", "train"], default="both", help="what to time")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and the output gradient")
    ap.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT")
    args = ap.parse_args(argv)

    if args.rows <= 0 or args.dim <= 0 or args.steps <= 0 or args.warmup < 0 or args.threads <= 0:
        ap.error("--rows, --dim, --steps and --threads must be > 0 and --warmup >= 0")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    try:
        batches = read_trace(args.keys, args.rows)
    except (OSError, TraceError) as e:
        print(f"torch_embeddingbag: {e}", file=sys.stderr)
        return 1
    num_tables = len(batches[0])
    keys_per_step = statistics.fmean(sum(k.numel() for _, k in feats) for feats in batches)
    bags = batches[0][0][0].numel() - 1

    # One set of tables alive at a time: forward tables are freed before the training ones exist.
    table_bytes = num_tables * args.rows * args.dim * 4
    avail = mem_available_bytes()
    if avail is not None and table_bytes > 0.8 * avail:
        print(f"torch_embeddingbag: {num_tables} tables of {args.rows} x {args.dim} fp32 need "
              f"{table_bytes / 2**30:.1f} GiB but only {avail / 2**30:.1f} GiB is available", file=sys.stderr)
        return 1

    # Other work on the machine (a build, another benchmark) makes OpenMP threads wait on each
    # other; record the load so such runs can be recognized afterwards.
    load_before = os.getloadavg()[0]
    results = {}
    if args.phase in ("both", "forward"):
        tables = make_tables(num_tables, args.rows, args.dim, sparse=False, bound=0.01)
        results["forward"] = summarize(run_forward(tables, batches, args.steps, args.warmup), keys_per_step)
        del tables
    if args.phase in ("both", "train"):
        tables = make_tables(num_tables, args.rows, args.dim, sparse=True, bound=0.01)
        times = run_train(tables, batches, args.steps, args.warmup, args.lr, args.dim, args.seed)
        results["train"] = summarize(times, keys_per_step)
        del tables

    print(f"torch.nn.EmbeddingBag  torch {torch.__version__}  threads {args.threads}  cpu {cpu_model()}")
    print(f"tables {num_tables}  rows {args.rows}  dim {args.dim}  bags/table {bags}  "
          f"keys/step {keys_per_step:.0f}  batches {len(batches)}  steps {args.steps} (+{args.warmup} warm-up)")
    print(f"load average (1 min) {load_before:.2f} before, {os.getloadavg()[0]:.2f} after, on {os.cpu_count()} CPUs")
    print(f"{'phase':<8} {'median ms':>10} {'p10 ms':>9} {'p90 ms':>9} {'Mlookups/s':>11} {'row GB/s':>9}")
    for phase, r in results.items():
        row_gbs = r["lookups_per_s"] * args.dim * 4 / 1e9
        print(f"{phase:<8} {r['step_ms_median']:>10.3f} {r['step_ms_p10']:>9.3f} {r['step_ms_p90']:>9.3f} "
              f"{r['lookups_per_s'] / 1e6:>11.2f} {row_gbs:>9.2f}")

    if args.json:
        out = {
            "peer": "torch.nn.EmbeddingBag",
            "torch_version": torch.__version__,
            "numpy_version": np.__version__,
            "python_version": platform.python_version(),
            "cpu": cpu_model(),
            "threads": args.threads,
            "trace": os.path.abspath(args.keys),
            "tables": num_tables,
            "rows": args.rows,
            "dim": args.dim,
            "batch": bags,
            "num_batches": len(batches),
            "keys_per_step": keys_per_step,
            "steps": args.steps,
            "warmup": args.warmup,
            "mode": "sum",
            "forward_no_grad": True,
            "optimizer": "sgd",
            "lr": args.lr,
            "sparse_grad": True,
            "zero_grad": "set_to_none",
            "loadavg_1m_before": load_before,
            "loadavg_1m_after": os.getloadavg()[0],
            "cpu_count": os.cpu_count(),
        }
        for phase, r in results.items():
            for k, v in r.items():
                out[f"{phase}_{k}"] = v
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
