"""Lab 2's sample submissions for the grader's sample class (see fuselab/samples.py).

grade ids: test_fold_weights (2), test_fold_module (2), test_fold_refuses (1), test_fold_network (3),
test_fused (2), test_in_registers (1), test_speedup (4); written answers are graded by hand and not listed.

The three classic folding bugs live in the Python fold, so they cost parts A and B and nothing in part C, whose
kernels get their folded parameters from the lab (torch's own fold), not from the student's.
"""

import re

from ..sample import Sample

_FOLD_BUGS = {"test_fold_weights": "zero", "test_fold_module": "zero", "test_fold_network": "zero"}


def _drop_training_check(source: str) -> str:
    """fold_conv_bn without its `if bn.training: raise ValueError(...)`: it folds whatever it is given."""
    return re.sub(r"    if bn\.training:\n.*?(?=    if bn\.running_mean is None)", "", source, count=1, flags=re.S)


SAMPLES = {
    "correct": Sample(why="the instructor's plain solution"),
    "missing_bias": Sample(
        changes={"fold_weights": lambda s: s.replace(
            "conv_b = torch.zeros_like(bn_mean)",
            "return w_folded.detach().to(conv_w.dtype), torch.zeros_like(bn_mean)  # no bias to fold")},
        expect=dict(_FOLD_BUGS),
        why="a conv without bias gets a zero folded bias: the BN's β − μ·γ/√(σ²+ε) shift is lost"),
    "no_eps": Sample(
        changes={"fold_weights": lambda s: s.replace("torch.rsqrt(bn_var.to(compute) + bn_eps)",
                                                     "torch.rsqrt(bn_var.to(compute))")},
        expect=dict(_FOLD_BUGS),
        why="eps left out of the square root: wrong where a channel's variance is small, inf where it is 0"),
    "train_mode": Sample(
        changes={"fold_module": _drop_training_check},
        expect={"test_fold_refuses": "zero"},
        why="folds a BN in training mode instead of refusing: its batch statistics are not what eval mode uses"),
    "no_relu": Sample(
        changes={"fused_source": lambda s: s.replace("out[i] = fmaxf(acc, 0.0f);", "out[i] = acc;")},
        expect={"test_fused": "zero", "test_speedup": "zero"},
        why="the fused kernel forgets the ReLU: the folded conv alone is not Conv+BN+ReLU"),
}

# fold_conv_bn the way torch.nn.utils.fusion.fuse_conv_bn_eval writes it: deepcopy, then new Parameters; with
# getattr defaults, a module-level tuple of classes and `import copy`. Honest code: full marks, nothing flagged.
_FUSION_STYLE = '''import copy

BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def fold_conv_bn(conv, bn):
    # Return a new conv module equal to bn(conv(x)) in eval mode; raise ValueError where folding is not valid.
    if not isinstance(bn, BATCHNORMS):
        raise ValueError(f"expected a BatchNorm, got {type(bn).__name__}")
    if getattr(bn, "training", False):
        raise ValueError("BatchNorm in training mode: fold only in eval mode (model.eval())")
    if getattr(bn, "running_mean", None) is None:
        raise ValueError("BatchNorm without running statistics: there is nothing fixed to fold")
    fused = copy.deepcopy(conv)
    weight, bias = fold_conv_bn_weights(conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps,
                                        getattr(bn, "weight", None), getattr(bn, "bias", None))
    fused.weight = nn.Parameter(weight, requires_grad=conv.weight.requires_grad)
    fused.bias = nn.Parameter(bias, requires_grad=conv.weight.requires_grad)
    fused.padding_mode = getattr(conv, "padding_mode", "zeros")
    return fused.eval()
'''

SAMPLES.update({
    "honest_idioms": Sample(
        changes={"fold_module": _FUSION_STYLE},
        why="deepcopy + nn.Parameter assignment, getattr with defaults, a non-literal module constant, "
            "import copy: idioms PyTorch itself uses, full marks and no flag"),
    "fast_but_wrong": Sample(
        changes={"fused_source": lambda s: s.replace("int64_t total = (int64_t)N * C * H * W;",
                                                     "int64_t total = (int64_t)N * C * H * (W & ~1);")},
        expect={"test_fused": "zero", "test_speedup": "zero"},
        why="launches too few threads when the width is odd, so the output's tail is never written: right (and "
            "fast) at the timed shape, wrong at the tests' odd widths; speed counts only for a correct kernel"),
})
