"""CoDETR's ``use_lsj``: off by default, so batch padding stays masked (as
upstream trains its non-LSJ configs); on, the padded batch is the image.
On an LSJ batch (every image padded to the batch size by the pipeline)
the two settings train identically, which is why upstream's LSJ configs,
where the key has no effect, agree with the port."""
import copy

import torch

from .codetr_utils import build_tiny, tiny_model_cfg

FULL, SMALL = (96, 96), (64, 80)


def _batch(small_second_image: bool):
    from tests.test_models.dino_utils import raw_batch
    batch = raw_batch([2, 1])
    if small_second_image:
        height, width = SMALL
        batch['inputs'][1] = batch['inputs'][1][:, :height, :width]
        batch['data_samples'][1].set_metainfo(
            dict(img_shape=SMALL, ori_shape=SMALL))
    return batch


def _losses(model, batch):
    """Loss dict of ``batch`` (copied: the model writes its metainfo) and
    the img_shape each head saw."""
    data = model.data_preprocessor(copy.deepcopy(batch), training=True)
    torch.manual_seed(0)
    with torch.no_grad():
        losses = model.loss(data['inputs'], data['data_samples'])
    shapes = [tuple(s.metainfo['img_shape']) for s in data['data_samples']]
    return {k: v for k, v in losses.items() if 'loss' in k}, shapes


def _differ(first, second):
    """Whether any loss differs (the RPN's are per-level lists)."""

    def values(losses, key):
        value = losses[key]
        return torch.stack(value) if isinstance(value, list) else value

    return any(not torch.equal(values(first, k), values(second, k))
               for k in first)


def test_use_lsj_default_off_padding_masked_and_on_padding_is_image():
    cfg = tiny_model_cfg(deterministic=True)
    cfg.pop('use_lsj')  # the class default
    model = build_tiny(cfg)
    assert model.use_lsj is False

    padded = _batch(small_second_image=True)
    off, off_shapes = _losses(model, padded)
    assert off_shapes == [FULL, SMALL]  # untouched: padding masked
    assert not model._lsj_padding_logged
    model.use_lsj = True
    on, on_shapes = _losses(model, padded)
    assert on_shapes == [FULL, FULL]  # the padded batch is the image
    assert model._lsj_padding_logged  # the difference is logged
    assert on.keys() == off.keys() and _differ(on, off)

    # LSJ batch: img_shape already equals batch_input_shape.
    lsj = _batch(small_second_image=False)
    lsj_on, _ = _losses(model, lsj)
    model.use_lsj = False
    lsj_off, _ = _losses(model, lsj)
    assert not _differ(lsj_on, lsj_off)
