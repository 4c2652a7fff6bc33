"""One tap on a model's ``parse_losses`` for the hooks that read the losses
between the forward and the backward (RankConsistencyHook,
NonFiniteSkipHook).

``MMDistributedDataParallel.train_step``, ``AutoDDP.train_step`` and
``BaseModel.train_step`` all call ``parse_losses`` after the forward and
before ``optim_wrapper.update_params``. Each hook adds a listener; the
first installs the tap (an instance attribute that shadows the method)
and the last removes it, so hooks may start and stop in any order without
undoing each other's patch.
"""
from typing import Any, Callable

# listener(losses, parsed_loss, log_vars), after parse_losses returned.
Listener = Callable[[dict, Any, dict], None]
_TAP = '_mmddp_ext_loss_tap'


def add_loss_listener(model: Any, listener: Listener) -> None:
    tap = model.__dict__.get(_TAP)
    if tap is None:
        original = model.parse_losses
        listeners = []

        def parse_losses(losses, *args, **kwargs):
            parsed_loss, log_vars = original(losses, *args, **kwargs)
            for call in list(listeners):
                call(losses, parsed_loss, log_vars)
            return parsed_loss, log_vars

        tap = dict(
            listeners=listeners,
            previous=model.__dict__.get('parse_losses'),
            tapped=parse_losses)
        model.__dict__[_TAP] = tap
        model.__dict__['parse_losses'] = parse_losses
    tap['listeners'].append(listener)


def remove_loss_listener(model: Any, listener: Listener) -> None:
    tap = model.__dict__.get(_TAP)
    if tap is None or listener not in tap['listeners']:
        return
    tap['listeners'].remove(listener)
    if tap['listeners']:
        return
    del model.__dict__[_TAP]
    if tap['previous'] is None:
        model.__dict__.pop('parse_losses', None)
    else:
        model.__dict__['parse_losses'] = tap['previous']
