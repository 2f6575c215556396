"""Input pipeline: what Petastorm reading delivers per rank against what the trainer consumes.

    python benchmarks/input_pipeline.py --data FEATURES [--scaling results/scaling.json]

Reads each rank's shard (np=2 sharding) through the trainer's own reader (`train_batches`: Petastorm
rows decoded, shuffled and collated into padded batches), in turn with our .npy decoder and with
Petastorm's own (np.load per cell), repeats times, one torch thread. The trainer's consumption per
rank and its share of step time spent waiting for data come from the scaling benchmark's np=2 runs
of the same data (its train_log.jsonl timers), when given.

The data wait of a one-epoch run is mostly the first fill of the shuffle buffer, paid once per
job; later epochs' readers open ahead, while the previous epoch validates. So the trainer also
runs a few epochs at np=2, logging once per epoch, and the wait is reported for the first epoch
and for the later ones apart.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, horovodrun, run, save, spread, work_folder  # noqa: E402
from benchmarks.scaling import trainer_args  # noqa: E402

# Readers compared: the default (pyarrow alone), Petastorm's reader with our .npy decoder (the
# default until 2026-11), and Petastorm's reader with its own np.load decoder.
READERS = {"arrow": ("arrow", True), "ours": ("petastorm", True),
           "petastorm_np_load": ("petastorm", False)}


def read_shard(data: Path, rank: int, size: int, batch_size: int, variant: str) -> float:
    """Rows per second of one epoch of one rank's shard."""
    import hvd_ctsm.data.npy_codec as npy_codec
    from hvd_ctsm.data.batches import plan_epoch, read_metadata, split_url, train_batches

    reader, fast = READERS[variant]
    meta, url = read_metadata(data), split_url(data, "train")
    plan = plan_epoch(url, size, batch_size)
    switch, before = npy_codec.use_fast_decoding, os.environ.get("HVD_CTSM_READER")
    os.environ["HVD_CTSM_READER"] = reader
    if not fast:  # Petastorm's own decoder: leave the loaded schema's codecs as they are
        npy_codec.use_fast_decoding = lambda schema: 0
    try:
        t0, rows = time.perf_counter(), 0
        for batch in train_batches(url, rank, size, 0, plan, batch_size, meta.max_len,
                                   seed=0):
            rows += batch["item"].shape[0]
        return rows / (time.perf_counter() - t0)
    finally:
        npy_codec.use_fast_decoding = switch
        if before is None:
            os.environ.pop("HVD_CTSM_READER")
        else:
            os.environ["HVD_CTSM_READER"] = before


def trainer_side(scaling: Path | None) -> dict | None:
    if not scaling or not scaling.exists():
        return None
    runs = json.loads(scaling.read_text())["runs"]["np2"]
    return {"rows_per_s_per_rank": spread(r["rows_per_s"] / r["ranks"] for r in runs),
            "data_wait_share": spread(r["shares"].get("data", 0.0) for r in runs)}


def data_wait_by_epoch(data: Path, work: Path, config: str | None, epochs: int) -> list[float]:
    """One np=2 training run of `epochs` epochs, logged once per epoch: each epoch's data share
    (averaged over ranks by the trainer)."""
    from benchmarks.trainer_ab import steps_per_epoch

    steps = steps_per_epoch(data, config, 2)
    out = work / "trainer"
    args = trainer_args(data, out, config, [f"epochs={epochs}", f"log_every_steps={steps}"])
    run(horovodrun(2, args), work / "trainer.log")
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return [r.get("time_share/data", 0.0) for r in records]


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, type=Path, help="feature job output folder")
    p.add_argument("--batch-size", type=int, default=32, help="as the trainer's data.batch_size")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--scaling", type=Path, help="scaling.json of the same data")
    p.add_argument("--config", default=None, help="trainer preset for the multi-epoch run")
    p.add_argument("--epochs", type=int, default=3, help="epochs of the multi-epoch run")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    repeats = 1 if args.quick else args.repeats
    rates = {name: [] for name in READERS}
    for _ in range(repeats):
        for name in READERS:
            per_rank = [read_shard(args.data, r, 2, args.batch_size, name) for r in range(2)]
            rates[name].append(min(per_rank))  # the slower shard paces the job
    reading = {name: spread(values) for name, values in rates.items()}
    by_epoch = []
    for _ in range(repeats):
        with work_folder(prefix="bench-input-") as tmp:
            by_epoch.append(data_wait_by_epoch(args.data, Path(tmp), args.config,
                                               2 if args.quick else args.epochs))
    payload = {"data": args.data.name, "batch_size": args.batch_size, "repeats": repeats,
               "read_rows_per_s_per_rank": reading,
               "decoder_speedup": reading["ours"]["median"]
               / reading["petastorm_np_load"]["median"],
               "trainer": trainer_side(args.scaling),
               "data_wait_by_epoch": {
                   "runs": by_epoch,
                   "first_epoch": spread(r[0] for r in by_epoch),
                   "later_epochs": spread(x for r in by_epoch for x in r[1:])}}
    save("input_pipeline", payload, args.out)
    print(json.dumps({k: v for k, v in payload.items() if k != "trainer"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
