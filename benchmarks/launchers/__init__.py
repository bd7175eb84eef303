"""How the suite's runs reach devices, at the paper's scale as at the rehearsal's:

    spec -> plan (runs x the assignment) -> launcher -> one training job per run -> results store -> report

`assign` decides which devices each run gets and how many runs go at once (the plan estimates with
the same assignment); `local` starts each run as a data-parallel job through PyTorch's elastic
launcher; `slurm` submits each run as a SLURM job through submitit (requeued on preemption, resumed
from its checkpoint), `resources` deciding what each job asks for and `jobs` following them. Every
launcher's runs add their outcomes to the ablation's results store, each a file of its own (no lock),
so results from many processes and jobs never overwrite each other.
"""
