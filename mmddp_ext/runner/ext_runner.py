import copy
from typing import Dict, List, Optional, Union

import torch.nn as nn
from mmengine.device import get_device
from mmengine.dist import is_distributed
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import MODEL_WRAPPERS, RUNNERS
from mmengine.runner import Runner
from torch.nn.parallel import DistributedDataParallel

from ..hooks.safe_checkpoint_hook import SafeCheckpointHook
from ..utils.checkpoint_safety import safe_checkpoint_loading
from ..utils.dist_env import init_distributed, rank_device


@RUNNERS.register_module()
class ExtRunner(Runner):
    """MMEngine ``Runner`` that launches on CPU or GPU and resumes safely.

    Select it with ``runner_type = 'ExtRunner'`` (``tools/train.py`` and
    ``configs/_base_/mmddp_ext.py`` do). Compared with ``Runner`` it
    differs in four methods, each calling ``super()`` for everything else:

    - ``setup_env``: initialises the process group through
      :func:`mmddp_ext.utils.dist_env.init_distributed`, which picks gloo
      when NCCL cannot run and sets a CUDA device only when there is one.
    - ``wrap_model``: passes ``device_ids`` to a DDP wrapper only for a
      model on a CUDA device (stock passes ``[LOCAL_RANK]`` always).
    - ``register_hooks``: adds :class:`SafeCheckpointHook`, so checkpoints
      hold only tensors and plain types.
    - ``load_checkpoint``: reads local files with ``weights_only=True``.

    Config keys it reads besides ``Runner``'s:

    - trusted_checkpoints (list[str]): Checkpoint paths that may be loaded
      with ``weights_only=False`` if the safe load refuses them (files from
      stock MMEngine). Defaults to ``[]``.
    """

    def setup_env(self, env_cfg: Dict) -> None:
        if self.distributed and not is_distributed():
            init_distributed(self.launcher,
                             **copy.deepcopy(env_cfg.get('dist_cfg', {})))
        super().setup_env(env_cfg)

    def wrap_model(self, model_wrapper_cfg: Optional[Dict],
                   model: nn.Module) -> nn.Module:
        if not self.distributed or is_model_wrapper(model):
            return super().wrap_model(model_wrapper_cfg, model)
        if model_wrapper_cfg is None:
            # The arguments stock Runner uses when no wrapper is configured.
            model_wrapper_cfg = dict(
                type='MMDistributedDataParallel',
                broadcast_buffers=False,
                find_unused_parameters=self.cfg.get('find_unused_parameters',
                                                    False))
        model_wrapper_cfg = copy.deepcopy(dict(model_wrapper_cfg))
        model_wrapper_cfg.setdefault('type', 'MMDistributedDataParallel')
        wrapper_type = MODEL_WRAPPERS.get(model_wrapper_cfg['type'])
        if isinstance(wrapper_type, type) and issubclass(
                wrapper_type, DistributedDataParallel):
            device = rank_device() if get_device() != 'cpu' else None
            model_wrapper_cfg.setdefault(
                'device_ids', None if device is None else [device.index])
        return super().wrap_model(model_wrapper_cfg, model)

    def register_hooks(
            self,
            default_hooks: Optional[Dict[str, Union[Hook, Dict]]] = None,
            custom_hooks: Optional[List[Union[Hook, Dict]]] = None) -> None:
        super().register_hooks(default_hooks, custom_hooks)
        if not any(isinstance(h, SafeCheckpointHook) for h in self._hooks):
            self.register_hook(SafeCheckpointHook())

    def load_checkpoint(self, filename: str, *args, **kwargs):
        with safe_checkpoint_loading(self.cfg.get('trusted_checkpoints')):
            return super().load_checkpoint(filename, *args, **kwargs)
