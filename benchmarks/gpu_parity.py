"""The GPU check's parity part: the catalog-scale code, whose unit tests run on a CPU, gives the
same answers on the GPU (benchmarks/gpu.py, `--parts parity`). Each check is the property a
unit test asserts, at a size where the GPU's kernels differ from a toy's, and reports its
largest difference beside pass or fail:

- exact_exp: to the last bit or two of exp, and the CPU's bits on the device (lazy rows bring
  a row up to date with it; tests/unit/test_lazy_rows.py).
- catch_up: a row's catch-up has the same bits whatever rows share its call (else two ranks
  that catch a row up in different company drift apart).
- lazy_rows: AdamW on the rows a step touched, the missed steps caught up, ends where AdamW
  proper over dense gradients ends.
- blocked_loss: candidate_cross_entropy (rows in blocks, excluded pairs) equals the dense
  masked cross-entropy, value and gradients, at 4,096 rows x 100,000 candidates.
- chunked_topk: top-10 by item chunks with sparse exclusions equals the dense top-10.
"""

from __future__ import annotations

import time

import torch

from hvd_ctsm.model import catalog
from hvd_ctsm.train import lazy_rows

GROUP = {"lr": 0.002, "betas": (0.9, 0.98), "eps": 1e-8, "weight_decay": 0.01}


def exact_exp(device) -> dict:
    x = torch.cat([torch.linspace(-745.0, 0.0, 1_000_001, dtype=torch.float64),
                   torch.linspace(0.0, 5.0, 100_001, dtype=torch.float64)])
    on_cpu, here = lazy_rows.exact_exp(x), lazy_rows.exact_exp(x.to(device)).cpu()
    normal = on_cpu > 1e-300  # below, exact_exp keeps the smallest normal number's scale
    relative = ((here[normal] - torch.exp(x[normal])) / torch.exp(x[normal])).abs().max()
    return {"ok": bool(relative <= 4e-16), "max_relative_error": float(relative),
            "cpu_bits_differ": int((here != on_cpu).sum())}


def history_of(steps: int, device) -> lazy_rows.StepHistory:
    """As the unit test's: lr warming up over the first 50 steps."""
    group = dict(GROUP)
    history = lazy_rows.StepHistory(0, device, group)
    for step in range(1, steps + 1):
        group["lr"] = 0.002 * min(1.0, step / 50)
        history.record(step, group)
    return history


def catch_up(device, rows: int = 100_000, trials: int = 50) -> dict:
    history = history_of(200, device)
    g = torch.Generator().manual_seed(0)
    start = [t.to(device) for t in (torch.randn(rows, 64, generator=g),
                                    torch.randn(rows, 64, generator=g) * 1e-3,
                                    torch.rand(rows, 64, generator=g) * 1e-6)]
    last = torch.randint(0, 201, (rows,), generator=g).to(device)

    def caught_up(index):
        copies = [t[index].clone() for t in start]
        lazy_rows.catch_up(*copies, last[index], 200, history, GROUP)
        return copies

    every, differing = caught_up(torch.arange(rows, device=device)), 0
    for _ in range(trials):
        size = int(torch.randint(1, 5000, (1,), generator=g))
        index = torch.randperm(rows, generator=g)[:size].to(device)
        differing += sum(int((alone != among[index]).sum())
                         for alone, among in zip(caught_up(index), every, strict=True))
    return {"ok": differing == 0, "rows": rows, "trials": trials, "differing_values": differing}


def lazy_rows_parity(device, rows: int = 50_000, dim: int = 64, steps: int = 120) -> dict:
    """One table two ways through the same sparse gradients (a few hundred rows a step, some
    rows touched once, some never): AdamW proper on the dense gradient, LazyRows on the rows."""
    g = torch.Generator().manual_seed(1)
    start = torch.randn(rows, dim, generator=g).to(device)
    modules = [torch.nn.Embedding.from_pretrained(start.clone(), freeze=False, sparse=True)
               for _ in range(2)]
    (lazy, dense) = (m.weight for m in modules)
    opts = [torch.optim.AdamW([t], lr=0.002, weight_decay=0.01, foreach=False)
            for t in (lazy, dense)]
    rows_of = lazy_rows.LazyRows(opts[0], modules[:1])
    for step in range(steps):
        touched = torch.randint(0, rows // 2, (400,), generator=g)  # rows // 2 on: never
        values = torch.randn(len(touched), dim, generator=g)
        grad = torch.sparse_coo_tensor(touched[None], values, (rows, dim),
                                       check_invariants=True).to(device)
        for opt in opts:
            opt.param_groups[0]["lr"] = 0.002 * min(1.0, (step + 1) / 50)
        dense.grad = grad.to_dense()
        opts[1].step()
        modules[0](touched.to(device))  # the lookup brings its rows up to date first
        lazy.grad = grad
        taken = lazy_rows.take_row_gradients([lazy])
        opts[0].step()
        rows_of.step(taken)
    rows_of.settle()
    pairs = [(lazy, dense)] + [(opts[0].state[lazy][k], opts[1].state[dense][k])
                               for k in ("exp_avg", "exp_avg_sq")]
    worst = max(float((a - b).detach().abs().max()) for a, b in pairs)
    ok = all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in pairs)  # the unit test's
    return {"ok": ok, "rows": rows, "steps": steps, "max_abs_difference": worst}


def blocked_loss(device, num_rows: int = 4096, candidates: int = 100_000, dim: int = 64) -> dict:
    g = torch.Generator().manual_seed(5)

    def leaf(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device).requires_grad_()

    states, vectors, shift = leaf(num_rows, dim), leaf(candidates, dim, scale=0.1), leaf(candidates)
    target = torch.randint(0, candidates, (num_rows,), generator=g).to(device)
    rows = torch.randint(0, num_rows, (200_000,), generator=g).to(device)
    columns = torch.randint(0, candidates, (200_000,), generator=g).to(device)
    keep = columns != target[rows]  # the target's own column is never excluded
    rows, columns = rows[keep], columns[keep]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    got = catalog.candidate_cross_entropy(states, vectors, shift, target, rows, columns)
    got_grads = torch.autograd.grad(got, (states, vectors, shift))
    sync()
    blocked_s = time.perf_counter() - t0
    logits = (states @ vectors.T + shift).index_put((rows, columns),
                                                    torch.tensor(float("-inf"), device=device))
    want = torch.nn.functional.cross_entropy(logits, target)
    want_grads = torch.autograd.grad(want, (states, vectors, shift))
    pairs = [(got, want), *zip(got_grads, want_grads, strict=True)]
    worst = max(float((a - b).detach().abs().max()) for a, b in pairs)
    ok = all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in pairs)
    return {"ok": ok, "rows": num_rows, "candidates": candidates, "loss": float(got.detach()),
            "max_abs_difference": worst, "blocked_s": round(blocked_s, 4)}


def chunked_topk(device, num_rows: int = 512, num_items: int = 200_000, k: int = 10) -> dict:
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(num_rows, num_items, generator=g).to(device)
    seen = [torch.randint(0, num_items, (int(n),), generator=g).tolist()
            for n in torch.randint(0, 300, (num_rows,), generator=g)]
    excluded = catalog.ItemPairs.from_lists(seen, num_items)
    values, indices = catalog.chunked_topk(lambda lo, hi: scores[:, lo:hi], num_rows,
                                           num_items, k, excluded)
    dense = scores.masked_fill(excluded.dense(num_rows).to(device), float("-inf"))
    dense[:, 0] = float("-inf")
    expected = dense.topk(k, dim=1)
    return {"ok": torch.equal(indices, expected.indices)
            and torch.equal(values, expected.values), "rows": num_rows, "items": num_items}


CHECKS = {"exact_exp": exact_exp, "catch_up": catch_up, "lazy_rows": lazy_rows_parity,
          "blocked_loss": blocked_loss, "chunked_topk": chunked_topk}


def run(device, add) -> None:
    """Each check in turn, `add`ing {"check", "device", "ok", ..., "s"}; one that raises is
    recorded as failed with its error, and the others still run."""
    for name, check in CHECKS.items():
        t0 = time.perf_counter()
        try:
            row = check(device)
        except Exception as exc:  # noqa: BLE001 - the check's failure is its result
            row = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
        add({"check": name, "device": device.type, **row,
             "s": round(time.perf_counter() - t0, 2)})
