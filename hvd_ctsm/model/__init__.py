"""The network and its file.

- `ctsm`: the CTSM encoder (a causal, temporally-masked transformer) and its heads' wiring;
- `heads`: the next-item and p(sale) heads; `catalog`: losses and scores over an item catalog
  of any size, in chunks, without a [targets x items] tensor;
- `topk`: the top-K items of many clients, in item chunks (batch scoring and the pyfunc);
- `checkpoint`: a model's state on disk, written atomically, and the one model loader
  (`load_model`: a registry, a run folder or a model.pt).

The network (ctsm, heads, catalog) imports only torch and the typed config it is built from,
`CTSM(sizes, ModelConfig)`: it knows nothing of ranks, datasets or config files. Every default
of the network is ModelConfig's (hvd_ctsm.config.model_config), written once.
`checkpoint` may also import `hvd_ctsm.files`, `topk` `hvd_ctsm.data` (batches).
"""
