"""Half-size tables from Python (issue 31): bf16/fp16 rows, state and outputs through strata.Store and
strata.torch.EmbeddingBagCollection; state_dict dtypes and their round trip; gradients of the wrong
dtype; a small model trained with bf16 rows and stochastic rounding ends near fp32's loss."""

import numpy as np
import pytest
import torch

import strata
import strata.torch as st
from conftest import config, random_feature, table

TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16}


def half_table(name, rows, dim, dtype, optimizer="adagrad", output_dtype=None, state_dtype=None, sr=False, **kw):
    t = table(name, rows, dim, optimizer=optimizer, **kw)
    t["dtype"] = dtype
    if output_dtype:
        t["output_dtype"] = output_dtype
    if state_dtype:
        t["state_dtype"] = state_dtype
    if sr:
        t["stochastic_rounding"] = True
    return t


def same_bits(a, b):
    """Whether two tensors hold the same bits (torch.equal takes -0.0 for 0.0 and no NaN for itself)."""
    view = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.view(view[a.dtype]), b.view(view[b.dtype])) if a.dtype in view else torch.equal(a, b)


def tensors(features):
    return {k: {kk: torch.from_numpy(v) for kk, v in f.items()} for k, f in features.items()}


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_state_dict_has_the_tables_dtypes_and_round_trips(dtype):
    cfg = config([half_table("a", 30, 4, dtype, optimizer="adam", state_dtype="bf16", output_dtype=dtype),
                  table("b", 20, 3, optimizer="adagrad")])
    rng = np.random.default_rng(1)
    m = st.EmbeddingBagCollection(cfg)
    for _ in range(3):
        out = m(tensors({"a": random_feature(rng, 30, 5), "b": random_feature(rng, 20, 5)}))
        assert out["a"].dtype == TORCH[dtype] and out["b"].dtype == torch.float32
        out["a"].float().pow(2).sum().add(out["b"].pow(2).sum()).backward()
    sd = m.state_dict()
    assert sd["embedding_bags.a.weight"].dtype == TORCH[dtype]
    assert sd["embedding_bags.a.optimizer_state"].dtype == torch.bfloat16
    assert sd["embedding_bags.b.weight"].dtype == torch.float32
    # The tensors hold the rows exactly: widened, they are the store's fp32 reads.
    w, s = m.store.read_rows("a")
    assert np.array_equal(sd["embedding_bags.a.weight"].float().numpy(), w)
    assert np.array_equal(sd["embedding_bags.a.optimizer_state"].float().numpy(), s)
    n = st.EmbeddingBagCollection(cfg)
    n.load_state_dict(sd)
    for k, v in n.state_dict().items():
        assert v.dtype == sd[k].dtype and same_bits(v, sd[k]), k
    # Both continue bit for bit.
    features = {"a": random_feature(np.random.default_rng(7), 30, 6), "b": random_feature(rng, 20, 6)}
    for e in (m, n):
        out = e(tensors(features))
        out["a"].float().sum().add(out["b"].sum()).backward()
    for k, v in m.state_dict().items():
        assert same_bits(v, n.state_dict()[k]), k


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_special_values_round_trip_bit_for_bit(dtype):
    """NaNs with a sign and payload, -0.0, subnormals and infinities of a half-size table survive
    state_dict, load_state_dict and merge_state_dicts bit for bit (torch's .to() would make every
    bf16 NaN one canonical NaN)."""
    bits = np.array([0xFFC1, 0x7FC3, 0x8000, 0x0001, 0x8003, 0x7F80, 0xFF80, 0x3F80], np.uint16)
    if dtype == "fp16":
        bits = np.array([0xFE01, 0x7E05, 0x8000, 0x0001, 0x8003, 0x7C00, 0xFC00, 0x3C00], np.uint16)
    half = torch.from_numpy(bits.view(np.int16)).view(TORCH[dtype])
    cfg = config([half_table("a", 2, 4, dtype, optimizer="sgd")])
    m = st.EmbeddingBagCollection(cfg)
    m.store.write_rows("a", 0, half.float().numpy().reshape(2, 4))
    sd = m.state_dict()
    assert torch.equal(sd["embedding_bags.a.weight"].view(torch.int16).flatten(), half.view(torch.int16))
    n = st.EmbeddingBagCollection(cfg)
    n.load_state_dict(sd)
    assert same_bits(n.state_dict()["embedding_bags.a.weight"], sd["embedding_bags.a.weight"])
    shard = dict(sd)
    shard["embedding_bags.a.shard"] = torch.tensor([1, 0, 2, 2, 4, 0, 1, 2, 0, 4])
    shard["embedding_bags.a.replicas"] = torch.tensor([0])
    merged = st.merge_state_dicts([shard])
    assert same_bits(merged["embedding_bags.a.weight"], sd["embedding_bags.a.weight"])


def test_half_arrays_of_the_other_half_dtype_or_unaligned_are_refused():
    s = strata.Store(config([half_table("a", 10, 4, "bf16", output_dtype="bf16")]))
    s.submit(0, {"a": {"keys": np.array([1, 2]), "lengths": np.array([2])}})
    with pytest.raises(ValueError, match=r"table 'a'.*fp16.*expected bf16"):
        s.forward(0, [np.zeros((1, 4), np.float16)])  # float16 for a bf16 table
    buf = np.zeros(2 * 4 + 1, np.int16)
    with pytest.raises(ValueError, match=r"outputs\[0\] is not aligned"):
        s.forward(0, [np.frombuffer(buf.data, np.int16, count=4, offset=1).reshape(1, 4)])
    s.forward(0)
    s.backward(0, [np.frombuffer(bytes(10), np.int16, count=4, offset=1).reshape(1, 4)])  # read: copied aligned
    assert s.in_flight == 0


def test_a_state_dict_of_another_dtype_is_refused_and_changes_nothing():
    cfg = config([half_table("a", 10, 4, "bf16")])
    m = st.EmbeddingBagCollection(cfg)
    before = m.state_dict()
    sd = dict(before)
    sd["embedding_bags.a.weight"] = before["embedding_bags.a.weight"].float() + 1  # float32 rows for a bf16 table
    with pytest.raises(RuntimeError, match=r"embedding_bags\.a\.weight has dtype torch\.float32 \(expected "
                                           r"torch\.bfloat16, the table's dtype; .*explicitly: "
                                           r"\.to\(torch\.bfloat16\)\)"):
        m.load_state_dict(sd)
    sd["embedding_bags.a.weight"] = before["embedding_bags.a.weight"].float().numpy()
    with pytest.raises(RuntimeError, match=r"NumPy array of float32 \(expected a torch\.bfloat16 tensor"):
        m.load_state_dict(sd)
    for k, v in m.state_dict().items():
        assert same_bits(v, before[k]), k
    # Converted explicitly, it loads.
    sd["embedding_bags.a.weight"] = (before["embedding_bags.a.weight"].float() + 1).to(torch.bfloat16)
    m.load_state_dict(sd)
    assert same_bits(m.state_dict()["embedding_bags.a.weight"], sd["embedding_bags.a.weight"])


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_outputs_and_gradients_equal_fp32_ones_rounded(dtype):
    """Two stores of the same half-size rows, one writing fp32 outputs and one half-size outputs:
    the half outputs are the fp32 ones rounded to nearest, and gradients that the half type holds
    give the same updates in both."""
    rng = np.random.default_rng(3)
    stores = [strata.Store(config([half_table("a", 40, 8, dtype, output_dtype=out)])) for out in (None, dtype)]
    for step in range(4):
        f = {"a": random_feature(rng, 40, 6, weighted=True)}
        grads = torch.from_numpy(rng.normal(size=(6, 8)).astype(np.float32)).to(TORCH[dtype])
        outs = []
        for s, g in zip(stores, (grads.float(), grads)):
            s.submit(step, f)
            outs.append(s.forward(step)[0])
            s.backward(step, [g.numpy() if g.dtype != torch.bfloat16 else g])
        wide, half = outs
        half = torch.from_numpy(half).view(torch.bfloat16) if dtype == "bf16" else torch.from_numpy(half)
        assert half.dtype == TORCH[dtype]
        assert same_bits(torch.from_numpy(wide).to(TORCH[dtype]), half)
    assert np.array_equal(stores[0].read_rows("a")[0], stores[1].read_rows("a")[0])
    assert np.array_equal(stores[0].read_rows("a")[1], stores[1].read_rows("a")[1])


def test_gradients_of_another_dtype_are_refused_and_change_nothing():
    s = strata.Store(config([half_table("a", 10, 4, "bf16", output_dtype="bf16")]))
    s.submit(0, {"a": {"keys": np.array([1, 2]), "lengths": np.array([2])}})
    out = s.forward(0)
    assert out[0].dtype == np.int16  # bf16 bits (NumPy has no bfloat16)
    before = s.read_rows("a")
    with pytest.raises(ValueError, match=r"table 'a'.*fp32.*expected bf16"):
        s.backward(0, [np.ones((1, 4), np.float32)])
    with pytest.raises(TypeError, match=r"grads\[0\] has dtype float64 \(expected float32, float16 or bfloat16"):
        s.backward(0, [np.ones((1, 4), np.float64)])
    assert s.in_flight == 1
    assert all(np.array_equal(a, b) for a, b in zip(before, s.read_rows("a")))
    s.backward(0, [torch.ones((1, 4), dtype=torch.bfloat16)])
    assert s.in_flight == 0


def test_bf16_rows_with_stochastic_rounding_train_to_fp32s_loss():
    """Issue 31's convergence check: a small model (embeddings -> linear -> MSE against the sum of
    each key's hidden value plus noise, so the loss has a floor) trained 300 steps with bf16 rows
    and stochastic rounding ends within 2% of the same model with fp32 rows (the mean loss of the
    last 50 steps; both see the same keys and noise). At this learning rate bf16 rows rounded to
    nearest stall: their loss ends about 36% above fp32's (0.0170 against 0.0125)."""
    rows, dim, batch, bag = 200, 8, 64, 4
    target_rows = torch.from_numpy(np.random.default_rng(11).normal(size=(rows,)).astype(np.float32))

    def train(dtype):
        t = table("a", rows, dim, optimizer="adagrad", lr=0.01)
        if dtype != "fp32":
            t.update(dtype=dtype, stochastic_rounding=True)
        torch.manual_seed(0)
        ebc = st.EmbeddingBagCollection(config([t]))
        head = torch.nn.Linear(dim, 1)
        opt = torch.optim.SGD(head.parameters(), lr=0.05)
        rng = np.random.default_rng(5)
        losses = []
        for _ in range(300):
            keys = rng.integers(0, rows, size=batch * bag)
            out = ebc({"a": {"keys": torch.from_numpy(keys), "lengths": torch.full((batch,), bag)}})["a"]
            want = target_rows[torch.from_numpy(keys)].view(batch, bag).sum(1, keepdim=True)
            want = want + torch.from_numpy(rng.normal(scale=0.1, size=(batch, 1)).astype(np.float32))
            loss = torch.nn.functional.mse_loss(head(out.float()), want)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return float(np.mean(losses[-50:])), losses[0]

    fp32, start = train("fp32")
    bf16, _ = train("bf16")
    assert fp32 < 0.5 * start  # it learned
    print(f"loss: start {start:.4f}, fp32 {fp32:.4f}, bf16 {bf16:.4f}")
    assert abs(bf16 - fp32) <= 0.02 * fp32, (bf16, fp32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_worlds_half_size_shards_merge_as_their_dtype(dtype):
    """merge_state_dicts of half-size shards (test_reshard.py cuts them) gives whole tables of the
    same dtype, holding exactly the rows that were cut."""
    from test_reshard import SPECS, shard_dicts
    specs = [s for s in SPECS if s[1] in ("row", "column")]
    sds, whole = shard_dicts(3, specs)
    for sd in sds:
        for k in list(sd):
            if k.endswith(".weight") or k.endswith(".optimizer_state"):
                sd[k] = sd[k].to(dtype)
    merged = st.merge_state_dicts(sds)
    for name, _, _, _, opt in specs:
        w, s, _ = whole[name]
        assert merged[f"embedding_bags.{name}.weight"].dtype == dtype
        assert same_bits(merged[f"embedding_bags.{name}.weight"], torch.from_numpy(w).to(dtype)), name
        if opt != "sgd":
            assert same_bits(merged[f"embedding_bags.{name}.optimizer_state"], torch.from_numpy(s).to(dtype)), name


def test_a_checkpoint_of_another_dtype_loads_only_when_converting(tmp_path):
    half = config([half_table("a", 6, 4, "bf16", optimizer="adam", state_dtype="bf16")])
    wide = config([table("a", 6, 4, optimizer="adam")])
    s = strata.Store(half)
    s.submit(0, {"a": {"keys": np.array([1, 2, 5]), "lengths": np.array([3])}})
    s.forward(0)
    s.backward(0, [np.full((1, 4), 0.5, np.float32)])
    s.save(str(tmp_path))
    t = strata.Store(wide)
    before = t.read_rows("a")
    with pytest.raises(ValueError, match=r"table 'a': dtype bf16 in the checkpoint \(expected fp32 .*convert_dtypes"):
        t.load(str(tmp_path))
    assert all(np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(before, t.read_rows("a")))
    with pytest.raises(TypeError, match="convert_dtypes is a int"):
        t.load(str(tmp_path), convert_dtypes=1)
    t.load(str(tmp_path), convert_dtypes=True)  # widened: exact
    assert all(np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(s.read_rows("a"), t.read_rows("a")))
    assert t.step == 1
