"""The learning rates and gradient weight decay each CosmoFlow reference run trained with, per batch size."""

from __future__ import annotations


def _expand(points: list[tuple[int, float]], epochs: int = 128) -> list[float]:
    """A per-epoch LR list (index 0 = epoch_num 1) from (first epoch_num, LR) change points."""
    lrs = []
    for epoch_num in range(1, epochs + 1):
        lrs.append(max((p for p in points if p[0] <= epoch_num), key=lambda p: p[0])[1])
    return lrs


# The LR each reference run trained at, epoch_num 1 to 128 (every config's max_epochs), written from
# its code and, where a log carries the LR, checked against the log below. i = epoch_num - 1 is the
# epoch index the code sees; every source steps its warm-up once an epoch.
REFERENCE_LR = {
    # LBNL's runs of the mlcommons/hpc TF reference (cosmo_rcp_64.yaml): base_lr 0.001 at base batch 64,
    # so the 4 warm-up epochs are flat; Keras LearningRateScheduler sets the LR at each epoch's start
    # from utils/optimizers.py `_lr_schedule`: factor d of boundary e once `e < i` (epoch_num e+2),
    # absolute on the peak: {16: 0.25, 32: 0.125}. No published log of these runs carries the LR.
    64: _expand([(1, 0.001), (18, 0.00025), (34, 0.000125)]),
    # NVIDIA's MXNet v1.0 train.py `LRScheduler` (config_DGXA100_16x8x1.sh: INIT_LR 0.001, LR 0.004,
    # WARMUP_EPOCHS 4, LRSCHED_EPOCHS "16 32"; run_and_time.sh LRSCHED_DECAYS "0.25 0.125"): epoch
    # i = (update - first) // steps_per_epoch; 0.001 + 0.003 i / 4 for i < 4, then 0.004 x d once
    # `b < i` (epoch_num b+2). MXNet counts updates from 1, so the last step of each epoch already runs
    # at the next epoch's LR (1 step in 4,096); the first step of each epoch is what this lists. If
    # NVIDIA's RCP runs were instead the TF reference with these hyperparameters (the JSON's float
    # warm-up factor and single decay factor are what the TF code logs), the per-epoch LR is the same up
    # to epoch 33; after it, the second factor is 0.125 only by the MXNet runs' logs (TF: <= 0.25).
    128: _expand(
        [(1, 0.001), (2, 0.00175), (3, 0.0025), (4, 0.00325), (5, 0.004), (18, 0.001), (34, 0.0005)]
    ),
    # NVIDIA's MXNet v1.0 at batch 1024 (config_DGXA100_128x8x1.sh: LR 0.012, WARMUP_EPOCHS 0,
    # LRSCHED_EPOCHS "32 64", the default decays 0.25 0.125, logged as such): 0.012 from the first
    # step, 0.012 x d once `b < i`. The same caveat as batch 128 holds after epoch 65.
    1024: _expand([(1, 0.012), (34, 0.003), (66, 0.0015)]),
    # NVIDIA's PyTorch v2.0 optimizer.py `LRSchedulerCalculator` under LambdaLR stepped once an epoch
    # (trainer.py), submission_dgxa100_4x8x1.yaml: init_lr 0.001 x (1 + 3 i / 2) for i < 2, then lr 0.004
    # x d once `b <= i` (epoch_num b+1): decay_steps [4, 6], decay_values [0.25, 0.0625]. The run's log
    # carries the LR of every epoch (test_the_lr_nvidia_logged_at_batch_32_is_the_rcp_32_schedule).
    32: _expand([(1, 0.001), (2, 0.0025), (3, 0.004), (5, 0.001), (7, 0.00025)]),
    # Fujitsu's v1.0 TF code (cosmo_closed_512.yaml: base_lr 0.006 at base batch 128, 6 warm-up epochs,
    # step decays {19: 0.5, 21: 0.25, 22: 0.125, 23: 0.0625}), utils/optimizers.py `_lr_schedule_mod`:
    # i = floor(global_step / steps_per_epoch); 0.006 + 0.018 i / 6 for i < 6, then 0.024 x d once
    # i - 6 >= e - 6 + 1 ("+1 is for the same behavior as the reference implementation"): epoch_num e+2.
    # Fujitsu's logs carry no LR; NVIDIA's PyTorch code with these hyperparameters decays one epoch
    # earlier, as HelmholtzAI's logs show (test_nvidias_pytorch_code_decays_one_epoch_before_fujitsus).
    512: _expand(
        [
            (1, 0.006),
            (2, 0.009),
            (3, 0.012),
            (4, 0.015),
            (5, 0.018),
            (6, 0.021),
            (7, 0.024),
            (21, 0.012),
            (23, 0.006),
            (24, 0.003),
            (25, 0.0015),
        ]
    ),
}


REFERENCE_GRADIENT_WEIGHT_DECAY = {64: 0.02, 128: 0.0, 1024: 0.0, 32: 0.0, 512: 0.02}
"""On the hidden dense kernels. 64: Keras l2(0.01) adds 0.02 w to their gradient. 512: Fujitsu's
MomentumWD adds weight_decay 0.02 x w to the `*_l2` kernels and logs weight_decay / 2 = 0.01."""
