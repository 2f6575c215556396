"""Petastorm's dataset metadata (`_common_metadata`), written without Petastorm.

Petastorm's readers find a dataset's schema and row-group counts in `_common_metadata`: the
pickled Unischema under `dataset-toolkit.unischema.v1` and {file: row groups} under
`dataset-toolkit.num_row_groups_per_file.v1`, beside the files' own Arrow schema. Where Petastorm
is installed, its materialize_dataset writes them; where it is not (current stacks), the feature
job writes the same file with this module, so Petastorm's readers (on a classic stack) still read
our datasets. Our own reader needs none of it.

The pickle is a constant: the bytes of `pickle.dumps(hvd_ctsm.data.schema.make_schema())` under
Petastorm 0.13.1. A classic-stack test checks that they still are
(tests/integration/test_without_petastorm.py); change it with schema.FIELDS (and SCHEMA_VERSION).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

UNISCHEMA_KEY = b"dataset-toolkit.unischema.v1"
ROW_GROUPS_KEY = b"dataset-toolkit.num_row_groups_per_file.v1"
UNISCHEMA_PICKLE = base64.b64decode(
    "gASVUQMAAAAAAACME3BldGFzdG9ybS51bmlzY2hlbWGUjAlVbmlzY2hlbWGUk5QpgZR9lCiMBV9uYW1llIwLQ3RzbUV4YW1w"
    "bGWUjAdfZmllbGRzlIwLY29sbGVjdGlvbnOUjAtPcmRlcmVkRGljdJSTlClSlCiMCWNsaWVudF9pZJRoAIwOVW5pc2NoZW1h"
    "RmllbGSUk5QoaAyMBW51bXB5lIwEc3RyX5STlCmMEHBldGFzdG9ybS5jb2RlY3OUjAtTY2FsYXJDb2RlY5STlCmBlH2UjAtf"
    "c3BhcmtfdHlwZZSMEXB5c3Bhcmsuc3FsLnR5cGVzlIwKU3RyaW5nVHlwZZSTlCmBlHNiiXSUgZSMC2hpc3RvcnlfbGVulGgO"
    "KGgeaA+MBWludDMylJOUKWgUKYGUfZRoF2gYjAtJbnRlZ2VyVHlwZZSTlCmBlHNiiXSUgZSMBGl0ZW2UaA4oaChoIE6FlGgS"
    "jAxOZGFycmF5Q29kZWOUk5QpgZSJdJSBlIwKZXZlbnRfdHlwZZRoDihoL2ggaCloKymBlIl0lIGUjAV2YWx1ZZRoDihoM2gP"
    "jAdmbG9hdDMylJOUaCloKymBlIl0lIGUjAl0aW1lc3RhbXCUaA4oaDloD4wFaW50NjSUk5RoKWgrKYGUiXSUgZSMB2xvZ19n"
    "YXCUaA4oaD9oNWgpaCspgZSJdJSBlIwMY2xpZW50X2F0dHJzlGgOKGhDaCBOToaUaCspgZSJdJSBlIwKdGFyZ2V0X3Bvc5Ro"
    "DihoSGggaCloKymBlIl0lIGUjAt0YXJnZXRfaXRlbZRoDihoTGggaCloKymBlIl0lIGUjAx0YXJnZXRfbGFiZWyUaA4oaFBo"
    "NWgpaCspgZSJdJSBlIwLdGFyZ2V0X3RpbWWUaA4oaFRoO2gpaCspgZSJdJSBlIwNdGFyZ2V0X2xvZ19kdJRoDihoWGg1aClo"
    "KymBlIl0lIGUjAtwcmlvcl9pdGVtc5RoDihoXGggaCloKymBlIl0lIGUjAxjbGllbnRfaXRlbXOUaA4oaGBoIGgpaCspgZSJ"
    "dJSBlHVoDGgdaB5oJ2goaC5oL2gyaDNoOGg5aD5oP2hCaENoR2hIaEtoTGhPaFBoU2hUaFdoWGhbaFxoX2hgaGN1Yi4="
)


def write_common_metadata(folder: Path) -> None:
    """`folder`/_common_metadata for the Parquet files in it, as Petastorm writes it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hvd_ctsm.files.atomic import atomic_write_bytes

    files = sorted(folder.glob("*.parquet"))
    if not files:
        raise ValueError(f"{folder} holds no Parquet files to describe")
    counts = {f.name: pq.ParquetFile(f).num_row_groups for f in files}
    schema = pq.read_schema(files[0])
    metadata = dict(schema.metadata or {})
    metadata |= {UNISCHEMA_KEY: UNISCHEMA_PICKLE, ROW_GROUPS_KEY: json.dumps(counts).encode()}
    sink = pa.BufferOutputStream()
    pq.write_metadata(schema.with_metadata(metadata), sink)
    atomic_write_bytes(folder / "_common_metadata", sink.getvalue().to_pybytes())
