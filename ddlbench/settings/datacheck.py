"""Cross-key checks between data, model and run (before launch; ConfigError, exit 2)."""
from __future__ import annotations

from pathlib import Path

from ddlbench.errors import ConfigError

LANGUAGE_DATA = ("markov", "text")
VISION_DATA = ("blobs", "digits", "imagefolder")
FLOORED_DATA = ("markov", "blobs")   # datasets with a known best achievable loss
DIGITS_SAMPLES = 1797                # sklearn.datasets.load_digits


def check_data(cfg) -> None:
    d, m, run = cfg.data, cfg.model, cfg.run
    if d.name in LANGUAGE_DATA and m.kind != "language":
        raise ConfigError(f"data={d.name} is a language dataset but model={m.name} is a {m.kind} model")
    if d.name in VISION_DATA and m.kind != "vision":
        raise ConfigError(f"data={d.name} is an image dataset but model={m.name} is a {m.kind} model")
    if d.name == "synthetic" and (run.epochs or run.target is not None or run.eval_every):
        raise ConfigError("run.epochs/eval_every/target need a dataset with a validation split; "
                          "data=synthetic is random noise (use data=markov, blobs, digits, "
                          "imagefolder or text)")
    if (run.eval_every or run.target is not None) and not run.epochs:
        raise ConfigError("run.eval_every and run.target apply to epoch training: set run.epochs")
    if run.target_vs_floor and (d.name not in FLOORED_DATA or run.target_metric != "loss"):
        raise ConfigError("run.target_vs_floor needs run.target_metric=loss and a dataset with a "
                          f"known floor ({', '.join(FLOORED_DATA)}), got data={d.name}")
    if run.target_metric == "accuracy" and run.target is not None and not 0 < run.target <= 1:
        raise ConfigError(f"run.target {run.target}: an accuracy target must be in (0, 1]")
    if run.final_objective and not run.epochs:
        raise ConfigError("run.final_objective is computed over a dataset's training split: set "
                          "run.epochs and a dataset (data=digits, blobs, markov, imagefolder, text)")
    if run.stop_at_target and run.target is None:
        raise ConfigError("run.stop_at_target needs run.target")
    _check_sizes(cfg)


def _check_sizes(cfg) -> None:
    d, m, gb = cfg.data, cfg.model, cfg.run.global_batch
    if d.name in ("markov", "blobs") and d.train_samples < gb:
        raise ConfigError(f"data.train_samples {d.train_samples} is smaller than run.global_batch {gb}")
    if d.name == "markov" and d.states > m.vocab_size:
        raise ConfigError(f"data.states {d.states} exceeds model.vocab_size {m.vocab_size}")
    if d.name == "digits":
        _check_digits(d, m, cfg.run)
    if d.name == "text":
        need = 256 if d.tokenizer == "byte" else 50257
        if m.vocab_size < need:
            raise ConfigError(f"tokenizer {d.tokenizer} needs model.vocab_size >= {need}, "
                              f"model {m.name} has {m.vocab_size}")
        for name in (d.train_file, d.val_file):
            if not (Path(d.path) / name).is_file():
                raise ConfigError(f"data.path: {Path(d.path) / name} does not exist (Wikitext-103 "
                                  "layout: wiki.train.tokens, wiki.valid.tokens)")
        if d.tokenizer == "gpt2":
            for name in ("vocab.json", "merges.txt"):
                if not (Path(d.tokenizer_dir) / name).is_file():
                    raise ConfigError(f"data.tokenizer_dir: {Path(d.tokenizer_dir) / name} does not exist")
    if d.name == "imagefolder":
        from ddlbench.models.datasets.imagefolder import class_dirs
        for sub in (d.train_dir, d.val_dir):
            if not (Path(d.path) / sub).is_dir():
                raise ConfigError(f"data.path: {Path(d.path) / sub} is not a directory "
                                  "(ImageFolder layout: <path>/train/<class>/*.jpg, <path>/val/...)")
        n = len(class_dirs(Path(d.path) / d.train_dir))
        if n != m.num_classes:
            raise ConfigError(f"data.path has {n} classes but model.num_classes is {m.num_classes}")


def _check_digits(d, m, run) -> None:
    if m.num_classes < 10:
        raise ConfigError(f"data=digits has 10 classes; model.num_classes is {m.num_classes}")
    if d.features == "raw" and (m.image_size != 8 or m.channels != 1):
        raise ConfigError("data.features=raw gives 1 x 8 x 8 inputs: the model needs image_size 8 "
                          f"and channels 1 (model={m.name}: {m.image_size}, {m.channels})")
    if d.features == "upscaled" and m.channels != 3:
        raise ConfigError(f"data.features=upscaled gives 3 channels; model.channels is {m.channels}")
    n_train = DIGITS_SAMPLES - int(round(DIGITS_SAMPLES * d.val_fraction))
    if d.train_samples is not None and d.train_samples > n_train:
        raise ConfigError(f"data.train_samples {d.train_samples} exceeds the {n_train} training "
                          f"samples of data=digits at val_fraction {d.val_fraction}")
    if d.val_fraction == 0 and (run.target is not None or run.eval_every):
        raise ConfigError("data.val_fraction=0 leaves no validation split: run.target and "
                          "run.eval_every need one")
