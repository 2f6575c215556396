"""The network and its file.

- `ctsm`: the CTSM encoder (a causal, temporally-masked transformer) and its heads' wiring;
- `heads`: the next-item and p(sale) heads; `catalog`: losses and scores over an item catalog
  of any size, in chunks, without a [targets x items] tensor;
- `checkpoint`: a model's state on disk, written atomically.

The network imports only torch: it knows nothing of ranks, datasets or configs' files.
`checkpoint` may also import `hvd_ctsm.files`.
"""
