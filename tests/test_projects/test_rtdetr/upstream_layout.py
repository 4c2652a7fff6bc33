"""Key/shape layouts of upstream RT-DETR state dicts, for synthetic
checkpoints.

Written from the module structure of lyuwenyu/RT-DETR (``src/nn/backbone/
presnet.py``, ``src/zoo/rtdetr/hybrid_encoder.py``, ``rtdetr_decoder.py``
and ``rtdetrv2_decoder.py`` of ``rtdetr_pytorch`` and ``rtdetrv2_pytorch``):
module names, nesting and tensor shapes, not code. ``data/
make_upstream_layouts.py`` checks these functions against the modules of an
upstream checkout for every zoo model, and regenerates the pinned r18vd
layouts in ``data/`` that the tests compare them with. The values of the
anchor buffers, which the layouts give shapes of only, are upstream's
arithmetic (:func:`upstream_anchors`), shared with the D-FINE family.
"""
from typing import Dict, List, Sequence

Layout = Dict[str, List[int]]

# PResNet blocks per stage, as upstream's ResNet_cfg
BLOCKS = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3], 50: [3, 4, 6, 3],
          101: [3, 4, 23, 3]}

#: The official COCO models: (version, name) -> architecture keywords of
#: :func:`rtdetr_layout` (upstream configs/rtdetr*/ *.yml).
ZOO = {
    (1, 'r18vd'): dict(depth=18, expansion=0.5, num_layers=3),
    (1, 'r34vd'): dict(depth=34, expansion=0.5, num_layers=4),
    (1, 'r50vd_m'): dict(depth=50, expansion=0.5, num_layers=6),
    (1, 'r50vd'): dict(depth=50, expansion=1.0, num_layers=6),
    (1, 'r101vd'): dict(depth=101, hidden_dim=384, encoder_ffn=2048,
                        num_layers=6),
}
ZOO.update({(2, name): arch for (_, name), arch in list(ZOO.items())})


def batch_norm(prefix: str, channels: int, frozen: bool = False) -> Layout:
    """BatchNorm2d; upstream's FrozenBatchNorm2d has no counter."""
    layout = {
        f'{prefix}.{name}': [channels]
        for name in ('weight', 'bias', 'running_mean', 'running_var')
    }
    if not frozen:
        layout[f'{prefix}.num_batches_tracked'] = []
    return layout


def conv_norm(prefix: str, cin: int, cout: int, kernel: int,
              frozen: bool = False) -> Layout:
    """Upstream ConvNormLayer: ``conv`` (no bias) + ``norm``."""
    layout = {f'{prefix}.conv.weight': [cout, cin, kernel, kernel]}
    layout.update(batch_norm(f'{prefix}.norm', cout, frozen))
    return layout


def presnet_layout(depth: int, frozen_norm: bool = False) -> Layout:
    """PResNet variant 'd', 4 stages, no prefix (the ImageNet files)."""
    layout = {}
    stem = [(3, 32), (32, 32), (32, 64)]
    for i, (cin, cout) in enumerate(stem, 1):
        layout.update(
            conv_norm(f'conv1.conv1_{i}', cin, cout, 3, frozen_norm))
    expansion = 4 if depth >= 50 else 1
    cin = 64
    for stage, (count, width) in enumerate(zip(BLOCKS[depth],
                                               [64, 128, 256, 512])):
        cout = width * expansion
        for index in range(count):
            prefix = f'res_layers.{stage}.blocks.{index}'
            if expansion == 1:
                branches = [(cin, width, 3), (width, width, 3)]
            else:
                branches = [(cin, width, 1), (width, width, 3),
                            (width, cout, 1)]
            for name, (bin_, bout, kernel) in zip('abc', branches):
                layout.update(
                    conv_norm(f'{prefix}.branch2{name}', bin_, bout, kernel,
                              frozen_norm))
            if index == 0:
                # stride-2 stages pool, then project ('short.conv')
                short = f'{prefix}.short' + ('.conv' if stage else '')
                layout.update(conv_norm(short, cin, cout, 1, frozen_norm))
            cin = cout
    return layout


def _linear(prefix: str, cin: int, cout: int) -> Layout:
    return {f'{prefix}.weight': [cout, cin], f'{prefix}.bias': [cout]}


def _layer_norm(prefix: str, dims: int) -> Layout:
    return {f'{prefix}.weight': [dims], f'{prefix}.bias': [dims]}


def _self_attn(prefix: str, dims: int) -> Layout:
    layout = {
        f'{prefix}.in_proj_weight': [3 * dims, dims],
        f'{prefix}.in_proj_bias': [3 * dims]
    }
    layout.update(_linear(f'{prefix}.out_proj', dims, dims))
    return layout


def _mlp(prefix: str, dims: Sequence[int]) -> Layout:
    layout = {}
    for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
        layout.update(_linear(f'{prefix}.layers.{i}', cin, cout))
    return layout


def hybrid_encoder_layout(version: int, in_channels: Sequence[int],
                          hidden_dim: int, encoder_ffn: int,
                          expansion: float) -> Layout:
    """HybridEncoder, prefix ``encoder.``; 1 AIFI layer on the last
    level, 3 RepVGG blocks per CSP block."""
    layout = {}
    for i, channels in enumerate(in_channels):
        conv, norm = ('conv', 'norm') if version == 2 else ('0', '1')
        prefix = f'encoder.input_proj.{i}'
        layout[f'{prefix}.{conv}.weight'] = [hidden_dim, channels, 1, 1]
        layout.update(batch_norm(f'{prefix}.{norm}', hidden_dim))
    aifi = 'encoder.encoder.0.layers.0'
    layout.update(_self_attn(f'{aifi}.self_attn', hidden_dim))
    layout.update(_linear(f'{aifi}.linear1', hidden_dim, encoder_ffn))
    layout.update(_linear(f'{aifi}.linear2', encoder_ffn, hidden_dim))
    for norm in ('norm1', 'norm2'):
        layout.update(_layer_norm(f'{aifi}.{norm}', hidden_dim))
    hidden = int(hidden_dim * expansion)
    for i in range(len(in_channels) - 1):
        layout.update(
            conv_norm(f'encoder.lateral_convs.{i}', hidden_dim, hidden_dim,
                      1))
        layout.update(
            conv_norm(f'encoder.downsample_convs.{i}', hidden_dim,
                      hidden_dim, 3))
        for block in ('fpn_blocks', 'pan_blocks'):
            prefix = f'encoder.{block}.{i}'
            for conv in ('conv1', 'conv2'):
                layout.update(
                    conv_norm(f'{prefix}.{conv}', 2 * hidden_dim, hidden, 1))
            for k in range(3):
                layout.update(
                    conv_norm(f'{prefix}.bottlenecks.{k}.conv1', hidden,
                              hidden, 3))
                layout.update(
                    conv_norm(f'{prefix}.bottlenecks.{k}.conv2', hidden,
                              hidden, 1))
            if hidden != hidden_dim:
                layout.update(
                    conv_norm(f'{prefix}.conv3', hidden, hidden_dim, 1))
    return layout


def decoder_layout(version: int,
                   feat_channels: Sequence[int],
                   num_layers: int,
                   num_classes: int = 80,
                   dims: int = 256,
                   ffn: int = 1024,
                   num_heads: int = 8,
                   num_points: int = 4,
                   eval_size: int = 640) -> Layout:
    """RTDETRTransformer (v1) / RTDETRTransformerv2, prefix ``decoder.``;
    v2 adds the buffers of its ``eval_spatial_size`` anchors and the
    per-point scale of its deformable attention."""
    num_levels = len(feat_channels)
    layout = {}
    for i, channels in enumerate(feat_channels):
        layout[f'decoder.input_proj.{i}.conv.weight'] = [dims, channels, 1, 1]
        layout.update(batch_norm(f'decoder.input_proj.{i}.norm', dims))
    samples = num_heads * num_levels * num_points
    for i in range(num_layers):
        prefix = f'decoder.decoder.layers.{i}'
        layout.update(_self_attn(f'{prefix}.self_attn', dims))
        layout.update(_layer_norm(f'{prefix}.norm1', dims))
        attn = f'{prefix}.cross_attn'
        layout.update(_linear(f'{attn}.sampling_offsets', dims, 2 * samples))
        layout.update(_linear(f'{attn}.attention_weights', dims, samples))
        layout.update(_linear(f'{attn}.value_proj', dims, dims))
        layout.update(_linear(f'{attn}.output_proj', dims, dims))
        if version == 2:
            layout[f'{attn}.num_points_scale'] = [num_levels * num_points]
        layout.update(_layer_norm(f'{prefix}.norm2', dims))
        layout.update(_linear(f'{prefix}.linear1', dims, ffn))
        layout.update(_linear(f'{prefix}.linear2', ffn, dims))
        layout.update(_layer_norm(f'{prefix}.norm3', dims))
    layout['decoder.denoising_class_embed.weight'] = [num_classes + 1, dims]
    layout.update(_mlp('decoder.query_pos_head', [4, 2 * dims, dims]))
    proj, norm = ('proj', 'norm') if version == 2 else ('0', '1')
    layout.update(_linear(f'decoder.enc_output.{proj}', dims, dims))
    layout.update(_layer_norm(f'decoder.enc_output.{norm}', dims))
    layout.update(_linear('decoder.enc_score_head', dims, num_classes))
    layout.update(_mlp('decoder.enc_bbox_head', [dims, dims, dims, 4]))
    for i in range(num_layers):
        layout.update(
            _linear(f'decoder.dec_score_head.{i}', dims, num_classes))
        layout.update(
            _mlp(f'decoder.dec_bbox_head.{i}', [dims, dims, dims, 4]))
    if version == 2:
        tokens = sum((eval_size // s)**2 for s in (8, 16, 32))
        layout['decoder.anchors'] = [1, tokens, 4]
        layout['decoder.valid_mask'] = [1, tokens, 1]
    return layout


def rtdetr_layout(version: int,
                  depth: int,
                  num_layers: int,
                  expansion: float = 1.0,
                  hidden_dim: int = 256,
                  encoder_ffn: int = 1024,
                  num_classes: int = 80) -> Layout:
    """A whole upstream RT-DETR: backbone (frozen norms from ResNet-50 on,
    as upstream's ``freeze_norm``), encoder and decoder."""
    frozen = depth >= 50
    layout = {
        f'backbone.{k}': v
        for k, v in presnet_layout(depth, frozen).items()
    }
    in_channels = [128, 256, 512] if depth < 50 else [512, 1024, 2048]
    layout.update(
        hybrid_encoder_layout(version, in_channels, hidden_dim, encoder_ffn,
                              expansion))
    layout.update(
        decoder_layout(version, [hidden_dim] * 3, num_layers, num_classes))
    return layout


def zoo_layout(version: int, name: str) -> Layout:
    """Layout of an official COCO model, e.g. ``zoo_layout(2, 'r50vd_m')``.
    """
    return rtdetr_layout(version, **ZOO[(version, name)])


def synthetic_state_dict(layout: Layout, seed: int = 0) -> dict:
    """Random tensors with exactly ``layout``'s keys and shapes, finite
    through a forward pass: values N(0, 0.1^2), BN variances in [0.5,
    1.5), counters 7, and v2's ``num_points_scale`` upstream's value for 4
    points per level (1/4), as real checkpoints hold."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in layout.items():
        if key.endswith('num_points_scale'):
            state[key] = torch.full(shape, 1 / 4)
        elif key.endswith('running_var'):
            state[key] = torch.rand(shape, generator=gen) + 0.5
        elif not shape:
            state[key] = torch.tensor(7)
        else:
            state[key] = 0.1 * torch.randn(shape, generator=gen)
    return state


def upstream_anchors(eval_size: Sequence[int], strides: Sequence[int]):
    """The ``anchors`` and ``valid_mask`` buffers upstream caches for its
    ``eval_spatial_size``: ``_generate_anchors`` (grid_size 0.05, eps
    0.01) of RT-DETRv2's ``rtdetrv2_decoder.py``, D-FINE's
    ``dfine_decoder.py`` and DEIM's / DEIMv2's ``engine/deim/*_decoder.py``
    (the same code in the four trees, at the commits the data/ READMEs
    pin), written out here so that tests compare the port with upstream's
    arithmetic, not with itself."""
    import torch
    eval_h, eval_w = eval_size
    anchors = []
    for lvl, s in enumerate(strides):
        h, w = int(eval_h / s), int(eval_w / s)
        grid_y, grid_x = torch.meshgrid(
            torch.arange(h), torch.arange(w), indexing='ij')
        grid_xy = torch.stack([grid_x, grid_y], dim=-1)
        grid_xy = (grid_xy.unsqueeze(0) + 0.5) / torch.tensor(
            [w, h], dtype=torch.float32)
        wh = torch.ones_like(grid_xy) * 0.05 * (2.0**lvl)
        anchors.append(
            torch.concat([grid_xy, wh], dim=-1).reshape(-1, h * w, 4))
    anchors = torch.concat(anchors, dim=1)
    valid_mask = ((anchors > 0.01) * (anchors < 1 - 0.01)).all(
        -1, keepdim=True)
    anchors = torch.log(anchors / (1 - anchors))
    return torch.where(valid_mask, anchors, torch.inf), valid_mask


def with_upstream_anchors(state: dict, eval_size: Sequence[int],
                          strides: Sequence[int]) -> dict:
    """``state`` (a synthetic checkpoint, random values everywhere) with
    the values upstream holds in its anchor buffers, where it has them."""
    if 'decoder.anchors' in state:
        anchors, valid_mask = upstream_anchors(eval_size, strides)
        state['decoder.anchors'] = anchors
        state['decoder.valid_mask'] = valid_mask
    return state
