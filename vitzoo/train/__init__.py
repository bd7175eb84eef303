"""Training: `fit(TrainConfig(...))` from Python, `vitzoo train ...` from the shell.

    from vitzoo.train import TrainConfig, fit
    summary = fit(TrainConfig(model="vit_ti16", data="fashion-mnist", epochs=10, out="runs/a",
                              model_options=dict(img_size=28, patch_size=4)))

`config` holds every knob and the recipes, `loop` the loop (a `Trainer`: `trainer.run()`, then
`trainer.model`), `build` what a run is built from, `optim` the groups, schedule and EMA,
`checkpoint` the state that survives crashes, `summary` what a run reports, `distributed` the
processes and devices.
"""

from vitzoo.errors import TrainingDiverged
from vitzoo.train.build import GlobalBatchSampler
from vitzoo.train.config import RECIPES, TrainConfig
from vitzoo.train.loop import Trainer, fit
from vitzoo.train.optim import Schedule

__all__ = ["RECIPES", "GlobalBatchSampler", "Schedule", "TrainConfig", "Trainer",
           "TrainingDiverged", "fit"]
