"""``ResumableEpochBasedTrainLoop``: MMEngine's epoch loop that resumes in
the middle of an epoch without training its first part again, and whose
random numbers are a function of the run's seed, the iteration and the
rank."""
from typing import Optional

from mmengine.registry import LOOPS
from mmengine.runner import EpochBasedTrainLoop

from ..datasets.resumable_batch_sampler import ResumableBatchSampler
from ..utils.torch_private import stop_loader_workers
from .exact_resume import reseed_step


@LOOPS.register_module()
class ResumableEpochBasedTrainLoop(EpochBasedTrainLoop):
    """``EpochBasedTrainLoop`` with an exact mid-epoch resume.

    ``ExtRunner`` builds it where a config asks for ``EpochBasedTrainLoop``
    (``mmddp_ext_cfg.exact_resume``); it takes the same arguments.

    Differs from ``EpochBasedTrainLoop`` in two places:

    - ``run_epoch``: after a resume in the middle of an epoch, the batches
      the checkpoint had trained are skipped by index in the batch
      sampler (:class:`~mmddp_ext.datasets.ResumableBatchSampler`) and
      the batch index the hooks see continues from there (MMEngine
      iterates the whole epoch again while its iteration counter goes on
      from the checkpoint). The global generators are seeded from
      ``(seed, epoch, rank)`` before the epoch's hooks run.
    - ``run_iter``: seeds them from ``(seed, iteration, rank)`` before the
      iteration's hooks run, so what a step draws (denoising noise,
      dropout, a batch-level resize) does not depend on what happened
      before it in this process, such as an evaluation or a restart.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._skip_batches = 0
        # The epoch run_epoch is in, and the iteration it started at.
        self._started_epoch: Optional[int] = None
        self._start_iter = 0

    def resume_at(self, batches_in_epoch: int) -> None:
        """Continue the resumed epoch after its first ``batches_in_epoch``
        batches."""
        sampler = self.dataloader.batch_sampler
        if not isinstance(sampler, ResumableBatchSampler):
            raise TypeError(
                'a mid-epoch resume skips batches in ResumableBatchSampler, '
                f'but the dataloader has {type(sampler).__name__}; build '
                "the runner with mmddp_ext_cfg.exact_resume=True.")
        self._skip_batches = batches_in_epoch
        sampler.next_batch = self._iter

    def batches_in_epoch(self, epoch: int, iteration: int) -> int:
        """How many batches of ``epoch`` a checkpoint that continues at
        ``(epoch, iteration)`` has trained: 0 for an epoch not begun."""
        if epoch != self._started_epoch:
            return 0
        return iteration - self._start_iter

    def run_epoch(self) -> None:
        skip, self._skip_batches = self._skip_batches, 0
        self._started_epoch = self._epoch
        self._start_iter = self._iter - skip
        reseed_step(self.runner, 'epoch', self._epoch)
        self.dataloader.batch_sampler.skip_in_next_pass(skip)
        self.runner.call_hook('before_train_epoch')
        self.runner.model.train()
        batches = iter(self.dataloader)
        try:
            for idx, data_batch in enumerate(batches, start=skip):
                self.run_iter(idx, data_batch)
        except BaseException:
            # Not left to the garbage collector with the traceback
            # (torch_private.stop_loader_workers says why).
            stop_loader_workers(batches)
            raise
        self.runner.call_hook('after_train_epoch')
        self._epoch += 1

    def run_iter(self, idx, data_batch) -> None:
        reseed_step(self.runner, 'iter', self._iter)
        super().run_iter(idx, data_batch)
