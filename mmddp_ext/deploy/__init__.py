"""Deployment of the real-time DETRs (RT-DETR, D-FINE, DEIM, DEIMv2) with
upstream's ONNX contract: ``(images, orig_target_sizes) -> (labels,
boxes, scores)``.

Importing this registers nothing and imports neither ``onnx`` nor
``onnxruntime`` (the ``deploy`` extra): only :func:`export_onnx` and the
ONNX Runtime helpers do, when called. The contract, the weights used and
the measured agreement: ``docs/deploy.md``.

    model, info = build_deploy_model('CONFIG.py', 'CHECKPOINT.pth')
    labels, boxes, scores = model(images, orig_target_sizes)
    export_onnx(model, info, 'model.onnx')
"""
from .build_deploy_model import DeployInfo, build_deploy_model
from .deploy_model import (DeployModel, check_deployable_head,
                           check_deployable_type)
from .onnx_export import (BATCH_AXIS, INPUT_NAMES, OUTPUT_NAMES,
                          default_onnx_path, export_onnx,
                          onnxruntime_differences, run_onnxruntime)
from .rtdetr_postprocess import rtdetr_postprocess

__all__ = [
    'BATCH_AXIS', 'INPUT_NAMES', 'OUTPUT_NAMES', 'DeployInfo', 'DeployModel',
    'build_deploy_model', 'check_deployable_head', 'check_deployable_type',
    'default_onnx_path', 'export_onnx', 'onnxruntime_differences',
    'rtdetr_postprocess', 'run_onnxruntime'
]
