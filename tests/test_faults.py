"""Faults a hostile but fair user can cause (issue 14): nothing is lost, nothing is written outside
where it belongs, nothing hangs. One test per case; each docstring states the behaviour."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from hub_testing import HANGS_AFTER_S, TOKEN, pulled_once, tiny, within  # tests/hub_testing.py

import vitzoo
from vitzoo.errors import ConfigError


def same_outputs(a, b) -> bool:
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        return a.config == b.config and torch.equal(a(x), b(x))


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` (hidden ones too) and a hash of its bytes."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ 1-2. save_pretrained: all or nothing
@pytest.mark.parametrize("card", [{"metrics": {"accuracy": None}}, {"metrics": {"accuracy": True}},
                                  {"metrics": {"accuracy": float("nan")}}, {"metrics": {"top1": "0.9"}},
                                  {"tags": "vit"}, {"licence": "mit"}])
def test_a_save_refused_for_its_card_writes_nothing(tmp_path, card):
    """A card option that is not what it should be (a metric that is no finite number, tags as one
    text, an unknown option) is a ConfigError raised before any file is written: no directory appears,
    nothing is left beside it."""
    with pytest.raises(ConfigError, match="card"):
        tiny().save_pretrained(tmp_path / "saved", card=card)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_save_over_an_earlier_save_leaves_it_whole(tmp_path):
    """A save that fails (here: a bad card metric) into a directory holding an earlier save leaves every
    byte of the earlier save in place, and it loads as the model that was saved."""
    first = tiny(0)
    first.save_pretrained(tmp_path / "saved")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError):
        tiny(1, num_heads=4, act="gelu_tanh").save_pretrained(tmp_path / "saved", card={"metrics": {"accuracy": None}})
    assert snapshot(tmp_path) == before
    assert same_outputs(vitzoo.from_pretrained(tmp_path / "saved").eval(), first)


def test_a_failed_write_during_a_save_leaves_the_earlier_save_whole(tmp_path, monkeypatch):
    """A failure while the files are written (a full disk, a kill) leaves the earlier save whole: the
    new files are written beside the directory and only then put in place together."""
    from vitzoo.checkpoints import native

    first = tiny(0)
    first.save_pretrained(tmp_path / "saved")
    before = snapshot(tmp_path)

    def disk_full(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(native, "write_text", disk_full)
    with pytest.raises(OSError, match="No space"):
        tiny(1).save_pretrained(tmp_path / "saved")
    assert snapshot(tmp_path) == before
    assert same_outputs(vitzoo.from_pretrained(tmp_path / "saved").eval(), first)


def test_a_save_replaces_an_earlier_save_whole(tmp_path):
    """A save that succeeds over an earlier one holds exactly the new model's three files."""
    tiny(0).save_pretrained(tmp_path / "saved", card={"dataset": "cifar10", "metrics": {"accuracy": 0.5}})
    second = tiny(1, num_heads=4)
    second.save_pretrained(tmp_path / "saved")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved"]
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert "cifar10" not in (tmp_path / "saved" / "README.md").read_text()
    assert same_outputs(vitzoo.from_pretrained(tmp_path / "saved").eval(), second)


def test_a_save_into_a_directory_holding_more_keeps_the_rest(tmp_path):
    """Saving into a directory that holds other files (as a training run does) replaces the model's
    files and keeps the others."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    tiny(0).save_pretrained(tmp_path / "run")
    model = tiny(1)
    model.save_pretrained(tmp_path / "run")
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == "{}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
    assert same_outputs(vitzoo.from_pretrained(tmp_path / "run").eval(), model)


# ------------------------------------------------------------------ 5. a Hub server that never answers
HUB_TOKEN = TOKEN


@pytest.fixture
def silent_server():
    """A loopback server that accepts connections and never answers; yields its URL."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    held, stop = [], threading.Event()

    def accept():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def test_a_pull_from_a_silent_server_stops_and_says_how_to_work_offline(hermetic_hub, one_second, silent_server,
                                                                        monkeypatch):
    """A pull from a server that accepts and never answers stops after the Hub timeout with a HubError
    naming the server, HF_HUB_DOWNLOAD_TIMEOUT and how to work offline (HF_HUB_OFFLINE=1, a local path)."""
    from vitzoo.errors import HubError

    monkeypatch.setenv("HF_ENDPOINT", silent_server)
    with pytest.raises(HubError, match=rf"(?s){silent_server} did not answer within 1 s.*HF_HUB_DOWNLOAD_TIMEOUT.*HF_HUB_OFFLINE=1.*local"):
        within(HANGS_AFTER_S, lambda: vitzoo.from_pretrained("hf-hub:alice/silent"))


def test_a_push_to_a_silent_server_stops(hermetic_hub, one_second, silent_server, monkeypatch):
    """A push to a server that accepts and never answers stops after the Hub timeout with a HubError
    naming the server."""
    from vitzoo.errors import HubError

    monkeypatch.setenv("HF_ENDPOINT", silent_server)
    with pytest.raises(HubError, match=rf"{silent_server} did not answer within 1 s"):
        within(HANGS_AFTER_S, lambda: tiny().push_to_hub("alice/silent", token=HUB_TOKEN))


def test_a_cached_model_loads_when_the_server_is_silent(hermetic_hub, one_second, silent_server, monkeypatch):
    """A model pulled once loads from the cache when the server later accepts and never answers."""
    model = tiny()
    pulled_once(model, "alice/cached", hermetic_hub / "hub", monkeypatch)
    monkeypatch.setenv("HF_ENDPOINT", silent_server)
    assert same_outputs(within(HANGS_AFTER_S, lambda: vitzoo.from_pretrained("hf-hub:alice/cached")).eval(), model)


# ------------------------------------------------------------------ 6. revisions git would refuse
BAD_REVISIONS = ["../../..../x", "a/../b", "/main", "main/", "v1.", "a//b", ".hidden", "x/.y", "br.lock",
                 "a@{1}", "@", "tab\there", "new\nline", "sp ace", "a~1", "a^", "a:b", "a?", "a*", "a[0]",
                 "back\\slash", "del\x7f", ""]
GOOD_REVISIONS = ["main", "v1.0", "refs/pr/1", "feature/x-1", "a" * 40, "release_2026.11"]


@pytest.mark.parametrize("revision", GOOD_REVISIONS)
def test_revisions_git_accepts_are_accepted(revision):
    """Branch, tag, pull-request and commit names that git accepts are revisions."""
    from vitzoo.checkpoints.hub import check_revision, parse

    assert check_revision(revision) == revision
    assert parse(f"hf-hub:org/name@{revision}") == ("org/name", revision)


@pytest.mark.parametrize("revision", BAD_REVISIONS)
def test_a_revision_git_refuses_is_refused_before_anything_is_sent(hermetic_hub, revision, monkeypatch):
    """A revision git's ref-name rules refuse (`..`, a leading or trailing `/`, a trailing `.`, `//`,
    a part starting with `.` or ending in `.lock`, `@{`, `@`, control characters, space, `~^:?*[\\`)
    is a HubError naming it, whether it comes after the @ of a reference or as `revision=`, on pull
    and on push, before any request: nothing is written into the cache or beside it."""
    from vitzoo.errors import HubError
    from vitzoo.checkpoints.hub import download

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: a request would fail otherwise
    if revision:
        with pytest.raises(HubError, match="is not a revision"):
            vitzoo.from_pretrained(f"hf-hub:org/name@{revision}")
    with pytest.raises(HubError, match="is not a revision"):
        download("hf-hub:org/name", revision=revision)
    with pytest.raises(HubError, match="is not a revision"):
        tiny().push_to_hub("org/name", token=HUB_TOKEN, revision=revision)
    assert not (hermetic_hub / "hf_home").exists()


def test_the_cli_refuses_a_revision_git_refuses(hermetic_hub, tmp_path, capsys):
    """`vitzoo pull --revision` and `vitzoo push --revision` refuse such a name with a one-line error."""
    from vitzoo.cli import main

    tiny().save_pretrained(tmp_path / "saved")
    assert main(["pull", "org/name", str(tmp_path / "out"), "--revision", "../../x"]) != 0
    assert main(["push", str(tmp_path / "saved"), "org/name", "--revision", "a..b"]) != 0
    err = capsys.readouterr().err
    assert "'../../x' is not a revision" in err and "'a..b' is not a revision" in err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ 3. train --out onto what is not this run
RUN_TINY = dict(embed_dim=32, depth=2, num_heads=2, mlp_dim=64, img_size=28, patch_size=7)


def train_config(out, **changes):
    from vitzoo.train import TrainConfig

    base = dict(model="vit_ti16", model_options=dict(RUN_TINY), data="synthetic", train_limit=64, test_limit=32,
                batch_size=16, steps=2, lr=3e-3, warmup=1, log_every=1, checkpoint_every=0, quiet=True,
                tensorboard=False, out=str(out), device="cpu")  # exact equalities below are a CPU property
    return TrainConfig(**{**base, **changes})


def test_training_refuses_an_out_that_holds_a_saved_model(tmp_path):
    """`--out` onto a save_pretrained directory is refused, naming the saved model; its files are kept
    byte for byte."""
    from vitzoo.train import fit

    tiny().save_pretrained(tmp_path / "saved")
    before = snapshot(tmp_path)
    with pytest.raises(ValueError, match=r"--out .*saved already holds a saved model"):
        fit(train_config(tmp_path / "saved"))
    assert snapshot(tmp_path) == before


def test_training_refuses_an_out_that_is_its_pretrained_source(tmp_path):
    """`--pretrained DIR --out DIR` (or an --out holding the --pretrained file) is refused, naming the
    source, before anything is written."""
    from vitzoo.train import fit

    vitzoo.create("vit_ti16", **RUN_TINY, num_classes=10).save_pretrained(tmp_path / "source")
    before = snapshot(tmp_path)
    with pytest.raises(ValueError, match="already holds the --pretrained source"):
        fit(train_config(tmp_path / "source", pretrained=str(tmp_path / "source")))
    with pytest.raises(ValueError, match="already holds the --pretrained source"):
        fit(train_config(tmp_path / "source", pretrained=str(tmp_path / "source" / "model.safetensors")))
    assert snapshot(tmp_path) == before


def test_training_refuses_an_out_that_holds_other_files_or_is_a_file(tmp_path):
    """`--out` onto a directory holding files of its own names them; onto a file says it is a file."""
    from vitzoo.train import fit

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me\n")
    with pytest.raises(ValueError, match=r"already holds files of its own \(todo.txt\)"):
        fit(train_config(tmp_path / "notes"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        fit(train_config(tmp_path / "file"))
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me\n" and (tmp_path / "file").read_text() == "x"


def test_training_into_an_empty_out_directory_runs(tmp_path):
    """An existing empty --out directory is fine for a new run."""
    from vitzoo.train import fit

    (tmp_path / "empty").mkdir()
    assert fit(train_config(tmp_path / "empty"))["status"] == "finished"


# ------------------------------------------------------------------ 4. resume from what is left
def run_losses(run: Path) -> list[tuple[int, float]]:
    import json

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if "loss" in r]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> list[tuple[int, float]]:
    """The losses of the 6-step run the resumed runs below must reproduce."""
    from vitzoo.train import fit

    run = tmp_path_factory.mktemp("uninterrupted") / "run"
    fit(train_config(run, steps=6))
    return run_losses(run)


def stopped_run(tmp_path, keep: int = 1) -> Path:
    """A 6-step run stopped after step 4, with a checkpoint every 2 steps."""
    from vitzoo.train import fit

    run = tmp_path / "run"
    fit(train_config(run, steps=6, stop_at=4, checkpoint_every=2, keep_checkpoints=keep))
    return run


def resume(run: Path):
    from vitzoo.train import fit

    return fit(train_config(run, steps=6, checkpoint_every=2, resume=True))


@pytest.mark.parametrize("pointer", [b"step_00000099\n", b"", b"\xff\xfe garbage", b"../../elsewhere\n"])
def test_resume_with_a_damaged_latest_pointer_uses_the_newest_complete_checkpoint(tmp_path, uninterrupted, pointer):
    """A `checkpoints/latest` that names a missing directory, is empty, unreadable or points outside
    the run is said (a warning) and the newest complete checkpoint is resumed from: the run goes on at
    step 5 and its losses are those of an uninterrupted run."""
    run = stopped_run(tmp_path)
    (run / "checkpoints" / "latest").write_bytes(pointer)
    with pytest.warns(UserWarning, match="resuming from the newest complete checkpoint, step_00000004"):
        summary = resume(run)
    assert summary["step"] == 6 and run_losses(run) == uninterrupted


def test_resume_with_a_damaged_pointer_and_no_complete_checkpoint_stops(tmp_path):
    """With the pointer naming a missing checkpoint and none complete left, resume stops with a
    CheckpointError that says so, instead of starting again from step 0; nothing is deleted."""
    from vitzoo.errors import CheckpointError

    run = stopped_run(tmp_path)
    (run / "checkpoints" / "step_00000004" / "state.pt").unlink()
    (run / "checkpoints" / "latest").write_text("step_00000099\n")
    before = snapshot(run)
    with pytest.raises(CheckpointError, match=r"latest names 'step_00000099', which is not a complete checkpoint.*"
                                              r"holds no complete checkpoint"):
        resume(run)
    assert snapshot(run) == before


@pytest.mark.parametrize("damaged", ["model.safetensors", "state.pt"])
def test_resume_from_a_truncated_checkpoint_names_it_and_uses_the_previous_one(tmp_path, uninterrupted, damaged):
    """A truncated file in the newest checkpoint is named (a warning) and the previous checkpoint is
    resumed from; the losses are those of an uninterrupted run."""
    run = stopped_run(tmp_path, keep=2)
    path = run / "checkpoints" / "step_00000004" / damaged
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.warns(UserWarning, match=rf"step_00000004/{damaged} is damaged or truncated.*previous checkpoint, step_00000002"):
        summary = resume(run)
    assert summary["step"] == 6 and run_losses(run) == uninterrupted


def test_resume_from_the_only_checkpoint_truncated_stops_and_keeps_it(tmp_path):
    """When the only checkpoint is truncated, resume stops with a CheckpointError naming the file; the
    checkpoint is kept for the user to restore."""
    from vitzoo.errors import CheckpointError

    run = stopped_run(tmp_path)
    path = run / "checkpoints" / "step_00000004" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    before = snapshot(run)
    with pytest.raises(CheckpointError, match=r"no checkpoint reads: .*step_00000004/model.safetensors is damaged"):
        resume(run)
    assert snapshot(run) == before


@pytest.mark.parametrize("how", ["move", "copy"])
def test_a_moved_or_copied_run_resumes(tmp_path, uninterrupted, how):
    """A run directory moved or copied elsewhere resumes from its checkpoint there, with the same losses."""
    import shutil

    run = stopped_run(tmp_path)
    elsewhere = tmp_path / "elsewhere" / "run"
    elsewhere.parent.mkdir()
    (shutil.move if how == "move" else shutil.copytree)(run, elsewhere)
    summary = resume(elsewhere)
    assert summary["step"] == 6 and run_losses(elsewhere) == uninterrupted


# ------------------------------------------------------------------ should fix: every number option
@pytest.mark.parametrize("options, fragment", [
    ({"num_classes": True}, "num_classes must be an int, got True"),
    ({"head_options": {"representation_size": "64"}, "head": "mlp"}, "representation_size must be an int, got '64'"),
    ({"representation_size": 0, "head": "mlp"}, "representation_size must be > 0"),
    ({"embed_dim": 64.0}, "embed_dim must be an int"),
    ({"norm_eps": float("nan")}, "norm_eps must be a finite number"),
    ({"dropout": float("inf")}, "dropout must be a finite number"),
    ({"std": 0}, "std must be > 0"),
    ({"std": (0.5, -0.5, 0.5)}, "std must be > 0"),
    ({"mean": float("nan")}, "mean must be a finite number"),
    ({"stem": "resnet", "resnet_layers": (True,)}, "option layers must be positive block counts"),
])
def test_a_model_option_of_the_wrong_type_or_range_is_one_config_error(options, fragment):
    """Every number option of a model: a bool or text where a number belongs, NaN, infinite, zero or
    negative where it cannot be, is a ConfigError naming the option, raised when the config is made."""
    with pytest.raises(ConfigError, match=fragment):
        vitzoo.get_config("vit_ti16", **options)


@pytest.mark.parametrize("changes, fragment", [
    ({"log_every": 0}, "log_every must be > 0"),
    ({"eval_every": -1}, "eval_every must be >= 0"),
    ({"checkpoint_every": -5}, "checkpoint_every must be >= 0"),
    ({"train_limit": 0}, "train_limit must be > 0"),
    ({"test_limit": -1}, "test_limit must be > 0"),
    ({"warmup": float("nan")}, "warmup must be a finite number"),
    ({"lr": float("inf")}, "lr must be a finite number"),
    ({"lr": "0.1"}, "lr must be a number, got '0.1'"),
    ({"steps": True}, "steps must be an int, got True"),
    ({"batch_size": 16.0}, "batch_size must be an int"),
    ({"label_smoothing": 1.0}, "label_smoothing must be in \\[0, 1\\)"),
    ({"mixup": -0.2}, "mixup must be >= 0"),
    ({"fewshot": (5, 0)}, "fewshot must be > 0, got 0"),
    ({"betas": (0.9, float("nan"))}, "betas must be a finite number"),
    ({"keep_checkpoints": 0}, "keep_checkpoints must be > 0"),
])
def test_a_training_option_of_the_wrong_type_or_range_is_one_config_error_before_data_loads(tmp_path, changes, fragment):
    """Every number option of a training run is checked when the TrainConfig is made, as one
    ConfigError naming the option, before any data loads or anything is written."""
    with pytest.raises(ConfigError, match=fragment):
        train_config(tmp_path / "run", data="fashion-mnist", data_dir=str(tmp_path / "nowhere"), **changes)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag, value, fragment", [
    ("--log-every", "0", "log_every must be > 0"), ("--eval-every", "-1", "eval_every must be >= 0"),
    ("--fewshot", "0", "fewshot must be > 0"), ("--warmup", "nan", "warmup must be a finite number"),
    ("--train-limit", "0", "train_limit must be > 0"),
])
def test_the_cli_reports_a_bad_number_option_in_one_line(tmp_path, capsys, flag, value, fragment):
    """On the command line the same checks give a one-line error (exit status 2), no traceback."""
    from vitzoo.cli import main

    assert main(["train", "vit_ti16", "--data", "synthetic", "--device", "cpu", "--out", str(tmp_path / "run"), flag, value]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flag, value", [("--fewshot", "0"), ("--draws", "0"), ("--test-limit", "0"),
                                         ("--batch-size", "-1"), ("--l2-reg", "nan")])
def test_eval_reports_a_bad_number_option_before_loading_anything(tmp_path, capsys, flag, value):
    """`vitzoo eval` checks its number options the same way, before it loads the model or the data."""
    from vitzoo.cli import main

    tiny().save_pretrained(tmp_path / "saved")
    assert main(["eval", str(tmp_path / "saved"), "--data", "synthetic", flag, value]) == 2
    assert f"{flag[2:].replace('-', '_')} must be" in capsys.readouterr().err


def test_a_nan_loss_from_the_normalisation_does_not_advise_a_lower_learning_rate(tmp_path):
    """A loss that is NaN because the normalised images are not finite (here a std so small that
    x / std overflows) says so and names mean and std; it does not advise lowering the learning rate."""
    from vitzoo.errors import TrainingDiverged
    from vitzoo.train import fit

    config = train_config(tmp_path / "run", model_options={**RUN_TINY, "std": 1e-45})
    with pytest.raises(TrainingDiverged, match="normalised images hold NaN or infinite values") as err:
        fit(config)
    assert "learning rate" not in str(err.value) and "std" in str(err.value)


# ------------------------------------------------------------------ should fix: foreign and unreadable files
def test_an_empty_npz_is_not_a_checkpoint(tmp_path):
    """An empty .npz file is a CheckpointError saying it is not a checkpoint (not a bare EOFError)."""
    from vitzoo.errors import CheckpointError

    (tmp_path / "empty.npz").write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty.npz is not a checkpoint: the file is empty"):
        vitzoo.from_pretrained(tmp_path / "empty.npz")


@pytest.mark.parametrize("content", [b"random bytes here" * 10, b"\x93NUMPY not really" * 4])
def test_a_random_npz_is_not_a_checkpoint_and_pickles_are_never_advised(tmp_path, content):
    """An .npz that is not a zip archive is not a checkpoint; numpy's advice to allow pickles (an
    unsafe fix) is never passed on."""
    from vitzoo.errors import CheckpointError

    (tmp_path / "random.npz").write_bytes(content)
    with pytest.raises(CheckpointError, match="is not a checkpoint: the file is not a zip archive") as err:
        vitzoo.from_pretrained(tmp_path / "random.npz")
    assert "pickle" not in str(err.value)


def test_an_npz_of_python_objects_is_not_a_checkpoint(tmp_path):
    """An .npz holding object arrays (pickled Python objects) is not a checkpoint; they are never loaded."""
    import numpy as np

    from vitzoo.errors import CheckpointError

    np.savez(tmp_path / "objects.npz", a=np.array([{"x": 1}], dtype=object))
    with pytest.raises(CheckpointError, match="not a checkpoint: it holds pickled Python objects, which vitzoo never loads"):
        vitzoo.from_pretrained(tmp_path / "objects.npz")


def test_a_truncated_npz_is_damaged(tmp_path):
    """A zip archive cut short is reported as damaged or truncated."""
    import numpy as np

    from vitzoo.errors import CheckpointError

    np.savez(tmp_path / "full.npz", a=np.zeros(1000))
    data = (tmp_path / "full.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="cut.npz is damaged or truncated"):
        vitzoo.from_pretrained(tmp_path / "cut.npz")


def test_an_unreadable_weights_file_is_not_called_damaged(tmp_path):
    """A weights file the system will not read (here: a directory where the file belongs) is reported
    with the system's reason, not as damaged."""
    from vitzoo.errors import CheckpointError

    tiny().save_pretrained(tmp_path / "saved")
    (tmp_path / "saved" / "model.safetensors").unlink()
    (tmp_path / "saved" / "model.safetensors").mkdir()
    with pytest.raises(CheckpointError, match="cannot read .*model.safetensors") as err:
        vitzoo.from_pretrained(tmp_path / "saved")
    assert "damaged" not in str(err.value)


def test_a_config_json_that_is_not_utf8_says_so(tmp_path):
    """A config.json with bytes that are not UTF-8 is a CheckpointError naming the file."""
    from vitzoo.errors import CheckpointError

    tiny().save_pretrained(tmp_path / "saved")
    (tmp_path / "saved" / "config.json").write_bytes(b'{"format": "vitzoo", "model": {"act": "\xff"}}')
    with pytest.raises(CheckpointError, match="config.json is not UTF-8 text"):
        vitzoo.from_pretrained(tmp_path / "saved")


@pytest.mark.parametrize("document, error, fragment", [
    ('{"format": "vitzoo", "format_version": 1, "model": {"depth": "2"}}', ConfigError, "depth must be an int"),
    ('{"format": "vitzoo", "format_version": 1, "model": {"resnet_layers": 5}}', ConfigError, "saved model config is not valid"),
    ('{"format": "vitzoo", "format_version": 1, "model": {"num_classes": true}}', ConfigError, "num_classes must be an int"),
    ('{"format": "vitzoo", "format_version": 1, "model": []}', None, "is not a vitzoo config.json"),
    ('{"format": "vitzoo", "format_version": "1", "model": {}}', None, "format_version must be an int"),
    ('["format", "vitzoo"]', None, "is not a JSON object"),
])
def test_a_config_json_with_wrong_types_names_the_file_and_the_problem(tmp_path, document, error, fragment):
    """A saved config.json whose values have the wrong types gives a typed error (ConfigError for a
    model option, CheckpointError for the file's layout) naming the file, not a bare TypeError."""
    from vitzoo.errors import CheckpointError

    tiny().save_pretrained(tmp_path / "saved")
    (tmp_path / "saved" / "config.json").write_text(document)
    with pytest.raises(error or CheckpointError, match=fragment) as err:
        vitzoo.from_pretrained(tmp_path / "saved")
    assert "config.json" in str(err.value)


# ------------------------------------------------------------------ should fix: a saved model under another name
def test_a_saved_model_loaded_under_another_model_name_warns(tmp_path):
    """`create(NAME, pretrained=DIR)` with DIR holding a saved model of another shape loads the saved
    model, as training does, and warns naming the options that differ."""
    tiny().save_pretrained(tmp_path / "saved")
    with pytest.warns(UserWarning, match=r"holds another model than the one requested: embed_dim=32 \(not 768\)"):
        model = vitzoo.create("vit_b16", pretrained=tmp_path / "saved")
    assert model.config.embed_dim == 32


# ------------------------------------------------------------------ should fix: the CLI onto existing files
def test_convert_onto_an_existing_file_is_a_one_line_error(tmp_path, capsys):
    """`vitzoo convert SRC DST` with DST an existing file says DST is a file; the file is kept."""
    from vitzoo.cli import main

    tiny().save_pretrained(tmp_path / "saved")
    (tmp_path / "taken").write_text("mine\n")
    assert main(["convert", str(tmp_path / "saved"), str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err
    assert "taken is a file, not a directory" in err and "Traceback" not in err
    assert (tmp_path / "taken").read_text() == "mine\n"


def test_pull_onto_an_existing_file_is_a_one_line_error(hermetic_hub, tmp_path, capsys, monkeypatch):
    """`vitzoo pull REPO DIR` with DIR an existing file says DIR is a file; the file is kept."""
    from vitzoo.cli import main
    from hubserver import HubServer

    with HubServer(hermetic_hub / "hub", token=HUB_TOKEN) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        tiny().push_to_hub("alice/file", token=HUB_TOKEN)
        (tmp_path / "taken").write_text("mine\n")
        assert main(["pull", "alice/file", str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err
    assert "taken is a file, not a directory" in err and "Traceback" not in err
    assert (tmp_path / "taken").read_text() == "mine\n"


def test_train_onto_an_existing_file_is_a_one_line_error(tmp_path, capsys):
    """`vitzoo train --out FILE` says FILE is a file; the file is kept."""
    from vitzoo.cli import main

    (tmp_path / "taken").write_text("mine\n")
    assert main(["train", "vit_ti16", "--data", "synthetic", "--device", "cpu", "--out", str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err
    assert "is a file" in err and "Traceback" not in err
    assert (tmp_path / "taken").read_text() == "mine\n"


# ------------------------------------------------------------------ should fix: a crash after the last step
def test_a_crash_in_fewshot_evaluation_still_leaves_the_weights_and_summary(tmp_path, monkeypatch):
    """A training whose few-shot evaluation fails after the last step raises that error, and the run
    still holds the trained model (loadable) and summary.json, which records the failure."""
    import json

    from vitzoo.train import build, fit

    def broken(*args, **kwargs):
        raise RuntimeError("few-shot broke")

    monkeypatch.setattr(build, "fewshot_linear_accuracy", broken)
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="few-shot broke") as err:
        fit(train_config(run, fewshot=(1,)))
    assert "trained model and summary.json are saved" in "".join(getattr(err.value, "__notes__", []))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["step"] == 2
    assert summary["fewshot_error"] == "RuntimeError: few-shot broke"
    assert vitzoo.from_pretrained(run).config.embed_dim == RUN_TINY["embed_dim"]


# ------------------------------------------------------------------ should fix: Hub errors that say what is wrong
def test_a_push_without_a_token_says_none_was_sent(hermetic_hub, monkeypatch):
    """A push with no token anywhere says a token is needed and none was sent (not that it was refused)."""
    from vitzoo.errors import HubError
    from hubserver import HubServer

    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    with HubServer(hermetic_hub / "hub", token=HUB_TOKEN) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(HubError, match="needs a token to write to alice/t and none was sent") as err:
            tiny().push_to_hub("alice/t")
    assert "refused" not in str(err.value)


def test_a_push_with_hf_hub_offline_says_offline_forbids_it(hermetic_hub, monkeypatch):
    """A push with HF_HUB_OFFLINE=1 says that the setting forbids it, not anything about the cache."""
    from vitzoo.errors import HubError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match="HF_HUB_OFFLINE=1 forbids talking to the Hub.*unset HF_HUB_OFFLINE") as err:
        tiny().push_to_hub("alice/t", token=HUB_TOKEN)
    assert "cache" not in str(err.value)


@pytest.mark.parametrize("endpoint", ["notaurl", "ftp://example.org", "http://"])
def test_an_endpoint_that_is_not_a_url_says_so(hermetic_hub, monkeypatch, endpoint):
    """HF_ENDPOINT that is not an http(s) URL is a HubError saying so, on pull and on push."""
    from vitzoo.errors import HubError

    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    with pytest.raises(HubError, match="is not an http\\(s\\) URL"):
        vitzoo.from_pretrained("hf-hub:alice/t")
    with pytest.raises(HubError, match="is not an http\\(s\\) URL"):
        tiny().push_to_hub("alice/t", token=HUB_TOKEN)


@pytest.mark.parametrize("repo_id", ["org/a..b", "org/name--x", "org/" + "a" * 100, "org/-x"])
def test_a_repo_name_the_hub_rejects_is_the_same_hub_error_on_pull_and_push(hermetic_hub, monkeypatch, repo_id):
    """A repository name the Hub would reject is one HubError, the same on pull and on push."""
    from vitzoo.errors import HubError

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(HubError, match="is not a valid Hub repo id") as pulled:
        vitzoo.from_pretrained(f"hf-hub:{repo_id}")
    with pytest.raises(HubError, match="is not a valid Hub repo id") as pushed:
        tiny().push_to_hub(repo_id, token=HUB_TOKEN)
    assert str(pulled.value) == str(pushed.value)
