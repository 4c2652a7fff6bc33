from .checkpoint_conflict_hook import CheckpointConflictHook
from .empty_gt_stats_hook import EmptyGTStatsHook
from .finite_predictions_hook import FinitePredictionsHook
from .nonfinite_skip_hook import NonFiniteSkipHook
from .preemption_hook import PreemptionHook
from .rank_consistency_hook import RankConsistencyHook
from .rank_status_hook import RankStatusHook
from .safe_checkpoint_hook import SafeCheckpointHook

__all__ = [
    'CheckpointConflictHook', 'EmptyGTStatsHook', 'FinitePredictionsHook',
    'NonFiniteSkipHook', 'PreemptionHook', 'RankConsistencyHook',
    'RankStatusHook', 'SafeCheckpointHook'
]
