"""Hand-written items in each native task format and their gold answers (shared by the tests)."""

from __future__ import annotations

import json
from pathlib import Path

ITEMS: dict[str, list[dict]] = {
    "arc": [
        {"id": "a1", "question": "Which gas do plants take in from the air?",
         "choices": {"text": ["oxygen", "carbon dioxide", "helium", "neon"], "label": ["A", "B", "C", "D"]},
         "answerKey": "B"},
        {"id": "a2", "question": "What melts ice fastest?",
         "choices": {"text": ["a warm hand", "a cold stone", "a freezer"], "label": ["1", "2", "3"]}, "answerKey": "1"},
        {"id": "a3", "question": "The sun is a",
         "choices": {"text": ["planet", "star", "moon", "comet"], "label": ["A", "B", "C", "D"]}, "answerKey": "B"},
    ],
    "openbookqa": [
        {"id": "o1", "question_stem": "A magnet will stick to",
         "choices": {"text": ["wood", "an iron nail", "glass", "paper"], "label": ["A", "B", "C", "D"]},
         "answerKey": "B"},
        {"id": "o2", "question_stem": "Rain comes from",
         "choices": {"text": ["clouds", "rocks", "trees", "sand"], "label": ["A", "B", "C", "D"]}, "answerKey": " A"},
    ],
    "piqa": [
        {"goal": "To dry wet hair,", "sol1": "use a towel.", "sol2": "use a spoon.", "label": 0},
        {"goal": "How do you open a jar?", "sol1": "Sing to the lid.", "sol2": "Twist the lid to the left.", "label": 1},
    ],
    "hellaswag": [
        {"ind": 1, "activity_label": "Baking cookies", "ctx_a": "A woman mixes flour and sugar in a bowl.",
         "ctx_b": "she", "ctx": "A woman mixes flour and sugar in a bowl. she",
         "endings": ["puts the dough on a tray.", "swims across [title] the lake.", "paints the  car blue.",
                     "reads a newspaper."], "label": "0"},
        {"ind": 2, "activity_label": "Running", "ctx_a": "A man ties his shoes.", "ctx_b": "then he",
         "ctx": "A man ties his shoes. then he",
         "endings": ["eats the shoes.", "starts to run down the road.", "falls asleep.", "sings loudly."],
         "label": "1"},
    ],
    "boolq": [
        {"passage": "Water boils at 100 degrees Celsius at sea level.", "question": "does water boil at 100 degrees",
         "answer": True, "label": 1},
        {"passage": "Cats are mammals.", "question": "are cats reptiles", "answer": False, "label": 0},
    ],
    "winogrande": [
        {"sentence": "The trophy does not fit in the suitcase because the _ is too big.", "option1": "trophy",
         "option2": "suitcase", "answer": "1"},
        {"sentence": "Sarah lent Maria a book because _ had finished reading it.", "option1": "Sarah",
         "option2": "Maria", "answer": "1"},
        {"sentence": "The cup fell off the table because _ was slippery.", "option1": "the cup",
         "option2": "the table", "answer": "2"},
    ],
    "siqa": [
        {"context": "Jordan gave Robin a gift.", "question": "How would Robin feel?", "answerA": "grateful",
         "answerB": "angry", "answerC": "bored", "label": "1"},
        {"context": "Alex missed the bus.", "question": "What will Alex do next?", "answerA": "fly home",
         "answerB": "sleep at the stop", "answerC": "wait for the next bus", "label": "3"},
    ],
}
GOLD = {"arc": [1, 0, 1], "openbookqa": [1, 0], "piqa": [0, 1], "hellaswag": [0, 1], "boolq": [1, 0],
        "winogrande": [0, 0, 1], "siqa": [0, 2]}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
