"""The heads and losses: next-item losses, scoring, seen and tied items, later targets (pure
torch, no distribution). The network's own properties are in test_model.py."""

import pytest
import torch

from hvd_ctsm.config.model_config import ModelConfig
from hvd_ctsm.model.catalog import seen_pairs, tied_pairs
from hvd_ctsm.model.ctsm import CTSM
from hvd_ctsm.model.heads import future_pairs
from tests.unit.test_model import SIZES, ctsm, make_batch, model


@pytest.mark.parametrize("loss", ["full", "shared", "sampled", "bce"])
def test_losses_are_finite_and_train(loss):
    torch.manual_seed(0)
    m = ctsm(dim=16, layers=1, heads=2, dropout=0.0, loss=loss, negatives=8)
    batch, _ = make_batch()
    batch |= {"target_row": torch.tensor([0, 0, 1, 2]), "target_pos": torch.tensor([3, 11, 6, 2]),
              "target_item": torch.tensor([4, 9, 4, 7]),
              "target_label": torch.tensor([1.0, 0.0, 1.0, 0.0]),
              "target_log_dt": torch.tensor([0.5, 0.1, 2.0, 0.0])}
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    first = None
    for _ in range(30):
        losses = m(batch)
        total = losses["next_item"] + losses["sale"]
        assert torch.isfinite(total)
        first = first if first is not None else float(total.detach())
        opt.zero_grad()
        total.backward()
        opt.step()
    assert float(total.detach()) < first * 0.7


@pytest.mark.parametrize("loss", ["full", "shared"])
def test_buffers_are_lookups_that_training_never_changes(loss):
    """The DDP backend does not broadcast buffers each step (torch_backend.NO_BUFFER_SYNC): that
    is right only while every buffer is built from the dataset's metadata and never changes."""
    torch.manual_seed(0)
    m = ctsm(dim=16, layers=1, heads=2, loss=loss, item_category=True, item_tags=True,
             position_buckets=4).train()
    before = {name: b.clone() for name, b in m.named_buffers()}
    assert {name.rsplit(".", 1)[-1] for name in before} >= {
        "place_to_row", "item_to_category", "item_to_tags", "tag_share"}
    assert not set(before) & set(m.state_dict())  # none saved: each rank builds its own
    batch, _ = make_batch()
    batch |= {"target_row": torch.tensor([0, 1, 2]), "target_pos": torch.tensor([11, 6, 2]),
              "target_item": torch.tensor([4, 9, 7]), "target_label": torch.ones(3),
              "target_log_dt": torch.zeros(3)}
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(3):
        total = sum(m(batch).values())
        opt.zero_grad()
        total.backward()
        opt.step()
    for name, b in m.named_buffers():
        assert torch.equal(b, before[name]), name

def test_score_and_recommend():
    m = model()
    batch, lengths = make_batch()
    states = m.encoder(batch)[torch.arange(3), lengths - 1]
    full = m.score(states)
    assert full.shape == (3, 50) and torch.isneginf(full[:, 0]).all()
    some = m.score(states, torch.tensor([3, 4, 5]))
    assert torch.allclose(some, full[:, 3:6], atol=1e-5)
    per_row = m.score(states, torch.tensor([[3, 4], [5, 6], [7, 8]]))
    assert torch.allclose(per_row[1], full[1, 5:7], atol=1e-5)
    top_item = int(full[0].argmax())
    values, items = m.recommend(states, k=5, seen=[[top_item], [], []])
    assert items.shape == (3, 5) and top_item not in items[0] and 0 not in items
    dense = full.clone()
    dense[0, top_item] = float("-inf")
    assert torch.allclose(values, dense.topk(5).values, atol=1e-5)
    p = m.p_sale(states, torch.tensor([1, 2, 3]))
    assert ((p > 0) & (p < 1)).all()


def test_unknown_head_is_refused():
    with pytest.raises(ValueError, match="model.head_weights key"):
        ModelConfig(head_weights={"next_item": 1.0, "churn": 1.0})
    cfg = ModelConfig()
    cfg.head_weights = {"next_item": 1.0, "churn": 1.0}  # past the config's own check
    with pytest.raises(ValueError, match="unknown heads"):
        CTSM(SIZES, cfg)


def test_without_item_bias_the_bias_stays_zero_and_the_state_keys_match():
    torch.manual_seed(0)
    m = ctsm(dim=16, layers=1, heads=2, dropout=0.0, item_bias=False)
    batch, _ = make_batch()
    batch |= {"target_row": torch.tensor([0, 1]), "target_pos": torch.tensor([3, 6]),
              "target_item": torch.tensor([4, 9]), "target_label": torch.tensor([1.0, 0.0]),
              "target_log_dt": torch.tensor([0.5, 0.1])}
    opt = torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        sum(m(batch).values()).backward()
        opt.step()
    assert torch.count_nonzero(m.heads["next_item"].bias) == 0
    with_bias = ctsm(dim=16, layers=1, heads=2, dropout=0.0)
    assert m.state_dict().keys() == with_bias.state_dict().keys()


def test_seen_items_marks_only_the_past_of_each_target():
    items = torch.tensor([[5, 7, 5, 9, 0], [3, 4, 0, 0, 0]])
    seen = seen_pairs(items, torch.tensor([0, 0, 1, 1]), torch.tensor([0, 2, 1, 3]),
                      num_items=10).dense(4)
    assert seen[0].nonzero().flatten().tolist() == [5]  # 7 and 9 come later
    assert seen[1].nonzero().flatten().tolist() == [5, 7]  # a repeat counts once; 9 is future
    assert seen[2].nonzero().flatten().tolist() == [3, 4]
    assert seen[3].nonzero().flatten().tolist() == [3, 4]  # padding (item 0) is left to the loss


@pytest.mark.parametrize("loss", ["full", "shared", "sampled", "bce"])
def test_exclude_seen_drops_history_from_the_negatives_but_keeps_a_repeated_target(loss):
    torch.manual_seed(0)
    m = ctsm(dim=16, layers=1, heads=2, dropout=0.0, loss=loss, negatives=49,
             head_weights={"next_item": 1.0}, exclude_seen=True)
    batch, _ = make_batch()
    history = batch["item"][0, :4]
    fresh = next(i for i in range(1, 50) if i not in history.tolist())
    batch |= {"target_row": torch.tensor([0, 0]), "target_pos": torch.tensor([3, 3]),
              "target_item": torch.tensor([int(history[1]), fresh]),
              "target_label": torch.zeros(2), "target_log_dt": torch.zeros(2)}
    loss_value = m(batch)["next_item"]
    assert torch.isfinite(loss_value)  # the repeated target (history[1]) was not masked
    if loss == "full":  # the softmax runs over the items not seen before, plus the target
        logits = m.score(m.states_at(batch))
        for t, target in enumerate(batch["target_item"].tolist()):
            others = [i for i in history.tolist() if i != target]
            logits[t, others] = float("-inf")
        expected = torch.nn.functional.cross_entropy(logits, batch["target_item"])
        assert torch.allclose(loss_value, expected)
        m.heads["next_item"].exclude_seen = False
        assert m(batch)["next_item"] > loss_value  # seen items were competing negatives


def test_uniform_bce_weight_adds_the_bce_loss_against_the_same_draws_to_the_softmax():
    torch.manual_seed(0)
    kwargs = dict(dim=16, layers=1, heads=2, dropout=0.0, negatives=8,
                  head_weights={"next_item": 1.0})
    mixed = ctsm(loss="full", uniform_bce_weight=0.5, **kwargs)
    softmax, bce = (ctsm(loss=kind, **kwargs) for kind in ("full", "bce"))
    for other in (softmax, bce):
        other.load_state_dict(mixed.state_dict())
    batch, _ = make_batch()
    batch |= {"target_row": torch.tensor([0, 1, 2]), "target_pos": torch.tensor([3, 6, 2]),
              "target_item": torch.tensor([4, 9, 7]), "target_label": torch.zeros(3),
              "target_log_dt": torch.zeros(3)}
    torch.manual_seed(1)
    mixed_loss = mixed(batch)["next_item"]
    torch.manual_seed(1)
    bce_loss = bce(batch)["next_item"]  # draws the same negatives
    expected = softmax(batch)["next_item"] + 0.5 * bce_loss
    assert torch.allclose(mixed_loss, expected)
    assert mixed_loss > softmax(batch)["next_item"] + 0.01  # the term is there and positive


def test_tied_targets_marks_the_items_of_targets_sharing_a_state():
    rows, pos = torch.tensor([0, 0, 0, 1, 1]), torch.tensor([2, 2, 5, 2, 2])
    items = torch.tensor([3, 4, 6, 3, 7])
    tied = tied_pairs(rows, pos, items, num_items=8).dense(5)
    marked = [sorted(torch.nonzero(r).flatten().tolist()) for r in tied]
    # (0, 2) has items 3 and 4; (0, 5) only 6; (1, 2) 3 and 7: never across rows or positions
    assert marked == [[3, 4], [3, 4], [6], [3, 7], [3, 7]]


def test_exclude_tied_leaves_a_sibling_target_out_of_the_softmax_negatives():
    torch.manual_seed(0)
    m = ctsm(dim=16, layers=1, heads=2, dropout=0.0, loss="full", head_weights={"next_item": 1.0},
             exclude_seen=False, exclude_tied=True)
    batch, _ = make_batch()
    batch |= {"target_row": torch.tensor([0, 0, 1]), "target_pos": torch.tensor([3, 3, 3]),
              "target_item": torch.tensor([5, 9, 9]), "target_label": torch.zeros(3),
              "target_log_dt": torch.zeros(3)}
    loss_value = m(batch)["next_item"]
    logits = m.score(m.states_at(batch))
    logits[0, 9] = logits[1, 5] = float("-inf")  # row 0's two targets share position 3
    expected = torch.nn.functional.cross_entropy(logits, batch["target_item"])
    assert torch.allclose(loss_value, expected)
    m.heads["next_item"].exclude_tied = False
    assert m(batch)["next_item"] > loss_value  # the sibling was a competing negative


def test_future_pairs_join_targets_of_one_example_predicted_from_later_states():
    rows, pos = torch.tensor([0, 0, 0, 0, 1, 1]), torch.tensor([1, 2, 2, 4, 0, 1])
    assert [t.tolist() for t in future_pairs(rows, pos, 1)] == [[0, 2, 4], [1, 3, 5]]
    # offset 2: (1, 3) and (0, 2) share no state; (2, 4) and (3, 5) cross into another example
    assert [t.tolist() for t in future_pairs(rows, pos, 2)] == [[0, 1], [2, 3]]
    assert [t.tolist() for t in future_pairs(rows, pos, 9)] == [[], []]


def test_future_targets_add_the_later_targets_with_decaying_weights_and_no_false_negatives():
    torch.manual_seed(0)
    kwargs = dict(dim=16, layers=1, heads=2, dropout=0.0, loss="full",
                  head_weights={"next_item": 1.0}, exclude_seen=False)
    ahead = ctsm(future_targets=3, future_decay=0.5, **kwargs)
    plain = ctsm(**kwargs)
    plain.load_state_dict(ahead.state_dict())
    batch, _ = make_batch()
    batch |= {"target_row": torch.tensor([0, 0, 0, 1]), "target_pos": torch.tensor([2, 3, 4, 5]),
              "target_item": torch.tensor([4, 9, 7, 9]), "target_label": torch.zeros(4),
              "target_log_dt": torch.zeros(4)}
    scores = plain.score(plain.states_at(batch))
    ce = torch.nn.functional.cross_entropy

    def later(src, dst, before):  # row src's score against target dst's item, `before` masked
        logits = scores[src].clone()
        logits[before] = float("-inf")
        return ce(logits[None], torch.tensor([dst]))

    # offset 1: (0 -> 1) and (1 -> 2); offset 2: (0 -> 2); row 1 has one target only
    first = (later(0, 9, [4]) + later(1, 7, [9])) / 2
    second = later(0, 7, [4, 9])
    expected = plain(batch)["next_item"] + 0.5 * first + 0.25 * second
    assert torch.allclose(ahead(batch)["next_item"], expected)
