from .checkpoint_conversion import (CheckpointConversionError,
                                    build_reference_model,
                                    check_against_reference,
                                    compare_state_dicts,
                                    convert_file_to_upstream,
                                    convert_submodule_state_dict,
                                    convert_to_upstream_checkpoint,
                                    derived_decoder_buffers,
                                    drop_num_batches_tracked,
                                    feature_level_shapes,
                                    fill_num_batches_tracked,
                                    load_upstream_checkpoint,
                                    rename_to_upstream,
                                    save_converted_checkpoint,
                                    split_mmengine_checkpoint,
                                    strip_module_prefix, upstream_eval_size)
from .checkpoint_safety import (UnsafeCheckpointError, load_checkpoint_file,
                                safe_checkpoint_loading, to_plain)
from .class_count_check import check_class_counts, check_config_class_counts
from .coco_check import check_coco_file, check_config_annotations
from .precision import full_precision

__all__ = [
    'UnsafeCheckpointError', 'load_checkpoint_file', 'safe_checkpoint_loading',
    'to_plain', 'check_class_counts', 'check_config_class_counts',
    'check_coco_file', 'check_config_annotations', 'full_precision',
    'CheckpointConversionError', 'build_reference_model',
    'check_against_reference', 'convert_submodule_state_dict',
    'fill_num_batches_tracked', 'load_upstream_checkpoint',
    'save_converted_checkpoint', 'split_mmengine_checkpoint',
    'strip_module_prefix', 'compare_state_dicts', 'convert_file_to_upstream',
    'convert_to_upstream_checkpoint', 'derived_decoder_buffers',
    'drop_num_batches_tracked', 'feature_level_shapes', 'rename_to_upstream',
    'upstream_eval_size'
]
