"""Peer trainers measured against hvdtrain at the same setting (BENCHMARKS.md, "Against
other ways to train"); not part of hvdtrain's training path, and not tests."""
