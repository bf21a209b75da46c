"""Topic check of issue 33: zero-shot heads (`docintel train --descriptions`) and heads
trained on labelled documents (`docintel train DOCS --documents`), per encoder, scored at
document level on news articles, beside a TF-IDF + logistic regression baseline.

    .venv/bin/python bench/topic_check.py                              # default and stock
    .venv/bin/python bench/topic_check.py --encoders default,stock,PATH --variants

Everything runs through the functions `docintel train` calls (build_zeroshot,
train_documents) and scores with the one `--score-on` uses for documents
(evaluate_documents: the sentencize stage, the embed stage, the classify stage with the
head's temperature, the arg-max of each document's mean sentence probabilities): what is
measured is what ships. The baseline fits TfidfVectorizer + LogisticRegression on the
training documents, C chosen by 5-fold cross-validation on them alone. ``--variants``
adds zero-shot heads from other phrasings of the same six topic definitions (a template
over short phrases, the label names alone) and the plain per-sentence weighting of the
document-trained head. Prints a Markdown table (BENCHMARKS.md, "Topics: zero-shot and
document-trained heads (issue 33)").
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, load_average, machine_lines, md_row

from docintel.pipeline.config import load_config
from docintel.pipeline.offline.documents import (
    Weighting,
    evaluate_documents,
    read_documents,
    sentencize,
    train_documents,
)
from docintel.pipeline.offline.zeroshot import build_zeroshot
from docintel.pipeline.stages.embed_settings import EmbedConfig
from docintel.pipeline.stages.sentencize import SentencizeConfig

DATA = REPO / "data" / "news_topics"
# Other phrasings of the six definitions of data/news_topics (never of the check set): a
# template over short phrases of each definition, and the label names alone.
PHRASES = {
    "earnings": ["financial results", "quarterly profit and revenue", "earnings guidance"],
    "deals": ["a merger or acquisition", "a takeover bid", "the sale of a business"],
    "workforce": ["job cuts and layoffs", "hiring", "a strike or union wage talks"],
    "legal": ["a lawsuit or court ruling", "a regulator's investigation or fine", "fraud"],
    "leadership": ["a new chief executive", "an executive resignation", "board changes"],
    "products": ["a product launch", "a new model or service", "a product recall"],
}
TEMPLATE = "This news is about {}."
N_EXAMPLES = 3  # --variants: lead sentences of training documents per label, as [examples]


def _toml(labels: dict[str, list[str]], template: str | None) -> str:
    lines = [f"template = {json.dumps(template)}"] if template else []
    lines.append("[labels]")
    lines += [f"{k} = {json.dumps(v)}" for k, v in labels.items()]
    return "\n".join(lines) + "\n"


def _with_examples(labels_file: Path, train: Path, work: Path) -> Path:
    """``labels_file`` plus an ``[examples]`` table: the lead sentence of the first
    ``N_EXAMPLES`` training documents of each label (a few-shot head)."""
    docs = read_documents(train)
    sents = sentencize(docs.texts, load_config().sentencize, train)
    lead = {int(d): t for t, d in zip(sents.texts[::-1], sents.doc[::-1], strict=True)}
    examples: dict[str, list[str]] = {n: [] for n in docs.names}
    for i, y in enumerate(docs.y):
        name = docs.names[y]
        if len(examples[name]) < N_EXAMPLES and i in lead:
            examples[name].append(lead[i])
    table = "\n[examples]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in examples.items())
    path = work / "with_examples.toml"
    path.write_text(labels_file.read_text() + table)
    return path


def zero_shot_variants(
    labels_file: Path, train: Path, work: Path, variants: bool
) -> dict[str, Path]:
    """The descriptions files to build zero-shot heads from: labels.toml, and with
    ``variants`` the template over short phrases, the label names alone, and labels.toml
    with a few training sentences as [examples]."""
    files = {"labels.toml (sentences)": labels_file}
    if variants:
        files[f"labels.toml + {N_EXAMPLES} examples/label"] = _with_examples(
            labels_file, train, work
        )
        for name, labels, template in (
            ("template + phrases", PHRASES, TEMPLATE),
            ("template + label name", {k: [k] for k in PHRASES}, TEMPLATE),
        ):
            path = work / f"{name.replace(' ', '_').replace('+', '')}.toml"
            path.write_text(_toml(labels, template))
            files[name] = path
    return files


def encoder_cfg(name: str) -> EmbedConfig:
    """``default`` (the configured encoder), ``stock`` or a local encoder folder."""
    embed = load_config().embed
    return embed if name == "default" else embed.model_copy(update={"model_path": name})


def _scores(m: dict[str, Any]) -> dict[str, float]:
    return {"accuracy": m["accuracy"], "macro_f1": m["macro_f1"]}


def zero_shot(
    files: dict[str, Path], check: Path, embed: EmbedConfig, sent: SentencizeConfig, work: Path
) -> dict[str, Any]:
    out = {}
    for name, path in files.items():
        head = work / f"zs-{len(out)}"
        t0 = time.perf_counter()
        build_zeroshot(path, head, embed, ["en"])
        built = time.perf_counter() - t0
        m = evaluate_documents(head, check, embed, sent)
        out[name] = {**_scores(m), "build_s": round(built, 1)}
    return out


def documents_head(
    train: Path,
    check: Path,
    embed: EmbedConfig,
    sent: SentencizeConfig,
    work: Path,
    weightings: list[Weighting],
) -> dict[str, Any]:
    out = {}
    for weighting in weightings:
        head = work / f"docs-{weighting}"
        t0 = time.perf_counter()
        hold = train_documents(train, head, embed, sent, weighting=weighting)
        took = time.perf_counter() - t0
        m = evaluate_documents(head, check, embed, sent)
        out[weighting] = {
            **_scores(m),
            "sentence_accuracy": m["sentences"]["accuracy"],
            "holdout_accuracy": hold["accuracy"],
            "train_s": round(took, 1),
        }
    return out


def tfidf_baseline(train: Path, check: Path) -> dict[str, Any]:
    """TF-IDF (word 1-2 grams, sublinear tf) + logistic regression on the training
    documents, C by 5-fold stratified cross-validation (macro-F1) on them alone."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score
    from sklearn.model_selection import GridSearchCV, StratifiedKFold
    from sklearn.pipeline import make_pipeline

    tr = read_documents(train)
    ck = read_documents(check, names=tr.names)
    pipe = make_pipeline(
        TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1),
        LogisticRegression(max_iter=5000),
    )
    grid = {"logisticregression__C": [0.1, 0.3, 1, 3, 10, 30, 100]}
    search = GridSearchCV(
        pipe, grid, scoring="f1_macro", cv=StratifiedKFold(5, shuffle=True, random_state=0)
    )
    search.fit(tr.texts, tr.y)
    pred = search.predict(ck.texts)
    return {
        "accuracy": float(accuracy_score(ck.y, pred)),
        "macro_f1": float(f1_score(ck.y, pred, average="macro")),
        "C": search.best_params_["logisticregression__C"],
        "cv_macro_f1": round(float(search.best_score_), 4),
    }


def table(results: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    """The figures as Markdown: a zero-shot head's gap is to the same descriptions on the
    stock encoder, a document-trained head's to the TF-IDF + LR baseline."""
    gap_head = "gap (zero-shot: to stock; --documents: to TF-IDF+LR)"
    rows = [
        md_row(["encoder", "head", "doc accuracy", "doc macro-F1", gap_head, "time s"]),
        md_row(["---"] * 6),
    ]
    stock = results.get("stock", {}).get("zero_shot", {})
    for enc, r in results.items():
        for name, z in r["zero_shot"].items():
            gap = f"{z['accuracy'] - stock[name]['accuracy']:+.4f}" if name in stock else ""
            acc, f1 = f"{z['accuracy']:.4f}", f"{z['macro_f1']:.4f}"
            rows.append(md_row([enc, f"zero-shot: {name}", acc, f1, gap, f"{z['build_s']}"]))
        for w, d in r["documents"].items():
            gap = f"{d['accuracy'] - baseline['accuracy']:+.4f}"
            acc, f1 = f"{d['accuracy']:.4f}", f"{d['macro_f1']:.4f}"
            head = f"--documents ({w} weighting)"
            rows.append(md_row([enc, head, acc, f1, gap, f"{d['train_s']}"]))
    acc, f1 = f"{baseline['accuracy']:.4f}", f"{baseline['macro_f1']:.4f}"
    name = f"TF-IDF + LR (C={baseline['C']:g} by 5-fold CV on train)"
    rows.append(md_row(["—", name, acc, f1, "", ""]))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--encoders", default="default,stock", help="default, stock or folders")
    p.add_argument("--train", type=Path, default=DATA / "train.csv")
    p.add_argument("--check", type=Path, default=DATA / "check.csv")
    p.add_argument("--labels", type=Path, default=DATA / "labels.toml")
    p.add_argument("--variants", action="store_true", help="other phrasings and weightings")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    sent = load_config().sentencize
    weightings: list[Weighting] = ["document", "sentence"] if args.variants else ["document"]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="topic-check-") as tmp:
        work = Path(tmp)
        files = zero_shot_variants(args.labels, args.train, work, args.variants)
        for enc in args.encoders.split(","):
            embed, w = encoder_cfg(enc), work / f"enc{len(results)}"
            results[enc] = {
                "zero_shot": zero_shot(files, args.check, embed, sent, w),
                "documents": documents_head(args.train, args.check, embed, sent, w, weightings),
            }
            print(f"{enc}: {json.dumps(results[enc])}", file=sys.stderr, flush=True)
    baseline = tfidf_baseline(args.train, args.check)
    n_train, n_check = (len(read_documents(f).texts) for f in (args.train, args.check))
    print(*machine_lines(), f"load average: {load_average()}", sep="\n")
    print(f"train: {args.train.name} ({n_train} documents), check: {args.check.name} ({n_check})")
    print("\n".join(table(results, baseline)))
    if args.json:
        args.json.write_text(json.dumps({"results": results, "baseline": baseline}, indent=2))


if __name__ == "__main__":
    main()
