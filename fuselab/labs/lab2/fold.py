"""Lab 2, part A: the Conv/BN pairs to fold and the checks of a fold (weights, module, refusals)."""

import copy

import torch
import torch.nn as nn

# ------------------------------------------------------------------------------------------------ part A
# Conv/BN pairs to fold. Visible cases teach; hidden ones add other spatial sizes, eps values, groups, fp16 and a
# dead channel (running variance 0) whose eps fp16 cannot even represent. `small_variances=k`: k channels (random)
# get running variances between 1e-6 and 1e-4, as channels that barely vary in a trained network do; there even the
# default eps = 1e-5 changes the scale 1/sqrt(var + eps) by a large factor, so a fold that leaves eps out fails (with
# variances of about 1 it changes by 5e-6 relative, within fp32's tolerance, and such a fold would pass).
FOLD_CASES = [
    dict(name="3x3 conv with bias", cin=4, cout=6, kernel=3, bias=True),
    dict(name="eps=1e-5 (the default), 4 channels of 8 with variances of 1e-6 to 1e-4", cin=4, cout=8, kernel=3,
         bias=True, small_variances=4),
    dict(name="conv without bias", cin=4, cout=6, kernel=3, bias=False),
    dict(name="BN with affine=False", cin=3, cout=5, kernel=1, bias=True, affine=False),
    dict(name="depthwise 3x3, eps=1e-3", cin=8, cout=8, kernel=3, groups=8, bias=False, eps=1e-3),
    dict(name="fp16 parameters", cin=6, cout=6, kernel=3, groups=6, bias=False, dtype=torch.float16),
    # any spatial size, and the conv's geometry kept: a fold written for 2-D weights only, or one that builds a
    # new conv without the original's stride or dilation, fails here rather than only in the hidden tests
    dict(name="Conv1d with bias", dims=1, cin=3, cout=5, kernel=5, bias=True),
    dict(name="Conv3d without bias", dims=3, cin=2, cout=3, kernel=3, bias=False),
    dict(name="stride 2, dilation 3, padding 3", cin=3, cout=4, kernel=3, stride=2, dilation=3, padding=3, eps=1e-3),
    # the pitfall the text warns about: in fp16, 1e-8 rounds to 0, so var + eps = 0 and rsqrt gives inf
    dict(name="fp16, a dead channel (variance 0), eps=1e-8", cin=4, cout=4, kernel=3, groups=4, bias=False,
         eps=1e-8, dtype=torch.float16, dead_channel=True),
]
HIDDEN_FOLD_CASES = [
    dict(name="5x5, groups=2, eps=0.1", cin=4, cout=6, kernel=5, groups=2, bias=True, eps=0.1),
    dict(name="Conv1d without bias", dims=1, cin=3, cout=7, kernel=3, bias=False),
    dict(name="Conv3d, no bias, affine=False", dims=3, cin=2, cout=4, kernel=3, bias=False, affine=False),
    dict(name="a single channel", cin=1, cout=1, kernel=3, bias=False, eps=1e-2),
    dict(name="stride 2, dilation 2", cin=5, cout=3, kernel=3, stride=2, dilation=2, padding=2, eps=1.0),
    dict(name="fp16, dead channel, eps=1e-8", cin=8, cout=8, kernel=3, groups=8, bias=False, eps=1e-8,
         dtype=torch.float16, dead_channel=True),
    dict(name="fp16 with bias, affine=False", cin=4, cout=4, kernel=1, bias=True, affine=False,
         dtype=torch.float16, eps=1e-5),
    dict(name="1x1 pointwise, 32 channels", cin=16, cout=32, kernel=1, bias=False, eps=1e-5),
    dict(name="depthwise 3x3, eps=1e-5, variances of 1e-6 to 1e-4 in 5 of 12 channels", cin=12, cout=12, kernel=3,
         groups=12, bias=False, small_variances=5),
    dict(name="Conv1d, affine=False, eps=1e-5, one channel's variance 1e-6 to 1e-4", dims=1, cin=3, cout=5, kernel=3,
         bias=True, affine=False, small_variances=1),
    dict(name="fp16, eps=1e-5, variances of 1e-6 to 1e-4 in 2 of 6 channels", cin=6, cout=6, kernel=3, groups=6,
         bias=False, dtype=torch.float16, small_variances=2),
]

_CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
_BNS = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}


def randomize_bn(bn, gen):
    """Trained-looking BN state: running statistics and affine parameters away from their 0/1 initial values,
    so that forgetting the mean, the bias or eps shows. Variances from 0.05 are small enough for eps = 1e-3 to
    matter; at the default 1e-5 only smaller ones tell (a case's `small_variances`, ``make_conv_bn``)."""
    c = bn.num_features
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(c, generator=gen) * 0.5)
        bn.running_var.copy_(torch.rand(c, generator=gen) * 1.45 + 0.05)
        if bn.affine:
            bn.weight.copy_(torch.randn(c, generator=gen) * 0.5 + 1.0)
            bn.bias.copy_(torch.randn(c, generator=gen) * 0.3)
    return bn


def make_conv_bn(case, seed=0):
    """(conv, bn) for a case of FOLD_CASES, both in eval mode, with random weights and BN state."""
    gen = torch.Generator().manual_seed(seed)
    dims = case.get("dims", 2)
    torch.manual_seed(seed)
    conv = _CONVS[dims](case["cin"], case["cout"], case["kernel"], stride=case.get("stride", 1),
                        padding=case.get("padding", case["kernel"] // 2), dilation=case.get("dilation", 1),
                        groups=case.get("groups", 1), bias=case.get("bias", True))
    if conv.bias is not None:
        with torch.no_grad():
            conv.bias.copy_(torch.randn(case["cout"], generator=gen) * 0.3)
    bn = randomize_bn(_BNS[dims](case["cout"], eps=case.get("eps", 1e-5), affine=case.get("affine", True)), gen)
    if case.get("small_variances"):
        channels = torch.randperm(case["cout"], generator=gen)[:case["small_variances"]]
        with torch.no_grad():  # log-uniform between 1e-6 and 1e-4: never 0
            bn.running_var[channels] = 10.0 ** (torch.rand(len(channels), generator=gen) * 2 - 6)
    if case.get("dead_channel"):
        bn.running_var[0] = 0.0  # a channel that was constant over the training data
    dtype = case.get("dtype", torch.float32)
    return conv.to(dtype).eval(), bn.to(dtype).eval()


def conv_bn_tensors(conv, bn):
    """The arguments of a weight fold, in torch's order: conv_w, conv_b, mean, var, eps, gamma, beta."""
    return conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias


def float64_fold(conv_w, conv_b, mean, var, eps, gamma, beta):
    """The fold computed in float64 and rounded once to the parameters' dtype: the reference for part A."""
    d = torch.float64
    scale = 1.0 / torch.sqrt(var.to(d) + eps)
    if gamma is not None:
        scale = scale * gamma.to(d)
    w = conv_w.to(d) * scale.reshape((-1,) + (1,) * (conv_w.dim() - 1))
    b = ((conv_b.to(d) if conv_b is not None else 0.0) - mean.to(d)) * scale
    if beta is not None:
        b = b + beta.to(d)
    return w.to(conv_w.dtype), b.to(conv_b.dtype if conv_b is not None else conv_w.dtype)


def assert_unchanged(before: dict, module, what):
    """``module`` as ``snapshot`` saw it: every parameter and buffer slot of every submodule there, none set to
    None, made the other kind, given another dtype or shape or other values, and none added. What a function of
    the student's does to its arguments comes back to the checker's own modules, and ``state_dict`` alone leaves out
    a slot set to None, as ``torch.equal`` overlooks a dtype."""
    after = snapshot(module)
    for key in sorted(before.keys() | after.keys()):
        old, new = before.get(key, "absent"), after.get(key, "absent")
        same = (old is None and new is None) or (
            isinstance(old, tuple) and isinstance(new, tuple) and old[:3] == new[:3] and torch.equal(old[3], new[3]))
        if not same:
            prefix, name, _ = key
            raise AssertionError(f"{what}: the original {type(module).__name__}'s {prefix + '.' if prefix else ''}"
                                 f"{name} was modified; a fold must leave the original modules alone (work on "
                                 "copies)")


def snapshot(module) -> dict:
    """Every parameter and buffer slot of ``module`` and its submodules: ``(submodule, name, kind)`` → None or
    ``(is a Parameter, dtype, shape, a copy)``."""
    slots = {}
    for prefix, sub in module.named_modules():
        for kind, table in (("parameter", sub._parameters), ("buffer", sub._buffers)):
            for name, value in table.items():
                slots[(prefix, name, kind)] = None if value is None else (
                    isinstance(value, nn.Parameter), value.dtype, tuple(value.shape), value.detach().clone())
    return slots


def check_fold_weights(fold, cases=FOLD_CASES, seed=0):
    """Check ``fold(conv_w, conv_b, mean, var, eps, gamma, beta) -> (w, b)`` on every case: against a float64
    fold rounded to the parameters' dtype, against torch.nn.utils.fusion.fuse_conv_bn_weights where that is
    exact enough (fp32), with the right dtypes and shapes, leaving its inputs alone."""
    from ...check import assert_close
    for case in cases:
        conv, bn = make_conv_bn(case, seed)
        args = conv_bn_tensors(conv, bn)
        before = [a.clone() if torch.is_tensor(a) else a for a in args]
        what = f"case {case['name']!r}"
        with torch.no_grad():
            got = fold(*args)
        # first: a fold that changed its inputs would otherwise be compared with a fold of the changed inputs
        for arg, old, name in zip(args, before, ("conv_w", "conv_b", "mean", "var", "eps", "gamma", "beta")):
            if torch.is_tensor(arg) and (arg.dtype != old.dtype or not torch.equal(arg, old)):
                raise AssertionError(f"{what}: the fold modified its input {name} in place (an in-place op such "
                                     f"as mul_ or `*=` on it, or on its .data): compute new tensors instead")
        if not (isinstance(got, tuple) and len(got) == 2):
            raise AssertionError(f"{what}: return (folded_weight, folded_bias), got {type(got).__name__}")
        w, b = got
        if b is None:
            raise AssertionError(f"{what}: the folded bias is None. After folding every conv has a bias, "
                                 "b' = (b − μ)·γ/√(σ² + ε) + β, even when the conv had none (take b = 0)")
        w_ref, b_ref = float64_fold(*before)  # the arguments as they were given
        for name, value, ref in (("weight", w, w_ref), ("bias", b, b_ref)):
            if not torch.is_tensor(value) or value.shape != ref.shape or value.dtype != ref.dtype:
                raise AssertionError(f"{what}: folded {name} should be a {ref.dtype} tensor of shape "
                                     f"{tuple(ref.shape)}, got {getattr(value, 'dtype', type(value).__name__)} "
                                     f"of shape {tuple(getattr(value, 'shape', ()))}")
            if not torch.isfinite(value).all() and torch.isfinite(ref).all():
                hint = (" The parameters are fp16: fold them in float32 and cast back once at the end. In fp16, "
                        f"eps = {before[4]:g} rounds to {float(torch.tensor(before[4], dtype=torch.float16)):g}, so "
                        "var + eps is 0 for a channel that never varied, and rsqrt(0) = inf."
                        if value.dtype in (torch.float16, torch.bfloat16) else "")
                raise AssertionError(f"{what}: the folded {name} has inf or NaN entries where the exact fold is "
                                     f"finite.{hint}")
        try:
            assert_close(w.detach(), float64_fold_exact(before)[0], name=f"folded weight ({case['name']})")
            assert_close(b.detach(), float64_fold_exact(before)[1], name=f"folded bias ({case['name']})")
        except AssertionError as failure:
            known = _known_mistake(w.detach(), b.detach(), before)
            if known:
                raise AssertionError(f"{what}: {known}\n\n{failure}") from None
            raise
        if case.get("dtype", torch.float32) == torch.float32:
            w_torch, b_torch = torch.nn.utils.fusion.fuse_conv_bn_weights(*before)
            assert_close(w.detach(), w_torch.detach(), name=f"folded weight vs torch ({case['name']})")
            assert_close(b.detach(), b_torch.detach(), name=f"folded bias vs torch ({case['name']})")
    passed(fold, cases)


# The fold's classic mistakes, each as the float64 scale it computes instead of gamma / sqrt(var + eps).
_MISTAKES = (
    ("eps is left out: the scale is 1/sqrt(var), not 1/sqrt(var + eps)",
     lambda var, eps, gamma: gamma / torch.sqrt(var)),
    ("eps is added outside the square root: 1/(sqrt(var) + eps) instead of 1/sqrt(var + eps)",
     lambda var, eps, gamma: gamma / (torch.sqrt(var) + eps)),
    ("the variance is used as a standard deviation: 1/(var + eps) instead of 1/sqrt(var + eps)",
     lambda var, eps, gamma: gamma / (var + eps)),
    ("gamma is left out of the scale: gamma/sqrt(var + eps), gamma (the BN weight) included",
     lambda var, eps, gamma: torch.ones_like(gamma) / torch.sqrt(var + eps)),
)


def _known_mistake(w, b, args) -> str:
    """Which classic mistake (``_MISTAKES``) the folded weight matches, if one does; else ""."""
    conv_w, conv_b, mean, var, eps, gamma, beta = args
    d = torch.float64
    gamma64 = gamma.to(d) if gamma is not None else torch.ones_like(var, dtype=d)
    exact = float64_fold_exact(args)[0].detach()
    relative = 1e-3 if w.dtype in (torch.float16, torch.bfloat16) else 1e-5
    for said, scale_of in _MISTAKES:
        scale = scale_of(var.to(d), eps, gamma64)
        if torch.allclose(scale, gamma64 / torch.sqrt(var.to(d) + eps)):
            continue  # this case cannot tell the mistake apart (gamma = 1, say)
        wrong = (conv_w.to(d) * scale.reshape((-1,) + (1,) * (conv_w.dim() - 1))).detach()
        if not bool(torch.isfinite(wrong).all()):
            continue  # (a dead channel without eps) an infinite fold is reported as such before this
        # at the scale of the larger of the two folds: a mistake can make the weights far larger (1/var of a small
        # variance), and the student's fold rounds them at their own size
        tolerance = relative * max(float(exact.abs().max()), float(wrong.abs().max()))
        if bool(((w.to(d) - wrong).abs() <= tolerance).all()):
            return f"the folded weight matches a fold in which {said}"
    return ""


def float64_fold_exact(args):
    """The float64 fold, not rounded: what a fold's result is compared with."""
    conv_w, conv_b, mean, var, eps, gamma, beta = args
    d = torch.float64
    w, b = float64_fold(conv_w.to(d), None if conv_b is None else conv_b.to(d), mean.to(d), var.to(d), eps,
                        None if gamma is None else gamma.to(d), None if beta is None else beta.to(d))
    return w.detach(), b.detach()


def _input_for(conv, seed, batch=2):
    gen = torch.Generator().manual_seed(seed + 100)
    spatial = {1: (13,), 2: (9, 11), 3: (5, 6, 7)}[conv.weight.dim() - 2]
    return torch.randn((batch, conv.in_channels) + spatial, generator=gen).to(conv.weight.dtype)


def check_fold_module(fold_conv_bn, cases=FOLD_CASES, seed=0):
    """Check ``fold_conv_bn(conv, bn) -> conv'``: same kind of conv and geometry, a bias, outputs equal to
    bn(conv(x)) in eval mode (computed in float64), and the original modules untouched."""
    from ...check import assert_close
    for case in cases:
        conv, bn = make_conv_bn(case, seed)
        what = f"case {case['name']!r}"
        saved = (snapshot(conv), snapshot(bn))
        # everything the check compares with, from copies made before the student's fold runs: what it does to its
        # arguments comes back to ``conv`` and ``bn`` (``assert_unchanged`` then says so), never to these
        original, original_bn = copy.deepcopy(conv), copy.deepcopy(bn)
        x = _input_for(original, seed)
        with torch.no_grad():
            expected = copy.deepcopy(bn).double().eval()(copy.deepcopy(conv).double().eval()(x.double()))
            folded = fold_conv_bn(conv, bn)
        if type(folded) is not type(original):
            raise AssertionError(f"{what}: expected a new {type(original).__name__}, got {type(folded).__name__}")
        if folded is conv:
            raise AssertionError(f"{what}: return a new conv module, not the original one changed in place")
        for attr in ("stride", "padding", "dilation", "groups", "in_channels", "out_channels", "padding_mode"):
            if getattr(folded, attr) != getattr(original, attr):
                raise AssertionError(f"{what}: the folded conv's {attr} is {getattr(folded, attr)}, "
                                     f"the original's {getattr(original, attr)}")
        if folded.bias is None:
            raise AssertionError(f"{what}: the folded conv has no bias. After folding every conv needs one, "
                                 "b' = (b − μ)·γ/√(σ² + ε) + β, even when the original conv had none")
        if folded.weight.dtype != original.weight.dtype:
            raise AssertionError(f"{what}: folded weights are {folded.weight.dtype}, expected "
                                 f"{original.weight.dtype}")
        assert_unchanged(saved[0], conv, what)
        assert_unchanged(saved[1], bn, what)
        with torch.no_grad():
            got = folded.eval()(x.clone())
        low_precision = original.weight.dtype != torch.float32
        atol = 1e-2 * float(expected.abs().max()) if low_precision else None  # fp16 weights and inputs
        try:
            assert_close(got, expected, atol=atol, name=f"folded conv output ({case['name']})")
        except AssertionError as failure:
            known = _known_mistake(folded.weight.detach(), folded.bias.detach(),
                                   conv_bn_tensors(original, original_bn))
            if known:
                raise AssertionError(f"{what}: {known}\n\n{failure}") from None
            raise
    passed(fold_conv_bn, cases)


def name_of(function) -> str:
    return getattr(function, "__name__", "the fold")


def passed(function, cases):
    """The line a passing check prints, as fuselab.check's kernel checks do: a student sees the cell did check."""
    print(f"✓ {name_of(function)}: {len(cases)} case{'s' if len(cases) != 1 else ''} passed")


def check_pair_refusals(fold_conv_bn):
    """Folding must refuse a BN in training mode and a BN without running statistics, with a ValueError that says
    why."""
    conv, bn = make_conv_bn(FOLD_CASES[0])
    situations = [("a BatchNorm in training mode", conv, bn.train(), "eval")]
    conv2, _ = make_conv_bn(FOLD_CASES[0])
    no_stats = nn.BatchNorm2d(conv2.out_channels, track_running_stats=False).eval()
    situations.append(("a BatchNorm without running statistics (track_running_stats=False)", conv2, no_stats, None))
    for what, c, b, word in situations:
        try:
            fold_conv_bn(c, b)
        except NotImplementedError:
            raise
        except ValueError as exc:
            if word and word not in str(exc).lower():
                raise AssertionError(f"folding {what} raised ValueError({str(exc)!r}); say in the message that "
                                     "folding is valid only in eval mode") from None
            continue
        except Exception as exc:  # noqa: BLE001 - any other exception is the wrong kind of refusal
            raise AssertionError(f"folding {what} raised {type(exc).__name__}: {exc}; expected a ValueError "
                                 "that says why it cannot be folded") from exc
        raise AssertionError(f"folding {what} returned a conv instead of raising ValueError: BN folding is valid "
                             "only in eval mode, with running statistics")
