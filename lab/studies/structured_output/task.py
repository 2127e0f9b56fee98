"""The extraction task of notebook 07: a sentence about a person, and a JSON object of four fields to fill from it.

The sentences are generated from templates with a seed, so every answer is known: the task measures how often
a model's output parses and validates, and how many fields it gets right, with and without the grammar. A
generated set is small and artificial on purpose: its subject is the format, and known answers make field
accuracy exact. Scoring is lenient with the unconstrained output (a JSON object anywhere in the text counts,
markdown fences and prose around it are allowed, an age written as a string is read as a number), so that
what the grammar adds is not overstated.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lab.stats.intervals import paired_difference, wilson

FIELDS = ("name", "age", "city", "job")
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 130},
    "city": {"type": "string", "maxLength": 40}, "job": {"type": "string", "maxLength": 40}},
    "required": list(FIELDS)}
INSTRUCTION = ('Extract the person\'s details from the text as a JSON object with the keys "name" (string), '
               '"age" (integer), "city" (string) and "job" (string).\n\nText: ')

FIRST = ["Maria", "James", "Aiko", "Olu", "Priya", "Lukas", "Sofia", "Chen", "Fatima", "Diego", "Ingrid", "Kwame",
         "Elena", "Tomas", "Nadia", "Rahul", "Grace", "Mateo", "Leila", "Hugo"]
LAST = ["Lopez", "Smith", "Tanaka", "Adeyemi", "Sharma", "Weber", "Rossi", "Wang", "Haddad", "Silva", "Berg",
        "Mensah", "Petrova", "Novak", "Karimi", "Gupta", "Okafor", "Fernandez", "Nasser", "Dubois"]
CITIES = ["Lisbon", "Toronto", "Osaka", "Lagos", "Pune", "Munich", "Naples", "Shenzhen", "Beirut", "Recife",
          "Bergen", "Accra", "Sofia", "Prague", "Tehran", "Austin", "Nairobi", "Seville", "Amman", "Lyon"]
JOBS = ["nurse", "carpenter", "pilot", "teacher", "chemist", "baker", "architect", "journalist", "electrician",
        "lawyer", "farmer", "dentist", "librarian", "plumber", "engineer", "photographer", "accountant", "chef",
        "surgeon", "translator"]
TEMPLATES = [
    "{name} is a {age}-year-old {job} from {city}.",
    "Meet {name}: {age} years old, works as {a_job}, lives in {city}.",
    "{city} resident {name} ({age}) has worked as {a_job} for years.",
    "At {age}, {name} still works as {a_job} in {city}.",
    "Our new {job}, {name}, moved to {city} last spring. {name} turns {age} next week but is {age} today.",
    "Born and raised in {city}, {name} is {a_job}, aged {age}.",
]


@dataclass(frozen=True)
class Item:
    text: str
    answer: dict

    @property
    def prompt(self) -> list[dict]:
        """The chat to send: one user message."""
        return [{"role": "user", "content": INSTRUCTION + self.text}]


def _with_article(job: str) -> str:
    return ("an " if job[0] in "aeiou" else "a ") + job


def items(n: int, seed: int = 0) -> list[Item]:
    """n sentences with their answers (distinct people), generated from `seed`."""
    if not 1 <= n <= 400:
        raise ValueError(f"the extraction task has 1 to 400 items, got n={n}")
    rng = random.Random(seed)
    people = rng.sample([(f, last) for f in FIRST for last in LAST], n)
    out = []
    for i, (first, last) in enumerate(people):
        answer = {"name": f"{first} {last}", "age": rng.randint(19, 88), "city": rng.choice(CITIES),
                  "job": rng.choice(JOBS)}
        text = TEMPLATES[i % len(TEMPLATES)].format(a_job=_with_article(answer["job"]), **answer)
        out.append(Item(text, answer))
    return out


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


def parse(text: str) -> tuple[object, bool]:
    """(the JSON value the output holds, whether the whole output is that value). Lenient: a fenced block or
    the first balanced {...} in the text is tried when the whole text does not parse; None when nothing does."""
    try:
        return json.loads(text.strip()), True
    except json.JSONDecodeError:
        pass
    candidates = _FENCE.findall(text)
    start = text.find("{")
    if start >= 0:
        depth = 0
        for j, ch in enumerate(text[start:], start):
            depth += (ch == "{") - (ch == "}")
            if depth == 0:
                candidates.append(text[start:j + 1])
                break
    for c in candidates:
        try:
            return json.loads(c.strip()), False
        except json.JSONDecodeError:
            continue
    return None, False


def _norm(value) -> str:
    s = str(value).strip().casefold()
    return re.sub(r"^(an?|the) ", "", s)


def score(item: Item, text: str) -> dict:
    """One output's format and content: whole-output JSON, any JSON object in it, schema-valid, and each field
    right or wrong (a field of an unparsable output is wrong)."""
    value, whole = parse(text)
    obj = value if isinstance(value, dict) else {}
    row = {"whole_output_is_json": whole, "json_object_found": isinstance(value, dict),
           "schema_valid": isinstance(value, dict) and _validator().is_valid(value)}
    for f in FIELDS:
        got = obj.get(f)
        if f == "age":
            try:
                row[f] = got is not None and not isinstance(got, bool) and int(str(got).strip()) == item.answer[f]
            except ValueError:
                row[f] = False
        else:
            row[f] = got is not None and _norm(got) == _norm(item.answer[f])
    row["fields_right"] = sum(row[f] for f in FIELDS)
    return row


def validity_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per temperature and grammar on/off: rates with Wilson intervals, field accuracy with a bootstrap interval
    over items, tokens, and the tokens and time to a schema-valid answer when an invalid one is retried (a
    geometric number of tries: 1 / valid rate)."""
    rows = []
    for (temperature, constrained), g in df.groupby(["temperature", "grammar"]):
        n = len(g)
        row = {"temperature": temperature, "grammar": "on" if constrained else "off", "outputs": n}
        for col in ("whole_output_is_json", "json_object_found", "schema_valid"):
            k = int(g[col].sum())
            lo, hi = wilson(k, n)
            row.update({col: k / n, f"{col} 95% low": lo, f"{col} 95% high": hi})
        acc = g["fields_right"] / len(FIELDS)
        boot = paired_difference(acc, np.zeros(n))
        valid = row["schema_valid"]
        row.update({"field accuracy": acc.mean(), "field accuracy 95% low": boot["low"],
                    "field accuracy 95% high": boot["high"], "mean tokens": g["tokens"].mean(),
                    "hit max_tokens": int((g["finish_reason"] == "length").sum()),
                    "tokens per valid answer": g["tokens"].mean() / valid if valid else float("inf"),
                    "seconds per valid answer": g["batch_s_per_item"].iloc[0] / valid if valid else float("inf")})
        rows.append(row)
    return pd.DataFrame(rows)


def accuracy_comparison(df: pd.DataFrame) -> pd.DataFrame:
    """Per temperature: grammar on minus off in per-item field accuracy (paired by item), with its bootstrap
    interval, over all items and over the items both outputs parsed (content alone, format aside)."""
    rows = []
    for temperature, g in df.groupby("temperature"):
        on = g[g["grammar"]].set_index("item")
        off = g[~g["grammar"]].set_index("item").loc[on.index]
        both = on.index[on["json_object_found"] & off["json_object_found"]]
        for subset, idx in (("all items", on.index), ("items both parsed", both)):
            if len(idx) == 0:
                continue
            d = paired_difference(on.loc[idx, "fields_right"] / len(FIELDS), off.loc[idx, "fields_right"] / len(FIELDS))
            rows.append({"temperature": temperature, "items": subset, "n": len(idx),
                         "accuracy on - off": d["difference"], "95% low": d["low"], "95% high": d["high"],
                         "distinguishable": d["distinguishable"]})
    return pd.DataFrame(rows)


def _validator():
    """The schema's validator, imported on first use: `import jsonschema` takes ~1.8 s here (its URI format checker
    builds a grammar at import), which every `lab claims`, `lab docs` and `lab report` paid through this module."""
    import jsonschema

    return jsonschema.Draft202012Validator(SCHEMA)
