"""Lab 2, part B: the networks whose Conv/BN pairs a student folds, and the check of a folded network."""

import copy
import random

import torch
import torch.nn as nn

from .fold import assert_unchanged, passed, randomize_bn, snapshot

# ------------------------------------------------------------------------------------------------ part B
def conv_bn_relu(cin, cout, kernel=3, stride=1, groups=1, bias=False, eps=1e-3, affine=True):
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=bias),
                         nn.BatchNorm2d(cout, eps=eps, affine=affine), nn.ReLU())


class DepthwiseSeparable(nn.Sequential):
    """MobileNet's block: depthwise 3×3 conv → BN → ReLU, then pointwise 1×1 conv → BN → ReLU."""

    def __init__(self, cin, cout, stride=1, eps=1e-3):
        super().__init__(conv_bn_relu(cin, cin, 3, stride, groups=cin, eps=eps), conv_bn_relu(cin, cout, 1, eps=eps))


class MobileNetLike(nn.Module):
    """A small MobileNet-v1-style network: a strided 3×3 stem, depthwise-separable blocks, pooling, a classifier."""

    def __init__(self, widths=(8, 16, 32, 32, 64), strides=(1, 2, 1, 2), num_classes=10, eps=1e-3):
        super().__init__()
        self.stem = conv_bn_relu(3, widths[0], 3, 2, eps=eps)
        self.blocks = nn.Sequential(*[DepthwiseSeparable(a, b, s, eps) for a, b, s in zip(widths, widths[1:], strides)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(widths[-1], num_classes)
        self.foldable_pairs = 1 + 2 * len(self.blocks)

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


TINY_MOBILENET = dict(widths=(8, 16, 32, 32, 64), strides=(1, 2, 1, 2))          # CPU: tests, emulation
TIMED_MOBILENET = dict(widths=(32, 64, 128, 128, 256, 256, 512, 512), strides=(1, 2, 1, 2, 1, 2, 1),
                       num_classes=1000)                                          # GPU timing, 224×224 inputs
NETWORK_BATCHES = (1, 64)


def mobilenet(seed=0, **config):
    """A MobileNetLike in eval mode with trained-looking BN state (see ``randomize_bn``)."""
    torch.manual_seed(seed)
    model = MobileNetLike(**config)
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            randomize_bn(module, gen)
    return model.eval()


class BNAfterActivation(nn.Module):
    """conv → ReLU → BN: this BN follows a ReLU, not a conv, and must stay."""

    def __init__(self, c, eps):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.act = nn.ReLU()
        self.bn = nn.BatchNorm2d(c, eps=eps)

    def forward(self, x):
        return self.bn(self.act(self.conv(x)))


class SharedConvOutput(nn.Module):
    """relu(bn(conv(x))) + conv(x): the conv's output has another user, so folding the BN into the conv would
    change what the skip connection adds."""

    def __init__(self, c, eps):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 1, bias=True)
        self.bn = nn.BatchNorm2d(c, eps=eps)
        self.act = nn.ReLU()

    def forward(self, x):
        y = self.conv(x)
        return self.act(self.bn(y)) + y


class ResidualConvBN(nn.Module):
    """x + bn(conv(x)): a foldable pair inside a residual block (x has two users, the conv output one)."""

    def __init__(self, c, eps, bias=False, affine=True):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=bias)
        self.bn = nn.BatchNorm2d(c, eps=eps, affine=affine)

    def forward(self, x):
        return x + self.bn(self.conv(x))


def pair_across_containers(c, eps, bias=False):
    """A conv that ends one Sequential and the BN that starts the next: still a Conv→BN pair in the data flow."""
    return nn.Sequential(nn.Sequential(nn.ReLU(), nn.Conv2d(c, c, 3, padding=1, groups=c, bias=bias)),
                         nn.Sequential(nn.BatchNorm2d(c, eps=eps), nn.ReLU()))


# name -> (builder(c, eps, rng), foldable pairs it holds)
_BLOCKS = {
    "conv_bn_relu": (lambda c, eps, rng: conv_bn_relu(c, c, rng.choice([1, 3]), bias=rng.random() < 0.5, eps=eps,
                                                      affine=rng.random() < 0.8), 1),
    "depthwise_separable": (lambda c, eps, rng: DepthwiseSeparable(c, c, rng.choice([1, 2]), eps), 2),
    "bn_after_activation": (lambda c, eps, rng: BNAfterActivation(c, eps), 0),
    "shared_conv_output": (lambda c, eps, rng: SharedConvOutput(c, eps), 0),
    "residual_conv_bn": (lambda c, eps, rng: ResidualConvBN(c, eps, rng.random() < 0.5, rng.random() < 0.7), 1),
    "pair_across_containers": (lambda c, eps, rng: pair_across_containers(c, eps, rng.random() < 0.5), 1),
}


class Network(nn.Module):
    def __init__(self, stem, body, channels, num_classes=5):
        super().__init__()
        self.stem = stem
        self.body = body
        self.head = nn.Linear(channels, num_classes)

    def forward(self, x):
        return self.head(self.body(self.stem(x)).mean(dim=(2, 3)))


def _finish(model, seed):
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            randomize_bn(module, gen)
        elif isinstance(module, nn.Conv2d) and module.bias is not None:
            with torch.no_grad():
                module.bias.copy_(torch.randn(module.out_channels, generator=gen) * 0.3)
    return model.eval()


def tricky_network(seed=0):
    """One block of each kind (stem included): ``(model, foldable pairs, input shape)``."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    c, eps = 6, 1e-3
    blocks = [_BLOCKS[name][0](c, eps, rng) for name in _BLOCKS]
    count = 1 + sum(pairs for _, pairs in _BLOCKS.values())
    model = Network(conv_bn_relu(3, c, 3, 2, eps=eps), nn.Sequential(*blocks), c)
    return _finish(model, seed), count, (2, 3, 16, 18)


def random_network(seed):
    """A random network of the blocks above: ``(model in eval mode, foldable pairs, input shape)``."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    c = rng.choice([3, 4, 8])
    eps = rng.choice([1e-5, 1e-3, 0.1])
    names = [rng.choice(sorted(_BLOCKS)) for _ in range(rng.randint(3, 6))]
    stem_bias = rng.random() < 0.5
    blocks = [_BLOCKS[name][0](c, eps, rng) for name in names]
    count = 1 + sum(_BLOCKS[name][1] for name in names)
    model = Network(conv_bn_relu(3, c, 3, 2, bias=stem_bias, eps=eps), nn.Sequential(*blocks), c)
    shape = (rng.choice([1, 2, 3]), 3, rng.randint(12, 24), rng.randint(12, 24))
    return _finish(model, seed), count, shape


# What a forward pass runs, counted as ATen operations in this process: a BatchNorm computed another way (by
# F.batch_norm in a graph, an InstanceNorm with running statistics, a 1×1 depthwise conv, a multiply-add) is still
# an operation, and a folded pair must leave exactly one (its conv) where it ran two. Views and allocations are not
# work; neither are a graph's dead nodes (they are removed first, and the graph without them is the one checked).
_NOT_WORK = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias",
             "lift_fresh", "lift_fresh_copy"}


def _forward_operations(model, x):
    """``(batch-norm operations, all operations)`` that ``model(x)`` runs, counted at the ATen level."""
    from torch.utils._python_dispatch import TorchDispatchMode

    if getattr(type(model), "evaluated_remotely", False):
        raise AssertionError(
            f"the folded model is a module of your own class ({getattr(model, 'class_name', type(model).__name__)}) "
            "that torch.fx could not trace, so the grader cannot see which operations it runs (it runs in the "
            "process that runs your solution cells). Return a torch.nn model (a copy of the model with each folded "
            "pair replaced by its folded conv) or the fx GraphModule of your pass")

    class Count(TorchDispatchMode):
        norms = work = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func._schema.name.split("::")[-1]
            if not func.is_view and name not in _NOT_WORK:
                self.work += 1
                self.norms += "batch_norm" in name
            return func(*args, **(kwargs or {}))

    count = Count()
    with torch.no_grad(), count:
        model(x)
    return count.norms, count.work


def _bn_calls(model, x):
    """How many batch normalizations ``model(x)`` computes (whatever module or function computes them)."""
    return _forward_operations(model, x)[0]


def _has_effects(node, root) -> bool:
    """Whether a graph node may change something besides its own result (kept even when nothing uses it)."""
    import inspect
    try:
        if node.is_impure():
            return True
    except Exception:  # noqa: BLE001 - not decidable: keep it
        return True
    if node.op == "call_method":
        return node.target.endswith("_") or "out" in node.kwargs
    if node.op == "call_module":
        module = root.get_submodule(node.target)
        return any(getattr(m, "inplace", False) or isinstance(m, torch.fx.GraphModule) for m in module.modules())
    if node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        if name.endswith("_") or (name.startswith("i") and getattr(node.target, "__module__", "") in
                                  ("operator", "_operator")) or "out" in node.kwargs or node.kwargs.get("inplace"):
            return True
        try:
            bound = inspect.signature(node.target).bind(*node.args, **node.kwargs)
            return bool(bound.arguments.get("inplace", False))
        except (TypeError, ValueError):
            return False
    return False


def _without_dead_code(model):
    """A copy of ``model`` whose fx graphs (the model itself, or any submodule) have no dead nodes: an unused leftover
    conv is not a BatchNorm that still runs."""
    def dead(module):
        return [node for node in module.graph.nodes if node.op in ("call_function", "call_method", "call_module",
                                                                   "get_attr")
                and not node.users and not _has_effects(node, module)]

    if not any(isinstance(m, torch.fx.GraphModule) and dead(m) for m in model.modules()):
        return model
    model = copy.deepcopy(model)
    for module in list(model.modules()):
        if not isinstance(module, torch.fx.GraphModule):
            continue
        removed = False
        for node in reversed(list(module.graph.nodes)):
            if node.op in ("call_function", "call_method", "call_module", "get_attr") and not node.users \
                    and not _has_effects(node, module):
                module.graph.erase_node(node)
                removed = True
        if removed:
            module.recompile()
    return model


def check_fold_network(fold_network, networks, seed=0):
    """Check ``fold_network(model) -> (folded_model, count)`` on ``[(model, expected count, input shape)]``: the
    count, outputs equal to the original's in eval mode (float64 reference), the folded pairs' BNs really gone
    from the forward pass, the others still there, and the original model untouched."""
    from ...check import assert_close
    checked = 0
    for index, (model, expected_count, shape) in enumerate(networks):
        checked += 1
        what = f"network {index} ({type(model).__name__}, {expected_count} foldable Conv→BN pairs)"
        saved = snapshot(model)
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed + index))
        # what the folded model must compute, before any code of the student's runs: a folded graph runs here, on
        # the tensor it is given, and may write into it (an in-place op on its input), so it gets copies only
        with torch.no_grad():
            expected = copy.deepcopy(model).double().eval()(x.double())
        bn_before, work_before = _forward_operations(model, x)
        result = fold_network(model)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise AssertionError(f"{what}: return (folded_model, number_of_folded_pairs)")
        folded, count = result
        if not isinstance(folded, nn.Module) or folded is model:
            raise AssertionError(f"{what}: return a new folded model, leaving the original as it was")
        assert_unchanged(saved, model, what)
        if count != expected_count:
            raise AssertionError(f"{what}: folded {count} pair(s), expected {expected_count}. A BN is folded only "
                                 "when its input is a conv's output that nothing else uses")
        if not getattr(type(folded), "evaluated_remotely", False):  # a module the checker holds: what it runs
            folded = _without_dead_code(folded.eval())
        with torch.random.fork_rng(devices=[]):  # a folded graph's random ops use the checker's generator: a copy
            bn_after, work_after = _forward_operations(folded, x.clone())
        if bn_after != bn_before - expected_count:
            raise AssertionError(f"{what}: the folded model still runs {bn_after} BatchNorm(s), expected "
                                 f"{bn_before - expected_count} of the original {bn_before}")
        if work_after > work_before - expected_count:
            raise AssertionError(
                f"{what}: the folded model runs {work_after} operations, the original {work_before}: folding "
                f"{expected_count} pair(s) leaves one conv where each pair ran two operations, so at most "
                f"{work_before - expected_count}. A BatchNorm computed another way (a 1×1 conv, a multiply and an "
                "add, a separate bias add) is still a BatchNorm: its scale and shift belong in the conv's weights "
                "and bias")
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            got = folded(x.clone())
        assert_close(got, expected, atol=1e-4 * float(expected.abs().max()), rtol=1e-4,
                     name=f"folded model output ({what})")
        assert_unchanged(saved, model, what)
    passed(fold_network, range(checked))


def check_network_refusal(fold_network):
    """The network pass must refuse a model in training mode with a ValueError (BN folding is valid only in eval
    mode)."""
    model = mobilenet(**TINY_MOBILENET).train()
    try:
        fold_network(model)
    except ValueError:
        return
    raise AssertionError("fold_network folded a model in training mode instead of raising ValueError")


HIDDEN_NETWORK_SEEDS = range(1, 9)


def visible_networks():
    """The tiny MobileNet (9 pairs) and one block of each kind: ``[(model, foldable pairs, input shape)]``."""
    return [(mobilenet(**TINY_MOBILENET), 9, (2, 3, 32, 32)), tricky_network(0)]


def hidden_networks():
    return [random_network(seed) for seed in HIDDEN_NETWORK_SEEDS] + [
        (mobilenet(seed=5, **TINY_MOBILENET), 9, (1, 3, 17, 23))]
