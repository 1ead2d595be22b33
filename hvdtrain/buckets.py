"""How sync mode groups gradients for allreduce (`--bucket-mb`): pure functions.

Back-propagation produces the last layers' gradients first. A group goes out as soon
as its own gradients exist, while the earlier layers are still being computed, so
what is left exposed after back-propagation is roughly the last group (the first
layers) plus whatever the network has not yet carried. Two forces set the size:
- too large, and everything waits for the end: a fixed 25 MB (PyTorch DDP's default)
  holds all of a small model's gradients (ResNet-20's 1.08 MB, LeNet's 0.25 MB) in one
  group that leaves only when back-propagation has finished;
- too small, and every group pays a negotiation and a round trip.

`auto` sizes groups relative to the model: its gradient bytes in about
`AUTO_GROUPS` groups. BENCHMARKS.md ("Gradient groups") has the measurements behind
the choice.

Specs: "auto"; "auto:K" (K groups); a number of MB ("25"; "0" for one group). The
grouping itself, for a cap, is `hvdtrain.rounds.averaging.gradient_buckets`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hvdtrain.rounds.averaging import gradient_buckets  # the grouping itself, for a cap

# Gradient groups sized to the model (hvdtrain.buckets): a fixed 25 MB left a small
# model's gradients in one group that could leave only after back-propagation.
DEFAULT_BUCKET_MB = "auto"

__all__ = ["AUTO_GROUPS", "DEFAULT_BUCKET_MB", "BucketSpec", "gradient_buckets", "parse_bucket_spec"]

AUTO_GROUPS = 8


@dataclass(frozen=True)
class BucketSpec:
    """Either a fixed cap in MB, or a number of groups to split the model's gradients into."""

    cap_mb: float | None = None
    groups: int | None = None

    def cap_bytes(self, sizes: Sequence[int]) -> float:
        """The cap for gradients of these sizes (bytes); 0 means one group."""
        if self.groups is None:
            return self.cap_mb * 1e6
        total = sum(sizes)
        return total / self.groups if total else 0.0

    def __str__(self) -> str:
        if self.groups is None:
            return f"{self.cap_mb:g}"
        return "auto" if self.groups == AUTO_GROUPS else f"auto:{self.groups}"


def parse_bucket_spec(text) -> BucketSpec:
    """'auto' | 'auto:K' | MB (a number >= 0); ValueError naming the value otherwise."""
    spec = str(text).strip().lower()
    if spec == "auto":
        return BucketSpec(groups=AUTO_GROUPS)
    if spec.startswith("auto:"):
        groups = spec[5:]
        if groups.isdigit() and int(groups) > 0:
            return BucketSpec(groups=int(groups))
    else:
        try:
            cap = float(spec)
        except ValueError:
            cap = -1.0
        if 0 <= cap < float("inf"):
            return BucketSpec(cap_mb=cap)
    raise ValueError(f"--bucket-mb takes auto, auto:K (K groups) or a number of MB >= 0, "
                     f"got {text!r}")
