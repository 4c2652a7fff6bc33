"""Make a forward pass independent of how the batch is split across
ranks, for the gradient-equivalence comparison.

Three things legitimately differ between N ranks and one process over the
concatenated batch, and are switched off here so that what remains is a
real normalisation difference:

- random draws (the denoising noise of DINO-style heads): each random
  factory of ``torch`` returns a constant while active, and the in-place
  ones (``bernoulli_``, ``uniform_``, ``normal_``) fill a constant, so
  every element sees the same "noise" however the batch is split;
- dropout: dropout modules and ``nn.MultiheadAttention`` (whose attention
  dropout is no dropout module) are put in eval mode, and the functional
  dropouts return their input;
- BatchNorm batch statistics (per rank without SyncBN): BatchNorm modules
  use their running statistics (eval mode).

Nothing else changes mode: detectors behave differently in eval mode
(no denoising queries, no losses).
"""
import contextlib
from typing import Iterator, List

import torch
import torch.nn as nn

from ..utils.torch_private import BatchNormBase, DropoutBase

# value in [0, 1) returned by the uniform factories; integer factories
# return their lower bound, normal ones zero.
UNIFORM_CONSTANT = 0.5


def _rand_like(input, *args, **kwargs):
    return torch.full_like(input, UNIFORM_CONSTANT, **_like_kwargs(kwargs))


def _randn_like(input, *args, **kwargs):
    return torch.zeros_like(input, **_like_kwargs(kwargs))


def _randint_like(input, *args, **kwargs):
    low = args[0] if len(args) == 2 else kwargs.get('low', 0)
    return torch.full_like(input, low, **_like_kwargs(kwargs))


def _like_kwargs(kwargs: dict) -> dict:
    return {k: kwargs[k] for k in ('dtype', 'device') if k in kwargs}


def _factory(fill):

    def factory(*size, **kwargs):
        kwargs.pop('generator', None)
        if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
            size = tuple(size[0])
        return torch.full(size, fill, **_like_kwargs(kwargs))

    return factory


def _randint(*args, **kwargs):
    kwargs.pop('generator', None)
    ints = [a for a in args if isinstance(a, int)]
    size = next(a for a in args if isinstance(a, (tuple, list, torch.Size)))
    low = ints[0] if len(ints) == 2 else 0
    return torch.full(tuple(size), low, dtype=kwargs.get('dtype', torch.long),
                      device=kwargs.get('device'))


def _randperm(n, **kwargs):
    kwargs.pop('generator', None)
    return torch.arange(n, **_like_kwargs(kwargs))


CONSTANT_RANDOM = dict(
    rand=_factory(UNIFORM_CONSTANT),
    randn=_factory(0.0),
    rand_like=_rand_like,
    randn_like=_randn_like,
    randint_like=_randint_like,
    randint=_randint,
    randperm=_randperm,
)


def _bernoulli_(self, *args, **kwargs):
    return self.fill_(1.0)  # keep everything: no drop


def _uniform_(self, from_=0.0, to=1.0, **kwargs):
    return self.fill_((from_ + to) / 2)


def _normal_(self, mean=0.0, std=1.0, **kwargs):
    return self.fill_(mean)


def _bernoulli(input, *args, **kwargs):
    return torch.ones_like(input)


def _no_dropout(input, *args, **kwargs):
    return input


CONSTANT_IN_PLACE = dict(
    bernoulli_=_bernoulli_, uniform_=_uniform_, normal_=_normal_)
FUNCTIONAL_DROPOUTS = ('dropout', 'dropout1d', 'dropout2d', 'dropout3d',
                       'alpha_dropout', 'feature_alpha_dropout')
EVAL_TYPES = (BatchNormBase, DropoutBase, nn.MultiheadAttention)


@contextlib.contextmanager
def _patched(owner, replacements: dict) -> Iterator[None]:
    saved = {name: getattr(owner, name) for name in replacements}
    for name, fn in replacements.items():
        setattr(owner, name, fn)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(owner, name, fn)


@contextlib.contextmanager
def split_invariant(model: nn.Module) -> Iterator[None]:
    """Inside the block, ``model``'s forward gives each image the same
    result whichever batch it is in (see the module docstring)."""
    switched: List[nn.Module] = [
        m for m in model.modules() if isinstance(m, EVAL_TYPES) and m.training
    ]
    for module in switched:
        module.eval()
    try:
        with _patched(torch, dict(CONSTANT_RANDOM, bernoulli=_bernoulli)), \
                _patched(torch.Tensor, CONSTANT_IN_PLACE), \
                _patched(nn.functional, {
                    name: _no_dropout
                    for name in FUNCTIONAL_DROPOUTS}):
            yield
    finally:
        for module in switched:
            module.train()
