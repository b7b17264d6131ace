"""torch.ops.kreg: eager, torch.compile(fullgraph=True, dynamic=False) and torch.export
against torch.topk and per-group torch.mm loops on random and adversarial
inputs; gradients against float64 references and finite differences; a
small MoE layer that trains; errors; calls from several threads.

Runs where PyTorch is importable (the build's venv, build/venv), skipped
elsewhere."""

import math
import threading

import pytest

torch = pytest.importorskip("torch")
import kreg  # noqa: E402
import kreg.torch as kt  # noqa: E402

GEN = torch.Generator().manual_seed(7)
# Every shape below compiles once (dynamic=False): more than Dynamo's
# default of 8 recompilations per function.
torch._dynamo.config.recompile_limit = 64


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN).to(dtype)


def sizes(*s):
    return torch.tensor(s, dtype=torch.int32)


# ---- references -------------------------------------------------------------------


def topk_reference(x, k, largest=True):
    """Indices as kreg defines them: NaN (either sign) above +inf, -0 equal
    to +0, ties by ascending index."""
    def order(row):
        def key(j):
            v = row[j]
            nan = v != v
            return (not nan, 0.0 if nan else -v, j) if largest else (nan, 0.0 if nan else v, j)
        return sorted(range(len(row)), key=key)[:k]
    return torch.tensor([order(x[r].float().tolist()) for r in range(x.shape[0])],
                        dtype=torch.int32).reshape(x.shape[0], k)


def bits(t):
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def group_bounds(group_sizes):
    ends = torch.cumsum(group_sizes.long(), 0)
    return [(int(e - s), int(e)) for s, e in zip(group_sizes.long(), ends)]


def gmm_reference(lhs, rhs, group_sizes, transpose_rhs=False, group_offset=0, existing_out=None):
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    out = torch.zeros(lhs.shape[0], n, dtype=torch.float64)
    for g, (a, b) in enumerate(group_bounds(group_sizes)):
        i = g - group_offset
        if 0 <= i < rhs.shape[0]:
            w = rhs[i].double()
            out[a:b] = lhs[a:b].double() @ (w.t() if transpose_rhs else w)
    return out if existing_out is None else out + existing_out.double()


def tgmm_reference(lhs, rhs, group_sizes, group_offset=0, local_groups=None):
    local_groups = group_sizes.shape[0] if local_groups is None else local_groups
    out = torch.zeros(local_groups, lhs.shape[0], rhs.shape[1], dtype=torch.float64)
    for g, (a, b) in enumerate(group_bounds(group_sizes)):
        i = g - group_offset
        if 0 <= i < local_groups:
            out[i] = lhs[:, a:b].double() @ rhs[a:b].double()
    return out


def close(got, want, dtype=torch.float32, reduction=1):
    """atol * reduction + rtol * |want|: a bound on the size of these tests'
    normal inputs (the op's own check, plugins/gmm/op.cc, scales with the
    terms' magnitudes instead)."""
    atol, rtol = (1e-5, 1e-5) if dtype == torch.float32 else (1e-2, 1.0 / 128)
    got, want = got.double(), want.double()
    both_nan = torch.isnan(got) & torch.isnan(want)
    ok = both_nan | (got == want) | ((got - want).abs() <= atol * max(reduction, 1) + rtol * want.abs())
    assert bool(ok.all()), f"max error {(got - want).abs()[~ok].max()}"


# ---- top-k ------------------------------------------------------------------------


def check_topk(x, k, largest, values, indices):
    assert values.dtype == x.dtype and indices.dtype == torch.int32
    assert torch.equal(indices, topk_reference(x, k, largest))
    assert torch.equal(bits(values), bits(x.gather(1, indices.long())))  # bit for bit


ADVERSARIAL = [
    torch.tensor([[float("nan"), 1.0, float("inf"), -float("nan"), 0.0, -0.0, -float("inf"), 1.0]]),
    torch.zeros(3, 50),                                  # all equal: ties by index
    torch.tensor([[-0.0, 0.0] * 20]),                    # -0 equals +0
    torch.full((2, 33), float("inf")),
    torch.full((2, 9), float("nan")),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_eager_and_compiled_match_the_reference(dtype, largest):
    compiled = torch.compile(lambda x, k: torch.ops.kreg.topk(x, k, largest), fullgraph=True, dynamic=False)
    cases = [(randn(5, 300, dtype=dtype), 17), (randn(1, 1024, dtype=dtype), 8), (randn(3, 7, dtype=dtype), 7),
             (randn(0, 16, dtype=dtype), 4), (randn(2, 5, dtype=dtype), 0)]
    cases += [(x.to(dtype), 5) for x in ADVERSARIAL]
    for x, k in cases:
        for values, indices in (kt.topk(x, k, largest), compiled(x, k)):
            check_topk(x, k, largest, values, indices)
    x = randn(16, 4096)
    tv, ti = torch.topk(x, 64, largest=largest)
    values, indices = compiled(x, 64)
    assert torch.equal(values, tv) and torch.equal(indices.long(), ti)  # distinct values: one answer


def test_topk_row_ranges_pad_short_rows():
    x = randn(3, 40)
    starts, ends = sizes(0, 10, 38), sizes(40, 13, 40)
    values, indices = kt.topk(x, 5, True, starts, ends)
    for r in range(3):
        a, b = int(starts[r]), int(ends[r])
        want = topk_reference(x[r:r + 1, a:b], min(5, b - a))[0] + a
        assert torch.equal(indices[r, :want.numel()], want)
        assert torch.equal(values[r, :want.numel()], x[r, want.long()])
        assert bool((indices[r, want.numel():] == -1).all())
        assert bool((values[r, want.numel():] == -math.inf).all())


def test_topk_gradient_scatters_to_the_chosen_indices():
    x = randn(4, 50, dtype=torch.float32).requires_grad_()
    values, indices = kt.topk(x, 6)
    weights = randn(4, 6)
    (values * weights).sum().backward()
    want = torch.zeros(4, 50).scatter_(1, indices.long(), weights)
    assert torch.equal(x.grad, want)
    # Padding (-1, past a short range) sends its gradient nowhere.
    x = randn(2, 12).requires_grad_()
    values, indices = kt.topk(x, 4, True, sizes(0, 9), sizes(12, 12))
    values.backward(torch.ones(2, 4))
    assert x.grad.sum().item() == 7 and torch.equal(x.grad[1, 9:], torch.ones(3))
    # Finite differences agree (float32, eps 1e-3; ties would not).
    x = randn(2, 12).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: kt.topk(x, 4, True, sizes(0, 2), sizes(12, 12))[0], (x,),
                                    eps=1e-3, atol=1e-3, rtol=1e-3)


# ---- gmm and tgmm -------------------------------------------------------------------


PARTITIONS = [
    sizes(10, 0, 50, 30),            # an empty group, 10 rows past the groups (m=100)
    sizes(0, 0, 0, 0),               # nothing grouped: all rows past
    sizes(33, 67),                   # not dividing tiles
    sizes(100),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_gmm_eager_and_compiled_match_a_per_group_loop(dtype, transpose_rhs):
    compiled = torch.compile(lambda *a, **kw: kt.gmm(*a, **kw), fullgraph=True, dynamic=False)
    m, k, n = 100, 24, 40
    lhs = randn(m, k, dtype=dtype)
    for group_sizes in PARTITIONS:
        groups = group_sizes.shape[0]
        rhs = randn(groups, n, k, dtype=dtype) if transpose_rhs else randn(groups, k, n, dtype=dtype)
        want = gmm_reference(lhs, rhs, group_sizes, transpose_rhs)
        for f in (kt.gmm, compiled):
            out = f(lhs, rhs, group_sizes, transpose_rhs=transpose_rhs)
            assert out.dtype == dtype and out.shape == (m, n)
            close(out, want, dtype, k)
        # Out in f32 from bf16 inputs, existing_out, and a shard of groups.
        existing = randn(m, n)
        out = kt.gmm(lhs, rhs[1:], group_sizes, transpose_rhs=transpose_rhs, group_offset=1, existing_out=existing,
                     out_dtype=torch.float32)
        close(out, gmm_reference(lhs, rhs[1:], group_sizes, transpose_rhs, 1, existing), dtype, k)


def test_gmm_propagates_nan_and_inf_like_a_matmul():
    lhs, rhs, group_sizes = randn(20, 8), randn(2, 8, 6), sizes(12, 8)
    lhs[3, 2] = float("nan")
    lhs[15, 0] = float("inf")
    close(kt.gmm(lhs, rhs, group_sizes), gmm_reference(lhs, rhs, group_sizes), torch.float32, 8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tgmm_eager_and_compiled_match_a_per_group_loop(dtype):
    compiled = torch.compile(lambda *a, **kw: kt.tgmm(*a, **kw), fullgraph=True, dynamic=False)
    k, m, n = 24, 100, 40
    lhs, rhs = randn(k, m, dtype=dtype), randn(m, n, dtype=dtype)
    for group_sizes in PARTITIONS:
        want = tgmm_reference(lhs, rhs, group_sizes)
        for f in (kt.tgmm, compiled):
            out = f(lhs, rhs, group_sizes)
            assert out.shape == (group_sizes.shape[0], k, n)
            close(out, want, dtype, m)
    group_sizes = sizes(10, 0, 50, 30)
    close(kt.tgmm(lhs, rhs, group_sizes, group_offset=1, local_groups=2),
          tgmm_reference(lhs, rhs, group_sizes, 1, 2), dtype, m)


def gmm_grads(f, lhs, rhs, existing, weights, **kw):
    lhs, rhs, existing = (t.detach().clone().requires_grad_() for t in (lhs, rhs, existing))
    (f(lhs, rhs, existing_out=existing, **kw) * weights).sum().backward()
    return lhs.grad, rhs.grad, existing.grad


@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_gmm_gradients_match_a_float64_reference(transpose_rhs):
    m, k, n, group_sizes = 70, 12, 9, sizes(20, 0, 30, 15)  # an empty group, 5 rows past
    lhs = randn(m, k)
    rhs = randn(3, n, k) if transpose_rhs else randn(3, k, n)
    existing, weights = randn(m, n), randn(m, n)
    got = gmm_grads(lambda l, r, existing_out: kt.gmm(l, r, group_sizes, transpose_rhs=transpose_rhs, group_offset=1,
                                                      existing_out=existing_out), lhs, rhs, existing, weights)

    def ref(l, r, existing_out):
        return gmm_reference(l, r, group_sizes, transpose_rhs, 1) + existing_out

    want = gmm_grads(ref, lhs.double(), rhs.double(), existing.double(), weights.double())
    for g, w in zip(got, want):
        close(g, w, torch.float32, max(m, n))


def test_gmm_gradients_of_bf16_inputs_with_a_float32_out():
    """d(out) is float32, the operands bf16: each gradient is reduced in
    float32 and rounded once to its operand's dtype."""
    group_sizes = sizes(30, 0, 34)
    lhs, rhs, weights = randn(64, 16, dtype=torch.bfloat16), randn(3, 16, 8, dtype=torch.bfloat16), randn(64, 8)
    got = gmm_grads(lambda l, r, existing_out: kt.gmm(l, r, group_sizes, out_dtype=torch.float32) + existing_out,
                    lhs, rhs, randn(64, 8), weights)
    want = gmm_grads(lambda l, r, existing_out: gmm_reference(l, r, group_sizes) + existing_out,
                     lhs.double(), rhs.double(), randn(64, 8).double(), weights.double())
    assert got[0].dtype == got[1].dtype == torch.bfloat16
    for g, w in zip(got[:2], want[:2]):
        close(g, w, torch.bfloat16, 64)


def test_tgmm_gradients_match_a_float64_reference():
    k, m, n, group_sizes = 11, 60, 7, sizes(25, 0, 30)  # an empty group, 5 rows past
    lhs, rhs, weights = randn(k, m), randn(m, n), randn(3, k, n)

    def grads(f, lhs, rhs):
        lhs, rhs = lhs.detach().clone().requires_grad_(), rhs.detach().clone().requires_grad_()
        (f(lhs, rhs) * weights.to(lhs.dtype)).sum().backward()
        return lhs.grad, rhs.grad

    got = grads(lambda l, r: kt.tgmm(l, r, group_sizes), lhs, rhs)
    want = grads(lambda l, r: tgmm_reference(l, r, group_sizes), lhs.double(), rhs.double())
    for g, w in zip(got, want):
        close(g, w, torch.float32, max(k, n) * 3)


def test_gradcheck_against_finite_differences():
    """kreg has no float64 kernel: float32 against central differences,
    eps 1e-2, within 1e-2 absolute and relative."""
    group_sizes = sizes(3, 0, 4)
    lhs = randn(8, 5).requires_grad_()
    rhs = randn(3, 5, 4).requires_grad_()
    tol = dict(eps=1e-2, atol=1e-2, rtol=1e-2)
    assert torch.autograd.gradcheck(lambda l, r: kt.gmm(l, r, group_sizes), (lhs, rhs), **tol)
    assert torch.autograd.gradcheck(lambda l, r: kt.gmm(l, r.transpose(1, 2).contiguous(), group_sizes,
                                                        transpose_rhs=True), (lhs, rhs), **tol)
    lhs_t, rhs_t = randn(4, 8).requires_grad_(), randn(8, 3).requires_grad_()
    assert torch.autograd.gradcheck(lambda l, r: kt.tgmm(l, r, group_sizes), (lhs_t, rhs_t), **tol)


def test_compiled_gradients_equal_eager_ones():
    """AOTAutograd traces the C++ autograd kernels: a compiled forward and
    backward through all three ops gives eager's loss and gradients."""
    group_sizes = sizes(10, 0, 25)

    def loss(lhs, rhs, x):
        values, _ = kt.topk(x, 3)
        return (kt.gmm(lhs, rhs, group_sizes) ** 2).sum() + kt.tgmm(lhs.t().contiguous(), lhs, group_sizes).sum() \
            + values.sum()

    args = [randn(40, 8).requires_grad_(), randn(3, 8, 5).requires_grad_(), randn(4, 30).requires_grad_()]
    eager = loss(*args)
    compiled = torch.compile(loss, fullgraph=True, dynamic=False)(*args)
    assert torch.equal(compiled.detach(), eager.detach())
    for got, want in zip(torch.autograd.grad(compiled, args), torch.autograd.grad(eager, args)):
        assert torch.equal(got, want)


class MoE(torch.nn.Module):
    """Top-2 routing over 4 experts, each a two-layer MLP, as one gmm per
    layer over the tokens sorted by expert."""

    def __init__(self, d=16, hidden=32, experts=4, k=2):
        super().__init__()
        self.k, self.experts = k, experts
        self.router = torch.nn.Linear(d, experts)
        self.w1 = torch.nn.Parameter(torch.randn(experts, d, hidden, generator=GEN) / math.sqrt(d))
        self.w2 = torch.nn.Parameter(torch.randn(experts, hidden, d, generator=GEN) / math.sqrt(hidden))

    def forward(self, x):
        scores, chosen = kt.topk(self.router(x), self.k)
        weights = torch.softmax(scores, dim=-1)
        expert = chosen.long().flatten()
        order = torch.argsort(expert, stable=True)
        tokens = order // self.k
        group_sizes = torch.bincount(expert, minlength=self.experts).int()
        h = torch.relu(kt.gmm(x[tokens], self.w1, group_sizes))
        y = kt.gmm(h, self.w2, group_sizes) * weights.flatten()[order, None]
        return torch.zeros_like(x).index_add(0, tokens, y)


def test_a_moe_layer_trains():
    torch.manual_seed(0)
    model = MoE()
    x, target = randn(64, 16), randn(64, 16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        losses.append(loss.item())
        optimizer.step()
    assert model.w1.grad is not None and model.router.weight.grad is not None
    assert losses[-1] < 0.8 * losses[0], losses


def test_export_of_a_module_that_uses_the_ops():
    class Layer(torch.nn.Module):
        def forward(self, x, rhs, group_sizes):
            values, indices = torch.ops.kreg.topk(x, 4)
            return torch.ops.kreg.gmm(x, rhs, group_sizes), values, indices

    x, rhs, group_sizes = randn(12, 8), randn(2, 8, 5), sizes(5, 7)
    program = torch.export.export(Layer(), (x, rhs, group_sizes))
    assert "kreg.gmm" in str(program.graph) and "kreg.topk" in str(program.graph)
    for got, want in zip(program.module()(x, rhs, group_sizes), Layer()(x, rhs, group_sizes)):
        assert torch.equal(got, want)


# ---- errors, threads ----------------------------------------------------------------


def test_bad_arguments_raise_kregs_messages():
    with pytest.raises(ValueError, match="float64"):
        kt.topk(randn(2, 8).double(), 3)
    with pytest.raises(ValueError, match="k=9 exceeds the row length n=8"):
        kt.topk(randn(2, 8), 9)
    with pytest.raises(ValueError, match=r"group_sizes\[1\]=-2 is negative"):
        kt.gmm(randn(10, 4), randn(2, 4, 3), sizes(4, -2))
    with pytest.raises(ValueError, match="dtype|bf16|f32"):
        kt.gmm(randn(10, 4), randn(2, 4, 3, dtype=torch.bfloat16), sizes(5, 5))


def test_concurrent_calls_from_threads_agree():
    x, lhs, rhs, group_sizes = randn(32, 2000), randn(300, 32), randn(4, 32, 48), sizes(50, 100, 0, 150)
    want_topk, want_gmm = kt.topk(x, 16), kt.gmm(lhs, rhs, group_sizes)
    failures = []

    def work():
        for _ in range(20):
            v, i = kt.topk(x, 16)
            out = kt.gmm(lhs, rhs, group_sizes)
            if not (torch.equal(v, want_topk[0]) and torch.equal(i, want_topk[1]) and torch.equal(out, want_gmm)):
                failures.append(1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


@pytest.mark.parametrize("op", ["gmm", "tgmm"])
def test_grouped_matmuls_are_identical_across_thread_counts(op):
    """Each output element is reduced in one fixed order by one task, so no
    CPU variant's result depends on the thread count (DESIGN.md)."""
    registry = kreg.Registry()
    group_sizes = sizes(700, 0, 37, 900, 411)
    if op == "gmm":
        args = dict(lhs=randn(2048, 256).numpy(), rhs=randn(5, 256, 300).numpy(), group_sizes=group_sizes.numpy())
    else:
        args = dict(lhs=randn(256, 2048).numpy(), rhs=randn(2048, 300).numpy(), group_sizes=group_sizes.numpy())
    kernels = [k.name for k in registry.kernels(op) if k.available]
    assert any(name.endswith("/tiled") for name in kernels)
    for name in kernels:
        outs = [registry.run(name, threads=t, **args)["out"] for t in (1, 2, 3)]
        assert all((o == outs[0]).all() for o in outs[1:]), name
