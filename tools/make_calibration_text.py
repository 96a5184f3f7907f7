"""Writes the calibration and held-out chat texts in resources/calibration/ from Synthetic-Persona-Chat.

Each conversation becomes one paragraph of alternating user/assistant lines, cut after a
user turn (the format `seqmoe trace --chat` reads), so tracing covers both the prefill of
the history and the greedy continuation of the assistant's reply. Calibration text comes
from the test split, held-out text from the validation split: no conversation is in both.
``--predictor-text FILE`` also writes every conversation of both splits but the held-out ones
(cut elsewhere): the text the bundled demo predictor was trained on, traced with ``seqmoe trace
--chat --every-turn`` (not shipped: made from the corpus). Every turn is a reply to learn from,
and the reuse forecast learns only from replies.

    python tools/make_calibration_text.py [--data ../shared/data/corpus] [--predictor-text FILE]
"""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELD_OUT, HELD_OUT_SEED = 120, 2
"""The validation split's conversations kept for evaluation: no predictor learns from them."""


def conversations(csv_file: Path) -> list[list[str]]:
    with csv_file.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    result = []
    for row in rows:
        turns = [line.split(":", 1)[1].strip() for line in row["Best Generated Conversation"].splitlines() if ":" in line]
        if len(turns) >= 3:
            result.append([t for t in turns if t])
    return result


def chosen(convs: list[list[str]], count: int, seed: int) -> tuple[list[list[str]], random.Random]:
    """``count`` of ``convs`` drawn with ``seed``, and the generator that drew them, to cut them."""
    rng = random.Random(seed)
    return rng.sample(convs, min(count, len(convs))), rng


def paragraphs(picked: list[list[str]], rng: random.Random) -> str:
    """The ``picked`` conversations, each cut after a user turn drawn with ``rng``."""
    out = []
    for turns in picked:
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
    (out / "chat.txt").write_text(paragraphs(*chosen(test, 300, 1)))
    valid = conversations(source / "Synthetic-Persona-Chat_valid.csv")
    held_out, rng = chosen(valid, HELD_OUT, HELD_OUT_SEED)
    (out / "heldout-chat.txt").write_text(paragraphs(held_out, rng))
    if args.predictor_text:
        held_out_ids = {id(turns) for turns in held_out}
        learnable = test + [turns for turns in valid if id(turns) not in held_out_ids]
        args.predictor_text.write_text(paragraphs(*chosen(learnable, len(learnable), 3)))


if __name__ == "__main__":
    main()
