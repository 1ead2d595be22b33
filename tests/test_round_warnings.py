"""Rank 0's warnings about rounds before training starts (hvdtrain.training.world)."""

import pytest

from hvdtrain.config import load_config
from hvdtrain.training.world import int8_moments_warning


@pytest.mark.parametrize("overrides, workers, warned", [
    ({"optimizer": "lamb"}, 16, True),
    ({"optimizer": "adam"}, 4, True),
    ({}, 16, True),                              # auto takes LAMB at 16 x 64
    ({}, 8, False),                              # and SGD at 8 x 64: momentum fares well
    ({"optimizer": "lamb", "round_compression": "none"}, 16, False),
    ({"optimizer": "lamb", "round_compression": "fp16"}, 16, False),
    ({"optimizer": "lamb", "average_optimizer_state": False}, 16, False),
    ({"optimizer": "lamb"}, 1, False),           # one worker has no rounds
])
def test_int8_rounds_that_would_carry_adams_moments_are_named_before_training(
        overrides, workers, warned):
    cfg = load_config(None, {"mode": "local", "average_optimizer_state": True,
                             "round_compression": "int8", **overrides})
    line = int8_moments_warning(cfg, workers)
    assert (line is not None) == warned
    if warned:
        assert line.startswith("hvdtrain: warning: --average-optimizer-state sends ")
        assert "--round-compression none" in line and "\n" not in line
