"""optim.lazy_rows: AdamW on the rows a step touched (hvd_ctsm.train.lazy_rows) is AdamW itself
on those rows, and leaves every other row and its moments as they were."""

import pytest
import torch

from hvd_ctsm.train import lazy_rows


def sparse_gradient(rows: list[int], num_rows: int, dim: int, seed: int) -> torch.Tensor:
    """A sparse gradient naming `rows`, some twice (as gathered from two ranks)."""
    generator = torch.Generator().manual_seed(seed)
    index = torch.tensor(rows + rows[:2])
    values = torch.randn(len(index), dim, generator=generator)
    return torch.sparse_coo_tensor(index[None], values, (num_rows, dim))


def optimizers(weight_decay: float):
    torch.manual_seed(0)
    start = torch.randn(6, 3)
    tables = [torch.nn.Parameter(start.clone()) for _ in range(2)]
    opts = [torch.optim.AdamW([t], lr=0.05, weight_decay=weight_decay, foreach=False)
            for t in tables]
    return tables, opts


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_rows_touched_every_step_move_exactly_as_under_adamw(weight_decay):
    (lazy, dense), (lazy_opt, dense_opt) = optimizers(weight_decay)
    for step in range(5):
        grad = sparse_gradient(list(range(6)), 6, 3, seed=step)
        dense.grad = grad.to_dense()
        lazy.grad = grad
        for group in (*lazy_opt.param_groups, *dense_opt.param_groups):
            group["lr"] = 0.05 / (step + 1)  # a schedule changes lr between steps
        dense_opt.step()
        rows = lazy_rows.take_row_gradients([lazy])
        assert lazy.grad is None
        lazy_opt.step()  # the optimizer's own step skips a table without a gradient
        lazy_rows.step_rows(lazy_opt, lazy, rows[lazy])
    torch.testing.assert_close(lazy.detach(), dense.detach(), rtol=1e-6, atol=1e-7)
    for key in ("step", "exp_avg", "exp_avg_sq"):  # the same state, so checkpoints swap
        torch.testing.assert_close(lazy_opt.state[lazy][key], dense_opt.state[dense][key])


def test_untouched_rows_and_their_moments_stay_as_they_were():
    (lazy, dense), (lazy_opt, dense_opt) = optimizers(weight_decay=0.1)
    for step, rows in enumerate([[0, 1, 2], [3], [3, 4]]):
        grad = sparse_gradient(rows, 6, 3, seed=step)
        before = lazy.detach().clone()
        moments = lazy_opt.state[lazy]["exp_avg"].clone() if lazy_opt.state[lazy] else None
        lazy.grad = grad
        lazy_rows.step_rows(lazy_opt, lazy, lazy_rows.take_row_gradients([lazy])[lazy])
        untouched = [r for r in range(6) if r not in rows]
        assert torch.equal(lazy.detach()[untouched], before[untouched])
        if moments is not None:
            assert torch.equal(lazy_opt.state[lazy]["exp_avg"][untouched], moments[untouched])
        assert not torch.equal(lazy.detach()[rows], before[rows])
        dense.grad = grad.to_dense()
        dense_opt.step()
    # AdamW proper kept moving rows 0-2 by their momentum after step 1; the lazy one did not
    assert not torch.allclose(lazy.detach()[:3], dense.detach()[:3])
    assert float(lazy_opt.state[lazy]["step"]) == 3  # the bias corrections count every step


def test_repeated_rows_are_summed_once_each():
    table = torch.nn.Parameter(torch.zeros(5, 2))
    table.grad = torch.sparse_coo_tensor(torch.tensor([[1, 3, 1]]),
                                         torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]),
                                         (5, 2))
    index, values = lazy_rows.take_row_gradients([table])[table]
    assert index.tolist() == [1, 3]
    assert values.tolist() == [[6.0, 8.0], [3.0, 4.0]]


@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clipping_with_row_gradients_equals_torch_on_the_dense_gradient(max_norm):
    torch.manual_seed(1)
    weight = torch.nn.Parameter(torch.randn(4, 4))
    weight.grad = torch.randn(4, 4)
    grad = sparse_gradient([0, 2, 5], 8, 4, seed=3)
    reference = [weight.grad.clone(), grad.to_dense()]
    params = [torch.nn.Parameter(torch.zeros(4, 4)), torch.nn.Parameter(torch.zeros(8, 4))]
    for p, g in zip(params, reference, strict=True):
        p.grad = g
    expected = torch.nn.utils.clip_grad_norm_(params, max_norm)
    table = torch.nn.Parameter(torch.zeros(8, 4))
    table.grad = grad
    rows = lazy_rows.take_row_gradients([table])
    norm = lazy_rows.clip_grad_norm_([weight, table], list(rows.values()), max_norm)
    torch.testing.assert_close(norm, expected)
    torch.testing.assert_close(weight.grad, params[0].grad)
    index, values = rows[table]
    torch.testing.assert_close(values, params[1].grad[index])
