"""DDP-safe denoising queries with RT-DETR's class embedding layout."""
from mmdet.registry import MODELS
from torch import nn

from mmddp_ext.models.layers import DDPSafeCdnQueryGenerator


@MODELS.register_module()
class RTDETRCdnQueryGenerator(DDPSafeCdnQueryGenerator):
    """:class:`DDPSafeCdnQueryGenerator` whose label embedding has upstream
    RT-DETR's shape.

    Differs from ``CdnQueryGenerator.__init__`` only in
    ``label_embedding``: ``nn.Embedding(num_classes + 1, embed_dims,
    padding_idx=num_classes)`` like upstream's ``denoising_class_embed``,
    so converted checkpoints map 1:1. The extra padding row is never
    looked up (labels, noisy labels and the dummy group's label 0 are all
    below ``num_classes``), so the queries are the same as with mmdet's
    ``num_classes`` rows. The GT-less dummy group and ``dn_meta`` come
    unchanged from :class:`DDPSafeCdnQueryGenerator`.

    Accepts the config keys of :class:`DDPSafeCdnQueryGenerator`.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.label_embedding = nn.Embedding(
            self.num_classes + 1,
            self.embed_dims,
            padding_idx=self.num_classes)
