"""What grows with the catalog (hvd_ctsm.model.catalog): sparse exclusions, the chunked exact
softmax,
the shared sampled softmax with log-Q, the chunked top-K; each checked against its dense
definition on small cases."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hvd_ctsm.model import catalog
from hvd_ctsm.model.heads import EXACT_MAX_ITEMS, resolve_loss


def dense_seen(items, target_row, target_pos, num_items):
    """The dense definition: [T, num_items], item i at a position <= target_pos of the row."""
    t = items.shape[1]
    first = torch.full((items.shape[0], num_items), t, dtype=torch.long)
    first = first.scatter_reduce(1, items, torch.arange(t).expand_as(items), reduce="amin")
    mask = first[target_row] <= target_pos.unsqueeze(1)
    mask[:, 0] = False  # padding: every loss and ranking leaves it out on its own
    return mask


def dense_tied(target_row, target_pos, target_item, num_items):
    mask = torch.zeros(len(target_row), num_items, dtype=torch.bool)
    for a in range(len(target_row)):
        for b in range(len(target_row)):
            if target_row[a] == target_row[b] and target_pos[a] == target_pos[b]:
                mask[a, target_item[b]] = True
    return mask


def random_batch(seed, rows=6, window=9, num_items=40, targets=15):
    g = torch.Generator().manual_seed(seed)
    items = torch.randint(0, num_items, (rows, window), generator=g)
    target_row = torch.randint(0, rows, (targets,), generator=g)
    target_pos = torch.randint(0, 3, (targets,), generator=g) * 3  # ties: shared positions
    target_item = torch.randint(1, num_items, (targets,), generator=g)
    return items, target_row, target_pos, target_item


@pytest.mark.parametrize("seed", range(5))
def test_sparse_exclusions_equal_the_dense_masks(seed):
    items, row, pos, target = random_batch(seed)
    assert torch.equal(catalog.seen_pairs(items, row, pos, 40).dense(len(row)),
                       dense_seen(items, row, pos, 40))
    assert torch.equal(catalog.tied_pairs(row, pos, target, 40).dense(len(row)),
                       dense_tied(row, pos, target, 40))


def dense_softmax_loss(states, target, table, bias, excluded):
    logits = states @ table.T + bias
    if excluded is not None:
        mask = excluded.dense(len(target))
        mask[torch.arange(len(target)), target] = False
        logits = logits.masked_fill(mask, float("-inf"))
    logits[:, 0] = float("-inf")
    return F.cross_entropy(logits, target)


@pytest.mark.parametrize("chunk", [7, 16, 40, 1000])
@pytest.mark.parametrize("exclude", [False, True])
def test_chunked_exact_softmax_equals_the_dense_loss_and_gradient(chunk, exclude):
    items, row, pos, target = random_batch(3)
    g = torch.Generator().manual_seed(1)
    table = torch.randn(40, 8, generator=g, requires_grad=True)
    bias = torch.randn(40, generator=g, requires_grad=True)
    states = torch.randn(len(target), 8, generator=g, requires_grad=True)
    excluded = catalog.seen_pairs(items, row, pos, 40) if exclude else None

    def vectors(ids):
        return table[ids]

    chunked = catalog.softmax_cross_entropy(states, target, vectors, bias, excluded, chunk=chunk)
    grads = torch.autograd.grad(chunked, (states, table, bias))
    dense = dense_softmax_loss(states, target, table, bias, excluded)
    expected = torch.autograd.grad(dense, (states, table, bias))
    assert torch.allclose(chunked, dense, atol=1e-5)
    for got, want in zip(grads, expected, strict=True):
        assert torch.allclose(got, want, atol=1e-5)


def test_shared_sampled_softmax_leaves_out_the_target_and_the_seen_items():
    """With every item a uniform draw, the shared loss is the exact softmax (log-Q off), the
    row's other candidates excluded as the exact loss excludes them."""
    items, row, pos, target = random_batch(4, num_items=12)
    g = torch.Generator().manual_seed(2)
    table, bias = torch.randn(12, 6, generator=g), torch.randn(12, generator=g)
    states = torch.randn(len(target), 6, generator=g)
    excluded = catalog.seen_pairs(items, row, pos, 12)
    shared = catalog.shared_sampled_softmax(states, target, lambda ids: table[ids], bias,
                                            excluded, uniform=4000, probability=None,
                                            generator=torch.Generator().manual_seed(0),
                                            log_q=False)
    exact = dense_softmax_loss(states, target, table, bias, excluded)
    assert torch.allclose(shared, exact, atol=1e-5)


def test_shared_sampled_softmax_with_log_q_is_its_definition_row_by_row():
    """A few draws (so that most items are no candidate), log-Q on, seen items excluded, and
    targets that are among their own row's seen items: loss and gradients equal the definition
    written out one row at a time (the target's logit against every candidate that is neither
    the target nor excluded), each logit lowered by its item's log inclusion chance."""
    num_items, uniform = 30, 6
    items, row, pos, target = random_batch(7, num_items=num_items)
    target[0] = items[row[0], pos[0]]  # a repeat purchase: the target is also a seen item
    g = torch.Generator().manual_seed(3)
    table = torch.randn(num_items, 5, generator=g, requires_grad=True)
    bias = torch.randn(num_items, generator=g, requires_grad=True)
    states = torch.randn(len(target), 5, generator=g, requires_grad=True)
    frequency = catalog.TargetFrequency(num_items).update(target)
    excluded = catalog.seen_pairs(items, row, pos, num_items)
    loss = catalog.shared_sampled_softmax(states, target, lambda ids: table[ids], bias, excluded,
                                          uniform, frequency.probability,
                                          generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad(loss, (states, table, bias))

    drawn = torch.randint(1, num_items, (uniform,), generator=torch.Generator().manual_seed(1))
    candidates = sorted(set(target.tolist()) | set(drawn.tolist()))
    log_q = catalog.log_inclusion(frequency.probability(torch.arange(num_items)), len(target),
                                  uniform, num_items).float()
    pairs = set(zip(excluded.target.tolist(), excluded.item.tolist(), strict=True))
    terms = []
    for i, t in enumerate(target.tolist()):
        negatives = [c for c in candidates if c != t and (i, c) not in pairs]
        items_of_row = torch.tensor([t, *negatives])  # the target's logit first
        row_logits = states[i] @ table[items_of_row].T + bias[items_of_row] - log_q[items_of_row]
        terms.append(torch.logsumexp(row_logits, 0) - row_logits[0])
    definition = torch.stack(terms).mean()
    assert (0, int(target[0])) in pairs and len(candidates) < num_items - 5
    assert torch.allclose(loss, definition, atol=1e-6)
    for got, want in zip(grads, torch.autograd.grad(definition, (states, table, bias)),
                         strict=True):
        assert torch.allclose(got, want, atol=1e-6)


def masked_cross_entropy(states, vectors, shift, target_column, rows, columns):
    """candidate_cross_entropy's definition: whole logits, -inf at the pairs, F.cross_entropy."""
    logits = states @ vectors.T + shift
    logits = logits.index_put((rows, columns), torch.tensor(float("-inf")))
    return F.cross_entropy(logits, target_column)


@pytest.mark.parametrize("rows_per_block", [1, 3, 7, 40, None])
def test_candidate_cross_entropy_in_blocks_equals_the_masked_cross_entropy(rows_per_block):
    """Loss and every gradient, rows in blocks (the last one short) or in one, with excluded
    pairs in no order, repeated, and rows that have none."""
    g = torch.Generator().manual_seed(5)
    num_rows, num_candidates = 23, 17
    states = torch.randn(num_rows, 6, generator=g, requires_grad=True)
    vectors = torch.randn(num_candidates, 6, generator=g, requires_grad=True)
    shift = torch.randn(num_candidates, generator=g, requires_grad=True)
    target_column = torch.randint(0, num_candidates, (num_rows,), generator=g)
    rows = torch.randint(0, num_rows - 4, (60,), generator=g)  # the last 4 rows: none
    columns = torch.randint(0, num_candidates, (60,), generator=g)
    keep = columns != target_column[rows]  # the target's own column is never excluded
    rows, columns = rows[keep], columns[keep]
    got = catalog.candidate_cross_entropy(states, vectors, shift, target_column, rows, columns,
                                          rows_per_block)
    want = masked_cross_entropy(states, vectors, shift, target_column, rows, columns)
    assert torch.allclose(got, want, atol=1e-6)
    for a, b in zip(torch.autograd.grad(3 * got, (states, vectors, shift)),
                    torch.autograd.grad(3 * want, (states, vectors, shift)), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_candidate_cross_entropy_without_gradients_and_under_autocast():
    """Under no_grad: the same value, no graph. Under bfloat16 autocast: float32, the same
    value as without it (F.cross_entropy runs in float32 under autocast too), gradients kept."""
    g = torch.Generator().manual_seed(6)
    states = torch.randn(9, 4, generator=g, requires_grad=True)
    vectors, shift = torch.randn(11, 4, generator=g), torch.randn(11, generator=g)
    target_column = torch.randint(0, 11, (9,), generator=g)
    none = torch.zeros(0, dtype=torch.long)
    plain = catalog.candidate_cross_entropy(states, vectors, shift, target_column, none, none)
    with torch.no_grad():
        quiet = catalog.candidate_cross_entropy(states, vectors, shift, target_column, none,
                                                none)
    assert not quiet.requires_grad and torch.equal(quiet, plain.detach())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = catalog.candidate_cross_entropy(states, vectors, shift, target_column, none,
                                               none)
    assert cast.dtype == torch.float32 and torch.allclose(cast, plain, atol=1e-6)
    assert torch.allclose(torch.autograd.grad(cast, states)[0],
                          torch.autograd.grad(plain, states)[0], atol=1e-7)


def test_log_q_of_the_needed_items_is_the_whole_catalogs_entries_to_the_bit():
    """A step computes log-Q for its candidates and targets only (nothing catalog-sized): the
    same numbers as the whole catalog's vector of (counts + 1) / (sum + N), indexed."""
    num_items, g = 1000, torch.Generator().manual_seed(4)
    frequency = catalog.TargetFrequency(num_items)
    for _ in range(3):
        frequency.update(torch.randint(1, num_items, (300,), generator=g))
    everything = torch.arange(num_items)
    whole = (frequency.counts + 1) / (frequency.counts.sum() + num_items)
    assert torch.equal(frequency.probability(everything), whole)
    needed = torch.randint(1, num_items, (50,), generator=g)
    for probability in (frequency.probability, None):
        if probability is None:
            whole = torch.full((num_items,), 1 / (num_items - 1), dtype=torch.float64)
            whole[0] = 0.0
            chance = catalog.uniform_probability(needed, num_items)
        else:
            chance = probability(needed)
        reference = catalog.log_inclusion(whole, 300, 64, num_items)[needed]
        assert torch.equal(catalog.log_inclusion(chance, 300, 64, num_items), reference)


def fit_item_scores(log_q: bool, steps=400, num_items=100, batch=32, seed=0):
    """Learn one score per item from targets drawn by a Zipf law, with the shared sampled
    softmax (in-batch negatives plus 4 uniform draws): the softmax of the learned scores."""
    g = torch.Generator().manual_seed(seed)
    truth = 1.0 / torch.arange(1, num_items)
    truth = torch.cat([torch.zeros(1), truth / truth.sum()])  # item 0 is padding
    scores = torch.zeros(num_items, requires_grad=True)
    opt = torch.optim.Adam([scores], lr=0.05)
    frequency = catalog.TargetFrequency(num_items)
    for _ in range(steps):
        target = torch.multinomial(truth, batch, replacement=True, generator=g)
        probability = frequency.update(target).probability
        loss = catalog.shared_sampled_softmax(
            torch.ones(batch, 1), target, lambda ids: torch.zeros(len(ids), 1), scores, None,
            uniform=4, probability=probability, generator=g, log_q=log_q)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return truth[1:], torch.softmax(scores.detach()[1:], 0)


def test_log_q_correction_recovers_the_target_distribution_and_without_it_does_not():
    """In-batch negatives are drawn by popularity: uncorrected, popular items are pushed down
    as often as they are pulled up and the scores flatten; the log-Q correction undoes that, and
    the learned softmax matches the true distribution."""
    truth, corrected = fit_item_scores(log_q=True)
    _, uncorrected = fit_item_scores(log_q=False)

    def kl(p, q):
        return float((p * (p / q).log()).sum())

    assert kl(truth, corrected) < 0.03  # 0.009 measured
    assert kl(truth, uncorrected) > 10 * kl(truth, corrected)  # 0.34 measured


@pytest.mark.parametrize("chunk", [5, 13, 64])
def test_chunked_topk_equals_the_dense_topk_with_the_same_exclusions(chunk):
    items, row, pos, _ = random_batch(5, num_items=50)
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(len(row), 50, generator=g)
    excluded = catalog.seen_pairs(items, row, pos, 50)
    values, indices = catalog.chunked_topk(lambda lo, hi: scores[:, lo:hi], len(row), 50, k=7,
                                           excluded=excluded, chunk=chunk)
    dense = scores.masked_fill(excluded.dense(len(row)), float("-inf"))
    dense[:, 0] = float("-inf")
    expected = dense.topk(7, dim=1)
    assert torch.equal(indices, expected.indices) and torch.equal(values, expected.values)


def test_auto_loss_is_exact_up_to_the_threshold_and_shared_above():
    assert resolve_loss("auto", EXACT_MAX_ITEMS) == "full"
    assert resolve_loss("auto", EXACT_MAX_ITEMS + 1) == "shared"
    assert resolve_loss("auto", 10**6, future_targets=2) == "full"  # only full has those terms
    assert resolve_loss("bce", 10) == "bce"


def eval_batch(seed, num_items=60, rows=8, window=10):
    """A batch as the evaluation reader gives it: histories, one target per row, each client's
    earlier items and all its items."""
    g = torch.Generator().manual_seed(seed)
    items = torch.randint(1, num_items, (rows, window), generator=g)
    lengths = torch.randint(2, window + 1, (rows,), generator=g)
    items = items * (torch.arange(window)[None, :] < lengths[:, None])
    target = torch.randint(1, num_items, (rows,), generator=g)
    target[0] = items[0, 0]  # a repeat: ranks last under the full protocol
    prior = [row[row > 0].numpy() for row in items]
    return {"item": items, "event_type": (items > 0).long(), "value": torch.zeros(rows, window),
            "log_gap": torch.zeros(rows, window),
            "client_attrs": torch.zeros(rows, window, 1, dtype=torch.long),
            "target_row": torch.arange(rows), "target_pos": lengths - 1, "target_item": target,
            "target_label": (torch.arange(rows) % 2).float(), "target_log_dt": torch.zeros(rows),
            "prior_items": prior, "client_items": [list(p) + [int(t)] for p, t in
                                                   zip(prior, target, strict=True)],
            "client_id": [f"c{seed}-{r}" for r in range(rows)]}


@pytest.mark.parametrize("chunk", [7, 25])
def test_chunked_evaluation_gives_the_whole_matrix_ranks(chunk):
    from hvd_ctsm.config.model_config import ModelConfig
    from hvd_ctsm.evaluation.evaluate import Popularity, evaluate, model_scorer
    from hvd_ctsm.model.ctsm import CTSM, ModelSizes

    torch.manual_seed(0)
    model = CTSM(ModelSizes(num_items=60, num_event_types=3, attr_sizes=[2], max_len=10),
                 ModelConfig(dim=8, layers=1, heads=2, dropout=0.0)).eval()
    batches = [eval_batch(seed) for seed in range(3)]
    popularity = Popularity.fit(batches, 60)
    for scorer in (model_scorer(model, torch.device("cpu")), popularity.scorer()):
        whole = evaluate(batches, scorer, 60, keep_ranks=True)
        chunked = evaluate(batches, scorer, 60, keep_ranks=True, chunk=chunk)
        for protocol in ("full", "sampled"):
            assert np.array_equal(np.concatenate(chunked.ranks[protocol]),
                                  np.concatenate(whole.ranks[protocol]))
        assert chunked.summary() == whole.summary()
    assert np.concatenate(whole.ranks["full"])[0] == 58  # the repeat target ranks last


def test_the_full_ranks_by_chunks_and_by_sorting_equal_the_whole_matrix_ranks_with_ties():
    """Scores with many exact ties and near-ties a float32 ulp apart: the chunked ranking (float32
    bounds rounded outwards) and the sorted one of shared scores (popularity) count exactly what
    the whole matrix counts."""
    from hvd_ctsm.evaluation.evaluate import (ItemScores, _chunked_full_ranks, _dense_ranks,
                                              _shared_full_ranks)

    num_items, batch = 60, eval_batch(3)
    rows = len(batch["target_item"])
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(0, 5, (num_items,), generator=g).float() / 3  # 5 values: ties
    shared[7::9] = torch.nextafter(shared[7::9], torch.tensor(10.0))  # an ulp above a tie
    for matrix in (shared.expand(rows, -1), torch.randint(0, 4, (rows, num_items),
                                                          generator=g).float() * 1e3):
        scores = ItemScores(chunk=lambda lo, hi, m=matrix: m[:, lo:hi].clone(),
                            at=lambda items, m=matrix: m.gather(1, items))
        whole, _ = _dense_ranks(batch, scores, num_items, seed=0, negatives=10)
        for chunk in (7, 60):
            assert np.array_equal(_chunked_full_ranks(batch, scores, num_items, chunk), whole)
    whole, _ = _dense_ranks(batch, ItemScores(chunk=lambda lo, hi: shared[lo:hi].expand(
        rows, -1).clone(), at=lambda items: shared[items]), num_items, seed=0, negatives=10)
    assert np.array_equal(_shared_full_ranks(batch, shared, num_items), whole)
    assert whole[0] == num_items - 2 and len(set(whole.tolist())) > 3


@pytest.mark.parametrize("num_items, blocks", [(301, False), (catalog.ITEM_CHUNK + 1, True)])
def test_the_loss_line_says_blocks_of_rows_only_where_the_loss_makes_them(num_items, blocks):
    """It said 'in blocks of rows' at 301 items too, where the exact loss is one dense chunk."""
    from hvd_ctsm.config import load_config
    from hvd_ctsm.model.ctsm import CTSM, ModelSizes
    from hvd_ctsm.train.trainer import describe_loss

    cfg = load_config("default", ["model.dim=8", "model.layers=1", "model.heads=2"])
    sizes = ModelSizes(num_items=num_items, num_event_types=5, attr_sizes=[], max_len=4)
    line = describe_loss(cfg, CTSM(sizes, cfg.model))
    assert line.startswith("next-item loss: full: exact softmax over every item")
    assert ("in blocks of rows" in line) == blocks
