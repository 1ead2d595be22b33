"""Sync mode's gradient groups (--bucket-mb): specs and the caps they give."""

import pytest

from hvdtrain.buckets import AUTO_GROUPS, BucketSpec, gradient_buckets, parse_bucket_spec
from hvdtrain.config import load_config
from hvdtrain.errors import ConfigError

# ResNet-20's gradients, roughly: many small convolutions and a small last layer (bytes).
RESNET20_LIKE = [1728] + [9216] * 6 + [18432] + [36864] * 5 + [73728] + [147456] * 5 + [2560]


@pytest.mark.parametrize("text, spec", [
    ("auto", BucketSpec(groups=AUTO_GROUPS)), ("AUTO:3", BucketSpec(groups=3)),
    ("25", BucketSpec(cap_mb=25.0)), (0.5, BucketSpec(cap_mb=0.5)), ("0", BucketSpec(cap_mb=0.0)),
])
def test_specs_name_groups_or_a_size(text, spec):
    assert parse_bucket_spec(text) == spec
    assert parse_bucket_spec(str(spec)) == spec  # what a run records reads back the same


@pytest.mark.parametrize("text", ["-1", "auto:0", "auto:x", "big", "inf", ""])
def test_a_bad_spec_is_one_line_naming_it(text):
    with pytest.raises(ValueError, match=r"--bucket-mb takes auto, auto:K .* got '"):
        parse_bucket_spec(text)
    with pytest.raises(ConfigError, match="--bucket-mb takes auto"):
        load_config(None, dict(bucket_mb=text))


def test_auto_splits_a_small_model_that_a_fixed_25_mb_would_send_whole():
    assert len(gradient_buckets(RESNET20_LIKE, BucketSpec(cap_mb=25).cap_bytes(RESNET20_LIKE))) == 1
    groups = gradient_buckets(RESNET20_LIKE, parse_bucket_spec("auto").cap_bytes(RESNET20_LIKE))
    # About AUTO_GROUPS groups (greedy filling can leave one more), last layers first.
    assert AUTO_GROUPS <= len(groups) <= AUTO_GROUPS + 1
    assert groups[0][0] == len(RESNET20_LIKE) - 1
    assert sorted(i for g in groups for i in g) == list(range(len(RESNET20_LIKE)))


def test_a_cap_in_mb_does_not_depend_on_the_model_and_auto_has_nothing_to_split_when_empty():
    assert BucketSpec(cap_mb=0.1).cap_bytes([10, 20]) == 1e5
    assert BucketSpec(groups=4).cap_bytes([]) == 0.0


def test_yaml_numbers_are_taken_as_sizes_in_mb():
    assert load_config(None, dict(bucket_mb=25)).bucket_mb == "25"
    assert load_config(None, {}).bucket_mb == "auto"


def test_bench_takes_one_sync_setup_per_bucket_spec_and_refuses_a_bad_one():
    from hvdtrain.benchmarks.bench import parse_bucket_list
    assert parse_bucket_list("25, auto,auto:4") == ["25", "auto", "auto:4"]
    with pytest.raises(ConfigError, match="got 'x'"):
        parse_bucket_list("auto,x")
