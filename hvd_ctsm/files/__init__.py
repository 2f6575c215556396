"""Where the project's files go, and how they get there safely (standard library only: the
Spark job imports this on executors without torch).

- `storage`: a local path or an fsspec URL (s3://, hdfs://, ...), one error per unreachable URL;
- `atomic`: a file written whole or not at all;
- `outputs`: the marker in every folder we create, and the rules for replacing one.
- `holds`: one process at a time in a run folder or a pipeline's `--work` (NFS included).

Imports nothing else of ours.
"""
