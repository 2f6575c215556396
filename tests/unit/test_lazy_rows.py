"""optim.lazy_rows: AdamW on the rows a step touched, the missed steps caught up in closed form
(hvd_ctsm.train.lazy_rows), ends where AdamW proper ends, and reads no row it need not."""

import pytest
import torch

from hvd_ctsm.train import lazy_rows

ROWS, DIM = 12, 3


def sparse_gradient(rows: list[int], seed: int) -> torch.Tensor:
    """A sparse gradient naming `rows`, the first two twice (as gathered from two ranks)."""
    generator = torch.Generator().manual_seed(seed)
    index = torch.tensor(rows + rows[:2])
    values = torch.randn(len(index), DIM, generator=generator)
    return torch.sparse_coo_tensor(index[None], values, (ROWS, DIM), check_invariants=True)


def pair(weight_decay: float, start_step: float | None = None):
    """Two copies of one embedding table, each with its AdamW; `start_step`: both states begin
    there (zero moments), as deep into a run, where the bias corrections have settled."""
    torch.manual_seed(0)
    start = torch.randn(ROWS, DIM)
    modules = [torch.nn.Embedding.from_pretrained(start.clone(), freeze=False, sparse=True)
               for _ in range(2)]
    tables = [m.weight for m in modules]
    opts = [torch.optim.AdamW([t], lr=0.05, weight_decay=weight_decay, foreach=False)
            for t in tables]
    if start_step is not None:
        for table, opt in zip(tables, opts, strict=True):
            opt.state[table] = {"step": torch.tensor(start_step),
                                "exp_avg": torch.zeros_like(table),
                                "exp_avg_sq": torch.zeros_like(table)}
    return tables, opts, modules


def train(touched: list[list[int]], weight_decay: float, start_step=None, lr=None):
    """Both tables through the same sparse gradients: AdamW proper on the dense gradient,
    LazyRows on the rows; returns (lazy table, its optimizer, LazyRows, dense table, its)."""
    (lazy, dense), (lazy_opt, dense_opt), (module, _) = pair(weight_decay, start_step)
    rows = lazy_rows.LazyRows(lazy_opt, [module])
    for step, names in enumerate(touched):
        grad = sparse_gradient(names, seed=step)
        for group in (*lazy_opt.param_groups, *dense_opt.param_groups):
            group["lr"] = lr(step) if lr else 0.05
        dense.grad = grad.to_dense()
        dense_opt.step()
        lazy.grad = grad
        taken = lazy_rows.take_row_gradients([lazy])
        assert lazy.grad is None
        lazy_opt.step()  # the optimizer's own step skips a table without a gradient
        rows.step(taken)
    return lazy, lazy_opt, rows, dense, dense_opt, module


def assert_same_state(lazy, lazy_opt, dense, dense_opt, rtol, atol):
    torch.testing.assert_close(lazy.detach(), dense.detach(), rtol=rtol, atol=atol)
    for key in ("step", "exp_avg", "exp_avg_sq"):  # the same state, so checkpoints swap
        torch.testing.assert_close(lazy_opt.state[lazy][key], dense_opt.state[dense][key],
                                   rtol=rtol, atol=atol)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_rows_touched_every_step_move_exactly_as_under_adamw(weight_decay):
    every = [list(range(ROWS))] * 5
    lazy, lazy_opt, _, dense, dense_opt, _ = train(every, weight_decay, lr=lambda s: 0.05 / (s + 1))
    assert_same_state(lazy, lazy_opt, dense, dense_opt, rtol=1e-6, atol=1e-7)


def irregular(steps: int, seed: int = 0) -> list[list[int]]:
    """Rows 0-7 touched at random, a few a step; rows 8-10 at the first step and then only
    after more than WINDOW steps; row 11 never."""
    g = torch.Generator().manual_seed(seed)
    touched = [sorted(set(torch.randint(0, 8, (3,), generator=g).tolist()))
               for _ in range(steps)]
    touched[0] += [8, 9, 10]
    if steps > lazy_rows.WINDOW + 10:
        touched[lazy_rows.WINDOW + 10] += [9]
    return touched


def warmup(step: int) -> float:
    return 0.01 * min(1.0, (step + 1) / 10)


@pytest.mark.parametrize(("weight_decay", "start_step", "lr"), [
    (0.0, None, None), (0.1, None, None), (0.0, None, warmup), (0.5, None, warmup),
    (0.0, 1e4, None), (0.1, 1e4, warmup)])
def test_rows_caught_up_end_where_adamw_ends_them(weight_decay, start_step, lr):
    """From the first step or deep into a run, constant lr or warming up, with weight decay or
    without: the missed steps summed step by step (and by a series far out) are AdamW's own."""
    lazy, lazy_opt, rows, dense, dense_opt, _ = train(irregular(120), weight_decay, start_step, lr)
    before = lazy.detach().clone()
    rows.settle()
    assert not torch.equal(lazy.detach()[11], before[11]) or weight_decay == 0
    assert not torch.equal(lazy.detach()[8], before[8])  # touched at step 0 only: caught up
    assert_same_state(lazy, lazy_opt, dense, dense_opt, rtol=1e-5, atol=1e-5)  # 4e-6 measured


def test_dropping_the_missed_steps_as_lazy_adam_does_ends_elsewhere(monkeypatch):
    """Why the missed steps are caught up: without it (TensorFlow's LazyAdam) a row seen once
    moves by (1 - beta1) of what AdamW moves it."""
    monkeypatch.setattr(lazy_rows, "catch_up", lambda *args: None)
    lazy, _, rows, dense, _, _ = train(irregular(120), 0.0, lr=warmup)
    rows.settle()
    start = pair(0.0)[0][0].detach()
    assert (lazy - dense).norm() > 0.1 * (dense - start).norm()


def test_a_lookup_reads_the_rows_adamw_proper_holds_at_that_step():
    """A row read again after missing steps is caught up by its lookup, before the forward
    uses it: what the step reads is what AdamW proper would have there."""
    lazy, _, _, dense, _, module = train(irregular(120), 0.1, lr=warmup)
    read = module(torch.tensor([[8, 3], [10, 8]]))
    torch.testing.assert_close(read, dense.detach()[torch.tensor([[8, 3], [10, 8]])],
                               rtol=1e-5, atol=1e-5)
    assert not torch.allclose(lazy.detach()[11], dense.detach()[11])  # not read: still behind


def test_rows_a_step_does_not_touch_are_not_read_or_written_until_settled():
    lazy, lazy_opt, rows, _, _, _ = train(irregular(6), 0.1, start_step=100.0)
    before = lazy.detach().clone()
    moments = lazy_opt.state[lazy]["exp_avg"].clone()
    lazy.grad = sparse_gradient([2, 5], seed=99)
    taken = lazy_rows.take_row_gradients([lazy])
    lazy_opt.step()
    rows.step(taken)
    untouched = [r for r in range(ROWS) if r not in (2, 5)]
    assert torch.equal(lazy.detach()[untouched], before[untouched])
    assert torch.equal(lazy_opt.state[lazy]["exp_avg"][untouched], moments[untouched])
    assert not torch.equal(lazy.detach()[[2, 5]], before[[2, 5]])
    assert float(lazy_opt.state[lazy]["step"]) == 107  # the bias corrections count every step


def test_a_state_loaded_anew_starts_with_every_row_up_to_date():
    """A checkpoint is written settled: after loading one, no row is caught up a second time
    for the steps before it."""
    lazy, lazy_opt, rows, _, _, _ = train(irregular(8), 0.0, start_step=100.0)
    rows.settle()
    saved = lazy_opt.state_dict()
    settled = lazy.detach().clone()
    lazy_opt.load_state_dict(saved)  # new state tensors, as a resume or an elastic reset
    rows.settle()
    assert torch.equal(lazy.detach(), settled)


def test_repeated_rows_are_summed_once_each():
    table = torch.nn.Parameter(torch.zeros(5, 2))
    table.grad = torch.sparse_coo_tensor(torch.tensor([[1, 3, 1]]),
                                         torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]),
                                         (5, 2), check_invariants=True)
    index, values = lazy_rows.take_row_gradients([table])[table]
    assert index.tolist() == [1, 3]
    assert values.tolist() == [[6.0, 8.0], [3.0, 4.0]]


@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clipping_with_row_gradients_equals_torch_on_the_dense_gradient(max_norm):
    torch.manual_seed(1)
    weight = torch.nn.Parameter(torch.randn(4, 4))
    weight.grad = torch.randn(4, 4)
    grad = sparse_gradient([0, 2, 5], seed=3)
    params = [torch.nn.Parameter(torch.zeros(4, 4)), torch.nn.Parameter(torch.zeros(ROWS, DIM))]
    for p, g in zip(params, [weight.grad.clone(), grad.to_dense()], strict=True):
        p.grad = g
    expected = torch.nn.utils.clip_grad_norm_(params, max_norm)
    table = torch.nn.Parameter(torch.zeros(ROWS, DIM))
    table.grad = grad
    rows = lazy_rows.take_row_gradients([table])
    norm = lazy_rows.clip_grad_norm_([weight, table], list(rows.values()), max_norm)
    torch.testing.assert_close(norm, expected)
    torch.testing.assert_close(weight.grad, params[0].grad)
    index, values = rows[table]
    torch.testing.assert_close(values, params[1].grad[index])


def history_of(steps: int, group: dict) -> lazy_rows.StepHistory:
    """A StepHistory of `steps` steps from 0, lr warming up over the first 50."""
    history = lazy_rows.StepHistory(0, torch.device("cpu"), group)
    for step in range(1, steps + 1):
        group["lr"] = 0.002 * min(1.0, step / 50)
        history.record(step, group)
    return history


def test_a_rows_catch_up_has_the_same_bits_whatever_rows_share_its_call():
    """Under np=2 a row one rank reads is caught up there by its lookup, among that rank's rows,
    and on the other rank by the optimizer step, among other rows: both must hold the same bits
    after, or the ranks drift apart (a 10^6-item run under torchrun ended 'ranks in sync: False'
    after 40 steps, when torch.exp and pow gave a row another last bit in a tensor's tail)."""
    group = {"lr": 0.002, "betas": (0.9, 0.98), "eps": 1e-8, "weight_decay": 0.01}
    history = history_of(200, group)
    g = torch.Generator().manual_seed(0)
    n = 3000
    start = (torch.randn(n, 64, generator=g), torch.randn(n, 64, generator=g) * 1e-3,
             torch.rand(n, 64, generator=g) * 1e-6)
    last = torch.randint(0, 201, (n,), generator=g)  # recent, a window ago, far, up to date

    def caught_up(index):
        rows = [t[index].clone() for t in start]
        lazy_rows.catch_up(*rows, last[index], 200, history, group)
        return rows

    every = caught_up(torch.arange(n))
    for trial in range(100):
        index = torch.randperm(n, generator=g)[:int(torch.randint(1, 300, (1,), generator=g))]
        for name, alone, among_all in zip(("param", "exp_avg", "exp_avg_sq"), caught_up(index),
                                          every, strict=True):
            assert torch.equal(alone, among_all[index]), (trial, name)


def test_exact_exp_is_exp_to_the_last_bit_or_two():
    x = torch.cat([torch.linspace(-745.0, 0.0, 100_001, dtype=torch.float64),
                   torch.linspace(0.0, 5.0, 10_001, dtype=torch.float64)])
    expected = torch.exp(x)
    got = lazy_rows.exact_exp(x)
    normal = expected > 1e-300  # below, exact_exp keeps the smallest normal number's scale
    torch.testing.assert_close(got[normal], expected[normal], rtol=4e-16, atol=0.0)
    assert bool((got[~normal] <= 1e-300).all()) and bool((got >= 0).all())
