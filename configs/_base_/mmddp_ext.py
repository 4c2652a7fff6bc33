# The one-line opt-in: add this file to `_base_` of an existing MMDet 3.x
# config to run it with mmddp_ext:
#
#     _base_ = ['./my_dino_config.py', 'path/to/mmddp_ext/configs/_base_/mmddp_ext.py']
#
# - custom_imports registers mmddp_ext's components.
# - runner_type='ExtRunner' makes launcher='pytorch' work on CPU (gloo) as
#   well as GPU (nccl), and writes checkpoints that load with
#   torch.load(weights_only=True) on torch >= 2.6.
custom_imports = dict(imports=['mmddp_ext'], allow_failed_imports=False)
runner_type = 'ExtRunner'

