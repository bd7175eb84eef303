"""The measures issue 34 changed, checked on the specs' plans and constructed tables (no training): the head's
learning rate picked on a validation split, the data ablation's ResNet at the ViT's training compute, and
cells given the seeds that decide a contrast."""

import pytest

from benchmarks.ablations import ABLATIONS, data_size, head, pos_embed
from benchmarks.scales import SCALES
from benchmarks.spec import Ablation, Cell, Table


def test_a_cell_may_ask_for_more_seeds_than_the_ablation_and_never_for_fewer():
    spec = Ablation("x", "x", lambda scale: [Cell("a"), Cell("b", seeds=5), Cell("c", seeds=1)])
    runs = spec.runs(SCALES["cpu"])  # 3 seeds at the cpu scale
    counts = {label: sorted(r.seed for r in runs if r.label == label) for label in "abc"}
    assert counts == {"a": [0, 1, 2], "b": [0, 1, 2, 3, 4], "c": [0, 1, 2]}


def test_more_seeds_only_where_the_cpu_scale_fixed_them():
    for name, module in (("pos_embed", pos_embed), ("data", data_size)):
        runs = ABLATIONS[name].runs(SCALES["cpu"])
        more = {r.label for r in runs if r.seed >= 3}
        assert more and more == {c.label for c in module.cells(SCALES["cpu"]) if c.seeds}
        assert all(r.seed < 1 for r in ABLATIONS[name].runs(SCALES["quick"]))  # the test scale keeps its one seed


def test_every_head_run_holds_a_validation_split_out_and_keeps_its_best_point():
    for scale in ("cpu", "quick"):
        for cell in head.cells(SCALES[scale]):
            assert cell.train["val_size"] == data_size.subsets(SCALES[scale])[1] and cell.train["keep_best"]
            assert cell.train["eval_every"] > 0


def _head_records(values: dict[str, tuple[float, float]]) -> list[dict]:
    """label -> (validation accuracy, final training loss), three seeds each at the same numbers."""
    out = []
    for label, (val, loss) in values.items():
        pool, lr = label.split(", lr ")
        out += [{"label": label, "seed": s, "group": {"pool": pool, "lr": float(lr)},
                 "metrics": {"test_acc": 0.8 + s / 100, "val_acc": val, "final_loss": loss}} for s in range(3)]
    return out


def test_the_heads_rate_is_picked_on_validation_not_on_training_loss():
    # the training loss prefers the higher rate, validation the lower: validation decides
    records = _head_records({"token, lr 0.002": (0.85, 0.30), "token, lr 0.00075": (0.86, 0.40),
                             "gap, lr 0.002": (0.84, 0.31), "gap, lr 0.00075": (0.83, 0.41)})
    table = Table(records)
    assert head.best(table, "token") == "token, lr 0.00075" and head.best(table, "gap") == "gap, lr 0.002"
    assert head.picked_on(table) == "validation"
    for r in records:  # records without a validation split fall back to the lowest final training loss
        del r["metrics"]["val_acc"]
    table = Table(records)
    assert head.best(table, "token") == "token, lr 0.002" and head.picked_on(table) == "training loss"


def test_the_data_ablations_resnet_trains_at_the_vits_compute_and_each_family_at_one_schedule():
    scale = SCALES["cpu"]
    cells = data_size.cells(scale)
    for family in data_size.FAMILIES:
        assert len({c.train["steps"] for c in cells if c.coords["family"] == family}) == 1, family
    steps = {c.coords["family"]: c.train["steps"] for c in cells}
    flops = {f: data_size.image_flops(scale, *options) for f, options in data_size.family_options(scale).items()}
    # at the cpu scale the ResNet costs twice the ViT an image: half the steps, the same FLOPs within a step's
    assert flops["ResNet"] / flops["ViT"] == pytest.approx(2.0, rel=0.01)
    assert steps["ResNet"] * flops["ResNet"] == pytest.approx(steps["ViT"] * flops["ViT"], rel=1 / steps["ResNet"])
    assert steps["hybrid"] == steps["ViT"] and steps["ResNet"] < steps["ViT"]
    # the paper's models are of similar compute by the paper's choice: one schedule, as Figure 4's
    paper = data_size.cells(SCALES["paper"])
    assert len({c.train["steps"] for c in paper}) == 1


def _data_table(resnet_tflop: float, resnet_steps: int) -> Table:
    records = []
    for family, tflop, steps in (("ResNet", resnet_tflop, resnet_steps), ("ViT", 3.18, 1718)):
        records += [{"label": f"{family} 55000", "seed": s, "group": {"family": family, "images": 55000},
                     "flops": tflop * 1e12, "config": {"train": {"steps": steps}}, "metrics": {"test_acc": 0.87}}
                    for s in range(3)]
    return Table(records)


def test_the_data_findings_say_whether_the_families_are_compute_matched():
    matched = data_size.compute_ratio(_data_table(3.18, 858))
    assert matched.startswith("compute-matched: the ResNet's runs take 1.00x") and "858 steps against the ViT's 1718" in matched
    unmatched = data_size.compute_ratio(_data_table(6.37, 1718))
    assert "2.0x the ViT's training compute" in unmatched and "not compute-matched" in unmatched
    assert unmatched.endswith("toward the ResNet")


def test_the_transfer_findings_weigh_the_pre_training_compute_not_the_downstream_fine_tuning():
    from benchmarks.ablations import transfer

    table = _data_table(3.18, 858)  # whole runs: the ResNet's fine-tuning costs it twice the ViT's per image
    for r in table.records["ResNet 55000"]:
        r["flops"], r["upstream_flops"] = 4.3e12, 3.18e12
    for r in table.records["ViT 55000"]:
        r["flops"], r["upstream_flops"] = 3.74e12, 3.18e12
    assert transfer.pretraining_compute(table).startswith("compute-matched: the ResNet's runs take 1.00x the ViT's "
                                                         "pre-training compute")
    assert "not compute-matched" in data_size.compute_ratio(table)  # the whole run's: what the claims are not about


def test_records_superseded_by_a_changed_measure_are_archived_with_why_it_changed(tmp_path):
    import json

    from benchmarks.archive import archive, archived_records
    from benchmarks.suite import ARCHIVE, Run

    planned = [Run("x", "a", {"train": {"val_size": 5000}}, 0)]
    old = {"key": Run("x", "a", {"train": {}}, 0).key, "label": "a", "seed": 0, "config": {"train": {}}, "commit": "abc"}
    (tmp_path / "results.json").write_text(json.dumps({"runs": [old]}))
    assert archive(tmp_path, planned, "cpu", because="issue 34: the rate is picked on validation") == 1
    [entry] = json.loads((tmp_path / ARCHIVE).read_text())["runs"]
    assert entry["reason"].startswith("issue 34: the rate is picked on validation: other settings than --scale cpu's")
    assert "train.val_size: \"(unset)\" -> 5000" in entry["reason"] and archived_records(tmp_path) == [old]
