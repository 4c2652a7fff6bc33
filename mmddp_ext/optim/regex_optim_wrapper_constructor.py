"""``RegexOptimWrapperConstructor``: parameter groups chosen by regular
expressions, the way RT-DETR, D-FINE and DEIM write their optimizers.

Those code bases list the groups in their YAML ``optimizer.params``::

    optimizer:
      type: AdamW
      params:
        - params: '^(?=.*backbone)(?!.*norm).*$'
          lr: 0.00001
        - params: '^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn)).*$'
          weight_decay: 0.
      lr: 0.0001
      weight_decay: 0.0001

and ``YAMLConfig.get_optim_params`` turns them into torch parameter groups.
MMEngine's ``DefaultOptimWrapperConstructor`` cannot express these rules:
its ``custom_keys`` match substrings, and once a key matches a parameter
its ``norm_decay_mult`` / ``bias_decay_mult`` no longer apply, while its
``bias_decay_mult`` reaches only a module's ``bias`` (not names such as
``in_proj_bias`` that upstream's ``bias`` regex matches). This constructor
takes the list nearly verbatim::

    optim_wrapper = dict(
        type='OptimWrapper',
        constructor='RegexOptimWrapperConstructor',
        optimizer=dict(type='AdamW', lr=1e-4, weight_decay=1e-4),
        paramwise_cfg=dict(
            params=[
                dict(params='^(?=.*backbone)(?!.*norm).*$', lr=1e-5),
                dict(params='^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn)).*$',
                     weight_decay=0.),
            ],
            param_name_map=dict(type='rtdetr_upstream_param_names',
                                version=2)))
"""
import re
from typing import Callable, Dict, List, Optional, Union

import torch.nn as nn
from mmengine.optim import DefaultOptimWrapperConstructor
from mmengine.registry import FUNCTIONS, OPTIM_WRAPPER_CONSTRUCTORS

# paramwise_cfg keys of DefaultOptimWrapperConstructor that this
# constructor does not apply; a config that sets them next to ``params``
# would silently lose them.
MMENGINE_PARAMWISE_KEYS = ('custom_keys', 'bias_lr_mult', 'bias_decay_mult',
                           'norm_decay_mult', 'dwconv_decay_mult',
                           'flat_decay_mult', 'bypass_duplicate',
                           'dcn_offset_lr_mult')
KEYS = ('params', 'param_name_map')


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class RegexOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """Parameter groups from regular expressions, with upstream RT-DETR's
    ``get_optim_params`` semantics.

    Every trainable parameter (``requires_grad``) whose name matches a
    group's regex (``re.search``, which is what upstream's
    ``len(re.findall(pattern, name)) > 0`` tests) joins that group, which
    sets the group's own ``lr``, ``weight_decay`` or any other optimizer
    option; the optimizer's values fill in the rest. Trainable parameters
    that no regex matches form one last group with the optimizer's values.
    Frozen parameters are left out of the optimizer, as upstream does. A
    parameter that two regexes match is an error (upstream's torch
    optimizer refuses the duplicate too); an empty ``params`` list or no
    ``paramwise_cfg`` gives one group of all parameters.

    Differs from ``DefaultOptimWrapperConstructor.add_params``, which this
    replaces: groups follow the regexes of ``paramwise_cfg.params`` instead
    of ``custom_keys`` and the decay multipliers.

    Args:
        optim_wrapper_cfg (dict): The optim wrapper config, with
            ``optimizer`` (its ``lr`` and ``weight_decay`` are the values
            of parameters that no group overrides).
        paramwise_cfg (dict, optional): Keys:

            - ``params`` (list[dict]): One dict per parameter group, in
              upstream's order. ``params`` (str) is the regular expression
              matched against each parameter name; every other key (``lr``,
              ``weight_decay``, ``betas``, ...) is that group's optimizer
              option, as torch's parameter groups take them. Defaults to
              ``[]``.
            - ``param_name_map`` (dict | callable, optional): Maps the
              model's parameter names to the names the regexes were
              written for, where a port names its modules differently from
              upstream. A callable ``fn(model, **kwargs)`` returning
              ``{model name: upstream name}`` for every trainable
              parameter, or a dict ``dict(type=NAME, **kwargs)`` naming
              such a function in ``mmengine.registry.FUNCTIONS``. Defaults
              to None (the regexes see the model's own names).
    """

    def _validate_cfg(self) -> None:
        """Check the keys above instead of MMEngine's ``custom_keys`` and
        multipliers (differs from ``super()._validate_cfg``)."""
        if not isinstance(self.paramwise_cfg, dict):
            raise TypeError('paramwise_cfg of RegexOptimWrapperConstructor '
                            'must be a dict or None, got '
                            f'{type(self.paramwise_cfg).__name__}.')
        unknown = sorted(set(self.paramwise_cfg) - set(KEYS))
        if unknown:
            mmengine_keys = [
                k for k in unknown if k in MMENGINE_PARAMWISE_KEYS
            ]
            hint = (
                f' {mmengine_keys} belong to DefaultOptimWrapperConstructor: '
                'write them as regex groups in params, or drop '
                "constructor='RegexOptimWrapperConstructor'."
                if mmengine_keys else '')
            raise ValueError(
                f'paramwise_cfg has keys {unknown} that '
                f'RegexOptimWrapperConstructor does not take; it takes '
                f'{list(KEYS)}.{hint}')
        groups = self.paramwise_cfg.get('params', [])
        if not isinstance(groups, (list, tuple)):
            raise TypeError(
                'paramwise_cfg.params must be a list of dicts such as '
                "dict(params='^(?=.*backbone)(?!.*norm).*$', lr=1e-5), got "
                f'{type(groups).__name__}.')
        for index, group in enumerate(groups):
            self._validate_group(index, group)
        name_map = self.paramwise_cfg.get('param_name_map')
        if not (name_map is None or callable(name_map) or
                (isinstance(name_map, dict) and 'type' in name_map)):
            raise TypeError(
                'paramwise_cfg.param_name_map must be None, a function or '
                "dict(type='<function in mmengine FUNCTIONS>', ...), got "
                f'{name_map!r}.')

    @staticmethod
    def _validate_group(index: int, group) -> None:
        if not isinstance(group, dict) or not isinstance(
                group.get('params'), str):
            raise TypeError(
                f'paramwise_cfg.params[{index}] must be a dict whose '
                "'params' is a regular expression (str), e.g. "
                f"dict(params='backbone', lr=1e-5); got {group!r}.")
        try:
            re.compile(group['params'])
        except re.error as error:
            raise ValueError(
                f'paramwise_cfg.params[{index}].params = '
                f"{group['params']!r} is not a valid regular expression: "
                f'{error}.') from error

    def add_params(self, params: List[dict], module: nn.Module,
                   **kwargs) -> None:
        """Append upstream's parameter groups of ``module`` to ``params``.

        Replaces ``DefaultOptimWrapperConstructor.add_params`` (see the
        class docstring); ``**kwargs`` (its recursion state) is unused.
        """
        trainable = {
            name: param
            for name, param in module.named_parameters() if param.requires_grad
        }
        names = self._upstream_names(module, list(trainable))
        owner: Dict[str, int] = {}
        for index, spec in enumerate(self.paramwise_cfg.get('params', [])):
            pattern = spec['params']
            group = {k: v for k, v in spec.items() if k != 'params'}
            group['params'] = []
            for name, param in trainable.items():
                if re.search(pattern, names[name]) is None:
                    continue
                if name in owner:
                    raise ValueError(
                        self._overlap_message(name, names[name], owner[name],
                                              index))
                owner[name] = index
                group['params'].append(param)
            params.append(group)
        rest = [p for name, p in trainable.items() if name not in owner]
        if rest:
            params.append({'params': rest})

    def _overlap_message(self, name: str, upstream_name: str, first: int,
                         second: int) -> str:
        groups = self.paramwise_cfg['params']
        return (f'Parameter {name!r} (matched as {upstream_name!r}) matches '
                f"paramwise_cfg.params[{first}] ({groups[first]['params']!r})"
                f" and params[{second}] ({groups[second]['params']!r}); a "
                'parameter can be in one group only (upstream RT-DETR\'s '
                'optimizer refuses it too). Make the regexes exclusive, e.g. '
                "with a negative look-ahead '(?!.*norm)'.")

    def _upstream_names(self, module: nn.Module,
                        names: List[str]) -> Dict[str, str]:
        """``{model name: name the regexes see}`` for ``names``."""
        name_map = self._name_map_function()
        if name_map is None:
            return {name: name for name in names}
        function, kwargs = name_map
        mapped = function(module, **kwargs)
        missing = [name for name in names if name not in mapped]
        if missing:
            raise ValueError(
                f'paramwise_cfg.param_name_map ({function.__name__}) gave no '
                f'upstream name for {len(missing)} trainable parameter(s), '
                f'e.g. {missing[:5]}; the regexes cannot place them. Extend '
                'the map, or set param_name_map=None if the model uses '
                "upstream's names.")
        return mapped

    def _name_map_function(self) -> Optional[tuple]:
        name_map: Union[None, Callable,
                        dict] = self.paramwise_cfg.get('param_name_map')
        if name_map is None:
            return None
        if callable(name_map):
            return name_map, {}
        kwargs = dict(name_map)
        name = kwargs.pop('type')
        function = name if callable(name) else FUNCTIONS.get(name)
        if function is None:
            raise ValueError(
                f'paramwise_cfg.param_name_map type {name!r} is not in '
                "mmengine's FUNCTIONS registry; import the module that "
                'registers it (custom_imports), or pass the function.')
        return function, kwargs
