"""The DLRM example trains (its loss goes down) and the README's PyTorch example runs as written."""

import json
import os
import pathlib
import re
import runpy
import statistics
import sys

import pytest

SOURCE = pathlib.Path(os.environ.get("STRATA_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))


def test_dlrm_example_loss_goes_down(capsys):
    sys.path.insert(0, str(SOURCE / "python" / "examples"))
    try:
        import train_dlrm
    finally:
        sys.path.pop(0)
    losses = train_dlrm.main(["--steps", "60", "--batch", "128", "--rows", "2000", "--log-every", "20",
                              "--threads", "1"])
    assert len(losses) == 60
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < first - 0.05, (first, last)
    printed = capsys.readouterr().out
    assert re.search(r"step +60  loss \d\.\d+  [\d,]+ samples/s", printed), printed


def test_dlrm_example_torch_baselines_train_and_write_their_figures(tmp_path):
    sys.path.insert(0, str(SOURCE / "python" / "examples"))
    try:
        import train_dlrm
    finally:
        sys.path.pop(0)
    for kind in ("per-table", "fused"):
        out = tmp_path / f"{kind}.json"
        losses = train_dlrm.main(["--steps", "60", "--batch", "128", "--rows", "2000", "--log-every", "20",
                                  "--threads", "1", "--torch-tables", kind, "--json", str(out)])
        first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
        assert last < first - 0.05, (kind, first, last)
        figures = json.loads(out.read_text())
        assert figures["tables"] == "torch " + kind
        assert len(figures["samples_per_s"]) == 3 and figures["losses"] == losses
        assert figures["median_samples_per_s"] == statistics.median(figures["samples_per_s"][1:])


def test_readme_pytorch_example_runs_as_written():
    readme = (SOURCE / "README.md").read_text()
    block = re.search(r"<!-- python-example -->\n```python\n(.*?)```", readme, re.S)
    assert block, "README.md has no python example block"
    code = block.group(1)
    assert len(code.strip().splitlines()) <= 10
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["tables"].store.step == 10


def test_dlrm_example_device_flag():
    sys.path.insert(0, str(SOURCE / "python" / "examples"))
    try:
        import train_dlrm
        import torch
    finally:
        sys.path.pop(0)
    args = ["--steps", "60", "--batch", "128", "--rows", "2000", "--log-every", "20", "--threads", "1",
            "--device", "cuda"]
    if not torch.cuda.is_available():  # the module's refusal, in its words (the GPU run cannot run here)
        with pytest.raises(ValueError, match="this torch has no CUDA device"):
            train_dlrm.main(args)
        return
    for extra in ([], ["--torch-tables", "fused"]):
        losses = train_dlrm.main(args + extra)
        first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
        assert last < first - 0.05, (extra, first, last)


def test_dlrm_example_criteo_epochs_flags_and_help(tmp_path, capsys):
    """--criteo reads the file again at its end (and says so), the JSON counts the steps run, a file
    shorter than one batch is an error naming --batch, and --help gives every flag its default."""
    sys.path.insert(0, str(SOURCE / "python" / "examples"))
    try:
        import train_dlrm
    finally:
        sys.path.pop(0)
    tsv = tmp_path / "day.tsv"
    tsv.write_text("".join("\t".join([str(i % 2)] + [str(i % 7)] * 13 + [f"{i * 2654435761 % 2**32:08x}"] * 26) + "\n"
                           for i in range(70)))  # 2 batches of 32 per epoch, 6 lines left out
    out = tmp_path / "run.json"
    base = ["--rows", "100", "--threads", "1", "--log-every", "5", "--criteo", str(tsv), "--json", str(out)]
    losses = train_dlrm.main(base + ["--steps", "5", "--batch", "32", "--mode", "cached", "--cache-fraction", "0.5"])
    assert len(losses) == 5 and json.loads(out.read_text())["steps"] == 5
    assert "end of the file after 2 batches of 32; epoch 2 starts" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="70 lines, fewer than one batch of --batch 8192"):
        train_dlrm.main(base + ["--steps", "5", "--batch", "8192"])
    with pytest.raises(SystemExit):
        train_dlrm.main(["--cache-fraction", "1.5"])
    assert "--cache-fraction 1.5 (expected a fraction of the rows in (0, 1])" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_dlrm.main(["--help"])
    text = capsys.readouterr().out
    for flag in ("--steps", "--batch", "--rows", "--dim", "--mode", "--cache-fraction", "--device", "--threads",
                 "--lr", "--criteo", "--torch-tables", "--json", "--log-every", "--seed"):
        assert re.search(re.escape(flag) + r"[^\n]*\n(?:\s+[^\n]*\n)*?[^\n]*\(default", text), flag
