"""ParallelBench metrics for the Waiting Line and Puzzle tasks, and the registry of all metrics.

Every metric is a pure function `metric(prediction, answer) -> dict` over one sample:

    prediction  the decoded generation region, special tokens removed (a `str`);
    answer      the record's `answer` exactly as stored in the official JSONL (a string for
                copy/reverse/sort/*_index/sudoku, an object for the random tasks, latin and text).

List and puzzle metrics return `{"score", "score_strict", "headline"}` with values 0.0 or 1.0;
`headline` is the lenient `score`, the number the benchmark reports (as accuracy × 100 once
averaged). Text Writing metrics live in `dllm.eval.text_metrics` and are registered here too.

Parsing rules:

* Lenient list parse (`parse_list`): keep the text after the last `[`, then before the first `]`,
  trim brackets left at the ends, split on `,`, drop blank pieces, strip double quotes and spaces
  (only those) from each piece. Comparison is exact, case-sensitive and ordered.
* Strict list parse (`parse_list_strict`): both `[` and `]` must occur; the text after the last
  `[` and before the next `]` must be items joined by `", "`, every item a double-quoted string
  without inner quotes (text around the brackets is allowed).
* Lenient Sudoku parse (`parse_sudoku`): the lines carrying exactly four digits; exactly four
  such lines are required. Strict: exactly four non-empty lines, each exactly four digits.
  Digits are any Unicode decimal digits, read as their values.
* Latin Square: the first `s` lines whose comma-separated cells form the symbol set, checked as
  rows and columns by sets (see `latin_square_score`); the benchmark has no stricter form, so
  `score_strict` equals `score`.

    >>> list_match_score('Here: ["A B", "C D"]', '["A B", "C D"]')
    {'score': 1.0, 'score_strict': 1.0, 'headline': 1.0}
    >>> list_match_score('["A B","C D"]', '["A B", "C D"]')
    {'score': 1.0, 'score_strict': 0.0, 'headline': 1.0}
    >>> compute("sudoku_score", "1342\\n2431\\n4123\\n3214", "1342\\n2431\\n4123\\n3214")["headline"]
    1.0
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from . import text_metrics

if TYPE_CHECKING:
    from .text_metrics import Backends

_DIGITS = re.compile(r"\d")          # any Unicode decimal digit, as the benchmark's parse
SUDOKU_SIZE = 4


# ----------------------------------------------------------------------------------------------
# Parsers
# ----------------------------------------------------------------------------------------------

def parse_list(text: str) -> list[str]:
    """Lenient list parse (docs/parallelbench.md §Metrics); never fails, an unreadable text gives
    whatever pieces it has.

    1. If `[` occurs, keep the text after the last `[`.
    2. If `]` then occurs, keep the text before the first `]`.
    3. Trim brackets left at either end, then split on `,`.
    4. Drop pieces that are empty or whitespace; strip double quotes and spaces (nothing else,
       newlines stay) from both ends of each remaining piece.

        >>> parse_list('Sure! ["A B", "C D"]')
        ['A B', 'C D']
        >>> parse_list("['A B', 'C D']")
        ["'A B'", "'C D'"]
    """
    _require_str(text, "text")
    if "[" in text:
        text = text.rsplit("[", 1)[1]
    if "]" in text:
        text = text.split("]", 1)[0]
    text = text.strip("[]")
    return [piece.strip('" ') for piece in text.split(",") if piece.strip()]


def parse_list_strict(text: str) -> list[str] | None:
    """Strict list parse, as the benchmark's strict parse, or None.

    Both `[` and `]` must occur. The text after the last `[`, cut at the first `]` after it, must
    be items separated by exactly `", "` (comma and one space), every item starting and ending
    with `"` and holding no other `"`. Text around the brackets is allowed; single quotes, other
    separators, newlines between items and `[]` (no item) return None.

        >>> parse_list_strict('Sure: ["A B", "C D"] done')
        ['A B', 'C D']
        >>> parse_list_strict('["A B","C D"]') is None
        True
    """
    _require_str(text, "text")
    if "[" not in text:
        return None
    text = text.rsplit("[", 1)[1]
    if "]" not in text:
        return None
    items = []
    for item in text.split("]", 1)[0].split(", "):
        if not (item.startswith('"') and item.endswith('"')) or '"' in item[1:-1]:
            return None
        items.append(item[1:-1])
    return items


def parse_sudoku(text: str) -> list[str] | None:
    """Lenient 4×4 Sudoku parse (docs/parallelbench.md §Metrics): 4 rows of 4 digits, or None.

    Spaces and commas are deleted; every non-empty line contributes its digits (any Unicode
    decimal digit, written back as its ASCII digit, as the benchmark reads each as a number), and the
    lines holding exactly 4 digits are kept. Exactly 4 such lines are required, so `1 3 4 2`,
    `1,3,4,2`, `1|3|4|2`, code fences and an `Output:` line are accepted, while a one-line grid,
    `Row 1: 1342` (5 digits) and an echoed puzzle before the solution (8 rows) are not.

        >>> parse_sudoku("Output:\\n1 3 4 2\\n2,4,3,1\\n4|1|2|3\\n3214")
        ['1342', '2431', '4123', '3214']
    """
    _require_str(text, "text")
    text = text.strip().replace(" ", "").replace(",", "")
    rows = []
    for line in text.split("\n"):
        digits = _DIGITS.findall(line)
        if len(digits) == SUDOKU_SIZE:
            rows.append(_ascii_digits(digits))
    return rows if len(rows) == SUDOKU_SIZE else None


def parse_sudoku_strict(text: str) -> list[str] | None:
    """Strict 4×4 Sudoku parse: exactly 4 non-empty lines, each exactly 4 digits (any Unicode
    decimal digit, written back as its ASCII digit) after stripping the line; None otherwise."""
    _require_str(text, "text")
    rows = [line.strip() for line in text.split("\n") if line.strip()]
    if len(rows) != SUDOKU_SIZE or not all(len(row) == SUDOKU_SIZE and row.isdecimal() for row in rows):
        return None
    return [_ascii_digits(row) for row in rows]


def _ascii_digits(digits) -> str:
    """Unicode decimal digits as ASCII digits of the same values."""
    return "".join(str(int(d)) for d in digits)


# ----------------------------------------------------------------------------------------------
# Waiting Line
# ----------------------------------------------------------------------------------------------

def _result(lenient: bool, strict: bool) -> dict:
    score = 1.0 if lenient else 0.0
    return {"score": score, "score_strict": 1.0 if strict else 0.0, "headline": score}


def _score_both(prediction: str, check: Callable[[list[str]], bool]) -> dict:
    """Apply one list predicate to the lenient and the strict parse of the prediction."""
    _require_str(prediction, "prediction")
    strict = parse_list_strict(prediction)
    return _result(check(parse_list(prediction)), strict is not None and check(strict))


def list_match_score(prediction: str, answer) -> dict:
    """Copy, Reverse, Sort and the *_index tasks: the parsed prediction equals the parsed label.

    `answer` is the rendered target list (`'["A B", "C D"]'`), parsed leniently like the
    prediction; a list of names is accepted too. Comparison is exact, case-sensitive, ordered.
    """
    target = _as_names(answer, "list_match_score: answer")
    return _score_both(prediction, lambda pred: pred == target)


def list_shuffle_score(prediction: str, answer) -> dict:
    """Shuffle: the prediction is a permutation of `answer["input"]` and differs from it in order.

    `answer` is `{"input": [names], "example": ...}`; `input` may also be a rendered list string.
    A duplicated, missing, extra or altered name, or the input order itself, scores 0.
    """
    source = _field_names(answer, "input", "list_shuffle_score")
    return _score_both(prediction, lambda pred: sorted(pred) == sorted(source) and pred != source)


def list_random_insert_score(prediction: str, answer) -> dict:
    """Insert Random: `answer["word"]` occurs, and removing its first occurrence leaves exactly
    `answer["input"]`. Any insertion position is accepted.

    `answer` is `{"input": [names], "word": name, "example": ...}`.
    """
    source = _field_names(answer, "input", "list_random_insert_score")
    word = _field_str(answer, "word", "list_random_insert_score")

    def check(pred: list[str]) -> bool:
        if word not in pred:
            return False
        rest = list(pred)
        rest.remove(word)
        return rest == source

    return _score_both(prediction, check)


def list_random_remove_score(prediction: str, answer) -> dict:
    """Remove Random: the prediction has n − 1 names, exactly one name of `answer["input"]` is
    missing from it, and deleting that name from the input gives the prediction exactly.

    `answer` is `{"input": [names], "example": ...}`.
    """
    source = _field_names(answer, "input", "list_random_remove_score")

    def check(pred: list[str]) -> bool:
        if len(pred) != len(source) - 1:
            return False
        missing = set(source) - set(pred)
        if len(missing) != 1:
            return False
        rest = list(source)
        rest.remove(missing.pop())
        return rest == pred

    return _score_both(prediction, check)


def list_random_replace_score(prediction: str, answer) -> dict:
    """Replace Random: the prediction has n names, `answer["word"]` occurs, and writing the word
    into a copy of `answer["input"]` at the index of its first occurrence gives the prediction,
    so exactly that one position changed.

    `answer` is `{"input": [names], "word": name, "example": ...}`.
    """
    source = _field_names(answer, "input", "list_random_replace_score")
    word = _field_str(answer, "word", "list_random_replace_score")

    def check(pred: list[str]) -> bool:
        if len(pred) != len(source) or word not in pred:
            return False
        expected = list(source)
        expected[pred.index(word)] = word
        return expected == pred

    return _score_both(prediction, check)


# ----------------------------------------------------------------------------------------------
# Puzzles
# ----------------------------------------------------------------------------------------------

def latin_square_score(prediction: str, answer) -> dict:
    """Latin Square (docs/parallelbench.md §Metrics) over the symbol set `S = set(answer["symbols"])`, `s = |S|`.

    Lenient `score`: strip the lines of the prediction and drop empty ones; keep the lines whose
    comma-separated, stripped cells form exactly the set `S`; with fewer than `s` such lines the
    score is 0. The first `s` of them are the rows; every column (by position, truncated at the
    shortest row) must also have cell set `S`. Checks use sets, so a row with extra repeated cells
    is not rejected by itself. Spaces after commas, code fences, prose and extra lines after the
    square pass; other letter case, quoted cells, space-separated grids and a header line
    repeating the symbols (it becomes row 1) fail.

    `score_strict` equals `score`: the benchmark scores this task the same in its strict mode.

    If `answer` carries `first_row` (a list of symbols or a comma-joined string), the first row
    must equal it. `answer` is `{"symbols": [...], "example": ..., "first_row"?}`;
    symbols may also be a rendered list `"[H, 4, C, A]"`; non-string symbols are compared as
    `str(symbol)`.
    """
    _require_str(prediction, "prediction")
    symbols = _latin_symbols(answer)
    first_row = _latin_first_row(answer)
    target, size = set(symbols), len(set(symbols))

    lines = [line.strip() for line in prediction.split("\n") if line.strip()]

    rows = [cells for cells in ([c.strip() for c in line.split(",")] for line in lines) if set(cells) == target]
    valid = len(rows) >= size and _latin_valid(rows[:size], target, first_row)
    return _result(valid, valid)


def _latin_valid(rows: list[list[str]], target: set[str], first_row: list[str] | None) -> bool:
    if not rows or any(set(row) != target for row in rows):
        return False
    width = min(len(row) for row in rows)
    if any({row[j] for row in rows} != target for j in range(width)):
        return False
    return first_row is None or rows[0] == first_row


def sudoku_score(prediction: str, answer) -> dict:
    """4×4 Sudoku (docs/parallelbench.md §Metrics): the parsed grid equals the solution exactly.

    `answer` is the solution as stored: 4 lines of 4 digits joined by newlines
    (`"1342\\n2431\\n4123\\n3214"`). `score` uses `parse_sudoku` (lenient), `score_strict` uses
    `parse_sudoku_strict`.
    """
    _require_str(prediction, "prediction")
    if not isinstance(answer, str):
        raise ValueError(f"sudoku_score expects the answer as a string of 4 lines of 4 digits, "
                         f"got {type(answer).__name__}: {answer!r}")
    solution = parse_sudoku_strict(answer)
    if solution is None:
        raise ValueError(f"sudoku_score: the answer must be 4 lines of 4 digits, got {answer!r}")
    return _result(parse_sudoku(prediction) == solution, parse_sudoku_strict(prediction) == solution)


# ----------------------------------------------------------------------------------------------
# Answer validation
# ----------------------------------------------------------------------------------------------

def _require_str(value, what: str) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a str, got {type(value).__name__}: {value!r}")


def _as_names(value, what: str) -> list[str]:
    """A list label given as a rendered string (parsed leniently) or as a list of strings."""
    if isinstance(value, str):
        return parse_list(value)
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return list(value)
    raise ValueError(f"{what} must be a rendered list string like '[\"A B\", \"C D\"]' or a list of "
                     f"strings, got {type(value).__name__}: {value!r}")


def _require_mapping(answer, metric: str, keys: str) -> Mapping:
    if not isinstance(answer, Mapping):
        raise ValueError(f"{metric} expects the answer as an object with {keys}, "
                         f"got {type(answer).__name__}: {answer!r}")
    return answer


def _field_names(answer, key: str, metric: str) -> list[str]:
    answer = _require_mapping(answer, metric, f"an {key!r} list")
    if key not in answer:
        raise ValueError(f"{metric}: the answer has no {key!r} field (keys: {sorted(answer)})")
    return _as_names(answer[key], f"{metric}: answer[{key!r}]")


def _field_str(answer, key: str, metric: str) -> str:
    answer = _require_mapping(answer, metric, f"a {key!r} string")
    value = answer.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{metric}: answer[{key!r}] must be a string, got {type(value).__name__}: {value!r}")
    return value


def _latin_symbols(answer) -> list[str]:
    answer = _require_mapping(answer, "latin_square_score", "a 'symbols' list")
    if "symbols" not in answer:
        raise ValueError(f"latin_square_score: the answer has no 'symbols' field (keys: {sorted(answer)})")
    symbols = answer["symbols"]
    if isinstance(symbols, str):
        symbols = parse_list(symbols)
    elif isinstance(symbols, (list, tuple)) and all(isinstance(s, (str, int)) for s in symbols):
        symbols = [str(s) for s in symbols]
    else:
        raise ValueError(f"latin_square_score: answer['symbols'] must be a list of symbols or a rendered "
                         f"list like '[H, 4, C, A]', got {type(symbols).__name__}: {symbols!r}")
    if not symbols:
        raise ValueError("latin_square_score: answer['symbols'] is empty")
    return symbols


def _latin_first_row(answer) -> list[str] | None:
    first_row = answer.get("first_row")
    if first_row is None:
        return None
    if isinstance(first_row, str):
        return [cell.strip() for cell in first_row.split(",")]
    if isinstance(first_row, (list, tuple)) and all(isinstance(s, (str, int)) for s in first_row):
        return [str(s) for s in first_row]
    raise ValueError(f"latin_square_score: answer['first_row'] must be a list of symbols or a comma-joined "
                     f"string, got {type(first_row).__name__}: {first_row!r}")


# ----------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------

# Official metric function names (task_config.yaml `metric`) -> function.
METRICS: dict[str, Callable[..., dict]] = {
    "list_match_score": list_match_score,
    "list_shuffle_score": list_shuffle_score,
    "list_random_insert_score": list_random_insert_score,
    "list_random_remove_score": list_random_remove_score,
    "list_random_replace_score": list_random_replace_score,
    "latin_square_score": latin_square_score,
    "sudoku_score": sudoku_score,
    "summary_score": text_metrics.summary_score,
    "paraphrase_score": text_metrics.paraphrase_score,
    "sentence_to_words_score": text_metrics.sentence_to_words_score,
}

# Metrics that need external components (grammar, BERTScore) and take `backends=`.
TEXT_METRICS = frozenset({"summary_score", "paraphrase_score", "sentence_to_words_score"})


def compute(metric: str, prediction: str, answer: Any, *, backends: "Backends | None" = None) -> dict:
    """Score one sample with the metric named as in `task_config.yaml`.

    metric:     one of `METRICS`; an unknown name raises ValueError listing the valid ones.
    prediction: the decoded generation (str).
    answer:     the record's `answer`, unchanged.
    backends:   grammar/BERTScore backends for the Text Writing metrics; ignored by the pure
                metrics. None means no backend: grammar and BERTScore are reported unavailable
                (None), never 0.

    Returns the metric's dict; it always has `"headline"`.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown ParallelBench metric {metric!r}; valid metrics: {', '.join(sorted(METRICS))}")
    if metric in TEXT_METRICS:
        return METRICS[metric](prediction, answer, backends=backends)
    return METRICS[metric](prediction, answer)


__all__ = [
    "METRICS", "TEXT_METRICS", "compute", "parse_list", "parse_list_strict", "parse_sudoku",
    "parse_sudoku_strict", "list_match_score", "list_shuffle_score", "list_random_insert_score",
    "list_random_remove_score", "list_random_replace_score", "latin_square_score", "sudoku_score",
]
