"""The seeded ParallelBench generators (`dllm.eval.generators`): seed rule, record schema, labels
checked independently and by the task metrics, the draw order of the benchmark's description,
determinism, train/test disjointness, options and errors."""
import itertools
import json
import random
import re
import string
import time

import pytest

from dllm.eval import generators as G
from dllm.eval import wordlists as W

LINE_OPS = ("copy", "reverse", "sort", "shuffle", "insert_index", "insert_random",
            "remove_index", "remove_random", "replace_index", "replace_random")
LINE_TASKS = [f"waiting_line/{op}" for op in LINE_OPS]
N15_TASKS = [f"waiting_line_n15/{op}" for op in LINE_OPS]
PUZZLES = ["puzzle/latin_square_n4", "puzzle/sudoku_n4_12"]
W2S_TASKS = [f"words_to_sentence/{lv}" for lv in ("easy", "medium", "hard")]
ALL_TASKS = LINE_TASKS + N15_TASKS + PUZZLES + W2S_TASKS
ONE_SHOT = LINE_TASKS + N15_TASKS + PUZZLES

METRIC_OF = {"copy": "list_match_score", "reverse": "list_match_score", "sort": "list_match_score",
             "insert_index": "list_match_score", "remove_index": "list_match_score",
             "replace_index": "list_match_score", "shuffle": "list_shuffle_score",
             "insert_random": "list_random_insert_score", "remove_random": "list_random_remove_score",
             "replace_random": "list_random_replace_score",
             "latin_square_n4": "latin_square_score", "sudoku_n4_12": "sudoku_score"}
WITH_OUTPUT_FORMAT = {"copy", "shuffle", "insert_index", "insert_random", "replace_index", "replace_random"}
POOL = {f"{f} {l}" for f in W.FIRST_NAMES for l in W.LAST_NAMES}


def op_of(task):
    return task.rsplit("/", 1)[-1]


def label_of(record):
    """What the model must say: the string answer, or the object answer's example."""
    answer = record["answer"]
    return answer if isinstance(answer, str) else answer["example"]


def records_and_examples(records):
    """Each record followed by its in-context example (which is record-shaped too)."""
    for record in records:
        yield record
        yield from record["input"].get("icl_examples", [])


# -- seed rule ----------------------------------------------------------------------------------
@pytest.mark.parametrize("task,seed", [
    ("waiting_line/copy", 31940), ("waiting_line/reverse", 31383), ("waiting_line/shuffle", 30142),
    ("waiting_line/sort", 48898), ("puzzle/latin_square_n4", 51291),
    ("paraphrase_summarize/samsum", 59102), ("paraphrase_summarize/chatgpt-paraphrases", 39617),
    # the six index/random tasks hash their legacy names `<task>_list`
    ("waiting_line/insert_index", 49875), ("waiting_line/insert_random", 25751),
    ("waiting_line/remove_index", 46066), ("waiting_line/remove_random", 47444),
    ("waiting_line/replace_index", 32235), ("waiting_line/replace_random", 49003),
    # n = 15 variants reuse the n = 3..6 seeds
    ("waiting_line_n15/copy", 31940), ("waiting_line_n15/insert_index", 49875), ("copy", 31940),
])
def test_task_seed(task, seed):
    assert G.task_seed(task) == seed


def test_seed_rule_on_bare_names():
    assert G.seed_from_name("insert_index") == 29284          # the current name, not the seed used
    assert G.seed_from_name("insert_index_list") == 49875
    assert G.task_seed("waiting_line/copy", base=43) == (31940 + 1) % 65535


def test_train_seeds_are_disjoint_from_test_seeds():
    seeds = {G.train_seed(t, s) for t in ALL_TASKS for s in (0, 1, 999)}
    assert min(seeds) >= 65535
    assert G.train_seed("waiting_line/copy", 7) == 65535 + 31940 * 1000 + 7


def test_generator_tasks():
    assert G.generator_tasks() == ALL_TASKS


# -- word lists -----------------------------------------------------------------------------------
def test_wordlists():
    assert 90 <= len(W.FIRST_NAMES) <= 100 and len(set(W.FIRST_NAMES)) == len(W.FIRST_NAMES)
    assert 150 <= len(W.LAST_NAMES) <= 200 and len(set(W.LAST_NAMES)) == len(W.LAST_NAMES)
    words = list(W.W2S_HARD) + [w for ws in W.W2S_EASY.values() for w in ws]
    for item in list(W.FIRST_NAMES) + list(W.LAST_NAMES) + words:
        assert re.fullmatch(r"[A-Za-z]+", item), item
    for theme in list(W.W2S_EASY.values()) + [W.W2S_HARD]:
        assert len(set(theme)) == len(theme) >= 4
    assert len(G.POOL) == len(set(G.POOL)) == len(W.FIRST_NAMES) * len(W.LAST_NAMES)
    assert G.POOL[:2] == (f"{W.FIRST_NAMES[0]} {W.LAST_NAMES[0]}", f"{W.FIRST_NAMES[0]} {W.LAST_NAMES[1]}")


# -- schema ---------------------------------------------------------------------------------------
def check_line_record(task, record, icl):
    op = op_of(task)
    n15 = task.startswith("waiting_line_n15/")
    expected_input = {"context"} | ({"word"} if op.startswith(("insert", "replace")) else set()) \
        | ({"index"} if op.endswith("_index") else set()) | (set() if icl else {"icl_examples"})
    assert set(record["input"]) == expected_input
    expected_top = {"input", "answer", "metadata"} | ({"output_format"} if op in WITH_OUTPUT_FORMAT else set())
    assert set(record) == expected_top

    context = record["input"]["context"]
    names = json.loads(context)
    assert context == "[" + ", ".join(f'"{x}"' for x in names) + "]"
    assert all(isinstance(x, str) and x in POOL for x in names)
    assert len(set(names)) == len(names)
    n = len(names)
    assert (n == 15) if n15 else (3 <= n <= 6)

    meta = record["metadata"]
    assert meta["length"] == n
    word = record["input"].get("word")
    if word is not None:
        assert word in POOL and word not in names
        assert meta["word"] == word
    if op.startswith(("insert", "remove", "replace")):
        assert ("index" in meta) and (meta["index"] is None) == op.endswith("_random")
    else:
        assert set(meta) == {"length"}
    if op.endswith("_index"):
        index = record["input"]["index"]
        assert isinstance(index, int) and meta["index"] == index
        assert 0 <= index <= (n if op == "insert_index" else n - 1)

    answer = record["answer"]
    if op == "shuffle" or op.endswith("_random"):
        keys = {"input", "example"} | ({"word"} if op in ("insert_random", "replace_random") else set())
        assert isinstance(answer, dict) and set(answer) == keys
        assert answer["input"] == names and answer.get("word") == word
        label = json.loads(answer["example"])
    else:
        assert isinstance(answer, str)
        label = json.loads(answer)
    assert json.dumps(label) == label_of(record)
    if "output_format" in record:
        assert json.loads(record["output_format"]) == ["[MASK]"] * len(label)
    return names, label


@pytest.mark.parametrize("task", LINE_TASKS + N15_TASKS)
def test_waiting_line_schema(task):
    records = G.make_records(task)
    assert len(records) == 100
    for record in records:
        check_line_record(task, record, icl=False)
        examples = record["input"]["icl_examples"]
        assert isinstance(examples, list) and len(examples) == 1
        check_line_record(task, examples[0], icl=True)


@pytest.mark.parametrize("task", LINE_TASKS + N15_TASKS)
def test_waiting_line_labels(task):
    """Labels by an independent reading of each operation, for records and examples alike."""
    op = op_of(task)
    for record in records_and_examples(G.make_records(task)):
        names, label = json.loads(record["input"]["context"]), json.loads(label_of(record))
        word, index = record["input"].get("word"), record["input"].get("index")
        n = len(names)
        if op == "copy":
            assert label == names
        elif op == "reverse":
            assert label == list(reversed(names))
        elif op == "sort":
            assert label == sorted(names) and sorted(label) == sorted(names)
        elif op == "shuffle":
            assert sorted(label) == sorted(names) and label != names
        elif op == "insert_index":
            assert len(label) == n + 1 and label[index] == word and label[:index] + label[index + 1:] == names
        elif op == "insert_random":
            assert len(label) == n + 1 and word in label
            assert [x for x in label if x != word] == names
        elif op == "remove_index":
            assert len(label) == n - 1 and names[index] not in label
            assert label == [x for i, x in enumerate(names) if i != index]
        elif op == "remove_random":
            assert len(label) == n - 1 and len(set(names) - set(label)) == 1
            assert [x for x in names if x in label] == label
        elif op == "replace_index":
            assert len(label) == n and label[index] == word
            assert [x for i, x in enumerate(label) if i != index] == [x for i, x in enumerate(names) if i != index]
        elif op == "replace_random":
            assert len(label) == n and word in label
            diffs = [i for i in range(n) if label[i] != names[i]]
            assert len(diffs) == 1 and label[diffs[0]] == word


def test_random_variants_vary_the_hidden_position():
    for op in ("insert_random", "remove_random", "replace_random"):
        positions = set()
        for record in G.make_records(f"waiting_line/{op}"):
            names, label = json.loads(record["input"]["context"]), json.loads(label_of(record))
            positions.add(next((i for i in range(min(len(names), len(label))) if names[i] != label[i]),
                               min(len(names), len(label))))
        assert len(positions) >= 4, (op, positions)


@pytest.mark.parametrize("task", LINE_TASKS + N15_TASKS)
def test_bucketing_order(task):
    records = G.make_records(task)
    lengths = [r["metadata"]["length"] for r in records]
    if task.startswith("waiting_line_n15/"):
        assert lengths == [15] * 100
    else:
        assert lengths == [3] * 25 + [4] * 25 + [5] * 25 + [6] * 25
        example_lengths = [r["input"]["icl_examples"][0]["metadata"]["length"] for r in records]
        assert set(example_lengths) == {3, 4, 5, 6}           # the example's n is drawn independently


def test_latin_square():
    records = G.make_records("puzzle/latin_square_n4")
    assert len(records) == 100
    for record in records_and_examples(records):
        assert set(record) == {"input", "answer", "metadata"} and record["metadata"] == {"length": 4}
        inp = record["input"]
        assert inp["size"] == 4 and set(inp) <= {"size", "symbols", "icl_examples"}
        symbols = record["answer"]["symbols"]
        assert set(record["answer"]) == {"symbols", "example"}
        assert len(set(symbols)) == 4 and all(s in string.ascii_uppercase + string.digits for s in symbols)
        assert inp["symbols"] == "[" + ", ".join(symbols) + "]"
        rows = [line.split(",") for line in record["answer"]["example"].split("\n")]
        assert len(rows) == 4 and all(sorted(r) == sorted(symbols) for r in rows)
        assert all(sorted(col) == sorted(symbols) for col in zip(*rows))
    for record in records:
        assert len(record["input"]["icl_examples"]) == 1 and "icl_examples" in record["input"]


def brute_force_solutions(puzzle):
    """Every completion of a 4x4 puzzle: try all digits in the blanks, keep the valid grids."""
    grid = [[int(ch) for ch in line] for line in puzzle.split("\n")]
    blanks = [(r, c) for r in range(4) for c in range(4) if grid[r][c] == 0]
    found = []
    for digits in itertools.product(range(1, 5), repeat=len(blanks)):
        g = [row[:] for row in grid]
        for (r, c), d in zip(blanks, digits):
            g[r][c] = d
        units = [g[r] for r in range(4)] + [[g[r][c] for r in range(4)] for c in range(4)]
        units += [[g[r][c] for r in (r0, r0 + 1) for c in (c0, c0 + 1)] for r0 in (0, 2) for c0 in (0, 2)]
        if all(sorted(u) == [1, 2, 3, 4] for u in units):
            found.append("\n".join("".join(map(str, row)) for row in g))
    return found


def test_sudoku():
    records = G.make_records("puzzle/sudoku_n4_12")
    assert len(records) == 108
    puzzles = [r["input"]["sudoku"] for r in records]
    assert len(set(puzzles)) == 108
    for record in records:
        assert set(record) == {"input", "answer", "metadata"} and record["metadata"] == {"length": 12}
        assert set(record["input"]) == {"sudoku", "icl_examples"}
        (example,) = record["input"]["icl_examples"]
        assert set(example) == {"input", "answer"} and set(example["input"]) == {"sudoku"}
        assert example["input"]["sudoku"] not in puzzles                # never a test puzzle, so never itself
        for puzzle, answer in ((record["input"]["sudoku"], record["answer"]),
                               (example["input"]["sudoku"], example["answer"])):
            assert re.fullmatch(r"[0-4]{4}(\n[0-4]{4}){3}", puzzle) and puzzle.count("0") == 4
            assert brute_force_solutions(puzzle) == [answer]
            assert all(p in ("0", a) for p, a in zip(puzzle, answer))


def test_sudoku_grids_cover_all_valid_grids():
    """Both base classes are used: the drawn grids are not confined to one 96-grid class."""
    rng = random.Random(0)
    grids = {tuple(map(tuple, G._random_sudoku_grid(rng))) for _ in range(5000)}
    assert len(grids) == 288


def test_medium_word_sets_hold_four_distinct_words_from_four_themes():
    """A word of two themes ("song": party, music) is never drawn twice into one set."""
    themes = {w: {t for t, ws in W.W2S_EASY.items() if w in ws} for ws in W.W2S_EASY.values() for w in ws}
    for record in G.make_records("words_to_sentence/medium", split="train", num_samples=5000, shard=0):
        words = record["answer"]["words"]
        assert len(set(words)) == 4, words
        assert len(set().union(*(themes[w] for w in words))) >= 4


@pytest.mark.parametrize("task", W2S_TASKS)
def test_words_to_sentence(task):
    level = op_of(task)
    records = G.make_records(task)
    assert len(records) == 100
    sets = set()
    for record in records:
        assert set(record) == {"input", "answer", "metadata"} and record["metadata"] == {}
        words = record["answer"]["words"]
        assert set(record["answer"]) == {"words"} and set(record["input"]) == {"words"}
        assert len(set(words)) == 4
        assert record["input"]["words"] == f"{words[0]}, {words[1]}, {words[2]}, and {words[3]}"
        if level == "hard":
            assert set(words) <= set(W.W2S_HARD)
        elif level == "easy":                     # related common words: one theme
            assert any(set(words) <= set(ws) for ws in W.W2S_EASY.values())
        else:                                     # unrelated common words: no two from one theme alone
            assert set(words) <= {w for ws in W.W2S_EASY.values() for w in ws}
            assert not any(set(words) <= set(ws) for ws in W.W2S_EASY.values())
            assert not any(len(set(words) & set(ws)) == 4 for ws in W.W2S_EASY.values())
        sets.add(frozenset(words))
    assert len(sets) == 100


# -- labels score 1 under their metric --------------------------------------------------------------
@pytest.mark.parametrize("task", ONE_SHOT)
@pytest.mark.parametrize("options", [{}, {"sort_key": "last_name", "index_base": 1}])
def test_labels_score_one(task, options):
    metrics = pytest.importorskip("dllm.eval.metrics")
    metric = getattr(metrics, METRIC_OF[op_of(task)])
    for record in records_and_examples(G.make_records(task, **options)):
        result = metric(label_of(record), record["answer"])
        assert result["score"] == 1, (task, record)
        assert result.get("score_strict", 1) == 1, (task, record)


def test_train_labels_score_one():
    metrics = pytest.importorskip("dllm.eval.metrics")
    for task in LINE_TASKS + PUZZLES:
        metric = getattr(metrics, METRIC_OF[op_of(task)])
        for record in records_and_examples(G.make_records(task, split="train", num_samples=200)):
            assert metric(label_of(record), record["answer"])["score"] == 1, (task, record)


# -- the draws follow the benchmark's description -------------------------------------------------------
def reference_line_stream(op, seed, lo=3, hi=6, per_n=25):
    """Test records of one Waiting Line task re-derived from the written description, with the
    plain list operations it names (`sample(pool, n)`, `choice(pool minus names)`, ...)."""
    pool = [f"{f} {l}" for f in W.FIRST_NAMES for l in W.LAST_NAMES]
    rng = random.Random(seed)

    def one(n):
        names = rng.sample(pool, n)
        word = index = shuffled = None
        if op.startswith(("insert", "replace")):
            word = rng.choice([p for p in pool if p not in names])
        if op.startswith("insert"):
            index = rng.randint(0, n)
        elif op.startswith(("remove", "replace")):
            index = rng.randint(0, n - 1)
        elif op == "shuffle":
            shuffled = names[:]
            rng.shuffle(shuffled)
            while shuffled == names:
                rng.shuffle(shuffled)
        return names, word, index, shuffled

    buckets = {n: [] for n in range(lo, hi + 1)}
    while any(len(b) < per_n for b in buckets.values()):
        n = rng.randint(lo, hi)
        sample = one(n)
        if len(buckets[n]) < per_n:
            buckets[n].append(sample)
    tests = [s for n in range(lo, hi + 1) for s in buckets[n]]
    examples = [one(rng.randint(lo, hi)) for _ in range(len(tests))]
    return tests, examples


@pytest.mark.parametrize("op", ["copy", "shuffle", "insert_index", "replace_random"])
def test_waiting_line_matches_written_description(op):
    tests, examples = reference_line_stream(op, G.task_seed(op))
    records = G.make_records(f"waiting_line/{op}")
    for record, (names, word, index, shuffled), ex in zip(records, tests, examples):
        assert json.loads(record["input"]["context"]) == names
        assert record["input"].get("word") == word
        if op == "insert_index":
            assert record["input"]["index"] == index
        if op == "shuffle":
            assert json.loads(record["answer"]["example"]) == shuffled
        if op == "replace_random":
            assert json.loads(record["answer"]["example"]) == names[:index] + [word] + names[index + 1:]
        assert json.loads(record["input"]["icl_examples"][0]["input"]["context"]) == ex[0]


def test_latin_square_matches_written_description():
    rng = random.Random(51291)
    alphabet = list(string.ascii_uppercase + string.digits)

    def one():
        symbols = rng.sample(alphabet, 4)
        rows = [symbols[i:] + symbols[:i] for i in range(4)]
        rng.shuffle(rows)
        cols = list(range(4))
        rng.shuffle(cols)
        return symbols, "\n".join(",".join(row[c] for c in cols) for row in rows)

    tests = [one() for _ in range(100)]
    examples = [one() for _ in range(100)]
    for record, (symbols, square), (ex_symbols, _) in zip(G.make_records("puzzle/latin_square_n4"), tests, examples):
        assert record["answer"] == {"symbols": symbols, "example": square}
        assert record["input"]["icl_examples"][0]["answer"]["symbols"] == ex_symbols


# -- determinism, shards, subsets ------------------------------------------------------------------
@pytest.mark.parametrize("task", ["waiting_line/shuffle", "waiting_line_n15/insert_random", "puzzle/sudoku_n4_12",
                                  "puzzle/latin_square_n4", "words_to_sentence/medium"])
def test_deterministic(task):
    assert G.make_records(task) == G.make_records(task)
    assert G.make_records(task, split="train", num_samples=300, shard=2) == \
        G.make_records(task, split="train", num_samples=300, shard=2)
    shard0 = G.make_records(task, split="train", num_samples=300, shard=0)
    shard1 = G.make_records(task, split="train", num_samples=300, shard=1)
    assert shard0 != shard1
    assert G.make_records(task, split="train", num_samples=100, shard=0) == shard0[:100]


def test_num_samples_takes_a_prefix():
    for task in ("waiting_line/remove_index", "puzzle/sudoku_n4_12", "words_to_sentence/hard"):
        assert G.make_records(task, num_samples=7) == G.make_records(task)[:7]
    assert len(G.make_records("puzzle/sudoku_n4_12")) == G.default_num_samples("puzzle/sudoku_n4_12") == 108


def test_records_are_fresh_objects():
    first = G.make_records("waiting_line/copy")
    first[0]["input"]["context"] = "changed"
    assert G.make_records("waiting_line/copy")[0]["input"]["context"] != "changed"


# -- train split ----------------------------------------------------------------------------------------
def held_out_key(task, record):
    inp = record["input"]
    if task.startswith("waiting_line"):
        return inp["context"], inp.get("word"), inp.get("index")
    if task == "puzzle/latin_square_n4":
        return frozenset(record["answer"]["symbols"])
    if task == "puzzle/sudoku_n4_12":
        return inp["sudoku"]
    return frozenset(record["answer"]["words"])


@pytest.mark.parametrize("task", ["waiting_line/copy", "waiting_line/insert_index", "waiting_line_n15/sort",
                                  "puzzle/latin_square_n4", "puzzle/sudoku_n4_12", "words_to_sentence/easy"])
def test_train_is_disjoint_from_test(task):
    test_keys = {held_out_key(task, r) for r in G.make_records(task)}
    train = G.make_records(task, split="train", num_samples=3000)
    assert len(train) == 3000
    for record in train:
        assert held_out_key(task, record) not in test_keys
        for example in record["input"].get("icl_examples", []):
            assert held_out_key(task, example) not in test_keys
            assert held_out_key(task, example) != held_out_key(task, record)


@pytest.mark.parametrize("op", ["copy", "insert_index", "remove_random"])
def test_train_drops_test_inputs_when_they_recur(monkeypatch, op):
    """With a pool of 8 names, test inputs recur often in the train stream; none may survive."""
    task = f"waiting_line/{op}"
    monkeypatch.setattr(G, "POOL", G.POOL[:8])
    G._test_draws.cache_clear()
    G._test_keys.cache_clear()
    try:
        test_keys = {held_out_key(task, r) for r in G.make_records(task)}
        train = G.make_records(task, split="train", num_samples=2000)
        assert all(held_out_key(task, r) not in test_keys for r in train)
        assert len({held_out_key(task, r) for r in train}) > 50
    finally:
        G._test_draws.cache_clear()
        G._test_keys.cache_clear()


def test_train_records_carry_one_example_and_uniform_lengths():
    train = G.make_records("waiting_line/reverse", split="train", num_samples=4000)
    lengths = [r["metadata"]["length"] for r in train]
    for n in (3, 4, 5, 6):
        assert 800 < lengths.count(n) < 1200
    assert all(len(r["input"]["icl_examples"]) == 1 for r in train)
    for record in train[:200]:
        check_line_record("waiting_line/reverse", record, icl=False)
    assert {r["metadata"]["length"] for r in G.make_records("waiting_line_n15/copy", split="train", num_samples=50)} == {15}
    assert all("icl_examples" not in r["input"]
               for r in G.make_records("words_to_sentence/hard", split="train", num_samples=50))


def test_train_is_fast():
    start = time.perf_counter()
    records = G.make_records("waiting_line/insert_index", split="train", num_samples=10_000, shard=5)
    elapsed = time.perf_counter() - start
    assert len(records) == 10_000
    assert elapsed < 6.0, f"10k Waiting Line train records took {elapsed:.2f} s"


# -- conventions ----------------------------------------------------------------------------------------
def test_sort_by_last_name():
    default = G.make_records("waiting_line/sort")
    by_last = G.make_records("waiting_line/sort", sort_key="last_name")
    assert all("sort_key" not in r["metadata"] for r in records_and_examples(default))
    differs = 0
    for d, b in zip(records_and_examples(default), records_and_examples(by_last)):
        assert d["input"].get("context") == b["input"].get("context")
        assert b["metadata"]["sort_key"] == "last_name"
        names = json.loads(b["input"]["context"])
        label = json.loads(b["answer"])
        assert label == sorted(names, key=lambda x: (x.split()[1], x.split()[0]))
        differs += label != json.loads(d["answer"])
    assert differs > 100
    # other tasks ignore the option
    assert G.make_records("waiting_line/copy", sort_key="last_name") == G.make_records("waiting_line/copy")


@pytest.mark.parametrize("op", ["insert_index", "remove_index", "replace_index"])
def test_one_based_index(op):
    task = f"waiting_line/{op}"
    zero = G.make_records(task)
    one = G.make_records(task, index_base=1)
    assert all("index_base" not in r["metadata"] for r in records_and_examples(zero))
    shown = []
    for z, o in zip(records_and_examples(zero), records_and_examples(one)):
        assert o["input"]["index"] == z["input"]["index"] + 1 == o["metadata"]["index"]
        assert o["metadata"]["index_base"] == 1
        assert o["answer"] == z["answer"] and o["input"]["context"] == z["input"]["context"]
        names, label = json.loads(o["input"]["context"]), json.loads(o["answer"])
        position = o["input"]["index"]                               # the literal, 1-based reading
        n = len(names)
        if op == "insert_index":
            assert 1 <= position <= n + 1 and label[position - 1] == o["input"]["word"]
        elif op == "remove_index":
            assert 1 <= position <= n and label == names[:position - 1] + names[position:]
        else:
            assert 1 <= position <= n and label == names[:position - 1] + [o["input"]["word"]] + names[position:]
        shown.append(position)
    assert min(shown) == 1
    assert G.make_records("waiting_line/insert_random", index_base=1) == G.make_records("waiting_line/insert_random")


# -- errors ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,needles", [
    ({"task": "waiting_line/juggle"}, ["waiting_line/juggle", "waiting_line/copy"]),
    ({"task": "paraphrase_summarize/samsum"}, ["paraphrase_summarize/samsum", "puzzle/sudoku_n4_12"]),
    ({"split": "dev"}, ["'dev'", "test", "train"]),
    ({"num_samples": 0}, ["0", ">= 1"]),
    ({"num_samples": -3}, ["-3", ">= 1"]),
    ({"num_samples": 101}, ["101", "100", "train"]),
    ({"sort_key": "surname"}, ["surname", "full_name", "last_name"]),
    ({"index_base": 2}, ["2", "0, 1"]),
    ({"index_base": 1.0}, ["1.0", "0, 1"]),
    ({"num_samples": 2.5}, ["2.5", ">= 1"]),
    ({"shard": 1}, ["shard", "train"]),
    ({"split": "train", "shard": 1000}, ["1000", "0..999"]),
    ({"split": "train", "shard": -1}, ["-1", "0..999"]),
])
def test_bad_arguments(kwargs, needles):
    kwargs = {"task": "waiting_line/copy", **kwargs}
    with pytest.raises(ValueError) as err:
        G.make_records(kwargs.pop("task"), **kwargs)
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


def test_bad_task_seed_argument():
    with pytest.raises(ValueError, match="task"):
        G.task_seed("")


# -- JSONL helpers ----------------------------------------------------------------------------------------
def test_jsonl_round_trip(tmp_path):
    records = G.make_records("waiting_line/insert_random", num_samples=5) + [{"input": {"text": "Zoë café"}}]
    path = tmp_path / "sub" / "data.jsonl"
    assert G.write_jsonl(path, records) == 6
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 6 and lines[0].startswith('{"input":{"context":"[\\"')
    assert "Zoë café" in lines[-1]
    assert G.read_jsonl(path) == records
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n\n{oops\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl:3"):
        G.read_jsonl(tmp_path / "bad.jsonl")
    (tmp_path / "list.jsonl").write_text('{"a": 1}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"list\.jsonl:2: not a JSON object \(a list: \[1, 2\]\)"):
        G.read_jsonl(tmp_path / "list.jsonl")
