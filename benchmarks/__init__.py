"""Benchmarks of rocketmq-spark: ``python -m benchmarks [--quick]``."""
