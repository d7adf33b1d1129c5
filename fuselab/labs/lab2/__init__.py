"""Lab 2: Conv+BN folding.

In eval mode BatchNorm is a per-channel affine map, y = γ·(x − μ)/√(σ² + ε) + β, so it folds into the convolution
before it: W' = W·s and b' = (b − μ)·s + β per output channel, with s = γ/√(σ² + ε). No kernel is left for the BN.

Part A folds the parameters (Python, graded on the CPU), part B folds a whole network, part C fuses the folded
depthwise 3×3 conv with its ReLU in one kernel and measures it against the lab's fixed unfused reference: a conv
kernel, a BN kernel and a ReLU kernel, with two intermediates through DRAM.

The lab's sections are modules of this package: ``kernels`` (launchers, reference kernels, inputs, part C),
``fold`` (part A), ``networks`` (part B) and ``gpu_timing``; the notebook uses their names from here.
"""

from ..lab0 import saved_results  # noqa: F401 - the same reader of the course GPU's saved measurements
from .kernels import (
    BATCHNORM, CONTEXT_RESULTS, CONTEXT_SHAPES, DEPTHWISE_CONV, EPS, FOLDED, GPU_SHAPES, GRADED_TEST,
    HIDDEN_SMALL_SHAPES, IN_REGISTERS, LAUNCH_BOUND_SHAPE, NETWORK_RESULTS, NOTEBOOK, REFERENCE_SOURCES,
    REFERENCE_UNFUSED_SOURCE, RELU, SMALL_SHAPES, SOLUTION_SOURCES, STARTER_SOURCE, TIMED_SHAPE, UNFUSED_LAUNCHERS,
    build_reference, build_starter, bytes_moved, conv_bn, eager, fused, in_registers, make_inputs,
    reference, tuned_op, unfused, VarianceSpread,
)
from .fold import (
    FOLD_CASES, HIDDEN_FOLD_CASES, check_fold_module, check_fold_weights, check_pair_refusals, conv_bn_tensors,
    float64_fold, float64_fold_exact, make_conv_bn, name_of, randomize_bn,
)
from .networks import (
    BNAfterActivation, DepthwiseSeparable, HIDDEN_NETWORK_SEEDS, MobileNetLike, NETWORK_BATCHES, Network,
    ResidualConvBN, SharedConvOutput, TIMED_MOBILENET, TINY_MOBILENET, _bn_calls, check_fold_network,
    check_network_refusal, conv_bn_relu, hidden_networks, mobilenet, pair_across_containers, random_network,
    tricky_network, visible_networks,
)
from .gpu_timing import measure_context, plot_context, time_network_both_ways, time_network_stream, time_networks


def check_refusals(fold_conv_bn=None, fold_network=None):
    """Folding must refuse a BN in training mode and a BN without running statistics, with a ValueError that
    says why (``fold_conv_bn``, part A); so must the network pass on a model in training mode (``fold_network``,
    part B)."""
    if fold_conv_bn is not None:
        check_pair_refusals(fold_conv_bn)
        print(f"✓ {name_of(fold_conv_bn)}: refuses a BatchNorm in training mode and one without running statistics")
    if fold_network is not None:
        check_network_refusal(fold_network)
        print(f"✓ {name_of(fold_network)}: refuses a model in training mode")


# ------------------------------------------------------------------------------------------------ declaration
from ..registry import GradedTest, Lab  # noqa: E402 - the declaration closes the module

LAB = Lab(
    name="lab2", title="Conv + BatchNorm folding", notebook=NOTEBOOK, package=__name__,
    launchers=SOLUTION_SOURCES, reference_sources=REFERENCE_SOURCES,
    graded_cells={"test_fold_weights": 2, "test_fold_module": 2, "test_fold_refuses": 1, "test_fold_network": 3,
                  "test_fused": 2, "test_in_registers": 1, "test_speedup": 4},
    written_answers={"answer_train_mode": 1, "answer_in_registers": 1},
    graded_tests=(GradedTest(GRADED_TEST, "test_speedup", mode="device", shape=TIMED_SHAPE, dtype="float32",
                             speed_requires=("test_fused",), tuned_op="tuned_op"),),
)
