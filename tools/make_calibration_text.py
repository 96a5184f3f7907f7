"""Writes the calibration and held-out chat texts in resources/calibration/ from Synthetic-Persona-Chat.

Each conversation becomes one paragraph of alternating user/assistant lines, cut after a
user turn (the format `seqmoe trace --chat` reads), so tracing covers both the prefill of
the history and the greedy continuation of the assistant's reply. Calibration text comes
from the test split, held-out text from the validation split: no conversation is in both.
``--predictor-text FILE`` also writes every test-split conversation (cut elsewhere): the text
the bundled demo predictor was trained on, traced with ``seqmoe trace --chat --every-turn`` (not
shipped: made from the corpus). Every turn is a reply to learn from, and the reuse forecast
learns only from replies.

    python tools/make_calibration_text.py [--data ../shared/data/corpus] [--predictor-text FILE]
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
    """``count`` conversations, each cut after a random user turn."""
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
    parser.add_argument("--predictor-text", type=Path, help="also write every test-split conversation here")
    args = parser.parse_args()
    source = args.data / "synthetic-persona-chat"
    out = ROOT / "resources" / "calibration"
    out.mkdir(parents=True, exist_ok=True)
    test = conversations(source / "Synthetic-Persona-Chat_test.csv")
    (out / "chat.txt").write_text(paragraphs(test, 300, 1))
    (out / "heldout-chat.txt").write_text(paragraphs(conversations(source / "Synthetic-Persona-Chat_valid.csv"), 120, 2))
    if args.predictor_text:
        args.predictor_text.write_text(paragraphs(test, len(test), 3))


if __name__ == "__main__":
    main()
