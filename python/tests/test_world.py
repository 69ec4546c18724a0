"""Strata worlds over a torch.distributed process group, one process per rank (world_worker.py):
the ranks' outputs and shards equal a one-rank reference's, a world's checkpoint loads into worlds
of other sizes, faults give every survivor a clear error in time, and the DLRM example trains
under torchrun. Workers meet through a FileStore (no ports), run one thread each, and are killed
past their deadline: a hang fails the test naming the ranks, it never holds up the run."""

import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)
import strata  # noqa: E402 (after the skips, as world_worker, which needs torch.distributed)
import world_worker  # noqa: E402 (this folder: pytest puts it on sys.path)

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / "world_worker.py"
SOURCE = pathlib.Path(os.environ.get("STRATA_SOURCE_DIR", HERE.parents[1]))
EQUIVALENCE_WORLDS = [2, 3, 4]


class Rank:
    def __init__(self, rank, proc, out, err):
        self.rank, self.proc, self.out_path, self.err_path = rank, proc, out, err
        self.returncode = None

    @property
    def out(self):
        return self.out_path.read_text()

    @property
    def err(self):
        return self.err_path.read_text()

    def lines(self, word):
        return [line.split(" ", 1)[1] for line in self.out.splitlines() if line.startswith(word + " ")]

    def report(self):
        return f"--- rank {self.rank} (exit {self.returncode}) stdout:\n{self.out}\n--- stderr:\n{self.err[-4000:]}"


def run_ranks(commands, tmp_path, deadline):
    """Starts one process per command (output to files, so no pipe fills) and waits until they all
    end or `deadline` seconds pass; then kills those left (after a SIGABRT that makes Python print
    their stacks) and fails naming them."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    ranks, start = [], time.time()
    for r, cmd in enumerate(commands):
        out, err = tmp_path / f"rank{r}.out", tmp_path / f"rank{r}.err"
        with open(out, "w") as o, open(err, "w") as e:
            ranks.append(Rank(r, subprocess.Popen(cmd, stdout=o, stderr=e, env=env, start_new_session=True), out, err))
    while time.time() - start < deadline and any(r.returncode is None for r in ranks):
        for r in ranks:
            if r.returncode is None and r.proc.poll() is not None:
                r.returncode = r.proc.returncode
        time.sleep(0.05)
    hung = [r for r in ranks if r.returncode is None]
    for sig in (signal.SIGABRT, signal.SIGKILL) if hung else ():  # SIGABRT: PYTHONFAULTHANDLER prints the stacks
        for r in hung:  # each in its own session: the rank and anything it started (torchrun's workers)
            try:
                os.killpg(r.proc.pid, sig)
            except ProcessLookupError:
                pass  # ended meanwhile
        time.sleep(2 if sig == signal.SIGABRT else 0)
    for r in hung:
        r.proc.wait()
        r.returncode = r.proc.returncode
    if hung:
        pytest.fail(f"ranks {[r.rank for r in hung]} still ran after {deadline} s (killed; their stacks are in "
                    "their stderr):\n" + "\n".join(r.report() for r in ranks))
    return ranks


def launch(scenario, world, tmp_path, deadline, *args):
    """`world` workers of `scenario` (with `args`), meeting through a FileStore in `tmp_path`, their
    output there too: one launch per folder."""
    init = tmp_path / "filestore"  # fresh per launch: the FileStore's rendezvous file
    cmds = [[sys.executable, str(WORKER), scenario, str(r), str(world), str(init), *map(str, args)]
            for r in range(world)]
    return run_ranks(cmds, tmp_path, deadline)


@pytest.mark.parametrize("world", EQUIVALENCE_WORLDS)
def test_world_equals_the_one_rank_reference(world, tmp_path):
    """Every sharding type x {gpu, hybrid with caches of 4 rows}, sum/mean/none pooling with weights,
    every optimizer: 3 steps through Store with host views and 2 through the module with autograd
    and a StepLR; outputs, shards and state_dict against a one-rank cpu reference; a state_dict
    round trip and a foreign shard refused."""
    ranks = launch("equivalence", world, tmp_path, deadline=150)
    for r in ranks:
        assert r.returncode == 0 and r.lines("OK") == ["equivalence"], r.report()


def test_dynamic_tables_state_dicts_over_two_ranks(tmp_path):
    """A row-sharded and a table-sharded dynamic table train 3 steps as a one-rank reference on the
    concatenated batches; merge_state_dicts of both ranks' state_dicts is the reference's (keys,
    rows) and loads into one rank and back into the world; another rank's key is refused by name."""
    ranks = launch("dynamic", 2, tmp_path, deadline=120)
    for r in ranks:
        assert r.returncode == 0 and r.lines("OK") == ["dynamic"], r.report()


def test_a_world_checkpoint_loads_into_worlds_of_other_sizes(tmp_path):
    """2 ranks save (Store.save: a collective, each rank writing its shards once) after two steps
    and a rate change; 3 ranks and one store without a world (cpu tables) load it: every table's
    rows and optimizer state, the step and the rates equal the saver's, bit for bit."""
    ckpt, rows = tmp_path / "ckpt", tmp_path / "saved.npz"
    for scenario, world in (("save", 2), ("load", 3)):
        folder = tmp_path / scenario
        folder.mkdir()
        ranks = launch(scenario, world, folder, 120, ckpt, rows)
        for r in ranks:
            assert r.returncode == 0 and r.lines("OK") == [scenario], r.report()
    saved = np.load(rows)
    tables = world_worker.world_tables()
    one = strata.Store(world_worker.reference_config(tables))
    one.load(ckpt)
    for t in tables:
        n = t["name"]
        w, s = one.read_rows(n)
        assert np.array_equal(w, saved[f"weight_{n}"]) and np.array_equal(s, saved[f"state_{n}"]), n
        assert one.learning_rate(n) == saved[f"rate_{n}"], n
    assert one.step == int(saved["step"]) == 2


def check_fault(ranks, faulty, expect_exit, pattern):
    """The faulty rank's EVENT, then every survivor's ERROR matching `pattern` within 20 s of it."""
    report = "\n".join(r.report() for r in ranks)
    events = ranks[faulty].lines("EVENT")
    assert len(events) == 1, report
    event = float(events[0])
    assert expect_exit(ranks[faulty].returncode), report
    for r in ranks:
        if r.rank == faulty:
            continue
        assert r.returncode == 0 and r.lines("OK"), report
        t, text = r.lines("ERROR")[-1].split(" ", 1)
        assert re.search(pattern, text), report
        assert float(t) - event < 20, f"rank {r.rank} took {float(t) - event:.1f} s to report\n{report}"


def test_fault_config_differs_then_a_rank_raises_and_exits(tmp_path):
    ranks = launch("config", 3, tmp_path, deadline=60)
    check_fault(ranks, 1, lambda rc: rc == 1, r"RuntimeError: .*peer left")
    assert "rank 1 raises out of the program" in ranks[1].err
    for r in ranks:
        errors = r.lines("ERROR")
        if r.rank != 1:
            assert len(errors) == 3, r.report()
        assert re.search(r"ValueError: .*rank 2.*rows|ValueError: .*rows.*rank 2", errors[0]), r.report()
        assert "rank 1" in errors[1], r.report()


def test_fault_rank_killed_between_submit_and_forward(tmp_path):
    ranks = launch("kill", 3, tmp_path, deadline=60)
    check_fault(ranks, 1, lambda rc: rc == -9, r"RuntimeError: .*peer left")


def test_fault_rank_sleeps_past_the_timeout(tmp_path):
    ranks = launch("sleep", 3, tmp_path, deadline=60)
    check_fault(ranks, 2, lambda rc: rc == 0, r"RuntimeError: .*timed out after 3000 ms")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dlrm_example_under_torchrun(tmp_path):
    """train_dlrm.py under torchrun with 2 processes (gloo, tables on the emulated device): each
    rank prints its loss, rank 0 the world's samples/s and the exchange figures. --standalone is
    not used: torch 1.13 pins its port to 29400. --redirects 1 --tee 1: torchrun 1.13 under Python
    3.11 fails on its default "0" (Std.from_str("0") finds no flag), and these print each rank's
    stdout with a prefix "[default<rank>]:"."""
    example = SOURCE / "python" / "examples" / "train_dlrm.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "--redirects", "1", "--tee", "1",
           str(example), "--steps", "10", "--batch", "64", "--rows", "500", "--log-every", "5", "--threads", "1",
           "--device", "cpu"]
    ranks = run_ranks([cmd], tmp_path, deadline=150)  # past the example's 2-minute group timeout
    out = ranks[0].out
    assert ranks[0].returncode == 0, ranks[0].report()
    line = r"^(?:\[default\d\]:)?"  # torchrun's prefix of a rank's line
    for rank in (0, 1):
        assert re.search(line + rf"rank {rank} step +10  loss \d+\.\d+  [\d,]+ samples/s$", out, re.M), \
            ranks[0].report()
    assert re.search(line + r"world: 2 ranks, [\d,]+ samples/s$", out, re.M), ranks[0].report()
    exchange = r"rank 0 exchange: [1-9][\d,]* bytes/step, dedup factor \d+\.\d\d$"
    assert re.search(line + exchange, out, re.M), ranks[0].report()
