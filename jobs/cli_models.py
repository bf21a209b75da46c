"""`docintel train`, `evaluate` and `quantize`: the offline model tools (options, help and
printing; the work is in docintel.pipeline.offline)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from docintel.jobs.ui import PROGRESS_ENV, ConfigOpt, ProgressOpt, console, fail, out, safe
from docintel.pipeline.config import EmbedConfig, load_config
from docintel.pipeline.errors import DocintelError, UsageError

TrainDataArg = Annotated[
    Path | None,
    typer.Argument(
        help="Labelled CSV or Parquet with text,label columns: sentences, or whole documents "
        "with --documents. Not given with --descriptions.",
        metavar="DATA",
        exists=True,
        dir_okay=False,
    ),
]
DescriptionsOpt = Annotated[
    Path | None,
    typer.Option(
        "--descriptions",
        metavar="FILE",
        help="Build a zero-shot head from label descriptions, without labelled data: a "
        '\\[labels] table (label = "description" or a list of them) and an optional '
        "\\[examples] table (label = a few sentences). Scores are softmax(20 x cosine to "
        "each label's prototype), calibrated only when \\[examples] are given "
        "(docs/models.md). Default: none (train on DATA).",
        dir_okay=False,
    ),
]
DocumentsOpt = Annotated[
    bool,
    typer.Option(
        "--documents",
        help="DATA (and --score-on files) hold whole documents: each is split by the "
        "pipeline's sentencizer, its sentences learn its label (each document weighing "
        "once), the hold-out is drawn by document and metrics.json reports document "
        "accuracy and macro-F1 (a document's label: the arg-max of its sentences' mean "
        "probabilities, as a run labels it).",
    ),
]
TextColumnOpt = Annotated[
    str, typer.Option("--text-column", help="With --documents: the text column of DATA.")
]
LabelColumnOpt = Annotated[
    str, typer.Option("--label-column", help="With --documents: the label column of DATA.")
]
EvalDataArg = Annotated[
    Path,
    typer.Argument(help="Labelled CSV or Parquet (text,label).", exists=True, dir_okay=False),
]
OutDirOpt = Annotated[Path, typer.Option("--out", help="Folder for the classifier.")]
LabelNamesOpt = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated names for integer labels 0,1,2,... (e.g. Bearish,Bullish,"
        "Neutral; default for evaluate: the model's label order)."
    ),
]
SeedOpt = Annotated[int, typer.Option(help="Random seed (split, weights, order, dropout).")]
FineTuneOpt = Annotated[
    bool,
    typer.Option(
        "--fine-tune",
        help="Fine-tune the encoder on the data first (PyTorch), write it to OUT/encoder/, "
        "then train the head on its embeddings.",
    ),
]
MethodOpt = Annotated[
    str,
    typer.Option(
        help="With --fine-tune: 'lora' (low-rank adapters, a few MB, merged into the base at "
        "load) or 'full' (every weight; a merged fp16 folder, ~45 MB for MiniLM)."
    ),
]
PreserveOpt = Annotated[
    float,
    typer.Option(
        "--preserve",
        min=0,  # "x>=0": a "0.0" would widen the column and truncate other help lines
        metavar="W",
        help="With --fine-tune: keep the base encoder's geometry with weight W (0 = off): "
        "the loss adds W x mean(1 - cosine to the base's vector of each training text), so "
        "the tuned encoder still serves search, zero-shot and other heads (docs/models.md).",
    ),
]
TopLayersOpt = Annotated[
    int,
    typer.Option(
        "--top-layers",
        min=0,
        metavar="K",
        help="With --fine-tune: only the encoder's top K transformer layers learn (0 = all); "
        "the layers below keep the base's weights, and training is faster.",
    ),
]
EpochsOpt = Annotated[
    int, typer.Option(min=1, metavar="N", help="With --fine-tune: epochs over the data.")
]
HeadOpt = Annotated[
    str,
    typer.Option(
        help="Classifier head: 'mlp' (an ensemble of 5 MLPs, 384-192 units), 'linear' "
        "(one softmax layer over the embedding) or, with --fine-tune, 'joint' (the "
        "fine-tuning's own linear layer, trained with the encoder, exported to Keras) or "
        "'cosine' (likewise, the layer trained on the unit vectors the embed stage emits)."
    ),
]
ScoreOnOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--score-on",
        metavar="FILE",
        help="Labelled CSV/Parquet to score the trained model on too (repeatable; default: none); "
        "metrics.json gets its metrics, and its ECE as the top-level 'ece'.",
        exists=True,
        dir_okay=False,
    ),
]
AddDataOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--add-data",
        metavar="FILE",
        help="More labelled CSV/Parquet to train on with DATA (same columns and label ids; "
        "repeatable; default: none). The hold-out is drawn from all the rows.",
        exists=True,
        dir_okay=False,
    ),
]
AddWeightOpt = Annotated[
    float,
    typer.Option(
        "--add-weight",
        metavar="W",
        help="Weight of each --add-data row in the head's loss, relative to a row of DATA "
        "(within the classes' balanced weights; default 1). The shipped model uses 3: its "
        "written news sentences count three times a tweet. The fine-tuning weighs all alike.",
    ),
]
LanguagesOpt = Annotated[
    str,
    typer.Option(
        "--languages",
        metavar="CODES",
        help="The languages of DATA's texts, ISO 639-1 codes, comma-separated, recorded in "
        "training.json: a run gives sentences in any other language a null label and score "
        "(docs/models.md). Default: en.",
    ),
]
NormaliseTextOpt = Annotated[
    bool,
    typer.Option(
        "--normalise-text",
        help="Rewrite tweet artefacts in DATA's texts (training and hold-out, for the "
        "fine-tuning and the head): cashtags -> $TICKER, links removed, @mentions -> @USER. "
        "Texts at inference (and --score-on files) are not rewritten. Default: off.",
    ),
]
EncoderOpt = Annotated[
    str | None,
    typer.Option(
        help="Encoder to embed with (and, with --fine-tune, to start from): a local Hugging "
        "Face folder, an OUT/encoder folder of an earlier --fine-tune, or 'stock' (the stock "
        "MiniLM). Default: \\[embed] model_path (for evaluate: MODEL_DIR/encoder if it exists)."
    ),
]
ModelDirArg = Annotated[
    str,
    typer.Argument(
        help="Classifier folder written by `train`, or 'default' (the bundled fine-tuned "
        "model) or 'stock' (the bundled head on the stock MiniLM)."
    ),
]
Int8OutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out",
        help="int8 folder (default: \\[embed] int8_dir, i.e. <cache>/int8/<encoder "
        "version>/); the classifier goes to OUT/classify/<classifier version>.int8.onnx.",
    ),
]
ParityDataOpt = Annotated[
    Path | None,
    typer.Option(
        help="Labelled CSV/Parquet for the parity report (default: the vendored validation "
        "split, data/twitter_fin_sentiment/sent_valid.csv, when run from a source checkout; "
        "without it the report is skipped)."
    ),
]
DEFAULT_PARITY_DATA = Path("data/twitter_fin_sentiment/sent_valid.csv")


def _names(label_names: str | None) -> list[str] | None:
    return [n.strip() for n in label_names.split(",")] if label_names else None


def _embed_cfg(cfg: EmbedConfig, encoder: str | None) -> EmbedConfig:
    return cfg.model_copy(update={"model_path": encoder}) if encoder else cfg


def resolve_model(model: str) -> tuple[Path, str | None]:
    """A model named on the command line: its classifier folder, and the encoder to run it
    with when the name or folder implies one (None: keep the configured encoder).
    'default' and 'stock' are the bundled models (installed package data, wherever
    docintel is run from); a folder of `docintel train --fine-tune` brings its encoder/."""
    from docintel.pipeline.artefacts.paths import ENCODER_SUBDIR, STOCK
    from docintel.pipeline.config import DEFAULT_MODEL_NAME, ClassifyConfig

    if model in (DEFAULT_MODEL_NAME, STOCK):
        return ClassifyConfig(model_dir=model).resolved_model_dir(), model
    path = Path(model).expanduser()
    if not path.is_dir():
        raise UsageError(
            f"model {model!r} is not a folder: give a folder written by `docintel train`, "
            f"or '{DEFAULT_MODEL_NAME}' or '{STOCK}' for a bundled model"
        )
    encoder = path / ENCODER_SUBDIR
    return path.resolve(), str(encoder.resolve()) if encoder.is_dir() else None


def model_overrides(model: str | None) -> dict[str, str]:
    """Config overrides that run ``model`` (``docintel run --model``): its head, and its
    encoder when it has one of its own (else the configured encoder)."""
    if model is None:
        return {}
    head, encoder = resolve_model(model)
    overrides = {"classify.model_dir": str(head)}
    if encoder is not None:
        overrides["embed.model_path"] = encoder
    return overrides


class _FineTuneBar:
    """The fine-tuning's live bar (steps, loss, examples/s) and one line per epoch."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: Any = None
        self.epochs = 0

    def start(self, total_steps: int, steps_per_epoch: int) -> None:
        self.epochs = total_steps // steps_per_epoch
        self.task = self.progress.add_task("fine-tuning", total=total_steps, loss=math.nan, rate="")

    def step(self, epoch: int, loss: float, examples_per_s: float) -> None:
        what = f"fine-tuning, epoch {epoch}/{self.epochs}"
        rate = f"{examples_per_s:,.1f} ex/s"
        self.progress.update(self.task, advance=1, description=what, loss=loss, rate=rate)

    def epoch(self, r: dict[str, Any]) -> None:
        self.progress.console.print(
            f"epoch {r['epoch']}: train loss {r['train_loss']:.4f}; held-out loss "
            f"{r['holdout_loss']:.4f}, macro-F1 {r['holdout_macro_f1']:.4f}, accuracy "
            f"{r['holdout_accuracy']:.4f} ({r['seconds']:.0f} s)",
            highlight=False,
        )
        if r["epoch"] == self.epochs:
            self.progress.console.print(
                "embedding texts with the best epoch's encoder and training the head"
            )


def _fine_tune_progress(show: bool) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f} steps"),
        TextColumn("loss {task.fields[loss]:.4f}" if show else ""),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not show,
    )


def _training_params(
    head: str, method: str, epochs: int, fine_tune: bool, tuning: tuple[float, int] = (0.0, 0)
) -> tuple[Any, Any]:
    """The head's and the fine-tuning's parameters (None without --fine-tune) for the
    options; a bad combination is a usage error."""
    from docintel.pipeline.offline.finetune import COSINE_SCALE, FineTuneParams
    from docintel.pipeline.offline.train import HeadParams

    if method not in ("full", "lora"):
        raise typer.BadParameter(f"--method {method!r}: expected 'lora' or 'full'")
    if head not in ("mlp", "linear", "joint", "cosine"):
        raise typer.BadParameter(f"--head {head!r}: expected 'mlp', 'linear', 'joint' or 'cosine'")
    preserve, top_layers = tuning
    if preserve and not fine_tune:
        raise typer.BadParameter("--preserve keeps the geometry while fine-tuning: add --fine-tune")
    if top_layers and not fine_tune:
        raise typer.BadParameter("--top-layers chooses what the fine-tuning tunes: add --fine-tune")
    if head in ("joint", "cosine") and not fine_tune:
        raise typer.BadParameter(f"--head {head} is trained with the encoder: add --fine-tune")
    one_layer = head in ("linear", "joint", "cosine")
    head_params = HeadParams(members=1, hidden=()) if one_layer else HeadParams()
    if not fine_tune:
        return head_params, None
    scale = COSINE_SCALE if head == "cosine" else 0.0
    return head_params, FineTuneParams(
        method=method,
        epochs=epochs,
        cosine_scale=scale,
        keep_layer=head == "joint",
        preserve=preserve,
        top_layers=top_layers,
    )


def train(
    out_dir: OutDirOpt,
    data: TrainDataArg = None,
    config: ConfigOpt = None,
    label_names: LabelNamesOpt = None,
    seed: SeedOpt = 0,
    fine_tune: FineTuneOpt = False,
    method: MethodOpt = "lora",
    epochs: EpochsOpt = 2,
    preserve: PreserveOpt = 0.0,
    top_layers: TopLayersOpt = 0,
    encoder: EncoderOpt = None,
    head: HeadOpt = "mlp",
    score_on: ScoreOnOpt = None,
    normalise_text: NormaliseTextOpt = False,
    add_data: AddDataOpt = None,
    add_weight: AddWeightOpt = 1.0,
    languages: LanguagesOpt = "en",
    descriptions: DescriptionsOpt = None,
    documents: DocumentsOpt = False,
    text_column: TextColumnOpt = "text",
    label_column: LabelColumnOpt = "label",
    progress: ProgressOpt = True,
) -> None:
    """Train the Keras classifier head on embeddings of a labelled file; with --fine-tune,
    fine-tune the encoder on it first; with --descriptions, build a zero-shot head from
    label descriptions; with --documents, train on labelled whole documents.

    Holds out a stratified 10% of DATA (of its documents with --documents) for early
    stopping, epoch selection and metrics; writes model.keras, labels.json, training.json
    and metrics.json to --out, and with --fine-tune the encoder to OUT/encoder/ (run it
    with \\[embed] model_path = OUT/encoder and \\[classify] model_dir = OUT). The
    fine-tuned encoder's embeddings are tuned to these labels: keep the stock encoder for
    general-purpose embeddings. Heads are trained on the encoder they run with (--encoder,
    else \\[embed] model_path).

    Example:

      docintel train data/twitter_fin_sentiment/sent_train.csv --out my-head

      docintel train in.csv --out my-head --label-names Bearish,Bullish,Neutral

      docintel train labelled.csv --out my-model --fine-tune --encoder stock

      docintel train --descriptions data/news_topics/labels.toml --out topics-zs

      docintel train data/news_topics/train.csv --documents --out topics-docs
    """
    langs = _languages(languages)
    _check_train_mode(data, descriptions, documents, fine_tune, add_data, normalise_text)
    _check_add_weight(add_data, add_weight, head)
    how = _TrainRun(config, encoder, seed, score_on or [], (text_column, label_column), langs)
    if descriptions is not None or documents:
        _train_topics(data, out_dir, descriptions, documents, how)
        return
    assert data is not None  # _check_train_mode
    show = progress and (sys.stderr.isatty() or bool(os.environ.get(PROGRESS_ENV)))
    tuning = (preserve, top_layers)
    what = (head, method, epochs, fine_tune, normalise_text, (add_data or [], add_weight), tuning)
    _train_sentences(data, out_dir, how, _names(label_names), what, show)


def _train_sentences(
    data: Path,
    out_dir: Path,
    how: _TrainRun,
    label_names: list[str] | None,
    what: tuple[str, str, int, bool, bool, tuple[list[Path], float], tuple[float, int]],
    show: bool,
) -> None:
    """`train DATA`: a head on labelled sentences (``what``: head, method, epochs,
    fine-tune, normalise-text, (add-data, add-weight), (preserve, top-layers)), with the
    fine-tuning's progress bar."""
    from docintel.pipeline.offline.train import train as do_train

    head, method, epochs, fine_tune, normalise_text, add_data, tuning = what
    t0 = time.perf_counter()
    try:
        head_params, params = _training_params(head, method, epochs, fine_tune, tuning)
        embed = _embed_cfg(load_config(how.config).embed, how.encoder)
        with _fine_tune_progress(show) as bar:
            if params is None:
                bar.console.print("embedding texts and training the head")
            kwargs = {"fine_tune": params, "monitor": _FineTuneBar(bar), "params": head_params}
            kwargs |= {"score_on": how.score_on, "normalise": normalise_text}
            kwargs |= {"more_data": add_data[0], "add_weight": add_data[1]}
            kwargs |= {"languages": how.languages}
            m = do_train(data, out_dir, embed, label_names, seed=how.seed, **kwargs)
    except DocintelError as e:
        fail(e)
    took = f"{(time.perf_counter() - t0) / 60:.1f} min"
    print_metrics(m, f"held-out split of {data.name} -> {out_dir} ({took})")
    print_calibration(out_dir)


def _check_add_weight(add_data: list[Path] | None, add_weight: float, head: str) -> None:
    """Refuse (exit 2) a --add-weight that is not a positive number, one without
    --add-data, and one with --head joint (no head is fitted after its fine-tuning, which
    weighs all rows alike)."""
    if not (math.isfinite(add_weight) and add_weight > 0):
        raise typer.BadParameter(f"--add-weight {add_weight}: give a positive number")
    if add_weight != 1.0 and not add_data:
        raise typer.BadParameter("--add-weight weighs the --add-data rows: give --add-data too")
    if add_weight != 1.0 and head == "joint":
        raise typer.BadParameter(
            "--add-weight weighs rows in the head's loss; --head joint fits no head after "
            "the fine-tuning, which weighs all rows alike: drop one of them"
        )


def _check_train_mode(
    data: Path | None,
    descriptions: Path | None,
    documents: bool,
    fine_tune: bool,
    add_data: list[Path] | None,
    normalise_text: bool,
) -> None:
    """Refuse (exit 2) DATA and --descriptions together or neither, and the options a
    zero-shot or document-trained head does not take."""
    if descriptions is None and data is None:
        raise typer.BadParameter("give DATA (a labelled file) or --descriptions LABELS.toml")
    if descriptions is not None and data is not None:
        raise typer.BadParameter(
            f"--descriptions builds a head without labelled data: drop DATA ({data.name}), "
            "or drop --descriptions to train on it"
        )
    if descriptions is not None and not descriptions.is_file():
        raise typer.BadParameter(f"--descriptions {descriptions}: no such file")
    special = "--descriptions" if descriptions is not None else "--documents"
    if (descriptions is not None or documents) and (fine_tune or add_data or normalise_text):
        raise typer.BadParameter(
            f"{special} does not take --fine-tune, --add-data or --normalise-text"
        )


@dataclass(frozen=True)
class _TrainRun:
    """The options of `docintel train` that every kind of head is built with."""

    config: Path | None
    encoder: str | None
    seed: int
    score_on: list[Path]
    columns: tuple[str, str]  # text, label (--documents)
    languages: list[str]


def _train_topics(
    data: Path | None,
    out_dir: Path,
    descriptions: Path | None,
    documents: bool,
    how: _TrainRun,
) -> None:
    """`train --descriptions` and `train DATA --documents`: build, score, print."""
    from docintel.pipeline.offline import documents as docs
    from docintel.pipeline.offline.zeroshot import build_zeroshot

    t0 = time.perf_counter()
    try:
        cfg = load_config(how.config)
        embed = _embed_cfg(cfg.embed, how.encoder)
        if descriptions is not None:
            with console.status("embedding the descriptions"):
                record = build_zeroshot(descriptions, out_dir, embed, how.languages)
            _print_zero_shot(record, out_dir)
        else:
            assert data is not None  # _check_train_mode
            with console.status("sentencizing and embedding the documents, training the head"):
                m = docs.train_documents(
                    data,
                    out_dir,
                    embed,
                    cfg.sentencize,
                    seed=how.seed,
                    languages=how.languages,
                    columns=how.columns,
                )
            took = f"{(time.perf_counter() - t0) / 60:.1f} min"
            title = f"held-out documents of {data.name} -> {out_dir} ({took})"
            _print_documents(m, escape(safe(title)))
            print_calibration(out_dir)
        with console.status("scoring"):
            scored = docs.scored_files(
                out_dir, how.score_on, embed, cfg.sentencize, documents, how.columns
            )
    except DocintelError as e:
        fail(e)
    for name, m in scored.items():
        title = f"{out_dir} on {name}"
        (_print_documents if documents else print_metrics)(m, escape(safe(title)))


def _print_zero_shot(record: dict[str, Any], out_dir: Path) -> None:
    """What the zero-shot head is and how its scores are scaled."""
    from docintel.pipeline.offline.zeroshot import ZERO_SHOT_KEY

    zs = record[ZERO_SHOT_KEY]
    n = sum(zs["descriptions"].values())
    ex = sum(zs["examples"].values())
    out.print(
        f"zero-shot head: {len(zs['descriptions'])} labels, {n} descriptions, {ex} examples "
        f"-> {escape(safe(out_dir))}; scores: {zs['scores']}",
        highlight=False,
    )
    print_calibration(out_dir)


def _print_documents(m: dict[str, Any], title: str) -> None:
    """Document-level metrics as print_metrics prints them, then the sentence level."""
    print_metrics(m, f"{title}, document level")
    s = m["sentences"]
    out.print(
        f"sentence level (each sentence against its document's label): accuracy "
        f"{s['accuracy']:.4f}, macro-F1 {s['macro_f1']:.4f} (n={s['n']:,})",
        highlight=False,
    )


def _languages(value: str) -> list[str]:
    """``--languages en,de``: the codes, refused (exit 2) unless each is ISO 639-1."""
    from docintel.pipeline.errors import ModelError
    from docintel.pipeline.stages.classify import LANGUAGES_KEY, head_languages

    codes = [c.strip() for c in value.split(",") if c.strip()]
    try:
        return head_languages({LANGUAGES_KEY: codes}, "--languages")
    except ModelError as e:
        raise typer.BadParameter(str(e)) from None


def print_calibration(model_dir: Path) -> None:
    """The calibration the head's training.json records: the ECE it reached (stdout), and
    a warning (stderr) when its hold-out was small."""
    from docintel.pipeline.artefacts.paths import TRAINING_FILE
    from docintel.pipeline.offline.calibration import small_holdout_warning, summary_line
    from docintel.pipeline.stages.classify import CALIBRATION_KEY

    training = json.loads((model_dir / TRAINING_FILE).read_text(encoding="utf-8"))
    record = training.get(CALIBRATION_KEY)
    if not record:
        return
    out.print(summary_line(record), markup=False, highlight=False)
    warning = small_holdout_warning(record)
    if warning:
        console.print(f"warning: {warning}", markup=False, highlight=False)


def evaluate(
    model_dir: ModelDirArg,
    data: EvalDataArg,
    config: ConfigOpt = None,
    label_names: LabelNamesOpt = None,
    encoder: EncoderOpt = None,
) -> None:
    """Print accuracy, macro-F1, per-class scores and the confusion matrix on DATA.

    Embeds with MODEL_DIR/encoder when the model was fine-tuned (else \\[embed]
    model_path, or --encoder); a head trained on another encoder is refused.

    Example:

      docintel evaluate default data/twitter_fin_sentiment/sent_valid.csv

      docintel evaluate my-head labelled.csv --encoder stock
    """
    from docintel.pipeline.offline.train import evaluate as do_evaluate

    try:
        head, own_encoder = resolve_model(model_dir)
        embed = load_config(config).embed
        if own_encoder is not None and not embed.model_path:  # the model's own encoder
            embed = _embed_cfg(embed, own_encoder)
        embed = _embed_cfg(embed, encoder)
        with console.status("embedding and classifying"):
            m = do_evaluate(head, data, embed, _names(label_names))
    except DocintelError as e:
        fail(e)
    print_metrics(m, escape(safe(f"{model_dir} on {data.name}")))


def print_metrics(m: dict[str, Any], title: str) -> None:
    """Per-class scores, then the confusion matrix."""
    ece = f", ECE {m['ece']:.4f}" if "ece" in m else ""  # 10 bins over the top probability
    t = Table(
        title=f"{title}: accuracy {m['accuracy']:.4f}, macro-F1 {m['macro_f1']:.4f}{ece} "
        f"(n={m['n']:,})"
    )
    for col in ("label", "precision", "recall", "F1", "support"):
        t.add_column(col, justify="left" if col == "label" else "right")
    for name, c in m["per_class"].items():
        scores = (f"{c['precision']:.3f}", f"{c['recall']:.3f}", f"{c['f1']:.3f}")
        t.add_row(name, *scores, f"{c['support']:,}")
    out.print(t)
    cm = m["confusion_matrix"]
    c = Table(title="confusion matrix (rows: true, columns: predicted)")
    c.add_column("")
    for name in cm["labels"]:
        c.add_column(name, justify="right")
    for name, row in zip(cm["labels"], cm["rows_true_cols_pred"], strict=True):
        c.add_row(name, *(f"{v:,}" for v in row))
    out.print(c)


def quantize(
    config: ConfigOpt = None,
    out_dir: Int8OutOpt = None,
    data: ParityDataOpt = None,
) -> None:
    """Build the ONNX CPU encoders and classifier heads offline, with a parity report.

    Exports the configured encoder as a fused fp32 ONNX graph (the default CPU path; a run
    also builds it on first need) and quantizes it (ONNX Runtime dynamic int8,
    per-channel weights, FFN output projections kept fp32); rebuilds the configured Keras
    classifier as ONNX from its weights, kept in fp32 (the default CPU classify path) and
    quantized the same way (both run without TensorFlow). Then measures, on DATA, the
    encoder's embedding cosines to fp32 and the macro-F1 of int8 encoder, int8 classifier
    and both together against fp32 + fp32; writes parity.json in the int8 folder. CPU
    replicas of a spill layout load both int8 models.

    Examples (quantize, then a run whose CPU replicas spill to the int8 models):

      docintel quantize

      docintel run data/demo/documents.parquet demo-out --gpus 1
    """
    from docintel.pipeline.artefacts.paths import build_lock
    from docintel.pipeline.offline import quantize as q

    try:
        cfg = load_config(config)
        target = out_dir or cfg.embed.resolved_int8_dir()
        clf_dir = cfg.classify.resolved_model_dir()
        encoder = cfg.embed.resolved_model_path()
        with build_lock(target):  # the lock a run's build on first need takes: one at a time
            with console.status(f"exporting {encoder} as a fused fp32 ONNX graph"):
                q.build_fp32(encoder, target)
            with console.status(f"exporting and quantizing {encoder}"):
                q.build_int8(encoder, target)
            with console.status(f"converting and quantizing {clf_dir}"):
                q.build_fp32_classifier(clf_dir, target)
                head = q.build_int8_classifier(clf_dir, target)
        if data is None and not DEFAULT_PARITY_DATA.is_file():
            out.print(
                f"wrote {escape(safe(target))} and {escape(safe(head))}; no parity report "
                "(pass --data FILE)"
            )
            return
        data = data or DEFAULT_PARITY_DATA
        with console.status(f"parity report on {data}"):
            report = q.parity_report(target, cfg.embed, clf_dir, data)
        parity = q.write_parity(target, report)
    except DocintelError as e:
        fail(e)
    _print_parity(report, data)
    wrote = (report["encoder"]["artefact"], head, parity)
    out.print("wrote {}, {} and {}".format(*(escape(safe(w)) for w in wrote)))


def _print_parity(report: dict[str, Any], data: Path) -> None:
    enc, clf, both = report["encoder"], report["classifier"], report["end_to_end"]
    t = Table(
        title=f"int8 vs fp32 on {data.name} (n={report['n']:,}; "
        f"fp32 + fp32 macro-F1 {report['macro_f1_fp32']:.4f})"
    )
    for col in ("int8", "macro-F1", "drop", "labels agree"):
        t.add_column(col, justify="left" if col == "int8" else "right")
    for name, part in (("encoder", enc), ("classifier", clf), ("both", both)):
        f1, drop = f"{part['macro_f1_int8']:.4f}", f"{part['macro_f1_drop']:+.4f}"
        t.add_row(name, f1, drop, f"{part['labels_agree']:.2%}")
    out.print(t)
    out.print(
        f"encoder embeddings: cosine to fp32 mean {enc['cosine_mean']:.4f}, "
        f"min {enc['cosine_min']:.4f}; classifier probabilities: max difference "
        f"{clf['max_prob_diff']:.4f}"
    )
