"""Training: `fit(TrainConfig(...))` from Python, `vitzoo train ...` from the shell.

    from vitzoo.train import TrainConfig, fit
    summary = fit(TrainConfig(model="vit_ti16", data="fashion-mnist", epochs=10, out="runs/a",
                              model_options=dict(img_size=28, patch_size=4)))

`config`: the knobs and recipes; `loop`: the `Trainer`; `inputs`: the data and the evaluation
passes; `optim`: groups, schedule, EMA; `checkpoint`: exact resume and the run directory;
`report`: metrics and summary.json; `distributed`: processes, devices, signals.
"""

from vitzoo.errors import TrainingDiverged
from vitzoo.train.config import RECIPES, TrainConfig
from vitzoo.train.inputs import GlobalBatchSampler
from vitzoo.train.loop import Trainer, fit
from vitzoo.train.optim import Schedule

__all__ = ["RECIPES", "GlobalBatchSampler", "Schedule", "TrainConfig", "Trainer",
           "TrainingDiverged", "fit"]
