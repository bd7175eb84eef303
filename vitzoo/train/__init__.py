"""Training: `fit(TrainConfig(...))` from Python, `vitzoo train ...` from the shell.

    from vitzoo.train import TrainConfig, fit
    summary = fit(TrainConfig(model="vit_ti16", data="fashion-mnist", epochs=10, out="runs/a",
                              model_options=dict(img_size=28, patch_size=4)))

A caller that needs the trained model itself runs the `Trainer`: `trainer = Trainer.from_config(config)`,
`summary = trainer.run()`, then `trainer.model`.

See `vitzoo.train.config` for every knob and the recipes, `vitzoo.train.loop` for the loop itself,
`vitzoo.train.build` for what a run is built from (data splits, model, optimizer, precision),
`vitzoo.train.sampler` for the data order across processes and `vitzoo.train.distributed` for the
processes themselves.
"""

from vitzoo.errors import TrainingDiverged
from vitzoo.train.config import RECIPES, TrainConfig
from vitzoo.train.loop import Trainer, fit
from vitzoo.train.sampler import GlobalBatchSampler
from vitzoo.train.schedule import Schedule

__all__ = ["RECIPES", "GlobalBatchSampler", "Schedule", "TrainConfig", "Trainer", "TrainingDiverged", "fit"]
