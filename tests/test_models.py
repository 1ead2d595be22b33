import numpy as np
import pytest

from hvdtrain.config import MODELS, STATISTICS_SHARE
from hvdtrain.errors import ConfigError
from hvdtrain.models import build_model, model_names


def test_the_config_lists_exactly_the_registered_models():
    assert sorted(MODELS) == model_names() and len(set(MODELS)) == len(MODELS)


@pytest.mark.parametrize("name", model_names())
def test_the_plans_share_of_batch_norm_statistics_is_the_built_models(name):
    model = build_model(name, (28, 28, 1), 10)
    weights = sum(int(v.shape.num_elements()) for v in model.trainable_variables)
    statistics = sum(int(v.shape.num_elements()) for v in model.non_trainable_variables
                     if v.dtype in ("float32", "float16", "float64"))
    assert STATISTICS_SHARE.get(name, 0.0) == pytest.approx(statistics / weights, rel=0.01)


@pytest.mark.parametrize("name, input_shape, params", [
    ("lenet", (28, 28, 1), 61_706),          # LeNet-5
    ("resnet20", (32, 32, 3), 271_098),      # He et al.: 0.27 M
    ("resnet32", (32, 32, 3), 466_426),      # 0.46 M
    ("resnet56", (32, 32, 3), 857_082),      # 0.85 M
])
def test_parameter_counts_match_the_references(name, input_shape, params):
    assert build_model(name, input_shape, 10).count_params() == params


@pytest.mark.parametrize("name", model_names())
@pytest.mark.parametrize("input_shape, classes", [((8, 8, 1), 3), ((28, 28, 1), 10), ((20, 24, 3), 7)])
def test_models_take_any_small_input_and_output_logits(name, input_shape, classes):
    model = build_model(name, input_shape, classes)
    out = model(np.zeros((2, *input_shape), np.float32))
    assert out.shape == (2, classes) and out.dtype.name == "float32"


def test_alexnet_has_the_papers_61_million_parameters_at_224_and_227():
    for side in (224, 227):
        model = build_model("alexnet", (side, side, 3), 1000)
        assert model.count_params() == 60_965_224
        assert model.get_layer("pool5").output.shape[1:] == (6, 6, 256)
    assert build_model("alexnet-lrn", (227, 227, 3), 1000).count_params() == 60_965_224


def test_resnet50_v1_5_has_25_6_million_parameters_and_strides_on_the_3x3():
    model = build_model("resnet50", (224, 224, 3), 1000)
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert trainable == 25_557_032  # torchvision's count: BatchNorm moving statistics excluded
    assert model.get_layer("conv3_block1_2_conv").strides == (2, 2)
    assert model.get_layer("conv3_block1_1_conv").strides == (1, 1)
    assert model.get_layer("avg_pool").output.shape[-1] == 2048


def test_unknown_model_and_too_small_input_are_config_errors():
    with pytest.raises(ConfigError, match="--model must be one of .*got 'vgg'"):
        build_model("vgg", (28, 28, 1), 10)
    with pytest.raises(ConfigError, match="lenet needs images of at least 4x4, got 3x3"):
        build_model("lenet", (3, 3, 1), 10)
