"""Benchmark: the language stage (issue 32, item 6): how many English sentences keep their
label, how well other languages are found, and what the stage costs.

1. English kept: the share of the repository's English sentences the stage reads as
   ``en`` (so the default head labels them), on the written news check
   (``data/news_style_check``), the news-style tweet rows and all validation tweets
   (``data/twitter_fin_sentiment``), each sentence alone as its own document (the hardest
   case: no document to fall back to) and in documents of 10 consecutive sentences.
2. Other languages: 54 news sentences written for this bench in German, French, Spanish,
   Italian and Dutch (a third of them headlines of 2-4 words), alone and as documents.
3. Cost: CPU seconds (this process) per 1,000 sentences of the three English files, for
   the default settings and the alternatives (no quick pass; all 75 languages), in
   alternating rounds; the median round is shown.
4. Share of a CPU run (``--run``): one ``docintel run`` of the same English sentences as
   documents of 10, CPU pools, and each stage's seconds from its manifest.

Run from the repository root:

    .venv/bin/python bench/language.py --rounds 3 --run
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, docintel_executable, load_average, machine_lines, md_row

from docintel.pipeline.stages.language import LanguageConfig, LanguageDetector

ENGLISH = {
    "news check (479)": REPO / "data/news_style_check/news_sentences.csv",
    "news-style tweets (1,201)": REPO / "data/twitter_fin_sentiment/sent_valid_newsstyle.csv",
    "all validation tweets (2,486)": REPO / "data/twitter_fin_sentiment/sent_valid.csv",
}
FOREIGN = {
    "de": [
        "Der Umsatz des Konzerns stieg im dritten Quartal um zwölf Prozent auf 4,2 Mrd. Euro.",
        "Die Aktie verlor nach der Gewinnwarnung mehr als neun Prozent an Wert.",
        "Der Vorstand hält an seiner Prognose für das Gesamtjahr fest.",
        "Die Bank will bis Ende 2027 rund 3.000 Stellen abbauen.",
        "Analysten hatten mit einem deutlich höheren Ergebnis gerechnet.",
        "Die Dividende soll auf 1,20 Euro je Aktie erhöht werden.",
        "Gewinnwarnung bei Müller Maschinenbau.",
        "Die Übernahme muss noch von den Kartellbehörden genehmigt werden.",
        "Kurssturz an der Börse.",
        "Zinsen bleiben unverändert.",
        "Siemens erhöht die Prognose.",
        "Der Ölpreis ist am Montag deutlich gefallen.",
        "Die Inflation in der Eurozone ging im November auf 2,1 Prozent zurück.",
        "Das Unternehmen meldet einen Rekordgewinn.",
    ],
    "fr": [
        "Le chiffre d'affaires du groupe a progressé de 8 % au premier semestre.",
        "L'action a chuté de plus de 6 % après l'annonce des résultats trimestriels.",
        "La direction maintient ses objectifs pour l'ensemble de l'exercice.",
        "Le conseil d'administration proposera un dividende de 2,10 euros par action.",
        "Les analystes s'attendaient à une marge opérationnelle plus élevée.",
        "La banque prévoit de supprimer 1 200 postes d'ici à la fin de l'année prochaine.",
        "Résultats annuels en forte hausse.",
        "L'opération reste soumise à l'accord des autorités de la concurrence.",
        "La Bourse de Paris termine en baisse.",
        "Hausse des taux directeurs.",
        "Le groupe relève ses prévisions annuelles.",
        "Les prix du pétrole ont reculé lundi.",
        "L'inflation dans la zone euro est retombée à 2,1 % en novembre.",
        "Bénéfice record pour le constructeur.",
    ],
    "es": [
        "Las ventas de la compañía crecieron un 11 % en el tercer trimestre.",
        "Las acciones cayeron un 7 % tras la publicación de los resultados.",
        "El consejo de administración mantiene sus previsiones para todo el ejercicio.",
        "El banco repartirá un dividendo de 0,35 euros por acción en enero.",
        "Los analistas esperaban un beneficio neto bastante mayor.",
        "La empresa cerrará dos fábricas y despedirá a 800 trabajadores.",
        "Beneficio récord para la eléctrica.",
        "La operación está pendiente de la aprobación de los reguladores.",
        "La bolsa cierra con pérdidas.",
        "Suben los tipos de interés.",
        "La empresa eleva su previsión anual.",
        "El precio del petróleo bajó el lunes.",
        "La inflación de la eurozona se moderó hasta el 2,1 % en noviembre.",
        "Caída histórica del mercado.",
    ],
    "it": [
        "Il fatturato del gruppo è cresciuto del 9 per cento nel primo semestre.",
        "Le azioni sono crollate dopo l'annuncio dei conti trimestrali.",
        "La banca distribuirà un dividendo di 0,40 euro per azione.",
        "Borsa di Milano in calo.",
        "Il consiglio di amministrazione conferma le stime per l'intero esercizio.",
        "Utile netto in forte crescita.",
    ],
    "nl": [
        "De omzet van het concern steeg in het derde kwartaal met tien procent.",
        "Het aandeel daalde na de winstwaarschuwing met acht procent.",
        "De bank schrapt ruim duizend banen.",
        "Beurs van Amsterdam sluit lager.",
        "Het bestuur handhaaft de verwachtingen voor het hele jaar.",
        "Recordwinst voor de chipmachinemaker.",
    ],
}
SETTINGS: dict[str, LanguageConfig] = {
    "default (20 languages, quick pass)": LanguageConfig(),
    "20 languages, no quick pass": LanguageConfig(fast_languages=[]),
    "all 75 languages, quick pass": LanguageConfig(languages=["all"]),
}
DOC_SIZE = 10


def _texts(path: Path) -> list[str]:
    with path.open(newline="", encoding="utf-8") as f:
        return [r["text"] for r in csv.DictReader(f)]


def _docs(texts: list[str], size: int) -> list[list[str]]:
    return [texts[i : i + size] for i in range(0, len(texts), size)]


def _share(stage: LanguageDetector, texts: list[str], code: str, size: int) -> float:
    got = [lang for doc in _docs(texts, size) for lang in stage.document(doc)]
    return sum(g == code for g in got) / len(got)


def quality(stage: LanguageDetector) -> list[str]:
    rows = [md_row(["sentences", "alone: kept en", f"documents of {DOC_SIZE}: kept en"])]
    rows.append(md_row(["---", "---:", "---:"]))
    for name, path in ENGLISH.items():
        texts = _texts(path)
        rows.append(
            md_row(
                [
                    name,
                    f"{_share(stage, texts, 'en', 1):.2%}",
                    f"{_share(stage, texts, 'en', DOC_SIZE):.2%}",
                ]
            )
        )
    for size in (1, len(FOREIGN["de"])):
        hit = sum(round(_share(stage, t, c, size) * len(t)) for c, t in FOREIGN.items())
        total = sum(map(len, FOREIGN.values()))
        what = "alone" if size == 1 else "as one document per language"
        rows.append(md_row([f"other languages, {what}", f"{hit} of {total} found", ""]))
    return rows


def _cpu_per_1000(stage: LanguageDetector, texts: list[str]) -> float:
    t0 = time.process_time()
    for doc in _docs(texts, DOC_SIZE):
        stage.document(doc)
    return (time.process_time() - t0) / len(texts) * 1000


def cost(rounds: int) -> list[str]:
    texts = [t for p in ENGLISH.values() for t in _texts(p)]
    stages = {name: LanguageDetector(cfg) for name, cfg in SETTINGS.items()}
    for s in stages.values():
        s.setup()
        s.document(texts[:50])  # the models a Latin-script text needs, loaded (not timed)
    seen: dict[str, list[float]] = {name: [] for name in stages}
    for r in range(rounds):
        order = list(stages) if r % 2 == 0 else list(reversed(stages))
        for name in order:
            seen[name].append(_cpu_per_1000(stages[name], texts))
    base = statistics.median(seen[next(iter(stages))])
    rows = [
        md_row(["settings", "CPU s / 1,000 sentences", "vs default", "kept en (tweets, alone)"])
    ]
    rows.append(md_row(["---", "---:", "---:", "---:"]))
    tweets = _texts(ENGLISH["all validation tweets (2,486)"])
    for name, s in stages.items():
        med = statistics.median(seen[name])
        kept = _share(s, tweets, "en", 1)
        rows.append(md_row([name, f"{med:.2f}", f"{med / base:.2f}x", f"{kept:.2%}"]))
    return rows


def run_share(work: Path) -> list[str]:
    texts = [t for p in ENGLISH.values() for t in _texts(p)]
    docs = [" ".join(d) for d in _docs(texts, DOC_SIZE)]
    src = work / "in.parquet"
    pq.write_table(pa.table({"doc_id": [f"d{i:04d}" for i in range(len(docs))], "text": docs}), src)
    out = work / "out"
    cmd = [docintel_executable(), "run", str(src), str(out), "--run-id", "bench"]
    subprocess.run(cmd, check=True, capture_output=True)
    manifest = json.loads((out / "_manifest.json").read_text())
    secs: dict[str, float] = manifest["timings"]["stage_seconds"]
    total = sum(secs.values())
    n = manifest["counts"]["sentences"]
    rows = [md_row(["stage", "seconds", "share of the stages' time", "s / 1,000 sentences"])]
    rows.append(md_row(["---", "---:", "---:", "---:"]))
    for stage, s in secs.items():
        rows.append(md_row([stage, f"{s:.1f}", f"{s / total:.1%}", f"{s / n * 1000:.2f}"]))
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--run", action="store_true", help="also one docintel run (stage shares)")
    args = ap.parse_args(argv)
    print("\n".join(machine_lines()))
    print(f"load average at start: {load_average()}\n")
    stage = LanguageDetector(LanguageConfig())
    stage.setup()
    parts: list[tuple[str, Callable[[], list[str]]]] = [
        ("English kept and other languages found (default settings)", lambda: quality(stage)),
        (f"Cost, {args.rounds} alternating rounds", lambda: cost(args.rounds)),
    ]
    for title, make in parts:
        print(f"## {title}\n")
        print("\n".join(make()) + "\n")
    if args.run:
        with tempfile.TemporaryDirectory() as tmp:
            print("## One CPU run (docintel run, defaults), the manifest's stage seconds\n")
            print("\n".join(run_share(Path(tmp))) + "\n")
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    main()
