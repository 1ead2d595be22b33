"""Orchestration of one training run: what the `hvdtrain train` command does."""
