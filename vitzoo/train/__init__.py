"""Training: `fit(TrainConfig(...))` from Python, `vitzoo train ...` from the shell.

    from vitzoo.train import TrainConfig, fit
    summary = fit(TrainConfig(model="vit_ti16", data="fashion-mnist", epochs=10, out="runs/a",
                              model_options=dict(img_size=28, patch_size=4)))

See `vitzoo.train.config` for every knob and the recipes, `vitzoo.train.loop` for the loop itself.
"""

from vitzoo.errors import TrainingDiverged
from vitzoo.train.config import RECIPES, TrainConfig
from vitzoo.train.loop import GlobalBatchSampler, fit, fit_model
from vitzoo.train.schedule import Schedule

__all__ = ["RECIPES", "GlobalBatchSampler", "Schedule", "TrainConfig", "TrainingDiverged", "fit", "fit_model"]
