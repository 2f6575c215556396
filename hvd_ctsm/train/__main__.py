"""`python -m hvd_ctsm.train`: the trainer's program (hvd_ctsm.train.launch).

A module of its own, so that the training loop (hvd_ctsm.train) never imports the program that
chooses between it and the elastic loop, which is built from its parts.
"""

from hvd_ctsm.train.launch import cli

cli()
