"""Components on tiny real data and the real entry points at 2 ranks: Spark, Horovod and
torchrun workers, wheels, the pipeline."""
