"""DINO with the DDP-safe denoising generator and head."""
import torch
from mmdet.models.detectors import DINO
from mmdet.registry import MODELS
from mmdet.utils import OptConfigType

from ..dense_heads.ddp_safe_dino_head import DDPSafeDINOHead
from ..layers.ddp_safe_cdn_query_generator import DDPSafeCdnQueryGenerator


@MODELS.register_module()
class DDPSafeDINO(DINO):
    """``DINO`` that uses :class:`DDPSafeCdnQueryGenerator`.

    Select it with the two-line override of a stock DINO config::

        model = dict(type='DDPSafeDINO',
                     bbox_head=dict(type='DDPSafeDINOHead'))

    Differs from ``DINO.__init__`` only in the dn query generator.
    Upstream builds ``CdnQueryGenerator(**dn_cfg)`` directly rather than
    through the registry, so this class lets ``super().__init__`` build it
    and swaps in the DDP-safe generator with the same config and the same
    ``label_embedding`` weights. The swap runs under a forked CPU RNG, so
    parameter initialisation, and with it training whenever every batch
    has GT, is bit-identical to ``DINO``.

    The upstream guard in ``DINO.forward_decoder`` (``len(query) ==
    self.num_queries``, which compares the batch size) is left as is: with
    the dummy group, ``label_embedding`` is in the graph on every rank.

    Args:
        dn_cfg (dict): Config of the dn query generator, with the keys of
            ``CdnQueryGenerator`` except ``num_classes``, ``embed_dims``
            and ``num_matching_queries``, which come from the detector.
            Required.
        *args, **kwargs: Forwarded unchanged to ``DINO``.
    """
    # Its own path for a batch without GT is DDP-safe, so the doctor may
    # name it in a paste line (mmddp_ext.doctor.ddp_safe_types); a
    # subclass that keeps that path declares it again.
    ddp_safe_empty_gt = True

    def __init__(self, *args, dn_cfg: OptConfigType = None, **kwargs) -> None:
        if dn_cfg is None:
            raise ValueError(
                'DDPSafeDINO needs model.dn_cfg (the denoising query '
                'generator config), but got None. Copy dn_cfg from a stock '
                'DINO config, e.g. dict(label_noise_scale=0.5, '
                'box_noise_scale=1.0, group_cfg=dict(dynamic=True, '
                'num_groups=None, num_dn_queries=100)).')
        super().__init__(*args, dn_cfg=dn_cfg, **kwargs)
        if not isinstance(self.bbox_head, DDPSafeDINOHead):
            raise TypeError(
                'DDPSafeDINO needs model.bbox_head.type="DDPSafeDINOHead" '
                '(or a subclass), which gives the dummy denoising group '
                'zero loss weight, but got '
                f'{type(self.bbox_head).__name__}. Add '
                "bbox_head=dict(type='DDPSafeDINOHead') next to "
                "type='DDPSafeDINO' in the model config.")
        self.dn_query_generator = self._ddp_safe_generator(dn_cfg)

    def _ddp_safe_generator(self, dn_cfg: dict) -> DDPSafeCdnQueryGenerator:
        """The DDP-safe twin of the generator ``DINO.__init__`` built."""
        generator_cfg = dict(
            dn_cfg,
            num_classes=self.bbox_head.num_classes,
            embed_dims=self.embed_dims,
            num_matching_queries=self.num_queries)
        # A new nn.Embedding draws its init from the global RNG; fork it so
        # that every later initialisation matches upstream DINO.
        with torch.random.fork_rng(devices=[]):
            generator = DDPSafeCdnQueryGenerator(**generator_cfg)
        generator.load_state_dict(self.dn_query_generator.state_dict())
        return generator
