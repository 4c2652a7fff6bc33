r"""Convert official DEIMv2 (Intellindust-AI-Lab/DEIMv2) weights for
projects/DEIMv2.

Three kinds of source file are recognised from their keys:

- a detector checkpoint (keys ``backbone.*``, ``encoder.*``,
  ``decoder.*``, under ``ema.module`` or ``model``); the output is a state
  dict of the ``DEIMv2`` model, for ``load_from``:

    python tools/convert_deimv2_checkpoint.py deimv2_dinov3_s_coco.pth \
        checkpoints/deimv2_dinov3_s_coco_mmdet.pth \
        --config projects/DEIMv2/configs/deimv2_dinov3_s_coco.py

  DEIMv2's decoder keeps D-FINE's module names (``decoder.decoder.layers``,
  ``dec_bbox_head``, ...), so the mapping is
  ``tools/convert_dfine_checkpoint.py``'s, key for key; where a config
  shares the box branch (Atto, Femto, Pico: ``share_bbox_head``) upstream
  saves the one branch under every layer index, and those copies must be
  equal;
- a ViT file DEIMv2 starts from (``vitt_distill.pt``,
  ``vittplus_distill.pt``, DINOv3's ``dinov3_vits16*_pretrain_*.pth``:
  keys ``blocks.*``, ``patch_embed.*``, ``cls_token``): its names are the
  ViT's (``DINOv3STAs.vit``), so the configs load it as it is
  (``backbone.vit_init_cfg``); converting it checks it against a config's
  ViT;
- an ImageNet HGNetv2 file (``PPHGNetV2_B0_stage1.pth`` ...: keys
  ``stem.*``, ``stages.*``): names unchanged. For Atto, Femto and Pico,
  which upstream starts from B0's file, only the keys whose shapes match
  the config's backbone are kept, as upstream loads it; each dropped key
  is printed.

Every mapped key is printed. The conversion fails (exit code 1) on the
conditions ``tools/convert_dfine_checkpoint.py`` lists, on unequal copies
of a shared branch, and, with ``--config``, on ViT keys or shapes that
differ from the config's ViT.
"""
import argparse
import importlib.util
import os.path as osp
import re
import sys
from typing import Callable, Dict, Optional

import torch


def _sibling(name: str):
    """Import a script of this folder by file (tools/ is no package)."""
    path = osp.join(osp.dirname(osp.abspath(__file__)), f'{name}.py')
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# D-FINE's converter: the same decoder names, the same checkpoint handling.
_dfine = _sibling('convert_dfine_checkpoint')
ConversionError = _dfine.ConversionError
load_checkpoint = _dfine.load_checkpoint
save_converted = _dfine.save_converted
select_state_dict = _dfine.select_state_dict
reference_model = _dfine.reference_model
model_num_points = _dfine.model_num_points
is_hgnetv2_checkpoint = _dfine.is_backbone_checkpoint
_check_against = _dfine._rtdetr._check_against
_strip_module = _dfine._rtdetr._strip_module

VIT_KEY = re.compile(r'(blocks\.\d+\.|patch_embed\.|cls_token$)')
BRANCH = re.compile(r'^decoder\.(dec_bbox_head|dec_score_head)\.(\d+)\.(.+)$')


def is_vit_checkpoint(upstream: Dict[str, torch.Tensor]) -> bool:
    """True for a backbone-only ViT file (no detector prefix)."""
    keys = [_strip_module(k) for k in upstream]
    return any(VIT_KEY.match(k) for k in keys) and not any(
        k.startswith(('backbone.', 'encoder.', 'decoder.')) for k in keys)


def _shared_copy_problems(upstream: Dict[str, torch.Tensor], model) -> list:
    """Upstream keys of one shared branch (the model lists one module
    under several indices) that differ from index 0's."""
    if model is None:
        return []
    shared = {
        'dec_bbox_head': model.bbox_head.reg_branches,
        'dec_score_head': model.bbox_head.cls_branches
    }
    problems = []
    for key, value in upstream.items():
        match = BRANCH.match(_strip_module(key))
        if not match or match[2] == '0':
            continue
        branches = shared[match[1]]
        if branches[int(match[2])] is not branches[0]:
            continue
        first = upstream.get(f'decoder.{match[1]}.0.{match[3]}')
        if first is None or not torch.equal(first, value):
            problems.append(
                f'{key} differs from decoder.{match[1]}.0.{match[3]}, but '
                'the config shares this branch (share_bbox_head / '
                'share_score_head): use the config of the same model size.')
    return problems


def convert_detector_state_dict(
        upstream: Dict[str, torch.Tensor],
        model=None,
        log: Callable[[str], None] = print) -> Dict[str, torch.Tensor]:
    """A DEIMv2 detector state dict in the port's names.

    Args:
        upstream (dict): Upstream state dict.
        model (DEIMv2, optional): The config's model; when given, every
            shape, the sampling points and the shared branches are checked
            and every model key must be produced.
        log (callable): Receives one line per key.

    Returns:
        dict: The converted state dict.

    Raises:
        ConversionError: listing every problem at once.
    """
    problems = _shared_copy_problems(upstream, model)
    if problems:
        raise ConversionError('DEIMv2 checkpoint conversion failed:\n  ' +
                              '\n  '.join(problems))
    return _dfine.convert_state_dict(upstream, model and model.state_dict(),
                                     model and model_num_points(model), log)


def convert_vit_state_dict(
        upstream: Dict[str, torch.Tensor],
        reference: Optional[Dict[str, torch.Tensor]] = None,
        log: Callable[[str], None] = print) -> Dict[str, torch.Tensor]:
    """A ViT file, checked (names are unchanged).

    Args:
        upstream (dict): The ViT state dict.
        reference (dict, optional): ``model.backbone.vit.state_dict()``.
        log (callable): Receives one line per key.

    Returns:
        dict: The ViT state dict.
    """
    converted = {_strip_module(k): v for k, v in upstream.items()}
    for key, value in converted.items():
        log(f'keep  {key} {tuple(value.shape)}')
    if reference is not None:
        problems = _check_against(converted, reference)
        if problems:
            raise ConversionError(
                'DEIMv2 ViT file check failed (is it the file of this '
                'size? S: vitt_distill.pt, M: vittplus_distill.pt, L: '
                'dinov3_vits16, X: dinov3_vits16plus):\n  ' +
                '\n  '.join(problems))
    return converted


def convert_hgnetv2_state_dict(
        upstream: Dict[str, torch.Tensor],
        reference: Optional[Dict[str, torch.Tensor]] = None,
        log: Callable[[str], None] = print) -> Dict[str, torch.Tensor]:
    """An ImageNet HGNetv2 file; with a ``reference`` (the config's
    backbone state dict) only the keys it has with the same shape are
    kept, as upstream loads B0's file into Atto, Femto and Pico."""
    converted = {_strip_module(k): v for k, v in upstream.items()}
    if reference is None:
        return converted
    kept = {}
    for key, value in converted.items():
        if key in reference and reference[key].shape == value.shape:
            kept[key] = value
            log(f'keep  {key} {tuple(value.shape)}')
        else:
            log(f'drop  {key} {tuple(value.shape)} (not in this backbone '
                'or another shape)')
    if not kept:
        raise ConversionError(
            'DEIMv2 HGNetv2 file: no key matches the config\'s backbone; '
            'pass the config of a HGNetv2 size.')
    return kept


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        'src', help='upstream DEIMv2 checkpoint, ViT or HGNetv2 file')
    parser.add_argument('dst', help='output file')
    parser.add_argument(
        '--config',
        help='our model config; checks every shape, the sampling points, '
        'the shared branches and that no model key is missing '
        '(recommended)')
    parser.add_argument(
        '--trust-pickle',
        action='store_true',
        help='load the source with weights_only=False (only for files you '
        'trust, if the safe loader refuses it)')
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    try:
        checkpoint = load_checkpoint(args.src, args.trust_pickle)
        upstream, source = select_state_dict(checkpoint)
        model = reference_model(args.config) if args.config else None
        if is_vit_checkpoint(upstream):
            print(f'converting {len(upstream)} tensors (ViT) from {source}')
            converted = convert_vit_state_dict(
                upstream, model and model.backbone.vit.state_dict())
        elif is_hgnetv2_checkpoint(upstream):
            print(f'converting {len(upstream)} tensors (HGNetv2) from '
                  f'{source}')
            converted = convert_hgnetv2_state_dict(
                upstream, model and model.backbone.state_dict())
        else:
            print(f'converting {len(upstream)} tensors (DEIMv2) from '
                  f'{source}')
            converted = convert_detector_state_dict(upstream, model)
    except ConversionError as error:
        print(error, file=sys.stderr)
        return 1
    save_converted(converted, args.dst, args.src, source)
    return 0


if __name__ == '__main__':
    sys.exit(main())
