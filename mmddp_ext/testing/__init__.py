"""Helpers for testing DDP behaviour on real gloo ranks (used by tests/ and
by users debugging DDP on a laptop). Importing this registers nothing.

The rank launcher itself lives in :mod:`mmddp_ext.launch.rank_launcher`
(the DDP doctor runs its probe with it); it is re-exported here for the
tests' convenience."""
from ..launch.rank_launcher import (MultiRankError, free_port,
                                    kill_process_tree, process_tree,
                                    run_command, run_on_ranks)
from .meta_weights import weights_on_meta
from .model_index import model_index_read_once
from .rank_device import like_a_rank, on_rank_device, rank_test_device
from .runs_in_one_launch import RunsInOneLaunch, run_in_turn
from .synthetic_coco import make_synthetic_coco

__all__ = [
    'MultiRankError', 'free_port', 'kill_process_tree', 'process_tree',
    'run_command', 'run_on_ranks', 'make_synthetic_coco', 'weights_on_meta',
    'like_a_rank', 'on_rank_device', 'rank_test_device',
    'model_index_read_once', 'RunsInOneLaunch', 'run_in_turn'
]
