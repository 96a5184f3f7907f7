"""Writes the calibration and held-out chat texts in resources/calibration/ from Synthetic-Persona-Chat.

Each conversation becomes one paragraph of alternating user/assistant lines, cut after a
user turn (the format `seqmoe trace --chat` reads), so tracing covers both the prefill of
the history and the greedy continuation of the assistant's reply. Calibration text comes
from the test split, held-out text from the validation split: no conversation is in both.

    python tools/make_calibration_text.py [--data ../shared/data/corpus]
"""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def conversations(csv_file: Path) -> list[list[str]]:
    with csv_file.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    result = []
    for row in rows:
        turns = [line.split(":", 1)[1].strip() for line in row["Best Generated Conversation"].splitlines() if ":" in line]
        if len(turns) >= 3:
            result.append([t for t in turns if t])
    return result


def paragraphs(convs: list[list[str]], count: int, seed: int) -> str:
    rng = random.Random(seed)
    chosen = rng.sample(convs, min(count, len(convs)))
    out = []
    for turns in chosen:
        # An odd number of turns ends with the user's line, leaving the assistant to answer.
        cut = rng.randrange(1, min(len(turns), 13) + 1, 2)
        out.append("\n".join(turns[:cut]))
    return "\n\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "corpus")
    args = parser.parse_args()
    source = args.data / "synthetic-persona-chat"
    out = ROOT / "resources" / "calibration"
    out.mkdir(parents=True, exist_ok=True)
    (out / "chat.txt").write_text(paragraphs(conversations(source / "Synthetic-Persona-Chat_test.csv"), 300, 1))
    (out / "heldout-chat.txt").write_text(paragraphs(conversations(source / "Synthetic-Persona-Chat_valid.csv"), 120, 2))


if __name__ == "__main__":
    main()
