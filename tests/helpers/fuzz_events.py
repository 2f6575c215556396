"""Generated event rows for the validator's property tests (both tiers use the same ones)."""

from hypothesis import strategies as st

MAX_TS = 2_000_000_000
TYPES = ["purchase", "rating", "view", "profile"]
# Text that looks almost right is where validators break: padded, signed, exponent, special.
numeric_text = st.one_of(
    st.integers(-(10**20), 10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.from_regex(r"\A[ \t]?[-+]?(\d{1,12}\.?\d{0,3}|\.\d{1,3})([eE][-+]?\d{1,3})?[ \t]?\Z"),
    st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "-INFINITY", "+inf", "1e400",
                     "-1e400", "0x10", "1_000", "", " ", "  7  ", "5.", ".5", "--1"]),
)
garbage_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
ids = st.one_of(st.none(), st.sampled_from(["", " ", "c1", " c1 ", "c2", "\tc3"]),
                garbage_text)
event_types = st.one_of(st.none(), st.sampled_from(TYPES),
                        st.sampled_from(TYPES).map(lambda t: f" {t.upper()} "),
                        st.text("abcdefghijklmnopqrstuvwxyz ", max_size=10))
# Timestamps: numeric text and text no date parser accepts (ISO text is Spark's own parser).
timestamps = st.one_of(st.none(), numeric_text, st.text("xyz!?_", min_size=1, max_size=6))
values = st.one_of(st.none(), numeric_text, garbage_text)
rows = st.tuples(ids, ids, timestamps, event_types, values)
# Many exact copies: duplicates are one of the reasons, and the hardest to count right.
batches = st.lists(rows, max_size=60).flatmap(
    lambda base: st.lists(st.sampled_from(base), max_size=80).map(lambda extra: base + extra)
    if base else st.just(base))
