"""Spark jobs that build time-safe per-client sequences as Petastorm datasets."""
