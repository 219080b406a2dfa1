"""ParallelBench metrics: the spec's parse vectors, gold answers scoring 1, hand-made wrong answers
scoring 0, the formatting variants the parsers accept, and the Text Writing components with
their backends (a fake grammar checker and a loopback fake LanguageTool server; no network)."""
import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest

from dllm.eval import metrics, text_metrics
from dllm.eval.metrics import (
    METRICS, compute, latin_square_score, list_match_score, list_random_insert_score,
    list_random_remove_score, list_random_replace_score, list_shuffle_score, parse_list, parse_list_strict,
    parse_sudoku, parse_sudoku_strict, sudoku_score,
)
from dllm.eval.text_metrics import (
    Backends, BertScorer, GrammarChecker, paraphrase_score, sentence_to_words_score, summary_score,
)


def render(names):
    """The official rendering of a queue: double quotes, `", "` separator."""
    return "[" + ", ".join(f'"{name}"' for name in names) + "]"


def scores(result):
    return result["score"], result["score_strict"]


# ----------------------------------------------------------------------------------------------
# Lenient parse vectors (docs/parallelbench.md §Metrics), label ["A B", "C D"]
# ----------------------------------------------------------------------------------------------

LABEL = '["A B", "C D"]'


@pytest.mark.parametrize("prediction", [
    '["A B", "C D"]',
    "Here: [A B, C D]",
    "A B, C D",
    '["A B", "C D"',
    '["X"] then ["A B", "C D"]',
], ids=["exact", "prose-unquoted", "no-brackets", "unclosed", "last-list-wins"])
def test_lenient_vectors_score_one(prediction):
    assert list_match_score(prediction, LABEL)["score"] == 1.0
    assert parse_list(prediction) == ["A B", "C D"]


@pytest.mark.parametrize("prediction", [
    '["A B", "C D"] and ["X"]',
    '["A B",\n"C D"]',
    "['A B', 'C D']",
    '["a b", "C D"]',
], ids=["later-list", "newline-kept", "single-quotes", "case"])
def test_lenient_vectors_score_zero(prediction):
    result = list_match_score(prediction, LABEL)
    assert result["score"] == 0.0 and result["headline"] == 0.0


def test_lenient_parse_details():
    assert parse_list('["A B",\n"C D"]') == ["A B", '\n"C D']        # only quotes and spaces stripped
    assert parse_list("['A B', 'C D']") == ["'A B'", "'C D'"]
    assert parse_list('["A B", , "C D",  ]') == ["A B", "C D"]       # blank pieces dropped
    assert parse_list("") == []
    assert parse_list("[[A B, C D]]") == ["A B", "C D"]


# ----------------------------------------------------------------------------------------------
# Strict parse
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ('["A B", "C D"]', ["A B", "C D"]),
    ('  ["A B", "C D"]\n', ["A B", "C D"]),
    ('["A B"]', ["A B"]),
    ("[]", None),                                   # no item
    ('[""]', [""]),
    ('["A B","C D"]', None),
    ('["A B",  "C D"]', None),
    ('["A B",\n"C D"]', None),
    # text around the brackets is allowed: after the last `[`, before the next `]`
    ('Here: ["A B", "C D"]', ["A B", "C D"]),
    ('["A B", "C D"] done', ["A B", "C D"]),
    ('```\n["A B", "C D"]\n```', ["A B", "C D"]),
    ('["X"]\n["A B", "C D"]', ["A B", "C D"]),
    ('["A B", "C D"]<|eot_id|>', ["A B", "C D"]),
    ('["A B", "C D"', None),
    ('"A B", "C D"]', None),
    ("['A B', 'C D']", None),
    ("[A B, C D]", None),
    ('["A "B"", "C D"]', None),
    ("A B, C D", None),
])
def test_strict_parse(text, expected):
    assert parse_list_strict(text) == expected


def test_strict_score_separates_format_from_content():
    assert scores(list_match_score('["A B", "C D"]', LABEL)) == (1.0, 1.0)
    assert scores(list_match_score('Here: ["A B", "C D"]', LABEL)) == (1.0, 1.0)
    assert scores(list_match_score('["A B", "C D",]', LABEL)) == (1.0, 0.0)
    assert scores(list_match_score('["A B","C D"]', LABEL)) == (1.0, 0.0)
    assert scores(list_match_score('["C D", "A B"]', LABEL)) == (0.0, 0.0)


# ----------------------------------------------------------------------------------------------
# Waiting Line
# ----------------------------------------------------------------------------------------------

QUEUE = ["Charlotte Chavez", "Grace Baker", "Keith Cooper"]
NEW = "Aaron Stewart"
INSERTED = ["Charlotte Chavez", "Grace Baker", "Aaron Stewart", "Keith Cooper"]   # NEW inserted at index 2


def test_list_match_gold_and_wrong():
    label = render(INSERTED)
    assert list_match_score(label, label) == {"score": 1.0, "score_strict": 1.0, "headline": 1.0}
    assert list_match_score(label, INSERTED)["score"] == 1.0                   # a list label works too
    wrong = {
        "changed name": ["Charlotte Chavez", "Grace Baker", "Aaron Stewart", "Keith Cooperr"],
        "missing item": ["Charlotte Chavez", "Grace Baker", "Aaron Stewart"],
        "extra item": INSERTED + ["Grace Baker"],
        "order": ["Grace Baker", "Charlotte Chavez", "Aaron Stewart", "Keith Cooper"],
    }
    for case, names in wrong.items():
        assert scores(list_match_score(render(names), label)) == (0.0, 0.0), case


@pytest.mark.parametrize("as_string", [False, True], ids=["input-list", "input-string"])
def test_list_shuffle(as_string):
    answer = {"input": render(QUEUE) if as_string else QUEUE,
              "example": render(["Grace Baker", "Keith Cooper", "Charlotte Chavez"])}
    assert scores(list_shuffle_score(answer["example"], answer)) == (1.0, 1.0)
    assert scores(list_shuffle_score(render(QUEUE[::-1]), answer)) == (1.0, 1.0)
    wrong = {
        "equal to input": QUEUE,
        "duplicate": ["Grace Baker", "Grace Baker", "Charlotte Chavez"],
        "missing": ["Grace Baker", "Charlotte Chavez"],
        "extra": ["Grace Baker", "Keith Cooper", "Charlotte Chavez", NEW],
        "changed name": ["Grace Baker", "Keith Cooper", "Charlotte Chaves"],
    }
    for case, names in wrong.items():
        assert scores(list_shuffle_score(render(names), answer)) == (0.0, 0.0), case


def test_list_random_insert():
    answer = {"input": QUEUE, "word": NEW, "example": render(INSERTED)}
    for position in range(len(QUEUE) + 1):                                   # any position is fine
        names = QUEUE[:position] + [NEW] + QUEUE[position:]
        assert scores(list_random_insert_score(render(names), answer)) == (1.0, 1.0), position
    wrong = {
        "no new person": QUEUE,
        "also swapped two others": ["Grace Baker", "Charlotte Chavez", NEW, "Keith Cooper"],
        "inserted twice": [NEW, "Charlotte Chavez", "Grace Baker", NEW, "Keith Cooper"],
        "also dropped one": ["Charlotte Chavez", NEW, "Keith Cooper"],
        "another person": ["Charlotte Chavez", "Grace Baker", "Aaron Steward", "Keith Cooper"],
    }
    for case, names in wrong.items():
        assert scores(list_random_insert_score(render(names), answer)) == (0.0, 0.0), case


def test_list_random_remove():
    answer = {"input": render(QUEUE), "example": render(QUEUE[1:])}
    for position in range(len(QUEUE)):
        names = QUEUE[:position] + QUEUE[position + 1:]
        assert scores(list_random_remove_score(render(names), answer)) == (1.0, 1.0), position
    wrong = {
        "nobody removed": QUEUE,
        "also swapped the rest": ["Keith Cooper", "Grace Baker"],
        "two removed": ["Grace Baker"],
        "removed and renamed": ["Grace Baker", "Keith Coopper"],
        "removed and replaced": ["Grace Baker", NEW],
    }
    for case, names in wrong.items():
        assert scores(list_random_remove_score(render(names), answer)) == (0.0, 0.0), case


def test_list_random_replace():
    answer = {"input": QUEUE, "word": NEW, "example": render([NEW] + QUEUE[1:])}
    for position in range(len(QUEUE)):
        names = list(QUEUE)
        names[position] = NEW
        assert scores(list_random_replace_score(render(names), answer)) == (1.0, 1.0), position
    wrong = {
        "nothing replaced": QUEUE,
        "also swapped another pair": ["Keith Cooper", NEW, "Charlotte Chavez"],
        "also renamed another": [NEW, "Grace Baker", "Keith Coop"],
        "inserted instead": [NEW] + QUEUE,
        "replaced two": [NEW, NEW, "Keith Cooper"],
    }
    for case, names in wrong.items():
        assert scores(list_random_replace_score(render(names), answer)) == (0.0, 0.0), case


def test_waiting_line_answer_validation():
    with pytest.raises(ValueError, match="'input'"):
        list_shuffle_score("[]", {"example": "[]"})
    with pytest.raises(ValueError, match="object"):
        list_shuffle_score("[]", render(QUEUE))
    with pytest.raises(ValueError, match="'word'"):
        list_random_insert_score("[]", {"input": QUEUE})
    with pytest.raises(ValueError, match="list_match_score: answer must be a rendered list string"):
        list_match_score("[]", 42)
    with pytest.raises(ValueError, match="prediction"):
        list_match_score(None, LABEL)


# ----------------------------------------------------------------------------------------------
# Latin Square
# ----------------------------------------------------------------------------------------------

SYMBOLS = ["H", "4", "C", "A"]
SQUARE = ["H,4,C,A", "4,C,A,H", "C,A,H,4", "A,H,4,C"]
LATIN = {"symbols": SYMBOLS, "example": "\n".join(SQUARE)}


def test_latin_gold():
    assert latin_square_score("\n".join(SQUARE), LATIN) == {"score": 1.0, "score_strict": 1.0, "headline": 1.0}
    assert scores(latin_square_score("\n".join(SQUARE) + "\n", LATIN)) == (1.0, 1.0)
    # symbols as the prompt renders them, and digits stored as numbers
    assert latin_square_score("\n".join(SQUARE), {"symbols": "[H, 4, C, A]"})["score"] == 1.0
    assert latin_square_score("\n".join(SQUARE), {"symbols": ["H", 4, "C", "A"]})["score"] == 1.0


@pytest.mark.parametrize("prediction", [
    "H, 4, C, A\n4, C, A, H\nC, A, H, 4\nA, H, 4, C",
    "```csv\n" + "\n".join(SQUARE) + "\n```",
    "Here is a Latin square of size 4:\n\n" + "\n".join(SQUARE) + "\nEach symbol appears once per row and column.",
    "\n".join(SQUARE) + "\nH,4,C,A\nH,H,H,H",
], ids=["spaces-after-commas", "code-fence", "prose-lines", "extra-lines-after"])
def test_latin_accepted_variants(prediction):
    assert scores(latin_square_score(prediction, LATIN)) == (1.0, 1.0)       # strict is lenient, as the benchmark


@pytest.mark.parametrize("prediction", [
    "H,4,C,C\n4,C,A,H\nC,A,H,4\nA,H,4,C",                    # repeated symbol in a row
    "H,4,C,A\n4,C,A,H\n4,C,A,H\nA,H,4,C",                    # repeated symbol in a column
    "H,4,C,A\n" + "\n".join(SQUARE),                         # header line repeating the symbols
    "h,4,c,a\n4,c,a,h\nc,a,h,4\na,h,4,c",                    # other letter case
    '"H","4","C","A"\n"4","C","A","H"\n"C","A","H","4"\n"A","H","4","C"',   # quoted cells
    "H 4 C A\n4 C A H\nC A H 4\nA H 4 C",                    # space-separated grid
    "H,4,C,A\n4,C,A,H\nC,A,H,4",                             # three rows
    "H,4,C,A,4,C,A,H,C,A,H,4,A,H,4,C",                       # one line
    "H,4,C,X\n4,C,X,H\nC,X,H,4\nX,H,4,C",                    # a foreign symbol
    "\u2028".join(SQUARE),                                    # one line: only \n breaks lines
], ids=["row-repeat", "column-repeat", "header", "case", "quoted", "space-separated", "three-rows",
        "one-line", "foreign-symbol", "line-separator"])
def test_latin_rejected(prediction):
    assert scores(latin_square_score(prediction, LATIN)) == (0.0, 0.0)


def test_latin_set_quirk_and_first_row():
    # Sets, not sequences: a row with an extra repeated cell is not rejected by the lenient check.
    padded = "H,4,C,A,A\n4,C,A,H\nC,A,H,4\nA,H,4,C"
    assert scores(latin_square_score(padded, LATIN)) == (1.0, 1.0)
    grid = "\n".join(SQUARE)
    assert latin_square_score(grid, {**LATIN, "first_row": ["H", "4", "C", "A"]})["score"] == 1.0
    assert latin_square_score(grid, {**LATIN, "first_row": "H,4,C,A"})["score_strict"] == 1.0
    assert scores(latin_square_score(grid, {**LATIN, "first_row": ["4", "C", "A", "H"]})) == (0.0, 0.0)


def test_latin_answer_validation():
    with pytest.raises(ValueError, match="symbols"):
        latin_square_score("", {"example": ""})
    with pytest.raises(ValueError, match="object"):
        latin_square_score("", "[H, 4, C, A]")


# ----------------------------------------------------------------------------------------------
# Sudoku
# ----------------------------------------------------------------------------------------------

PUZZLE = "0042\n2031\n4023\n3214"
SOLUTION = "1342\n2431\n4123\n3214"


def test_sudoku_gold():
    assert sudoku_score(SOLUTION, SOLUTION) == {"score": 1.0, "score_strict": 1.0, "headline": 1.0}
    assert scores(sudoku_score("\n" + SOLUTION + "\n\n", SOLUTION)) == (1.0, 1.0)


@pytest.mark.parametrize("prediction", [
    "1 3 4 2\n2 4 3 1\n4 1 2 3\n3 2 1 4",
    "1,3,4,2\n2,4,3,1\n4,1,2,3\n3,2,1,4",
    "1|3|4|2\n2|4|3|1\n4|1|2|3\n3|2|1|4",
    "```\n" + SOLUTION + "\n```",
    "Output:\n" + SOLUTION,
], ids=["spaces", "commas", "pipes", "fence", "output-line"])
def test_sudoku_accepted_variants(prediction):
    assert parse_sudoku(prediction) == ["1342", "2431", "4123", "3214"]
    assert scores(sudoku_score(prediction, SOLUTION)) == (1.0, 0.0)


@pytest.mark.parametrize("prediction", [
    "1342243141233214",                                        # one line
    "Row 1: 1342\nRow 2: 2431\nRow 3: 4123\nRow 4: 3214",      # five digits per line
    "Input:\n" + PUZZLE + "\nOutput:\n" + SOLUTION,            # echoes the puzzle: 8 rows
    "1342\n2431\n4123",                                        # three rows
    "1342\u20282431\u20284123\u20283214",                       # one line: only \n breaks lines
], ids=["one-line", "row-labels", "echo", "three-rows", "line-separator"])
def test_sudoku_unparsable(prediction):
    assert parse_sudoku(prediction) is None
    assert scores(sudoku_score(prediction, SOLUTION)) == (0.0, 0.0)


def test_sudoku_digits_are_any_unicode_decimal_digits_read_by_value():
    full_width = SOLUTION.translate(str.maketrans("0123456789", "０１２３４５６７８９"))
    assert parse_sudoku(full_width) == parse_sudoku_strict(full_width) == SOLUTION.split("\n")
    assert scores(sudoku_score(full_width, SOLUTION)) == (1.0, 1.0)
    # an Arabic-Indic digit makes a fifth digit on the first line
    assert scores(sudoku_score("1342 \u0663\n2431\n4123\n3214", SOLUTION)) == (0.0, 0.0)
    assert parse_sudoku_strict("134\u00b2\n2431\n4123\n3214") is None     # a superscript is no decimal digit


def test_sudoku_wrong_grid():
    changed_given = "1342\n2413\n4123\n3214"        # row 2 had givens 2, 3, 1 at columns 1, 3, 4
    assert scores(sudoku_score(changed_given, SOLUTION)) == (0.0, 0.0)
    assert scores(sudoku_score(PUZZLE, SOLUTION)) == (0.0, 0.0)


def test_sudoku_answer_validation():
    with pytest.raises(ValueError, match="4 lines of 4 digits"):
        sudoku_score(SOLUTION, "1342")
    with pytest.raises(ValueError, match="string"):
        sudoku_score(SOLUTION, {"solution": SOLUTION})


# ----------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------

def test_registry_names_and_compute():
    assert set(METRICS) == {
        "list_match_score", "list_shuffle_score", "list_random_insert_score", "list_random_remove_score",
        "list_random_replace_score", "latin_square_score", "sudoku_score", "summary_score",
        "paraphrase_score", "sentence_to_words_score",
    }
    assert compute("sudoku_score", SOLUTION, SOLUTION)["headline"] == 1.0
    assert compute("list_match_score", LABEL, LABEL, backends=Backends())["headline"] == 1.0
    assert compute("sentence_to_words_score", "A dog.", {"words": ["dog"]})["headline"] is None
    with pytest.raises(ValueError, match=r"'list_macth_score'.*list_match_score"):
        compute("list_macth_score", LABEL, LABEL)


# ----------------------------------------------------------------------------------------------
# Text Writing: pure components
# ----------------------------------------------------------------------------------------------

SENTENCE = "Any idea of what sweater this is?"        # 8 tokens under 13a: "?" splits off


def test_rouge_identical_and_stemmed():
    summary = {"text": "Amanda: I baked cookies.", "summary": "Amanda baked cookies for Jerry."}
    result = summary_score("  Amanda baked cookies for Jerry.\n", summary)
    assert (result["rouge1"], result["rouge2"], result["rougeL"]) == (1.0, 1.0, 1.0)
    # Porter stemming and lower-casing: "cats"/"cat" and "running"/"runs" share stems.
    stemmed = summary_score("Cats running", {"text": "", "summary": "cat runs"})
    assert stemmed["rouge1"] == pytest.approx(1.0)
    disjoint = summary_score("Nothing here", {"text": "", "summary": "cat runs"})
    assert disjoint["rougeL"] == 0.0


def test_bleu_values():
    # A copy has BLEU 1, so inv_bleu 0.
    assert paraphrase_score(SENTENCE, {"text": SENTENCE})["inv_bleu"] == 0.0
    assert paraphrase_score(f"  {SENTENCE}\n", {"text": SENTENCE})["inv_bleu"] == 0.0
    # Case is kept: one of 8 unigrams differs, precisions 7/8, 6/7, 5/6, 4/5 -> BLEU = 0.5 ** 0.25.
    lowered = paraphrase_score(SENTENCE.lower(), {"text": SENTENCE})
    assert lowered["inv_bleu"] == pytest.approx(1 - 0.5 ** 0.25)
    # No smoothing: no shared 4-gram gives BLEU 0.
    assert paraphrase_score("Do you know this sweater?", {"text": SENTENCE})["inv_bleu"] == 1.0
    # Brevity penalty only: a 5-token prefix of the 8-token reference gives exp(1 - 8/5).
    prefix = paraphrase_score("Any idea of what sweater", {"text": SENTENCE})
    assert prefix["inv_bleu"] == pytest.approx(1 - math.exp(1 - 8 / 5))


def test_a_missing_bleu_package_is_named_when_an_empty_text_is_scored(monkeypatch):
    """Records are checked at load time by scoring an empty prediction: a missing package must show
    then, not after the decode."""
    import sys

    from dllm.eval import text_metrics
    text_metrics._bleu.cache_clear()
    monkeypatch.setitem(sys.modules, "sacrebleu", None)
    monkeypatch.setitem(sys.modules, "sacrebleu.metrics", None)
    try:
        with pytest.raises(ModuleNotFoundError, match=r"the BLEU score needs the 'sacrebleu' package; install it "
                                                      r"with pip install 'dllm\[eval\]'"):
            paraphrase_score("", {"text": "A cat sat."})
    finally:
        text_metrics._bleu.cache_clear()


def test_paraphrase_empty_is_all_zero():
    for prediction in ("", "  \n "):
        result = paraphrase_score(prediction, {"text": SENTENCE, "examples": "['x']"})
        assert result == {"inv_bleu": 0.0, "bertscore": 0.0, "grammar": 0.0, "score_v1": 0.0, "headline": 0.0}


def test_w2s_inclusion_is_case_sensitive_substring():
    def inclusion(prediction, words):
        return sentence_to_words_score(prediction, {"words": words})["inclusion"]

    assert inclusion("The dogs play.", ["dog"]) == 1.0
    assert inclusion("Dog plays.", ["dog"]) == 0.0
    assert inclusion("I ate ice cream.", ["ice_cream"]) == 0.0
    assert inclusion("I ate ice_cream.", ["ice_cream"]) == 1.0
    assert inclusion("The dog threw a ball in the park.", ["dog", "park", "ball", "throw"]) == 0.0
    assert inclusion("The dog likes to throw a ball in the park.", ["dog", "park", "ball", "throw"]) == 1.0


def test_grammar_unavailable_without_backend():
    for backends in (None, Backends()):
        w2s = sentence_to_words_score("The dog runs.", {"words": ["dog"]}, backends=backends)
        assert w2s["grammar"] is None and w2s["headline"] is None and w2s["score_v1"] is None
        assert w2s["inclusion"] == 1.0
        summ = summary_score("Amanda baked.", {"text": "", "summary": "Amanda baked."}, backends=backends)
        assert summ["headline"] is None and summ["score_v1"] is None and summ["rougeL"] == 1.0
        para = paraphrase_score("Do you know this sweater?", {"text": SENTENCE}, backends=backends)
        assert para["headline"] is None and para["bertscore"] is None and para["score_v1"] is None
        assert para["inv_bleu"] == 1.0
    described = Backends().describe()
    assert described["grammar"] == "unavailable" and described["grammar_version"] is None
    assert described["bertscore"] == "unavailable"


def test_empty_prediction_fails_grammar_by_definition():
    assert summary_score(" ", {"text": "", "summary": "Amanda baked."})["grammar"] == 0.0
    assert sentence_to_words_score("", {"words": []})["headline"] == 0.0


def test_text_answer_validation():
    with pytest.raises(ValueError, match="'words'"):
        sentence_to_words_score("x", {"text": "x"})
    with pytest.raises(ValueError, match="'summary'"):
        summary_score("x", "a summary")
    with pytest.raises(ValueError, match="'text'"):
        paraphrase_score("x", {"examples": "[]"})


# ----------------------------------------------------------------------------------------------
# Text Writing: composition with backends (test doubles)
# ----------------------------------------------------------------------------------------------

class FakeChecker(GrammarChecker):
    """Flags any text containing "teh"; records what it was asked."""

    name = "fake"
    version = "0"

    def __init__(self):
        self.seen = []

    def matches(self, text):
        self.seen.append(text)
        return ["typo"] if "teh" in text else []


class FakeBert(BertScorer):
    def __init__(self, value):
        self.value = value
        self.version, self.source = "0", None

    def score(self, candidate, reference):
        return self.value


def test_grammar_checker_base_contract():
    checker = FakeChecker()
    assert checker.check("  Fine text. \n") is True
    assert checker.seen == ["Fine text."]                       # the stripped text is checked
    assert checker.check(" \n") is False and len(checker.seen) == 1   # empty fails without asking
    assert checker.check("teh end") is False


def test_composition_with_fake_backends():
    checker = FakeChecker()
    backends = Backends(grammar=checker, bertscore=FakeBert(0.9))

    w2s = sentence_to_words_score(" The dog runs. ", {"words": ["dog"]}, backends=backends)
    assert w2s == {"inclusion": 1.0, "grammar": 1.0, "score_v1": 1.0, "headline": 1.0}
    assert checker.seen[-1] == "The dog runs."
    missing = sentence_to_words_score("The cat runs.", {"words": ["dog"]}, backends=backends)
    assert (missing["inclusion"], missing["grammar"], missing["score_v1"], missing["headline"]) == (0.0, 1.0, 0.0, 1.0)
    bad = sentence_to_words_score("teh dog runs.", {"words": ["dog"]}, backends=backends)
    assert (bad["inclusion"], bad["score_v1"], bad["headline"]) == (1.0, 0.0, 0.0)

    summ = summary_score("Amanda baked cookies.", {"text": "", "summary": "Amanda baked cookies for Jerry."},
                         backends=backends)
    assert summ["headline"] == 1.0 and summ["score_v1"] == pytest.approx(summ["rougeL"]) and 0 < summ["rougeL"] < 1

    para = paraphrase_score("Do you know this sweater?", {"text": SENTENCE}, backends=backends)
    assert (para["inv_bleu"], para["bertscore"], para["grammar"]) == (1.0, 0.9, 1.0)
    assert para["score_v1"] == pytest.approx(0.9) and para["headline"] == 1.0
    lowered = paraphrase_score(SENTENCE.lower(), {"text": SENTENCE}, backends=backends)
    assert lowered["score_v1"] == pytest.approx((1 - 0.5 ** 0.25) * 0.9)

    only_grammar = paraphrase_score("Do you know this sweater?", {"text": SENTENCE}, backends=Backends(grammar=checker))
    assert only_grammar["headline"] == 1.0 and only_grammar["bertscore"] is None and only_grammar["score_v1"] is None

    described = backends.describe()
    assert (described["grammar"], described["grammar_version"]) == ("fake", "0")
    assert described["bertscore"] == "bert_score"


# ----------------------------------------------------------------------------------------------
# LanguageTool wiring against a loopback fake server; configuration and unavailability
# ----------------------------------------------------------------------------------------------

class _FakeLanguageTool(BaseHTTPRequestHandler):
    """Answers like a LanguageTool v2 server: one match for any text containing "teh"."""

    def _send(self, payload):
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        if self.path.startswith("/v2/languages"):
            self._send([{"name": "English (US)", "code": "en", "longCode": "en-US"}])
        else:
            self.send_error(404)

    def do_POST(self):  # noqa: N802
        if not self.path.startswith("/v2/check"):
            self.send_error(404)
            return
        form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
        text = form.get("text", [""])[0]
        matches = []
        if "teh" in text:
            offset = text.index("teh")
            matches.append({
                "message": "Possible spelling mistake found.", "replacements": [{"value": "the"}],
                "offset": offset, "length": 3, "context": {"text": text, "offset": offset, "length": 3},
                "sentence": text, "rule": {"id": "MORFOLOGIK_RULE_EN_US", "description": "Possible spelling mistake",
                                           "issueType": "misspelling", "category": {"id": "TYPOS", "name": "Typo"}},
            })
        self._send({"software": {"name": "LanguageTool", "version": "6.6-fake"}, "matches": matches})

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_languagetool(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeLanguageTool)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(text_metrics, "_CHECKERS", {})
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_languagetool_checker_via_server(fake_languagetool, monkeypatch):
    checker = text_metrics.grammar_checker(fake_languagetool)
    assert isinstance(checker, text_metrics.LanguageToolChecker)
    assert checker.version == "6.6-fake" and checker.source == fake_languagetool
    assert checker.check("The dog runs.") is True
    assert checker.check("teh dog runs.") is False
    assert checker.check("   ") is False
    # cached per URL, whatever the spelling of the URL
    assert text_metrics.grammar_checker(fake_languagetool + "/v2/") is checker
    monkeypatch.setenv(text_metrics.ENV_LANGUAGETOOL_URL, fake_languagetool)
    assert text_metrics.grammar_checker() is checker
    backends = Backends.resolve()
    assert backends.grammar is checker and backends.grammar_reason is None
    described = backends.describe()
    assert (described["grammar"], described["grammar_version"]) == ("languagetool", "6.6-fake")
    assert described["grammar_source"] == fake_languagetool
    result = compute("sentence_to_words_score", "teh dog", {"words": ["dog"]}, backends=backends)
    assert result["headline"] == 0.0 and result["score_v1"] == 0.0


def test_grammar_not_configured(monkeypatch):
    monkeypatch.delenv(text_metrics.ENV_LANGUAGETOOL_URL, raising=False)
    monkeypatch.setattr(text_metrics, "_CHECKERS", {})
    assert text_metrics.grammar_checker() is None
    assert text_metrics.ENV_LANGUAGETOOL_URL in text_metrics.grammar_unavailable_reason()
    backends = Backends.resolve()
    assert backends.grammar is None and backends.describe()["grammar_unavailable_reason"]


def test_grammar_configured_but_down_warns(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setattr(text_metrics, "_CHECKERS", {})
    import socket
    with socket.socket() as sock:                  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    monkeypatch.setenv(text_metrics.ENV_LANGUAGETOOL_URL, url)
    with pytest.warns(RuntimeWarning, match=f"127.0.0.1:{port}"):
        assert text_metrics.grammar_checker(timeout=2.0) is None
    with pytest.warns(RuntimeWarning):
        reason = text_metrics.grammar_unavailable_reason(timeout=2.0)
    assert url in reason


def test_bertscore_unavailable(tmp_path):
    assert text_metrics.bert_scorer(None) is None
    scorer, reason = text_metrics.resolve_bertscore(tmp_path / "missing")
    assert scorer is None and "missing" in reason
    scorer, reason = text_metrics.resolve_bertscore(tmp_path)     # empty folder or no bert_score package
    assert scorer is None and reason


def test_metric_module_docstrings_run():
    import doctest
    assert doctest.testmod(metrics).failed == 0


def test_bench_and_sweep_name_a_missing_score_package_without_a_traceback(monkeypatch, tmp_path, capsys):
    import sys

    from dllm.cli import main
    from dllm.eval import data, text_metrics
    from tests.fixtures.scorers import PARAPHRASE_RECORDS
    data.write_official_layout(tmp_path / "pb", PARAPHRASE_RECORDS)
    text_metrics._bleu.cache_clear()
    monkeypatch.setitem(sys.modules, "sacrebleu", None)
    monkeypatch.setitem(sys.modules, "sacrebleu.metrics", None)
    try:
        for argv in (["bench", "--out", str(tmp_path / "r.jsonl")],
                     ["sweep", "--out-dir", str(tmp_path / "s"), "--sampler", "threshold", "--dry-run"]):
            assert main([*argv, "--data-dir", str(tmp_path / "pb"), "--limit", "1"]) == 2, argv[0]
            err = capsys.readouterr().err
            assert err.startswith("error: ") and "the BLEU score needs the 'sacrebleu' package" in err
            assert "Traceback" not in err
    finally:
        text_metrics._bleu.cache_clear()
