"""Task registry, selection and prompt assembly (golden strings from the benchmark's templates)."""
import pytest

from dllm.eval import tasks as T

HEAD = "You are managing a waiting line at a customer service desk.\n"


def test_registry_has_the_17_tasks_and_the_n15_variants():
    assert len(T.BENCHMARK_TASKS) == 17
    assert all(t in T.TASKS for t in T.BENCHMARK_TASKS)
    n15 = [t for t in T.TASKS if t.startswith("waiting_line_n15/")]
    assert len(n15) == 10
    assert T.TASKS["waiting_line/copy"].max_tokens == 32
    assert T.TASKS["waiting_line_n15/copy"].max_tokens == 128
    assert T.TASKS["puzzle/sudoku_n4_12"].max_tokens == 64 and T.TASKS["puzzle/sudoku_n4_12"].num_samples == 108
    assert {T.TASKS[t].headline for t in T.GROUPS["text"]} == {"grammar"}
    assert len(T.GROUPS["pure"]) == 12 and len(T.GROUPS["text"]) == 5


def test_waiting_line_golden_prompt_with_one_shot():
    rec = {"input": {"context": '["Ann Lee", "Bo Park"]', "word": "Cy Dunn", "index": 1,
                     "icl_examples": [{"input": {"context": '["Di Fox"]', "word": "Ed Gray", "index": 0},
                                       "answer": '["Ed Gray", "Di Fox"]'}]},
           "answer": '["Ann Lee", "Cy Dunn", "Bo Park"]'}
    turns = T.messages("waiting_line/insert_index", rec)
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert turns[0]["content"] == (HEAD + 'A new person "Ed Gray" is inserted into the line at position 0:\n'
                                   '["Di Fox"]\nPlease put the new person at the specified position and provide '
                                   "only the final list.\n")
    assert turns[1]["content"] == '["Ed Gray", "Di Fox"]'
    assert turns[2]["content"] == (HEAD + 'A new person "Cy Dunn" is inserted into the line at position 1:\n'
                                   '["Ann Lee", "Bo Park"]\nPlease put the new person at the specified position '
                                   "and provide only the final list.\n")


def test_object_answers_show_their_example_and_replace_random_has_no_final_newline():
    rec = {"input": {"context": '["A B", "C D"]', "word": "E F",
                     "icl_examples": [{"input": {"context": '["G H"]', "word": "I J"},
                                       "answer": {"input": ["G H"], "word": "I J", "example": '["I J"]'}}]},
           "answer": {"input": ["A B", "C D"], "word": "E F", "example": '["E F", "C D"]'}}
    turns = T.messages("waiting_line/replace_random", rec)
    assert turns[1]["content"] == '["I J"]'
    assert turns[2]["content"].endswith('Please replace one random person with "E F" and provide only the final list.')
    assert T.messages("waiting_line/copy", {"input": {"context": "[]"}, "answer": "[]"})[0]["content"].endswith("\n")


def test_sudoku_template_backslash_n_becomes_newline():
    rec = {"input": {"sudoku": "0042\n2031\n4023\n3214",
                     "icl_examples": [{"input": {"sudoku": "1342\n4003\n2104\n3420"}, "answer": "1342\n4213\n2134\n3421"}]},
           "answer": "1342\n2431\n4123\n3214"}
    turns = T.messages("puzzle/sudoku_n4_12", rec)
    assert "\\n" not in turns[2]["content"]
    assert turns[2]["content"].endswith("from 1 to 4.\n\nInput:\n0042\n2031\n4023\n3214\nOutput:\n")
    assert turns[1]["content"] == "1342\n4213\n2134\n3421"


def test_latin_and_text_templates():
    rec = {"input": {"size": 4, "symbols": "[H, 4, C, A]",
                     "icl_examples": [{"input": {"size": 4, "symbols": "[1, 2, 3, 4]"},
                                       "answer": {"symbols": ["1", "2", "3", "4"], "example": "1,2,3,4"}}]},
           "answer": {"symbols": ["H", "4", "C", "A"], "example": "H,4,C,A"}}
    assert T.messages("puzzle/latin_square_n4", rec)[2]["content"] == (
        "Generate a Latin square of size 4 with the symbols [H, 4, C, A]. Only output the final result as CSV.")
    para = T.messages("paraphrase_summarize/chatgpt-paraphrases", {"input": {"text": "Hi there."}, "answer": {}})
    assert para == [{"role": "user", "content": "Paraphrase the following sentence. Only output the final "
                                                "result.\n\nSentence: Hi there.\n\nParaphrase:"}]
    w2s = T.messages("words_to_sentence/easy", {"input": {"words": "dog, park, ball, and throw"}, "answer": {}})
    assert w2s[0]["content"] == "Construct a single, coherent sentence using the words dog, park, ball, and throw."


def test_missing_field_and_bad_record_errors():
    with pytest.raises(ValueError, match="'word'"):
        T.messages("waiting_line/insert_index", {"input": {"context": "[]", "index": 0}, "answer": "[]"})
    with pytest.raises(ValueError, match="'input' object"):
        T.messages("waiting_line/copy", {"answer": "[]"})
    with pytest.raises(ValueError, match="unknown ParallelBench task 'waiting_line/cpy'"):
        T.get_task("waiting_line/cpy")


def test_select_tasks_patterns_groups_and_errors():
    avail = list(T.TASKS)
    assert T.select_tasks("waiting_line/copy,puzzle/*", avail) == [
        "waiting_line/copy", "puzzle/latin_square_n4", "puzzle/sudoku_n4_12"]
    assert T.select_tasks("*/sort", avail) == ["waiting_line/sort", "waiting_line_n15/sort"]
    assert T.select_tasks("pure", avail) == [t for t in avail if t in T.GROUPS["pure"]]
    assert T.select_tasks(None, ["a/b"]) == ["a/b"]
    with pytest.raises(ValueError, match="'puzle/\\*' matches none"):
        T.select_tasks("puzle/*", avail)
    with pytest.raises(ValueError, match="empty task selection"):
        T.select_tasks(" , ", avail)
    for bad in (5, [5], ("waiting_line/copy", None)):
        with pytest.raises(ValueError, match=r"tasks must be a comma-separated string or a list of strings"):
            T.select_tasks(bad, avail)


def test_encode_messages_uses_the_chat_template(llada):
    _, tok = llada
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    ids = T.encode_messages(tok, turns)
    text = tok.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    assert T.prompt_id(turns) == T.prompt_id([dict(t) for t in turns]) != T.prompt_id(turns[:1])
