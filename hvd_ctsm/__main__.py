"""`python -m hvd_ctsm STEP ...`: the same as the `hvd-ctsm` command (hvd_ctsm.cli)."""

if __name__ == "__main__":
    from hvd_ctsm.cli import cli

    cli()
