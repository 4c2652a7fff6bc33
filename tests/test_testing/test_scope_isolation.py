"""A default scope one test makes does not reach the next one (the two
tests run in this order, in one worker: xdist keeps a file together)."""
from mmengine.registry import DefaultScope

SEEN = {}


def test_a_test_that_leaves_the_mmengine_scope_current():
    SEEN['before'] = DefaultScope.get_current_instance()
    DefaultScope.get_instance('left_by_a_test', scope_name='mmengine')
    assert DefaultScope.get_current_instance().scope_name == 'mmengine'


def test_the_next_test_starts_with_the_scope_before_it():
    assert DefaultScope.get_current_instance() is SEEN['before']
