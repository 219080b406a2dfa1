"""Seeded generators for the ParallelBench tasks whose metrics are pure (the "synthetic" data mode).

    from dllm.eval.generators import make_records, write_jsonl
    records = make_records("waiting_line/insert_index")                  # the 100 held-out test records
    train = make_records("waiting_line/shuffle", split="train", num_samples=20000, shard=3)
    write_jsonl("out/waiting_line/insert_index.jsonl", records)

Tasks (`generator_tasks()`):

    waiting_line/{copy, reverse, sort, shuffle, insert_index, insert_random, remove_index,
                  remove_random, replace_index, replace_random}      n = 3..6, 25 records per n
    waiting_line_n15/<same ten>                                      n = 15, 100 records
    puzzle/latin_square_n4                                           100 records
    puzzle/sudoku_n4_12                                              108 records
    words_to_sentence/{easy, medium, hard}                           100 records (own word lists)

Records follow the official JSONL schema field for field (`input` with `context`/`word`/`index`/
`size`/`symbols`/`sudoku`/`words` and one `icl_examples` entry for the one-shot tasks, `answer`,
`output_format` where the official files have it, `metadata`), so they render to the same
prompts and score under the same metrics. Names and words come from `dllm.eval.wordlists`, the
project's own lists, so the data is *equivalent* to the official files, never equal to them;
results on it are labelled synthetic.

Seeds and splits
----------------
* **test**: one `random.Random(task_seed(task))` stream per task, drawn as the benchmark's
  generator does: test samples first, then the in-context (ICL) examples. `task_seed` is the
  benchmark's rule `(SHA-256(short name) + 42) mod 65535`; the six index/random Waiting Line tasks
  hash their legacy names `<task>_list`, and the n = 15 variants reuse the seed of the n = 3..6
  task, as the official files do.
  - Waiting Line: draw `n = randint(3, 6)` and the sample; keep it if fewer than 25 samples of
    that n are kept; stop when all four buckets are full; emit n = 3, 4, 5, 6 in that order. Then
    draw 100 more samples (n = randint(3, 6), no bucketing); the i-th is record i's example.
    n = 15 variants: every sample has n = 15.
  - Latin square: 100 samples, then 100 ICL samples.
  - Sudoku: 108 distinct puzzles with a unique solution, then 108 ICL puzzles, none of which is
    a test puzzle (so an example is never the question itself).
  - Words to sentence: 100 distinct word sets; zero-shot, no ICL example.
  `num_samples=k` below the official count returns the first k records of that order (for
  Waiting Line, the first k in increasing n); more than the official count is an error.
* **train**: seed `65535 + task_seed(task) * 1000 + shard` (shard 0..999), so train streams never
  share a seed with a test stream (all test seeds are below 65535). Any `num_samples`; n is
  uniform in [3, 6] (15 for the n = 15 variants) with no bucketing; each record's sample is drawn
  and then its ICL example. A drawn sample whose test input (context + word + index; the Latin
  square's symbol set; the Sudoku puzzle; the W2S word set) is one of the task's test inputs is
  discarded and drawing goes on, so the test split stays held out; an ICL example with a test
  input, or equal to its own record's input, is redrawn likewise.

Same arguments give identical records; different shards give different records.

Draw details
------------
* Waiting Line pool: every "First Last" pair of the word lists, first-name-major; a sample is
  `rng.sample(pool, n)`. Insert and replace then draw the new person with
  `rng.choice(pool minus the sample)`, then the position (insert `randint(0, n)`, remove and
  replace `randint(0, n - 1)`). The random variants draw the position too but hide it: their
  label is an object (`{input, word?, example}`) and `metadata["index"]` is null. Shuffle
  re-shuffles a copy until it differs from the input.
* Latin square: `symbols = rng.sample(A..Z + 0..9, 4)`; the rows are the cyclic shifts of
  `symbols`, shuffled, then the columns are shuffled.
* Sudoku: a valid 4x4 grid is a base grid transformed by a random relabelling of the digits, a
  permutation of the row bands, of the rows within each band, of the column stacks, of the
  columns within each stack, and a transposition with probability 1/2. These moves split the 288
  valid grids into two classes (96 and 192 grids), so the base is taken from the first class with
  probability 1/3 and from the second otherwise: every valid grid is equally likely. Four cells,
  `rng.sample(range(16), 4)`, become 0; the puzzle is kept only if brute force finds exactly one
  solution.
* Words to sentence: easy takes 4 distinct words of one theme (`rng.choice` of theme, then
  `rng.sample`); medium one word of each of 4 distinct themes (`rng.sample` of 4 themes, then
  `rng.choice` of a word not yet taken); hard 4 distinct words of the flat list. Rendered
  `a, b, c, and d`.

Conventions and the benchmark's quirks
--------------------------------------
* **Sort by full name** (default, `sort_key="full_name"`): the benchmark's Sort prompt asks for
  alphabetical order "by last name", yet every official label (and every one-shot example) is
  sorted by the whole "First Last" string, i.e. by first name. The default follows the official
  labels; `sort_key="last_name"` sorts by last name, ties broken by first name, and writes
  `metadata["sort_key"] = "last_name"` into each Sort record and its example.
* **0-based positions** (default, `index_base=0`): the official files show 0-based positions
  ("position 0" is the first person; insert shows 0..n, where n appends; remove and replace show
  0..n-1). `index_base=1` shows the literal, 1-based reading instead (insert 1..n+1, remove and
  replace 1..n) for the same draws, and writes `metadata["index_base"] = 1` into each *_index
  record and its example; `metadata["index"]` always equals the shown `input["index"]`.
* Both options only touch the tasks they concern (Sort; the three *_index tasks) and are
  ignored elsewhere. Default records carry neither key, so they match the official schema exactly.
* Metadata (where the benchmark's description leaves the exact keys open): every Waiting Line
  record has `length` (input n); the index and random variants of insert, remove and replace
  add `index` (null in the random ones); insert and replace add `word`. Latin square
  `{"length": 4}`, Sudoku `{"length": 12}` (givens; the Sudoku ICL example has no metadata),
  W2S `{}`.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import string
from functools import lru_cache
from itertools import product

from .names import NAME_SOURCES, check_source, open_pool, pseudo_pool
from .wordlists import FIRST_NAMES, LAST_NAMES, W2S_EASY, W2S_HARD

TEST_SPLIT = "test"
TRAIN_SPLIT = "train"
SPLITS = (TEST_SPLIT, TRAIN_SPLIT)
SORT_KEYS = ("full_name", "last_name")
INDEX_BASES = (0, 1)
SEED_BASE = 42
SEED_MOD = 65535
TRAIN_SEED_OFFSET = 65535       # train seeds start here; every test seed is below it
SHARDS_PER_TASK = 1000          # train seed = offset + task_seed * 1000 + shard

WAITING_LINE_OPS = ("copy", "reverse", "sort", "shuffle", "insert_index", "insert_random",
                    "remove_index", "remove_random", "replace_index", "replace_random")
W2S_LEVELS = ("easy", "medium", "hard")
# The index/random Waiting Line tasks are seeded with the hash of their legacy names.
_LEGACY_SEED_NAMES = {op: f"{op}_list" for op in WAITING_LINE_OPS if op.endswith(("_index", "_random"))}

# Every "First Last" pair, first-name-major; sampling works on positions in this tuple.
POOL: tuple[str, ...] = tuple(f"{first} {last}" for first in FIRST_NAMES for last in LAST_NAMES)
LATIN_ALPHABET: tuple[str, ...] = tuple(string.ascii_uppercase + string.digits)
# One base grid per class of the 4x4 Sudoku grids under relabelling, band/row/stack/column
# permutations and transposition: the classes hold 96 and 192 of the 288 valid grids.
_SUDOKU_BASES = (((1, 2, 3, 4), (3, 4, 1, 2), (2, 1, 4, 3), (4, 3, 2, 1)),    # 96 grids
                 ((1, 2, 3, 4), (3, 4, 1, 2), (2, 3, 4, 1), (4, 1, 2, 3)))    # 192 grids


def _task_table() -> dict[str, dict]:
    table = {}
    for op in WAITING_LINE_OPS:
        table[f"waiting_line/{op}"] = {"kind": "line", "op": op, "n": (3, 6), "count": 100}
    for op in WAITING_LINE_OPS:
        table[f"waiting_line_n15/{op}"] = {"kind": "line", "op": op, "n": (15, 15), "count": 100}
    table["puzzle/latin_square_n4"] = {"kind": "latin", "count": 100}
    table["puzzle/sudoku_n4_12"] = {"kind": "sudoku", "count": 108}
    for level in W2S_LEVELS:
        table[f"words_to_sentence/{level}"] = {"kind": "w2s", "level": level, "count": 100}
    return table


_TASKS = _task_table()


# -- public API -------------------------------------------------------------------------------
def seed_from_name(name: str, base: int = SEED_BASE) -> int:
    """The benchmark's seed rule on a bare name: `(SHA-256(name) as big-endian int + base) % 65535`."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return (int.from_bytes(digest, "big") + base) % SEED_MOD


def task_seed(task: str, base: int = SEED_BASE) -> int:
    """The final RNG seed of a task's test split (the value the official `task_config.yaml` stores).

    The name hashed is the task's short name, the part after the last `/`, so
    `waiting_line_n15/copy` shares the seed of `waiting_line/copy`. The six index/random Waiting
    Line tasks hash their legacy names `<name>_list` (`insert_index` -> `insert_index_list`), as
    the official seeds do. Any name works (`paraphrase_summarize/samsum` -> 59102).

        task_seed("waiting_line/copy") == 31940; task_seed("puzzle/latin_square_n4") == 51291
    """
    if not isinstance(task, str) or not task.strip("/"):
        raise ValueError(f"task must be a non-empty task id such as 'waiting_line/copy', got {task!r}")
    short = task.rsplit("/", 1)[-1]
    return seed_from_name(_LEGACY_SEED_NAMES.get(short, short), base)


def train_seed(task: str, shard: int = 0) -> int:
    """The seed of one train-split shard: `65535 + task_seed(task) * 1000 + shard`, shard 0..999."""
    _check_shard(shard)
    return TRAIN_SEED_OFFSET + task_seed(task) * SHARDS_PER_TASK + shard


def generator_tasks() -> list[str]:
    """The task ids `make_records` accepts, Waiting Line first, then n = 15, puzzles and W2S."""
    return list(_TASKS)


def default_num_samples(task: str) -> int:
    """Records in the task's official test file (100; Sudoku 108): the test split's size."""
    return _spec(task)["count"]


def make_records(task: str, *, split: str = TEST_SPLIT, num_samples: int | None = None, shard: int = 0,
             sort_key: str = "full_name", index_base: int = 0, names: str = "lists") -> list[dict]:
    """Generate records of one task in the official JSONL schema.

    task:        one of `generator_tasks()`.
    split:       "test" (the held-out set, seeded with `task_seed(task)`) or "train" (seeded with
                 `train_seed(task, shard)`, any size, never repeating a test input).
    num_samples: test: 1..official count (default: the official count, first k records when
                 smaller); train: any k >= 1 (default: the official count).
    shard:       train only, 0..999; different shards give different records.
    sort_key:    "full_name" (official labels) or "last_name" (the prompt's literal reading);
                 Sort tasks only.
    index_base:  0 (official) or 1 (shown positions 1-based); *_index tasks only.
    names:       where Waiting Line people come from (`dllm.eval.names.NAME_SOURCES`): "lists"
                 (the project's word lists, one pool for both splits), "open" (Faker's names,
                 the train split from the train pool, the test split from the disjoint held-out
                 pool) or "pseudo" (made-up names, split the same way).

    Returns a list of new dicts (the caller may mutate them). Deterministic in its arguments.
    """
    spec = _spec(task)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    if sort_key not in SORT_KEYS:
        raise ValueError(f"unknown sort_key {sort_key!r}; valid sort keys: {', '.join(SORT_KEYS)}")
    if isinstance(index_base, bool) or not isinstance(index_base, int) or index_base not in INDEX_BASES:
        raise ValueError(f"index_base must be one of {', '.join(map(str, INDEX_BASES))}, got {index_base!r}")
    if num_samples is None:
        num_samples = spec["count"]
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be an integer >= 1, got {num_samples!r}")
    _check_shard(shard)
    check_source(names)
    if split == TEST_SPLIT:
        if shard != 0:
            raise ValueError(f"shard applies to the train split only; the test split has shard 0, got {shard!r}")
        if num_samples > spec["count"]:
            raise ValueError(f"the {task} test split has {spec['count']} records, asked for {num_samples}; "
                             f"use split={TRAIN_SPLIT!r} for more data")
    style = {"sort_key": sort_key, "index_base": index_base}
    kind = spec["kind"]
    if split == TEST_SPLIT:
        samples, examples = _test_draws(task, names)
        samples = samples[:num_samples]
        examples = examples[:num_samples] if examples is not None else None
    else:
        samples, examples = _train_draws(task, num_samples, shard, names)
    build = _BUILDERS[kind]
    records = []
    for i, sample in enumerate(samples):
        record = build(spec, sample, style)
        if examples is not None:
            record["input"]["icl_examples"] = [_example(kind, build(spec, examples[i], style))]
        records.append(record)
    return records


def write_jsonl(path: str | os.PathLike, records) -> int:
    """Write records one compact JSON object per line (UTF-8, `ensure_ascii=False`); parent folders
    are created. Returns the number of lines written."""
    path = os.fspath(path)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    count = 0
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")))
            fh.write("\n")
            count += 1
    return count


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a JSONL file (compact or spaced JSON, blank lines skipped); a bad line raises ValueError
    naming the file and line number."""
    path = os.fspath(path)
    records = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not a JSON object ({err.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{lineno}: not a JSON object (a {type(record).__name__}: {line.strip()[:60]})")
            records.append(record)
    return records


# -- validation -------------------------------------------------------------------------------
def _spec(task: str) -> dict:
    if task not in _TASKS:
        raise ValueError(f"no generator for task {task!r}; generated tasks: {', '.join(_TASKS)}")
    return _TASKS[task]


def _check_shard(shard: int) -> None:
    if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < SHARDS_PER_TASK:
        raise ValueError(f"shard must be an integer in 0..{SHARDS_PER_TASK - 1}, got {shard!r}")


# -- draws --------------------------------------------------------------------------------------
# A draw is a small tuple of everything random about one sample; `_key` reduces it to the part
# a prompt shows (the test input), `_BUILDERS` turn it into a record.

def _pool(names: str, split: str):
    """The people a split of a name source draws from (indexable, first-name-major)."""
    return POOL if names == "lists" else {"open": open_pool, "pseudo": pseudo_pool}[names](split)


def _draw_line(rng: random.Random, op: str, n: int, pool) -> tuple:
    """(names, word, position, shuffled) for one Waiting Line sample of n people from `pool`."""
    picked = rng.sample(range(len(pool)), n)          # same draws as rng.sample(pool, n)
    names = [pool[i] for i in picked]
    word = position = shuffled = None
    if op.startswith(("insert", "replace")):
        # rng.choice(pool minus names): one randrange over the remaining entries (the same draw
        # choice makes), mapped back to a pool position by skipping the picked ones.
        k = rng.randrange(len(pool) - n)
        for p in sorted(picked):
            if p <= k:
                k += 1
            else:
                break
        word = pool[k]
    if op.startswith("insert"):
        position = rng.randint(0, n)
    elif op.startswith(("remove", "replace")):
        position = rng.randint(0, n - 1)
    elif op == "shuffle":
        shuffled = names[:]
        rng.shuffle(shuffled)
        while shuffled == names:
            rng.shuffle(shuffled)
    return names, word, position, shuffled


def _draw_latin(rng: random.Random) -> tuple:
    """(symbols, rows) of one 4x4 Latin square."""
    symbols = rng.sample(LATIN_ALPHABET, 4)
    rows = [symbols[i:] + symbols[:i] for i in range(4)]
    rng.shuffle(rows)
    cols = list(range(4))
    rng.shuffle(cols)
    return symbols, [[row[c] for c in cols] for row in rows]


def _random_sudoku_grid(rng: random.Random) -> list[list[int]]:
    base = _SUDOKU_BASES[0] if rng.randrange(3) == 0 else _SUDOKU_BASES[1]
    label = rng.sample((1, 2, 3, 4), 4)                # digit d becomes label[d - 1]
    row_order = [2 * band + r for band in rng.sample((0, 1), 2) for r in rng.sample((0, 1), 2)]
    col_order = [2 * stack + c for stack in rng.sample((0, 1), 2) for c in rng.sample((0, 1), 2)]
    grid = [[label[base[r][c] - 1] for c in col_order] for r in row_order]
    if rng.random() < 0.5:
        grid = [list(col) for col in zip(*grid)]
    return grid


def sudoku_solutions(puzzle: list[list[int]], limit: int = 2) -> list[list[list[int]]]:
    """Brute force: the completions of a 4x4 puzzle (0 = blank), at most `limit` of them."""
    blanks = [(r, c) for r in range(4) for c in range(4) if puzzle[r][c] == 0]
    options = []
    for r, c in blanks:
        seen = set(puzzle[r]) | {puzzle[i][c] for i in range(4)}
        seen |= {puzzle[i][j] for i in (r // 2 * 2, r // 2 * 2 + 1) for j in (c // 2 * 2, c // 2 * 2 + 1)}
        options.append([d for d in (1, 2, 3, 4) if d not in seen])
    found = []
    for digits in product(*options):
        grid = [row[:] for row in puzzle]
        for (r, c), d in zip(blanks, digits):
            grid[r][c] = d
        if _valid_sudoku(grid):
            found.append(grid)
            if len(found) >= limit:
                break
    return found


def _valid_sudoku(grid: list[list[int]]) -> bool:
    full = {1, 2, 3, 4}
    for i in range(4):
        if set(grid[i]) != full or {grid[r][i] for r in range(4)} != full:
            return False
    for r0 in (0, 2):
        for c0 in (0, 2):
            if {grid[r][c] for r in (r0, r0 + 1) for c in (c0, c0 + 1)} != full:
                return False
    return True


def _draw_sudoku(rng: random.Random) -> tuple:
    """(puzzle, solution) as 4-line digit strings; redrawn until the puzzle has one solution."""
    while True:
        grid = _random_sudoku_grid(rng)
        blanks = rng.sample(range(16), 4)
        puzzle = [row[:] for row in grid]
        for cell in blanks:
            puzzle[cell // 4][cell % 4] = 0
        if len(sudoku_solutions(puzzle, limit=2)) == 1:
            return _grid_text(puzzle), _grid_text(grid)


def _grid_text(grid: list[list[int]]) -> str:
    return "\n".join("".join(map(str, row)) for row in grid)


def _draw_w2s(rng: random.Random, level: str) -> tuple:
    """The 4 words of one Words-to-Sentence sample: related common words (easy), unrelated common
    words, one from each of 4 themes (medium), unrelated uncommon words (hard)."""
    if level == "hard":
        return tuple(rng.sample(W2S_HARD, 4))
    if level == "easy":
        return tuple(rng.sample(W2S_EASY[rng.choice(sorted(W2S_EASY))], 4))
    words: list[str] = []
    for theme in rng.sample(sorted(W2S_EASY), 4):
        words.append(rng.choice([w for w in W2S_EASY[theme] if w not in words]))
    return tuple(words)


def _draw(spec: dict, rng: random.Random, pool=None) -> tuple:
    """One sample of a task; `pool`: the people of a Waiting Line task."""
    kind = spec["kind"]
    if kind == "line":
        return _draw_line(rng, spec["op"], rng.randint(*spec["n"]), pool)
    if kind == "latin":
        return _draw_latin(rng)
    if kind == "sudoku":
        return _draw_sudoku(rng)
    return _draw_w2s(rng, spec["level"])


def _key(spec: dict, draw: tuple):
    """What a prompt shows of a draw: equal keys mean the same test question."""
    kind = spec["kind"]
    if kind == "line":
        names, word, position, _ = draw
        shown = position if spec["op"].endswith("_index") else None
        return tuple(names), word, shown
    if kind == "latin":
        return frozenset(draw[0])        # the symbol set: a reordering asks for the same squares
    if kind == "sudoku":
        return draw[0]
    return frozenset(draw)


@lru_cache(maxsize=None)
def _test_draws(task: str, names: str) -> tuple[tuple, tuple | None]:
    """The test split's draws in emission order and their ICL draws (None for zero-shot tasks)."""
    spec = _TASKS[task]
    pool = _pool(names, TEST_SPLIT)
    rng = random.Random(task_seed(task))
    count, kind = spec["count"], spec["kind"]
    if kind == "line":
        lo, hi = spec["n"]
        per_n = count // (hi - lo + 1)
        buckets: dict[int, list] = {n: [] for n in range(lo, hi + 1)}
        while any(len(b) < per_n for b in buckets.values()):
            n = rng.randint(lo, hi)
            draw = _draw_line(rng, spec["op"], n, pool)
            if len(buckets[n]) < per_n:
                buckets[n].append(draw)
        samples = [d for n in range(lo, hi + 1) for d in buckets[n]]
        examples = [_draw(spec, rng, pool) for _ in range(count)]
    elif kind == "latin":
        samples = [_draw(spec, rng) for _ in range(count)]
        examples = [_draw(spec, rng) for _ in range(count)]
    elif kind == "sudoku":
        samples = _distinct(spec, rng, count, exclude=set())
        taken = {_key(spec, d) for d in samples}
        examples = [_redraw_until(spec, rng, taken) for _ in range(count)]
    else:
        samples, examples = _distinct(spec, rng, count, exclude=set()), None
    return tuple(samples), (tuple(examples) if examples is not None else None)


@lru_cache(maxsize=None)
def _test_keys(task: str, names: str) -> frozenset:
    spec = _TASKS[task]
    return frozenset(_key(spec, d) for d in _test_draws(task, names)[0])


def _distinct(spec: dict, rng: random.Random, count: int, exclude: set) -> list[tuple]:
    out, seen = [], set(exclude)
    while len(out) < count:
        draw = _draw(spec, rng)
        key = _key(spec, draw)
        if key not in seen:
            seen.add(key)
            out.append(draw)
    return out


def _redraw_until(spec: dict, rng: random.Random, banned) -> tuple:
    while True:
        draw = _draw(spec, rng)
        if _key(spec, draw) not in banned:
            return draw


def _train_draws(task: str, count: int, shard: int, names: str) -> tuple[list, list | None]:
    spec = _TASKS[task]
    rng = random.Random(train_seed(task, shard))
    held_out = _test_keys(task, names)
    pool = _pool(names, TRAIN_SPLIT)
    one_shot = spec["kind"] != "w2s"
    samples, examples = [], ([] if one_shot else None)
    while len(samples) < count:
        draw = _draw(spec, rng, pool)
        key = _key(spec, draw)
        if key in held_out:
            continue
        samples.append(draw)
        if one_shot:
            while True:
                example = _draw(spec, rng, pool)
                example_key = _key(spec, example)
                if example_key != key and example_key not in held_out:
                    break
            examples.append(example)
    return samples, examples


# -- records ------------------------------------------------------------------------------------
def render_list(items) -> str:
    """A list as the benchmark writes it: `["A B", "C D"]` (JSON strings, ", " between items)."""
    return json.dumps(list(items), ensure_ascii=False)


def _render_names(names: list[str]) -> str:
    # render_list for names that need no JSON escaping (checked once for the pool, below):
    # the hot path of the train split, several times faster than json.dumps.
    return '["' + '", "'.join(names) + '"]'


@lru_cache(maxsize=None)
def _mask_format(length: int) -> str:
    return render_list(["[MASK]"] * length)


if not all(part.isascii() and part.isalpha() for part in FIRST_NAMES + LAST_NAMES):
    raise RuntimeError("dllm.eval.wordlists: names must be ASCII letters only (they are rendered unescaped)")


def _line_record(spec: dict, draw: tuple, style: dict) -> dict:
    op = spec["op"]
    names, word, position, shuffled = draw
    n = len(names)
    if op == "copy":
        label = names
    elif op == "reverse":
        label = names[::-1]
    elif op == "sort":
        if style["sort_key"] == "last_name":
            label = sorted(names, key=lambda name: name.split(" ")[::-1])
        else:
            label = sorted(names)
    elif op == "shuffle":
        label = shuffled
    elif op.startswith("insert"):
        label = names[:position] + [word] + names[position:]
    elif op.startswith("remove"):
        label = names[:position] + names[position + 1:]
    else:
        label = names[:position] + [word] + names[position + 1:]

    by_index = op.endswith("_index")
    shown = position + style["index_base"] if by_index else None
    inp = {"context": _render_names(names)}
    if word is not None:
        inp["word"] = word
    if by_index:
        inp["index"] = shown

    if op == "shuffle" or op.endswith("_random"):
        answer = {"input": names[:]}
        if word is not None:
            answer["word"] = word
        answer["example"] = _render_names(label)
    else:
        answer = _render_names(label)

    record = {"input": inp, "answer": answer}
    if op in ("copy", "shuffle") or op.startswith(("insert", "replace")):
        record["output_format"] = _mask_format(len(label))
    metadata = {"length": n}
    if op.startswith(("insert", "remove", "replace")):
        metadata["index"] = shown
    if word is not None:
        metadata["word"] = word
    if op == "sort" and style["sort_key"] != "full_name":
        metadata["sort_key"] = style["sort_key"]
    if by_index and style["index_base"] != 0:
        metadata["index_base"] = style["index_base"]
    record["metadata"] = metadata
    return record


def _latin_record(spec: dict, draw: tuple, style: dict) -> dict:
    symbols, rows = draw
    return {"input": {"size": 4, "symbols": "[" + ", ".join(symbols) + "]"},
            "answer": {"symbols": list(symbols), "example": "\n".join(",".join(row) for row in rows)},
            "metadata": {"length": 4}}


def _sudoku_record(spec: dict, draw: tuple, style: dict) -> dict:
    puzzle, solution = draw
    return {"input": {"sudoku": puzzle}, "answer": solution,
            "metadata": {"length": sum(ch not in "0\n" for ch in puzzle)}}


def _w2s_record(spec: dict, draw: tuple, style: dict) -> dict:
    words = list(draw)
    return {"input": {"words": ", ".join(words[:-1]) + ", and " + words[-1]},
            "answer": {"words": words}, "metadata": {}}


_BUILDERS = {"line": _line_record, "latin": _latin_record, "sudoku": _sudoku_record, "w2s": _w2s_record}


def _example(kind: str, record: dict) -> dict:
    """A record as an in-context example: the official Sudoku examples carry no metadata."""
    if kind == "sudoku":
        record.pop("metadata", None)
    return record

