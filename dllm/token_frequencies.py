"""Token frequencies of a reference corpus: the background distribution that PC-Sampler's calibrated
confidence weighs candidate tokens against (docs/samplers.md §26), counted with a model's tokenizer.

File format (JSON), the layout PC-Sampler's loader reads:

    {"num_token": N, "p_baseline_dict": {"<token id>": <count>, ...},
     "format": "dllm-token-frequencies", "tokenizer": ..., "vocab_size": V, "texts": n, ...}

with where the texts came from (`dllm token-frequencies`: "sources" and "keys" for corpus files;
"tasks", "samples_per_task", "shard" and "names" for generated records).

`num_token` is the corpus's token count and every count a non-negative integer. The reference's own
corpus files (a count per token id under `p_baseline_dict`) load as they are; its counting script
writes the counts under `token_frequency_dict`, which is read too. A token the corpus never holds
has frequency 1 / N, as in the reference.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

FILE_NAME = "token_frequencies.json"    # a table shipped inside a checkpoint folder
FORMAT = "dllm-token-frequencies"
COUNT_KEYS = ("p_baseline_dict", "token_frequency_dict")


@dataclass
class TokenFrequencies:
    """Token id -> count over a corpus of `total` tokens; `metadata` holds the file's other fields."""

    counts: dict[int, int]
    total: int
    metadata: dict = field(default_factory=dict)
    path: str | None = None
    _logs: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def probabilities(self, vocab_size: int) -> torch.Tensor:
        """(vocab_size,) float32: count / total per token id, 1 / total for the ids never counted."""
        largest = max(self.counts, default=-1)
        if largest >= vocab_size:
            where = f"token frequencies {self.path!r}" if self.path else "the token frequencies"
            raise ValueError(f"{where} count token id {largest}, and the model's vocabulary has {vocab_size} ids "
                             f"(0..{vocab_size - 1}); count a corpus with this model's tokenizer "
                             f"(`dllm token-frequencies --model MODEL`)")
        table = torch.full((vocab_size,), 1 / self.total, dtype=torch.float32)
        if self.counts:
            ids = torch.tensor(list(self.counts), dtype=torch.long)
            table[ids] = torch.tensor([c / self.total for c in self.counts.values()], dtype=torch.float32)
        return table

    def digest(self) -> str:
        """"sha256:<12 hex digits>" of the counts and the total: what names a table without a file."""
        body = json.dumps([self.total, sorted(self.counts.items())])
        return "sha256:" + hashlib.sha256(body.encode()).hexdigest()[:12]

    def log_probabilities(self, vocab_size: int, floor: float, device) -> torch.Tensor:
        """(vocab_size,) float32 log(probabilities + floor) on `device`, computed once per size,
        floor and device (the counts are not to change after it is asked)."""
        key = (vocab_size, floor, str(device))
        if key not in self._logs:
            self._logs[key] = torch.log(self.probabilities(vocab_size) + floor).to(device)
        return self._logs[key]

    def save(self, path: str | os.PathLike) -> Path:
        """Write the table as JSON (the format in the module docstring)."""
        path = Path(path)
        body = {"num_token": self.total, "p_baseline_dict": {str(k): v for k, v in sorted(self.counts.items())},
                "format": FORMAT, **{k: v for k, v in self.metadata.items() if k not in (*COUNT_KEYS, "num_token")}}
        try:
            path.write_text(json.dumps(body) + "\n")
        except OSError as err:
            raise OSError(f"cannot write the token frequencies {str(path)!r}: {err}") from None
        return path


def count(tokenizer, texts: Iterable[str], *, progress: bool = False, total: int | None = None) -> TokenFrequencies:
    """Count the tokens of `texts` as the tokenizer encodes each (no special tokens added)."""
    from tqdm import tqdm

    counts: Counter[int] = Counter()
    n_texts = 0
    for text in tqdm(texts, desc="counting tokens", total=total, disable=not progress, unit="text"):
        counts.update(tokenizer(text, add_special_tokens=False)["input_ids"])
        n_texts += 1
    n_tokens = sum(counts.values())
    if n_tokens == 0:
        raise ValueError(f"the corpus ({n_texts} texts) holds no tokens; give texts to count")
    return TokenFrequencies(dict(counts), n_tokens, {"texts": n_texts})


def load(path: str | os.PathLike) -> TokenFrequencies:
    """A table written by `TokenFrequencies.save` / `dllm token-frequencies`, or one of PC-Sampler's
    corpus files; missing or malformed files are errors naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no token frequency file at {str(path)!r}; count one with `dllm token-frequencies "
                                f"--model MODEL --data CORPUS --out {path}`")
    body = read_json(path, "token frequency file")
    key = next((k for k in COUNT_KEYS if isinstance(body, dict) and k in body), None)
    if key is None:
        raise ValueError(f"token frequency file {str(path)!r} must be a JSON object with 'num_token' and "
                         f"'p_baseline_dict' (token id -> count)")
    total, raw = body.get("num_token"), body[key]
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise ValueError(f"token frequency file {str(path)!r}: num_token must be an integer >= 1, got {total!r}")
    if not isinstance(raw, dict):
        raise ValueError(f"token frequency file {str(path)!r}: {key} must map token ids to counts")
    counts = {}
    for token, n in raw.items():
        if not str(token).isdigit() or isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"token frequency file {str(path)!r}: {key} entry {token!r}: {n!r}; token ids must be "
                             f"integers >= 0 and counts integers >= 0")
        counts[int(token)] = n
    metadata = {k: v for k, v in body.items() if k not in (*COUNT_KEYS, "num_token")}
    return TokenFrequencies(counts, total, metadata, str(path))


def shipped(source: str | None) -> Path | None:
    """The table shipped in a checkpoint folder (`token_frequencies.json`), if any."""
    if not source:
        return None
    candidate = Path(source) / FILE_NAME
    return candidate if candidate.is_file() else None


def corpus_texts(path: str | os.PathLike, keys: tuple[str, ...] = ()) -> Iterator[str]:
    """The texts of a corpus file: a JSONL or JSON list of records (the string fields named in
    `keys`, joined by spaces; every string field when `keys` is empty) or plain text (one text per
    line). Records that are not objects, and lines that are not JSON in a .jsonl file, are errors
    naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no corpus file at {str(path)!r}")
    suffix = path.suffix.lower()
    if suffix == ".json":
        records = read_json(path, "corpus")
        if not isinstance(records, list):
            raise ValueError(f"corpus {str(path)!r}: a .json corpus must hold a list of records")
        for i, record in enumerate(records):
            yield _record_text(record, keys, f"{path} record {i}")
        return
    with path.open(encoding="utf-8") as lines:
        number = 0
        try:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                if suffix != ".jsonl":
                    yield line.rstrip("\n")
                    continue
                try:
                    record = json.loads(line)
                except (json.JSONDecodeError, RecursionError) as err:
                    raise ValueError(f"corpus {str(path)!r} line {number} is not JSON: {err}") from None
                yield _record_text(record, keys, f"{path} line {number}")
        except UnicodeDecodeError as err:
            raise ValueError(f"corpus {str(path)!r} after line {number} is not UTF-8 text: {err}") from None


def read_json(path: Path, what: str):
    """The JSON value in a file; an error naming the file when it is not UTF-8 JSON (or nests too deep)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        reason = "nests too deep" if isinstance(err, RecursionError) else f"is not JSON: {err}"
        raise ValueError(f"{what} {str(path)!r} {reason}") from None


def _record_text(record, keys: tuple[str, ...], where: str) -> str:
    if not isinstance(record, dict):
        raise ValueError(f"corpus {where}: a record must be a JSON object, got {type(record).__name__}")
    names = keys or tuple(k for k, v in record.items() if isinstance(v, str))
    return " ".join(record[k] for k in names if isinstance(record.get(k), str))
