"""hvdtrain's public Keras 3 layer in users' own scripts, under real horovodrun jobs."""

import ast
import os
import re

import numpy as np
import pytest

from conftest import HERE, horovodrun, load_rank_files

ROOT = os.path.dirname(HERE)
pytestmark = pytest.mark.multiprocess


def readme_example(marker: str = "readme-example", page: str = "README.md") -> str:
    """A marked example as printed: the README's script, or a guide's continuation of it."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as fh:
        text = fh.read()
    block = re.search(rf"<!-- {marker}: begin -->\n```python\n(.*?)```\n"
                      rf"<!-- {marker}: end -->", text, re.S)
    assert block, f"{page} lost its marked model.fit example ({marker})"
    return block.group(1)


def _compile_calls(script: str) -> list[ast.Call]:
    return [node for node in ast.walk(ast.parse(script)) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == "compile"]


def test_the_readme_example_compiles_without_xla_as_a_gpu_host_needs():
    """Keras's jit_compile="auto" compiles the whole step with XLA on a GPU, which Horovod's
    ops in it cannot be: the example a user copies says jit_compile=False (issue 46)."""
    calls = _compile_calls(readme_example())
    assert calls, "the README's example has no compile call"
    for call in calls:
        jit = {k.arg: k.value for k in call.keywords}.get("jit_compile")
        assert isinstance(jit, ast.Constant) and jit.value is False, ast.unparse(call)


@pytest.mark.ci
@pytest.mark.long  # a two-worker job of 25 seconds here
def test_readme_example_runs_on_two_workers_and_ends_in_consensus(tmp_path):
    # The example as printed, plus a few lines that save what each rank ends with.
    script = tmp_path / "train.py"
    script.write_text(readme_example() + (
        "np.savez(f'final-rank{hk.rank()}.npz', weights=np.concatenate(\n"
        "    [w.numpy().ravel() for w in model.weights]), rounds=callbacks[0].rounds,\n"
        "    dropout_seeds=[v.numpy() for v in model.non_trainable_variables\n"
        "                   if v.path.endswith('seed_generator_state')])\n"))
    result = horovodrun(str(script), cwd=str(tmp_path))
    ranks = load_rank_files(str(tmp_path), "final")
    np.testing.assert_array_equal(ranks[0]["weights"], ranks[1]["weights"])
    # hk.reseed_dropout gave each worker its own dropout stream; the rounds left it alone.
    assert ranks[0]["dropout_seeds"].size > 0
    assert not np.array_equal(ranks[0]["dropout_seeds"], ranks[1]["dropout_seeds"])
    # 60 steps, a round every 2: 15 an epoch, the epoch end's round among them.
    assert int(ranks[0]["rounds"]) == int(ranks[1]["rounds"]) == 60 // 2
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["1.weights.h5", "2.weights.h5"]
    assert "Epoch 2/2" in result.stdout and "[1]<stdout>:Epoch" not in result.stdout


@pytest.mark.long  # 34 s; timed rounds' wiring has its real job in make test (test_timed_rounds)
def test_readme_timed_rounds_example_ends_each_fit_in_consensus_at_the_same_round(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(readme_example() + readme_example("readme-example-timed",
                                                           "docs/keras-layer.md") + (
        "np.savez(f'final-rank{hk.rank()}.npz', weights=np.concatenate(\n"
        "    [w.numpy().ravel() for w in model.weights]), rounds=timed.rounds,\n"
        "    examples=timed.progress.examples, steps=timed.progress.steps_by_worker(2))\n"))
    horovodrun(str(script), cwd=str(tmp_path))
    ranks = load_rank_files(str(tmp_path), "final")
    np.testing.assert_array_equal(ranks[0]["weights"], ranks[1]["weights"])
    for key in ("rounds", "examples", "steps"):
        np.testing.assert_array_equal(ranks[0][key], ranks[1][key])
    # Two epochs of 2,048 examples, each ended at a round that found it complete.
    assert int(ranks[0]["examples"]) >= 2 * 2048
    assert int(ranks[0]["examples"]) == 32 * int(np.sum(ranks[0]["steps"]))


@pytest.fixture(scope="module")
def layer_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("keras_layer")
    horovodrun("keras_layer_worker.py", str(root))
    return str(root)


@pytest.mark.ci
@pytest.mark.long  # a two-worker job of 25 seconds here
def test_local_sgd_finds_gradient_averaging_wrapped_around_a_loss_scale_optimizer(layer_results):
    ranks = load_rank_files(layer_results, "local")
    # The warm start's 4 steps averaged their gradients; the 12 local steps after did not.
    assert [int(r["averaged_steps"]) for r in ranks] == [4, 4]
    np.testing.assert_array_equal(ranks[0]["weights"], ranks[1]["weights"])


@pytest.mark.ci
@pytest.mark.long  # their two-worker job takes 25 seconds here
def test_a_second_fit_keeps_each_workers_own_momentum_and_broadcasts_nothing(layer_results):
    ranks = load_rank_files(layer_results, "local")
    # Rank 1 starts the second fit with the momentum it ended the first with, not rank 0's.
    for r in ranks:
        np.testing.assert_array_equal(r["momentum_at_begin"][1], r["momentum_at_end"][0])
    assert not np.array_equal(ranks[0]["momentum_at_end"][0], ranks[1]["momentum_at_end"][0])
    # One broadcast, not one per fit: the 18 float32 weights and their momentum (144
    # bytes), plus the optimizers' few scalars (step counters, rate, loss scale).
    sent = int(ranks[0]["broadcast_bytes"])
    assert sent == int(ranks[1]["broadcast_bytes"])
    assert 2 * 18 * 4 < sent < 2 * (2 * 18 * 4)


@pytest.mark.ci
@pytest.mark.long  # their two-worker job takes 25 seconds here
def test_sync_layer_with_loss_scaling_keeps_ranks_identical_and_skips_overflow_together(
        layer_results):
    ranks = load_rank_files(layer_results, "sync")
    # Identical after every step, though the ranks started from different weights.
    np.testing.assert_array_equal(ranks[0]["weights"], ranks[1]["weights"])
    np.testing.assert_array_equal(ranks[0]["scales"], ranks[1]["scales"])
    weights, scales = ranks[0]["weights"], ranks[0]["scales"]
    poisoned = 3 - 1  # index of step 3 in the per-step records
    # Only rank 1's batch overflowed, yet both skipped that update and halved the scale.
    assert not np.array_equal(weights[poisoned - 1], weights[poisoned - 2])
    np.testing.assert_array_equal(weights[poisoned], weights[poisoned - 1])
    assert scales[poisoned] == scales[poisoned - 1] / 2
    assert np.isfinite(weights).all()
    assert int(ranks[0]["averaged_steps"]) == 6
