"""Lab 2's sample submissions for the grader's sample class (see fuselab/course/sample_class.py).

grade ids: test_fold_weights (2), test_fold_module (2), test_fold_refuses (1), test_fold_network (3),
test_fused (2), test_in_registers (1), test_speedup (4); written answers are graded by hand and not listed.

The three classic folding bugs live in the Python fold, so they cost parts A and B and nothing in part C, whose
kernels get their folded parameters from the lab (torch's own fold), not from the student's.
"""

import re

from ..registry import Sample

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

# fold_network that "folds" nothing: each foldable BatchNorm module call becomes an F.batch_norm call on the same
# running statistics. Outputs, count and the number of BatchNorm *modules* run were all right; every BN still runs.
_FUNCTIONAL_BN = '''def fold_network(model):
    # Return (folded_model, number_of_pairs_folded) for an eval-mode model; the original is left unchanged.
    if model.training:
        raise ValueError("the model is in training mode: BN folding is valid only in eval mode (model.eval())")
    traced = fx.symbolic_trace(copy.deepcopy(model))
    modules = dict(traced.named_modules())
    count = 0
    for node in list(traced.graph.nodes):
        if node.op != "call_module" or not isinstance(modules[node.target], nn.BatchNorm2d):
            continue
        source = node.args[0]
        if not (isinstance(source, fx.Node) and source.op == "call_module"
                and isinstance(modules[source.target], nn.Conv2d) and len(source.users) == 1):
            continue
        bn, graph, t = modules[node.target], traced.graph, node.target
        with graph.inserting_before(node):
            stats = [graph.get_attr(f"{t}.{name}") for name in ("running_mean", "running_var")]
            affine = [graph.get_attr(f"{t}.{name}") if bn.affine else None for name in ("weight", "bias")]
            same = graph.call_function(F.batch_norm, (source, *stats, *affine, False, 0.0, bn.eps))
        node.replace_all_uses_with(same)
        graph.erase_node(node)
        count += 1
    traced.recompile()
    return traced.eval(), count
'''

# the plain solution's folded graph, returned inside a module of the student's own class: honest, full marks
_OWN_CLASS = '''class FoldedNetwork(nn.Module):
    """The folded network, in a class of my own."""

    def __init__(self, body: nn.Module):
        super().__init__()
        self.body = body

    def forward(self, x):
        return self.body(x)


'''


def _wrap_in_own_class(source: str) -> str:
    return _OWN_CLASS + source.replace("    return traced.eval(), count",
                                       "    return FoldedNetwork(traced).eval(), count")


SAMPLES.update({
    "cheat_functional_bn": Sample(
        changes={"fold_network": _FUNCTIONAL_BN},
        expect={"test_fold_network": "zero"},
        why="fold_network replaces each foldable BatchNorm module by F.batch_norm on its statistics: right outputs "
            "and count, no BatchNorm module runs, nothing folded; the checker counts batch norms as operations"),
    "honest_own_class": Sample(
        changes={"fold_network": _wrap_in_own_class},
        why="the folded graph returned in a module of the student's own class: traced in the solution worker, "
            "checked in the checker like any graph module, full marks"),
})

# the fold written into the conv it was given: right weights, but the caller's model is changed under it (and a fold
# of the same conv twice folds the BN in twice). The clean recheck sent copies of the arguments and never saw it.
_IN_PLACE = '''def fold_conv_bn(conv, bn):
    # Return a new conv module equal to bn(conv(x)) in eval mode; raise ValueError where folding is not valid.
    if bn.training:
        raise ValueError("this BatchNorm is in training mode: folding is valid only in eval mode")
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("this BatchNorm keeps no running statistics: there is nothing fixed to fold")
    weight, bias = fold_conv_bn_weights(conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps,
                                        bn.weight, bn.bias)
    with torch.no_grad():
        conv.weight.copy_(weight)
        conv.bias = nn.Parameter(bias)
    return conv.eval()
'''

SAMPLES.update({
    "fold_in_place": Sample(
        changes={"fold_module": _IN_PLACE},
        expect={"test_fold_module": "zero"},
        why="fold_conv_bn writes the folded weights into the conv it was given and returns it: the caller's "
            "module changes; the checker writes the worker's arguments back, so it sees what the notebook sees"),
})
