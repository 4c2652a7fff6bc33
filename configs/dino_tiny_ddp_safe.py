# The demo model: tiny DINO with DDP-safe contrastive denoising (the
# documented two-line override of a stock DINO config) and the whole
# mmddp_ext stack. A rank whose batch has no GT trains with a zero-weighted
# dummy denoising group instead of a different graph.
#   bash tools/dist_train.sh configs/dino_tiny_ddp_safe.py 2
_base_ = ['./dino_tiny.py']

model = dict(type='DDPSafeDINO', bbox_head=dict(type='DDPSafeDINOHead'))
