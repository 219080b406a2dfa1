"""The ParallelBench task registry and prompt assembly.

Seventeen benchmark tasks in three categories, plus the n = 15 Waiting Line variants:

    waiting_line/{copy, reverse, sort, shuffle, insert_index, insert_random, remove_index,
                  remove_random, replace_index, replace_random}       32 tokens, one-shot
    waiting_line_n15/<same ten>                                        128 tokens, one-shot
    puzzle/latin_square_n4, puzzle/sudoku_n4_12                        64 tokens, one-shot
    paraphrase_summarize/{samsum, chatgpt-paraphrases}                 64 tokens, zero-shot
    words_to_sentence/{easy, medium, hard}                             64 tokens, zero-shot

Each task carries the prompt template and metric name of the benchmark's first release, so
records produced by our generators render to the same prompts as the official files.

A prompt is assembled as the benchmark does: `template.format(**record["input"])`, then every
two-character backslash-n sequence becomes a newline (only the Sudoku template has them); the
one-shot examples come first as user/assistant turns (the assistant says the example's answer,
or `answer["example"]` when the answer is an object), then the test turn; the conversation is
rendered with the model's chat template with the generation prompt added.
"""
from __future__ import annotations

import fnmatch
import hashlib
from dataclasses import dataclass

_LINE = "You are managing a waiting line at a customer service desk.\n"

WAITING_LINE_TEMPLATES = {
    "copy": "You need to record the following people in the order they arrived:\n{context}\n"
            "Please copy the list exactly and provide only the final list.\n",
    "insert_index": "A new person \"{word}\" is inserted into the line at position {index}:\n{context}\n"
                    "Please put the new person at the specified position and provide only the final list.\n",
    "insert_random": "A new person \"{word}\" is inserted into the line at a random position:\n{context}\n"
                     "Please put the new person in the random position and provide only the final list.\n",
    "remove_index": "The person at position {index} has left the waiting line:\n{context}\n"
                    "Please remove the person at the specified position and provide only the final list.\n",
    "remove_random": "One person has left the waiting line:\n{context}\n"
                     "Please remove a random person and provide only the final list.\n",
    "replace_index": "The person at position {index} must be replaced with \"{word}\":\n{context}\n"
                     "Please replace the person at the specified position with \"{word}\" and provide only the "
                     "final list.\n",
    # The benchmark's replace_random template alone has no trailing newline.
    "replace_random": "One person in the waiting line must be replaced with \"{word}\":\n{context}\n"
                      "Please replace one random person with \"{word}\" and provide only the final list.",
    "reverse": "The previous staff member put the waiting line in the wrong order.\n"
               "Please reverse the order of the following people in the waiting line to correct it:\n{context}\n"
               "Please reverse the order of the list and provide only the final list.\n",
    "shuffle": "The waiting line should be randomly shuffled to ensure fair service distribution:\n{context}\n"
               "Please randomly shuffle the list and provide only the final list.\n"
               "Ensure the sequence is different from the original.\n",
    "sort": "The following people should be organized alphabetically by last name for efficient processing:\n"
            "{context}\nPlease sort the list in alphabetical order and provide only the final list.\n",
}

WAITING_LINE_METRICS = {
    "copy": "list_match_score", "reverse": "list_match_score", "sort": "list_match_score",
    "insert_index": "list_match_score", "remove_index": "list_match_score", "replace_index": "list_match_score",
    "shuffle": "list_shuffle_score", "insert_random": "list_random_insert_score",
    "remove_random": "list_random_remove_score", "replace_random": "list_random_replace_score",
}

W2S_TEMPLATE = "Construct a single, coherent sentence using the words {words}."
W2S_TEMPLATE_ONE = "Construct a single, coherent sentence using the word {words}."
# Stored as the benchmark stores it: with literal backslash-n pairs, replaced at rendering.
SUDOKU_TEMPLATE = ("Fill the positions where the values are 0 in a 4x4 grid with digits 1-4 so that each column, "
                   "each row, and each of the four 2x2 subgrids that compose the grid contains all of the digits "
                   "from 1 to 4.\\n\\nInput:\\n{sudoku}\\nOutput:\\n")
LATIN_TEMPLATE = "Generate a Latin square of size {size} with the symbols {symbols}. Only output the final result as CSV."
SAMSUM_TEMPLATE = "Summarize the following conversation. Only output the final result.\n\n{text}\n\nSummary:"
PARAPHRASE_TEMPLATE = ("Paraphrase the following sentence. Only output the final result.\n\nSentence: {text}\n\n"
                       "Paraphrase:")


@dataclass(frozen=True)
class Task:
    """One benchmark task.

    id:          `<category>/<name>`, the official file path without `.jsonl`.
    template:    `str.format` template over the record's `input` fields.
    metric:      metric function name (`dllm.eval.metrics.METRICS`).
    max_tokens:  generation length the benchmark decodes with.
    num_samples: records in the official file (a mismatch only warns).
    headline:    "accuracy" (lenient score) or "grammar" (Text Writing).
    one_shot:    the records carry one in-context example.
    """

    id: str
    template: str
    metric: str
    max_tokens: int
    num_samples: int = 100
    headline: str = "accuracy"
    one_shot: bool = True

    @property
    def category(self) -> str:
        return self.id.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.id.rsplit("/", 1)[-1]

    @property
    def benchmark(self) -> bool:
        """One of the 17 tasks the benchmark average is taken over."""
        return self.id in BENCHMARK_TASKS


def _registry() -> dict[str, Task]:
    tasks = {}
    for name, body in WAITING_LINE_TEMPLATES.items():
        metric = WAITING_LINE_METRICS[name]
        tasks[f"waiting_line/{name}"] = Task(f"waiting_line/{name}", _LINE + body, metric, 32)
        tasks[f"waiting_line_n15/{name}"] = Task(f"waiting_line_n15/{name}", _LINE + body, metric, 128)
    tasks["puzzle/latin_square_n4"] = Task("puzzle/latin_square_n4", LATIN_TEMPLATE, "latin_square_score", 64)
    tasks["puzzle/sudoku_n4_12"] = Task("puzzle/sudoku_n4_12", SUDOKU_TEMPLATE, "sudoku_score", 64, num_samples=108)
    tasks["paraphrase_summarize/samsum"] = Task("paraphrase_summarize/samsum", SAMSUM_TEMPLATE, "summary_score", 64,
                                                headline="grammar", one_shot=False)
    tasks["paraphrase_summarize/chatgpt-paraphrases"] = Task(
        "paraphrase_summarize/chatgpt-paraphrases", PARAPHRASE_TEMPLATE, "paraphrase_score", 64,
        headline="grammar", one_shot=False)
    for level in ("easy", "medium", "hard"):
        tasks[f"words_to_sentence/{level}"] = Task(f"words_to_sentence/{level}", W2S_TEMPLATE,
                                                   "sentence_to_words_score", 64, headline="grammar", one_shot=False)
    return tasks


BENCHMARK_TASKS = tuple(
    [f"waiting_line/{n}" for n in WAITING_LINE_TEMPLATES]
    + ["paraphrase_summarize/samsum", "paraphrase_summarize/chatgpt-paraphrases"]
    + [f"words_to_sentence/{lv}" for lv in ("easy", "medium", "hard")]
    + ["puzzle/latin_square_n4", "puzzle/sudoku_n4_12"])

TASKS: dict[str, Task] = _registry()

GROUPS = {
    "all": BENCHMARK_TASKS,
    "waiting_line": tuple(t for t in TASKS if t.startswith("waiting_line/")),
    "waiting_line_n15": tuple(t for t in TASKS if t.startswith("waiting_line_n15/")),
    "puzzle": ("puzzle/latin_square_n4", "puzzle/sudoku_n4_12"),
    "text": tuple(t for t in BENCHMARK_TASKS if TASKS[t].headline == "grammar"),
    "pure": tuple(t for t in BENCHMARK_TASKS if TASKS[t].headline == "accuracy"),
}


def get_task(task_id: str) -> Task:
    """The registered task `task_id`; unknown ids raise ValueError listing the valid ones."""
    if task_id not in TASKS:
        raise ValueError(f"unknown ParallelBench task {task_id!r}; valid tasks: {', '.join(TASKS)}")
    return TASKS[task_id]


def select_tasks(spec: str | list[str] | None, available: list[str] | tuple[str, ...]) -> list[str]:
    """Task ids matching a comma-separated selection, in the order of `available`.

    Items are task ids (`waiting_line/copy`), glob patterns (`puzzle/*`, `*/sort`) or groups
    (`all` = the 17 benchmark tasks, `waiting_line`, `waiting_line_n15`, `puzzle`, `text`, `pure`).
    An item that matches nothing among `available` is an error naming it.
    """
    if spec is None:
        return list(available)
    listed = isinstance(spec, (list, tuple)) and all(isinstance(s, str) for s in spec)
    if not isinstance(spec, str) and not listed:
        raise ValueError(f"tasks must be a comma-separated string or a list of strings (task ids, patterns, "
                         f"groups), got {spec!r}")
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    if not items:
        raise ValueError("empty task selection; give task ids, patterns like 'puzzle/*', or a group "
                         f"({', '.join(GROUPS)})")
    chosen: set[str] = set()
    for item in items:
        if item in GROUPS:
            hit = [t for t in available if t in GROUPS[item]]
        else:
            hit = [t for t in available if fnmatch.fnmatchcase(t, item)]
        if not hit:
            raise ValueError(f"task selection {item!r} matches none of the available tasks: {', '.join(available)}")
        chosen.update(hit)
    return [t for t in available if t in chosen]


# -- prompt assembly --------------------------------------------------------------------------
def render_text(template: str, fields: dict) -> str:
    """`template.format(**fields)` with backslash-n pairs turned into newlines (as the benchmark)."""
    try:
        text = template.format(**fields)
    except KeyError as err:
        raise ValueError(f"prompt template needs the input field {err.args[0]!r}; the record has "
                         f"{', '.join(sorted(fields)) or 'no fields'}") from None
    except (IndexError, ValueError) as err:
        raise ValueError(f"prompt template {template[:60]!r} is not a template of named fields ({err})") from None
    return text.replace("\\n", "\n")


def messages(task: Task | str, record: dict, template: str | None = None) -> list[dict]:
    """The chat turns of one record: the in-context examples, then the test question."""
    task = get_task(task) if isinstance(task, str) else task
    template = template or task.template
    if not isinstance(record, dict) or not isinstance(record.get("input"), dict):
        raise ValueError(f"a {task.id} record must be an object with an 'input' object, got {str(record)[:80]!r}")
    turns = []
    for ex in record["input"].get("icl_examples") or []:
        if not isinstance(ex, dict) or not isinstance(ex.get("input"), dict):
            raise ValueError(f"{task.id}: an in-context example must be an object with an 'input' object, got "
                             f"{str(ex)[:80]!r}")
        answer = ex.get("answer")
        shown = answer if isinstance(answer, str) else (answer or {}).get("example")
        if shown is None:
            raise ValueError(f"{task.id}: an in-context example's answer has neither text nor an 'example' field")
        turns.append({"role": "user", "content": render_text(template, ex["input"])})
        turns.append({"role": "assistant", "content": shown})
    fields = {k: v for k, v in record["input"].items() if k != "icl_examples"}
    turns.append({"role": "user", "content": render_text(template, fields)})
    return turns


def encode_messages(tokenizer, turns: list[dict]) -> list[int]:
    """Token ids of a conversation through the tokenizer's chat template (generation prompt added),
    tokenized without extra special tokens as the LLaDA and Dream references do."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("the benchmark renders prompts with the model's chat template, and this tokenizer has none")
    text = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def prompt_id(turns: list[dict]) -> str:
    """A short stable id of a prompt's content (12 hex digits of its SHA-256)."""
    blob = "\x1e".join(f"{t['role']}\x1f{t['content']}" for t in turns)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:12]
