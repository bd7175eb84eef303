"""What the ablations' specs measure, on their plans and constructed tables (no training): seeds
per cell, the head's rate, the ResNet at the ViT's compute and the note that says so."""

import pytest

from benchmarks.ablations import data_size, head, transfer
from benchmarks.scales import SCALES
from benchmarks.spec import Ablation, Cell, Table


def test_a_cell_may_ask_for_more_seeds_than_the_ablation_and_never_for_fewer():
    spec = Ablation("x", "x", lambda scale: [Cell("a"), Cell("b", seeds=5), Cell("c", seeds=1)])
    runs = spec.runs(SCALES["cpu"])  # 3 seeds at the cpu scale
    counts = {label: sorted(r.seed for r in runs if r.label == label) for label in "abc"}
    assert counts == {"a": [0, 1, 2], "b": [0, 1, 2, 3, 4], "c": [0, 1, 2]}


def test_the_heads_rate_is_picked_on_a_held_out_validation_split():
    for cell in head.cells(SCALES["cpu"]):
        assert cell.train["val_size"] == data_size.subsets(SCALES["cpu"])[1]
        assert cell.train["keep_best"] and cell.train["eval_every"] > 0
    # validation accuracy; the test accuracy prefers the other rate of each head
    cells = {"token, lr 0.002": (0.85, 0.87), "token, lr 0.00075": (0.86, 0.85),
             "gap, lr 0.002": (0.84, 0.82), "gap, lr 0.00075": (0.83, 0.84)}
    table = Table([{"label": label, "seed": s, "group": {"pool": label.split(",")[0]},
                    "metrics": {"test_acc": test + s / 100, "val_acc": val}}
                   for label, (val, test) in cells.items() for s in range(3)])
    assert [head.best(table, "token"), head.best(table, "gap")] == ["token, lr 0.00075",
                                                                    "gap, lr 0.002"]


def test_the_data_ablations_resnet_trains_at_the_vits_compute_and_each_family_at_one_schedule():
    scale, steps = SCALES["cpu"], {}
    for cell in data_size.cells(scale):
        steps.setdefault(cell.coords["family"], set()).add(cell.train["steps"])
    assert all(len(s) == 1 for s in steps.values())
    (resnet,), (vit,), (hybrid,) = steps["ResNet"], steps["ViT"], steps["hybrid"]
    options = data_size.family_options(scale)
    flops = {family: data_size.image_flops(scale, *options[family]) for family in options}
    assert flops["ResNet"] / flops["ViT"] == pytest.approx(2.0, rel=0.01)  # half the steps
    assert resnet * flops["ResNet"] == pytest.approx(vit * flops["ViT"], rel=1 / resnet)
    assert hybrid == vit and len({c.train["steps"] for c in data_size.cells(SCALES["paper"])}) == 1


def test_the_data_and_transfer_findings_say_whether_the_families_are_compute_matched():
    def table(resnet, vit, resnet_steps):  # (training, pre-training) TFLOP at 55,000 images
        families = (("ResNet", resnet, resnet_steps), ("ViT", vit, 1718))
        return Table([{"label": f"{family} 55000", "seed": s, "flops": tflop * 1e12,
                       "upstream_flops": upstream * 1e12, "metrics": {"test_acc": 0.87},
                       "group": {"family": family, "images": 55000},
                       "config": {"train": {"steps": steps}}}
                      for family, (tflop, upstream), steps in families for s in range(3)])

    matched = data_size.compute_ratio(table((3.18, 0), (3.18, 0), 858))
    assert matched.startswith("compute-matched: the ResNet's runs take 1.00x")
    assert "858 steps against the ViT's 1718" in matched
    unmatched = data_size.compute_ratio(table((6.37, 0), (3.18, 0), 1718))
    assert "2.0x the ViT's training compute" in unmatched
    assert unmatched.endswith("toward the ResNet")
    # transfer's claims are about pre-training: its fine-tuning costs the ResNet more
    whole_runs = table((4.3, 3.18), (3.74, 3.18), 858)
    assert transfer.pretraining_compute(whole_runs).startswith(
        "compute-matched: the ResNet's runs take 1.00x the ViT's pre-training compute")
    assert "not compute-matched" in data_size.compute_ratio(whole_runs)

