"""The model alone: causality, padding, side features, saved sections (pure torch, no
distribution). The heads and losses are in test_heads.py."""

import pytest
import torch

from hvd_ctsm.config.model_config import ModelConfig, architecture
from hvd_ctsm.model.ctsm import (CTSM, ModelSizes, length_groups, position_bucket_of, recency_bias,
                                 time_gap_bias)

CATEGORIES = [0] + [1 + i % 3 for i in range(49)]  # item 0 (padding) has none
# Tags: item i has tag 1 + i % 4, also tag 5 when i is even, none when i % 7 == 0.
TAGS = [[]] + [[] if i % 7 == 0 else [1 + i % 4] + ([5] if i % 2 == 0 else [])
               for i in range(1, 50)]
SIZES = ModelSizes(num_items=50, num_event_types=5, attr_sizes=[4, 3], max_len=12,
                   item_category=CATEGORIES, item_tags=TAGS)


# The plain network these tests were written on: no tag vectors, PyTorch's own draws for the
# added tables (the defaults' item_tags and feature_init_std have tests of their own).
PLAIN = {"item_tags": False, "feature_init_std": None}


def ctsm(sizes=SIZES, **settings) -> CTSM:
    """A CTSM of `settings` over ModelConfig's defaults (with PLAIN)."""
    return CTSM(sizes, ModelConfig(**(PLAIN | settings)))


def event_fields(lengths: torch.Tensor, t: int, g: torch.Generator) -> dict:
    """Random events for rows of these lengths, padded with zeros to t positions."""
    b = len(lengths)
    valid = torch.arange(t)[None, :] < lengths[:, None]
    return {"item": torch.randint(1, 50, (b, t), generator=g) * valid,
            "event_type": torch.randint(1, 5, (b, t), generator=g) * valid,
            "value": torch.rand(b, t, generator=g) * valid,
            "log_gap": torch.rand(b, t, generator=g) * valid,
            "client_attrs": torch.randint(1, 3, (b, t, 2), generator=g) * valid[..., None]}


def make_batch(b=3, t=12, seed=0):
    lengths = torch.tensor([12, 7, 3])[:b]
    return event_fields(lengths, t, torch.Generator().manual_seed(seed)), lengths


def model(**kwargs):
    torch.manual_seed(0)
    return ctsm(dim=16, layers=2, heads=2, dropout=0.0, **kwargs).eval()


ARCHS = {  # CTSM's variants (the default has a recency bias) and the SASRec-style baseline
    "gated": dict(block="gated", recency_bias=False),
    "residual": dict(block="residual", recency_bias=False),
    "recency": dict(block="residual", recency_bias=True),
    "time": dict(block="residual", recency_bias=True, time_bias=True),
    "time-only": dict(block="residual", recency_bias=False, time_bias=True),
    "category": dict(block="residual", recency_bias=True, item_category=True),
    "tags": dict(block="residual", recency_bias=True, item_tags=True),
    "no-positions": dict(block="residual", recency_bias=True, learned_positions=False),
    "position-buckets": dict(block="residual", recency_bias=True, position_buckets=4),
    "sasrec": dict(block="residual", ff_mult=1, side_features=False, recency_bias=False),
}


FIELDS = ["item", "event_type", "value", "log_gap", "client_attrs"]
CASES = [(f, a) for a in ARCHS for f in FIELDS if a != "sasrec" or f == "item"]  # it reads items


@pytest.mark.parametrize("field,arch", CASES)
def test_changing_a_later_event_never_changes_earlier_states(field, arch):
    m = model(**ARCHS[arch])
    batch, _ = make_batch()
    before = m.encoder(batch)
    changed = {k: v.clone() for k, v in batch.items()}
    cut = 5
    if changed[field].is_floating_point():
        changed[field][:, cut:] += 3.0
    else:
        changed[field][:, cut:] = (changed[field][:, cut:] % 2) + 1
    after = m.encoder(changed)
    assert torch.allclose(before[:, :cut], after[:, :cut], atol=1e-6)
    assert not torch.allclose(before[0, cut:], after[0, cut:], atol=1e-4)  # the change did act


@pytest.mark.parametrize("arch", ["residual", "recency", "time", "no-positions"])
def test_padding_does_not_change_valid_positions(arch):
    m = model(**ARCHS[arch])
    batch, lengths = make_batch()
    padded = {k: torch.cat([v, torch.zeros_like(v)], dim=1) for k, v in batch.items()}
    big = ctsm(ModelSizes(50, 5, [4, 3], max_len=24), dim=16, layers=2, heads=2, dropout=0.0,
               **ARCHS[arch])
    big.load_state_dict({k: (v if k != "encoder.position.weight" else
                             torch.cat([v, torch.zeros(12, 16)]))
                         for k, v in m.state_dict().items()})
    big.eval()
    assert torch.allclose(m.encoder(batch), big.encoder(padded)[:, :12], atol=1e-5)


def _ragged_batch(lengths, seed=0):
    """make_batch's fields for rows of these lengths, with every position of each row a target
    (in a shuffled order)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    batch = event_fields(lengths, int(lengths.max()), g)
    rows = torch.cat([torch.full((int(n),), i) for i, n in enumerate(lengths)])
    positions = torch.cat([torch.arange(int(n)) for n in lengths])
    order = torch.randperm(len(rows), generator=g)
    batch["target_row"], batch["target_pos"] = rows[order], positions[order]
    return batch


@pytest.mark.parametrize("arch", ["recency", "time", "sasrec"])
def test_length_groups_give_each_target_the_state_one_padded_tensor_gives(arch):
    batch = _ragged_batch([12, 1, 3, 2, 7, 5, 12, 4])
    batch["item"][4, 2] = 0  # an unknown item inside a history: the row still has 7 events
    grouped = model(**ARCHS[arch])
    whole = model(**ARCHS[arch], length_groups=False)
    assert len(length_groups(batch["item"], batch["target_row"], batch["target_pos"])) == 5
    assert torch.allclose(grouped.states_at(batch), whole.states_at(batch), atol=1e-5)


def test_length_groups_pad_a_row_to_less_than_twice_its_length():
    batch = _ragged_batch([1, 2, 3, 4, 5, 9, 12, 12])
    groups = length_groups(batch["item"], batch["target_row"], batch["target_pos"])
    assert [(m.tolist(), w) for m, w in groups] == [
        ([0], 1), ([1], 2), ([2, 3], 4), ([4], 5), ([5, 6, 7], 12)]


def test_length_groups_train_to_the_same_gradients():
    batch = _ragged_batch([12, 1, 3, 6, 2], seed=1)
    batch["target_item"] = torch.randint(1, 50, batch["target_row"].shape)
    batch["target_label"] = torch.ones(len(batch["target_row"]))
    batch["target_log_dt"] = torch.zeros(len(batch["target_row"]))
    grads = []
    for groups in (True, False):
        m = model(length_groups=groups)
        sum(m(batch).values()).backward()
        grads.append({n: p.grad for n, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        assert torch.allclose(grad, grads[1][name], atol=1e-5), name


def test_recency_bias_is_causal_and_falls_with_distance():
    bias = recency_bias(heads=2, t=5)
    assert bias.shape == (2, 5, 5)
    assert torch.isneginf(bias[:, 1, 2:]).all() and torch.equal(bias[:, 3, 3], torch.zeros(2))
    assert (bias[:, 4, 1:5].diff(dim=-1) > 0).all()  # the nearer, the less penalty
    assert (bias[0, 4, :4] < bias[1, 4, :4]).all()  # the first head is the steepest


def test_time_gap_bias_falls_with_the_hours_between_events():
    hours = torch.tensor([[0.0, 1.0, 0.0, 100.0]])  # gaps since the previous event
    bias = time_gap_bias(torch.log1p(hours), torch.tensor([1.0, 0.5]))
    assert bias.shape == (1, 2, 4, 4)
    assert torch.equal(bias[0, :, 2, 1], torch.zeros(2))  # same hour: no penalty
    assert torch.allclose(bias[0, 0, 3, :3], -torch.log1p(torch.tensor([101.0, 100.0, 100.0])))
    assert torch.allclose(bias[0, 1], bias[0, 0] / 2)  # each head its own slope
    # The earlier rows read no later gap: changing the last gap leaves them as they were.
    before = time_gap_bias(torch.log1p(hours), torch.ones(2))
    later = time_gap_bias(torch.log1p(torch.tensor([[0.0, 1.0, 0.0, 5.0]])), torch.ones(2))
    assert torch.equal(later[0, :, :3, :3], before[0, :, :3, :3])


def assert_scoring_uses_the_input_vectors_and_reloads(m, vectors, option: str):
    """Scores are dot products with the same item vectors the input reads (plus the item
    bias), for all items and for given ones, and a saved model with `option` on reloads them."""
    states = torch.randn(2, 16)
    expected = states @ vectors.T + m.heads["next_item"].bias
    assert torch.allclose(m.score(states)[:, 1:], expected[:, 1:], atol=1e-6)
    assert torch.allclose(m.score(states, torch.tensor([4, 7])), expected[:, [4, 7]], atol=1e-6)
    saved = {"sizes": vars(SIZES), "model": m.state_dict(), "config": {"model": {
        "dim": 16, "layers": 2, "heads": 2, "dropout": 0.0, "loss": "full", "negatives": 5,
        "head_weights": {"next_item": 1.0, "sale": 0.5}, option: True,
        "block": "residual", "recency_bias": True}}}
    assert torch.allclose(CTSM.from_checkpoint(saved).score(states), m.score(states))


def test_item_category_adds_one_shared_vector_on_input_and_in_scoring():
    m = model(item_category=True)
    encoder = m.encoder
    with torch.no_grad():
        encoder.category.weight[1:] += 1.0
    vectors = encoder.item_vectors()
    shared = encoder.category.weight[torch.tensor(CATEGORIES)]
    assert torch.allclose(vectors - encoder.item.weight, shared)
    assert torch.equal(vectors[0], torch.zeros(16))  # padding stays zero
    assert torch.equal(encoder.item_vectors(torch.tensor([[3, 0]])), vectors[[3, 0]][None])
    assert_scoring_uses_the_input_vectors_and_reloads(m, vectors, "item_category")
    with pytest.raises(ValueError, match="3 item categories for 50 items"):
        ctsm(ModelSizes(50, 5, [], 12, item_category=[0, 1, 2]), item_category=True)


def test_item_tags_add_the_mean_of_their_vectors_on_input_and_in_scoring():
    m = model(item_tags=True)
    encoder = m.encoder
    with torch.no_grad():
        encoder.tags.weight[1:] += 1.0
    vectors = encoder.item_vectors()
    table = encoder.tags.weight
    for i in (0, 7, 3, 4):  # padding, no tags, one tag, two tags
        expected = sum(table[t] for t in TAGS[i]) / len(TAGS[i]) if TAGS[i] else torch.zeros(16)
        assert torch.allclose(vectors[i] - encoder.item.weight[i], expected, atol=1e-6)
    assert torch.equal(vectors[0], torch.zeros(16))  # padding stays zero
    assert torch.allclose(encoder.item_vectors(torch.tensor([[4, 0]])), vectors[[4, 0]][None])
    assert_scoring_uses_the_input_vectors_and_reloads(m, vectors, "item_tags")
    with pytest.raises(ValueError, match="tags for 2 items, the model has 50"):
        ctsm(ModelSizes(50, 5, [], 12, item_tags=[[], [1]]), item_tags=True)


def test_the_baseline_ignores_side_features_and_has_no_gates():
    m = model(**ARCHS["sasrec"])
    batch, _ = make_batch()
    other = dict(batch, event_type=batch["event_type"] % 2 + 1, value=batch["value"] + 1.0)
    assert torch.equal(m.encoder(batch), m.encoder(other))
    assert not any("gate" in name for name, _ in m.named_parameters())
    assert len(list(model(**ARCHS["gated"]).parameters())) > len(list(m.parameters()))


def test_saved_sections_rebuild_models_saved_before_the_architecture_settings():
    old = {"dim": 16, "layers": 1, "heads": 2, "dropout": 0.0, "loss": "full",
           "negatives": 5, "head_weights": {"next_item": 1.0}}
    rebuilt = CTSM(SIZES, ModelConfig.from_saved(old))
    assert any("gate_attn.w_r" in name for name, _ in rebuilt.named_parameters())
    plain = CTSM(SIZES, ModelConfig.from_saved(old | {"block": "residual",
                                                      "side_features": False}))
    assert not any("gate" in name or "numeric" in name for name, _ in plain.named_parameters())


def test_learned_positions_off_leaves_no_position_table_and_old_models_keep_theirs():
    def names(m):
        return {name for name, _ in m.named_parameters()}

    assert "encoder.position.weight" not in names(model(learned_positions=False))
    old = {"dim": 16, "layers": 1, "heads": 2, "dropout": 0.0, "loss": "full",
           "negatives": 5, "head_weights": {"next_item": 1.0}}  # saved before the setting
    assert "encoder.position.weight" in names(CTSM(SIZES, ModelConfig.from_saved(old)))
    assert architecture(old)["learned_positions"] is True


def test_feature_init_std_draws_the_added_tables_at_that_spread_and_none_keeps_pytorchs():
    small = model(feature_init_std=0.05).encoder
    for table in (small.position, small.event_type, *small.attrs):
        drawn = table.weight if table.padding_idx is None else table.weight[1:]
        assert 0.03 < drawn.std().item() < 0.07
        if table.padding_idx is not None:
            assert not table.weight[table.padding_idx].any()
    assert small.item.weight.std().item() == pytest.approx(16 ** -0.5, rel=0.2)  # untouched
    assert model().encoder.position.weight.std().item() == pytest.approx(1.0, rel=0.2)
    base = {"dim": 16, "layers": 1, "heads": 2, "head_weights": {}}
    assert architecture(base | {"feature_init_std": 0.05}) == architecture(base)  # warm starts


def test_position_buckets_keep_the_first_places_apart_and_share_the_late_ones():
    rows = position_bucket_of(200, 16).tolist()
    assert rows[0] == 0 and rows[-1] == 15 and sorted(set(rows)) == list(range(16))
    assert rows == sorted(rows)  # a later place never gets an earlier row
    assert rows[:8] == list(range(8)) and set(rows[100:]) == {14, 15}  # 100 places, 2 rows
    assert position_bucket_of(10, 0).tolist() == list(range(10))
    table = model(position_buckets=4).encoder.position.weight
    assert table.shape[0] == 4


def test_attention_dropout_defaults_to_the_dropout_and_can_be_set_apart():
    cfg = {"dim": 16, "layers": 2, "heads": 2, "dropout": 0.3, "loss": "full", "negatives": 5,
           "head_weights": {"next_item": 1.0}}
    blocks = CTSM(SIZES, ModelConfig.from_saved(cfg)).encoder.blocks
    assert {b.attn_dropout for b in blocks} == {0.3}
    apart = CTSM(SIZES, ModelConfig.from_saved(cfg | {"attention_dropout": 0.0}))
    assert {b.attn_dropout for b in apart.encoder.blocks} == {0.0}
    # Only the attention weights lose their dropout: the block's outputs keep theirs.
    assert all(b.dropout.p == 0.3 for b in apart.encoder.blocks)
    batch, _ = make_batch()
    apart.train()
    torch.manual_seed(0)
    first = apart.encoder(batch)
    assert not torch.equal(first, apart.encoder(batch))
