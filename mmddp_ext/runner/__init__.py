from .ext_runner import ExtRunner
from .resumable_epoch_loop import ResumableEpochBasedTrainLoop
from .resumable_iter_loop import ResumableIterBasedTrainLoop

__all__ = [
    'ExtRunner', 'ResumableEpochBasedTrainLoop', 'ResumableIterBasedTrainLoop'
]
