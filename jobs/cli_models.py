"""`docintel train`, `evaluate` and `quantize`: the offline model tools (options, help and
printing; the work is in docintel.pipeline.offline)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from docintel.jobs.ui import ConfigOpt, console, fail, out
from docintel.pipeline.config import load_config
from docintel.pipeline.errors import DocintelError

TrainDataArg = Annotated[
    Path,
    typer.Argument(
        help="Labelled CSV or Parquet with text,label columns.", exists=True, dir_okay=False
    ),
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
SeedOpt = Annotated[int, typer.Option(help="Random seed (split and weights).")]
ModelDirArg = Annotated[Path, typer.Argument(help="Classifier folder written by `train`.")]
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


def train(
    data: TrainDataArg,
    out_dir: OutDirOpt,
    config: ConfigOpt = None,
    label_names: LabelNamesOpt = None,
    seed: SeedOpt = 0,
) -> None:
    """Train the Keras classifier head on embeddings of a labelled file.

    Holds out a stratified 10% for early stopping and metrics; writes model.keras,
    labels.json, training.json and metrics.json to --out.

    Example:

      docintel train data/twitter_fin_sentiment/sent_train.csv --out my-head

      docintel train labelled.csv --out my-head --label-names Bearish,Bullish,Neutral
    """
    from docintel.pipeline.offline.train import train as do_train

    try:
        cfg = load_config(config)
        with console.status("embedding texts and training the head"):
            m = do_train(data, out_dir, cfg.embed, _names(label_names), seed=seed)
    except DocintelError as e:
        fail(e)
    print_metrics(m, f"held-out split of {data.name} -> {out_dir}")


def evaluate(
    model_dir: ModelDirArg,
    data: EvalDataArg,
    config: ConfigOpt = None,
    label_names: LabelNamesOpt = None,
) -> None:
    """Print accuracy, macro-F1, per-class scores and the confusion matrix on DATA.

    Example:

      docintel evaluate models/finsent data/twitter_fin_sentiment/sent_valid.csv
    """
    from docintel.pipeline.offline.train import evaluate as do_evaluate

    try:
        cfg = load_config(config)
        with console.status("embedding and classifying"):
            m = do_evaluate(model_dir, data, cfg.embed, _names(label_names))
    except DocintelError as e:
        fail(e)
    print_metrics(m, f"{model_dir} on {data.name}")


def print_metrics(m: dict[str, Any], title: str) -> None:
    """Per-class scores, then the confusion matrix."""
    t = Table(
        title=f"{title}: accuracy {m['accuracy']:.4f}, macro-F1 {m['macro_f1']:.4f} (n={m['n']:,})"
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
    """Build the ONNX CPU encoders and the int8 classifier offline, with a parity report.

    Exports the configured encoder as a fused fp32 ONNX graph (the default CPU path; a run
    also builds it on first need) and quantizes it (ONNX Runtime dynamic int8,
    per-channel weights, FFN output projections kept fp32); rebuilds the configured Keras
    classifier as ONNX from its weights and quantizes it the same way (runs without
    TensorFlow). Then measures, on DATA, the encoder's embedding cosines to fp32 and the
    macro-F1 of int8 encoder, int8 classifier and both together against fp32 + fp32;
    writes parity.json in the int8 folder. CPU replicas of a spill layout load both.

    Example:

      docintel quantize && docintel run corpus/ out/ --gpus 1 --config gpu.toml
    """
    from docintel.pipeline.offline import quantize as q

    try:
        cfg = load_config(config)
        target = out_dir or cfg.embed.resolved_int8_dir()
        clf_dir = cfg.classify.resolved_model_dir()
        encoder = cfg.embed.resolved_model_path()
        with console.status(f"exporting {encoder} as a fused fp32 ONNX graph"):
            q.build_fp32(encoder, target)
        with console.status(f"exporting and quantizing {encoder}"):
            q.build_int8(encoder, target)
        with console.status(f"converting and quantizing {clf_dir}"):
            head = q.build_int8_classifier(clf_dir, target)
        if data is None and not DEFAULT_PARITY_DATA.is_file():
            out.print(f"wrote {target} and {head}; no parity report (pass --data FILE)")
            return
        data = data or DEFAULT_PARITY_DATA
        with console.status(f"parity report on {data}"):
            report = q.parity_report(target, cfg.embed, clf_dir, data)
        parity = q.write_parity(target, report)
    except DocintelError as e:
        fail(e)
    _print_parity(report, data)
    out.print(f"wrote {report['encoder']['artefact']}, {head} and {parity}")


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
