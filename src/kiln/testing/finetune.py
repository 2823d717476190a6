"""Small task heads fine-tuned on the bundled MiniLM over generated data, so task metrics mean something.

Each model trains in about a minute on 2 CPU cores and is cached under `.kiln-cache/finetuned/` keyed by
this file's content and the torch/transformers versions, so later runs reuse it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from importlib import metadata
from pathlib import Path

import torch
import transformers

from kiln.source.loading import bundled_model_dir

# Under the working directory (the repository root for the tests and benchmarks), whatever the install.
CACHE = Path(os.environ.get("KILN_CACHE", ".kiln-cache")).resolve() / "finetuned"

THINGS = ["film", "hotel", "pizza", "laptop", "concert", "book", "service", "phone", "course", "coffee",
          "keyboard", "museum", "train ride", "haircut", "sofa", "game", "podcast", "bakery", "jacket", "app"]
GOOD = ["excellent", "wonderful", "delightful", "superb", "fantastic", "lovely", "brilliant", "great"]
BAD = ["terrible", "awful", "disappointing", "horrible", "dreadful", "useless", "broken", "poor"]
GOOD_VERBS = ["loved", "enjoyed", "adored", "would recommend"]
BAD_VERBS = ["hated", "regretted buying", "could not stand", "would avoid"]

NAMES = ["Anna Keller", "Tomas Novak", "Mei Lin", "Omar Haddad", "Sofia Rossi", "Lars Berg", "Priya Nair",
         "Jonas Weber", "Elena Petrova", "Kwame Mensah", "Lucia Gomez", "Hiro Tanaka", "Maja Horvat",
         "Noah Fischer", "Amara Obi", "Ivan Kuznetsov", "Leila Farah", "Finn Murphy", "Zoe Martin", "Ravi Shah"]
CITIES = ["Lisbon", "Krakow", "Osaka", "Nairobi", "Tallinn", "Porto", "Lyon", "Cork", "Quito", "Hanoi", "Bergen",
          "Leeds", "Graz", "Perth", "Cusco", "Turku"]
JOBS = ["nurse", "architect", "baker", "pilot", "teacher", "chemist", "carpenter", "journalist", "lawyer",
        "gardener", "engineer", "librarian"]
ORGS = ["Acme Labs", "Northwind", "Blue Harbor", "Globex", "Initech", "Umbrella Foods", "Stark Metals",
        "Vandelay Industries"]


def sentiment_examples(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        positive = rng.random() < 0.5
        thing = rng.choice(THINGS)
        if rng.random() < 0.5:
            text = f"The {thing} was {rng.choice(GOOD if positive else BAD)}."
        else:
            text = f"I {rng.choice(GOOD_VERBS if positive else BAD_VERBS)} this {thing}, it was " \
                   f"{rng.choice(GOOD if positive else BAD)}."
        out.append({"text": text, "label": "positive" if positive else "negative"})
    return out


def qa_examples(count: int, seed: int, unanswerable: float = 0.15) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        name, other = rng.sample(NAMES, 2)
        city, job, org, year = rng.choice(CITIES), rng.choice(JOBS), rng.choice(ORGS), str(rng.randint(1940, 2005))
        context = f"{name} was born in {city} in {year}. Today {name.split()[0]} works as a {job} for {org}. " \
                  f"{other} lives in {rng.choice(CITIES)}."
        kind = rng.choice(["city", "year", "job", "org"])
        who = other if rng.random() < unanswerable and kind != "city" else name
        question = {"city": f"Where was {name} born?", "year": f"In which year was {who} born?",
                    "job": f"What does {who} work as?", "org": f"Who does {who} work for?"}[kind]
        answer = {"city": city, "year": year, "job": job, "org": org}[kind]
        out.append({"question": question, "context": context, "answers": [answer] if who == name else []})
    return out


def _cache_dir(kind: str) -> Path:
    key = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    versions = f"torch{metadata.version('torch')}-tf{metadata.version('transformers')}"
    return CACHE / f"{kind}-{key}-{versions}"


def _train(model, batches, epochs: int, lr: float, frozen_layers: int = 0) -> None:
    """``frozen_layers``: the embeddings and this many of the lowest encoder layers keep the bundled weights, so the
    backward pass stops above them (CI trains these heads on every fresh clone)."""
    torch.manual_seed(0)
    if frozen_layers:
        for module in (model.bert.embeddings, *model.bert.encoder.layer[:frozen_layers]):
            module.requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for _ in range(epochs):
        for batch in batches:
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    model.eval()


def _save(model, tokenizer, target: Path) -> Path:
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    tmp.rename(target)  # a crash mid-training never leaves a half-written cache entry
    return target


def sentiment_model(max_length: int = 512) -> Path:
    """The sentiment head; ``max_length``: the longest input its tokenizer reads (saved as ``model_max_length``).

    Its inputs are one-sentence reviews (under 30 tokens). At 512, kiln optimize's agreement set, which reaches a
    model's maximum length, runs texts of up to 512 tokens through every batching: 105 s of a 153 s run of one
    variant (cProfile, tests/e2e/test_finetuned.py's classification run before it passed 128)."""
    target = _cache_dir("sentiment" if max_length == 512 else f"sentiment-{max_length}")
    if target.exists():
        return target
    torch.set_num_threads(2)
    tokenizer = transformers.AutoTokenizer.from_pretrained(bundled_model_dir())
    labels = {0: "negative", 1: "positive"}
    torch.manual_seed(0)  # the new head's initial weights
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        bundled_model_dir(), num_labels=2, id2label=labels, label2id={v: k for k, v in labels.items()})
    data = sentiment_examples(640, seed=1)
    batches = []
    for i in range(0, len(data), 32):
        chunk = data[i : i + 32]
        batch = tokenizer([d["text"] for d in chunk], padding=True, return_tensors="pt")
        batch["labels"] = torch.tensor([int(d["label"] == "positive") for d in chunk])
        batches.append(batch)
    _train(model, batches, epochs=2, lr=1e-4, frozen_layers=3)
    tokenizer.model_max_length = max_length
    target.parent.mkdir(parents=True, exist_ok=True)
    return _save(model, tokenizer, target)


def qa_model() -> Path:
    target = _cache_dir("qa")
    if target.exists():
        return target
    torch.set_num_threads(2)
    tokenizer = transformers.AutoTokenizer.from_pretrained(bundled_model_dir())
    # The new head's initial weights, seeded: unseeded, this recipe reached reference F1 0.804 on
    # tests/e2e/test_finetuned.py's rows in one fresh process (the test asks for > 0.8); seeded 0, 1 and 2, 0.858.
    # (One epoch at 5e-4, half the CPU, ranged 0.62-0.86 over four processes: not kept.)
    torch.manual_seed(0)
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(bundled_model_dir())
    data = qa_examples(1000, seed=1)  # 1600 took 125 s of a fresh clone's suite; 1000 still learns the task
    batches = []
    for i in range(0, len(data), 16):
        chunk = data[i : i + 16]
        enc = tokenizer([d["question"] for d in chunk], [d["context"] for d in chunk], padding=True,
                        return_offsets_mapping=True, return_tensors="pt")
        starts, ends = [], []
        for row, d in enumerate(chunk):
            if not d["answers"]:
                starts.append(0)
                ends.append(0)
                continue
            char_start = d["context"].index(d["answers"][0])
            char_end = char_start + len(d["answers"][0])
            seq = enc.sequence_ids(row)
            offsets = enc["offset_mapping"][row].tolist()
            tokens = [t for t, s in enumerate(seq)
                      if s == 1 and offsets[t][0] < char_end and offsets[t][1] > char_start]
            starts.append(tokens[0])
            ends.append(tokens[-1])
        enc.pop("offset_mapping")
        enc["start_positions"] = torch.tensor(starts)
        enc["end_positions"] = torch.tensor(ends)
        batches.append(enc)
    _train(model, batches, epochs=2, lr=1e-4, frozen_layers=3)
    target.parent.mkdir(parents=True, exist_ok=True)
    return _save(model, tokenizer, target)


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_squad(rows: list[dict], path: Path) -> Path:
    paragraphs = [{"context": r["context"], "qas": [
        {"id": str(i), "question": r["question"], "is_impossible": not r["answers"],
         "answers": [{"text": a, "answer_start": r["context"].index(a)} for a in r["answers"]]}]}
        for i, r in enumerate(rows)]
    path.write_text(json.dumps({"version": "v2.0", "data": [{"title": "generated", "paragraphs": paragraphs}]}))
    return path
