"""Masked-diffusion supervised training of a small LLaDA-architecture model on ParallelBench data.

    dllm train --out runs/pb-tiny                   # the shipped default model's recipe (six phases)
    dllm train --out runs/pb-tiny                   # run again: resumes from the checkpoints under runs/pb-tiny

`train(TrainConfig())` generates the training records, builds the tokenizer and the model, trains
each phase of the recipe (checkpointing as it goes, resuming from the checkpoints it finds) and
exports the model in the LLaDA Hugging Face layout to `<out>/model`, with `<out>/train_info.json`
recording the recipe. The defaults of `TrainConfig` make the shipped model.

Modules: `config` (the recipe and its flags), `data` (records, tokenizer, examples, batches),
`objective` (the loss and its masks), `model_init` (model config, initial weights, start model,
export), `loop` (learning-rate schedule and the training loop). docs/training.md describes the
recipe, why each part exists, and how the shipped model was made.
"""
from .config import (DEFAULT_TASK_WEIGHTS, DEFAULT_TASKS, EMBED_UPDATES, INITS, LAST_TASK_WEIGHTS, LOSSES,
                     NO_LATER_PHASES, PRECISIONS, PREV_HEAD_INPUTS, THEN_FIELDS, THEN_TASK_WEIGHTS, TRAIN_FIELDS,
                     TrainConfig, add_train_arguments, complete_recipe, config_from_args, cpu_has_bf16_units,
                     phase_configs, recipe_fields, step_precision, then_values)
from .data import (BOS, CHAT_TEMPLATE, COPY_WARMUP_LENGTHS, EOS, EOT, GPT2_SPLIT, HEADER_END, HEADER_START, MASK,
                   PAIR_BIND_ROWS, SPECIAL_TOKENS, WHOLE_NAME, Encoded, answer_text, build_tokenizer, copy_example,
                   copy_vocab, encode_records, example_columns, example_spans, global_pairing, make_batch,
                   name_sides, pair_example, record_people, render_prompt, response_sides, tokenizer_texts,
                   training_records)
from .loop import lr_at, phases_record, train
from .model_init import (PREV_HEAD_BIAS, PREV_HEAD_PAIRS, PREV_HEAD_SCALE, SHAPE_FIELDS, check_start_shape,
                         generation_defaults, init_weights, model_config, next_token_head, previous_token_head,
                         save_pretrained, start_model, window_heads)
from .objective import (binding_accuracy, bind_rows, diffusion_loss, end_weights, hole_rows, mask_distances,
                        smoothing_at, span_rows)

__all__ = [
    "BOS", "CHAT_TEMPLATE", "COPY_WARMUP_LENGTHS", "DEFAULT_TASKS", "DEFAULT_TASK_WEIGHTS", "EMBED_UPDATES", "EOS",
    "EOT", "Encoded", "GPT2_SPLIT", "HEADER_END", "HEADER_START", "INITS", "LAST_TASK_WEIGHTS", "LOSSES", "MASK",
    "NO_LATER_PHASES", "PAIR_BIND_ROWS", "PRECISIONS", "PREV_HEAD_BIAS", "PREV_HEAD_INPUTS", "PREV_HEAD_PAIRS",
    "PREV_HEAD_SCALE", "SHAPE_FIELDS", "SPECIAL_TOKENS", "THEN_FIELDS", "THEN_TASK_WEIGHTS", "TRAIN_FIELDS",
    "TrainConfig", "WHOLE_NAME", "add_train_arguments", "answer_text", "bind_rows", "binding_accuracy",
    "build_tokenizer", "check_start_shape", "complete_recipe", "config_from_args", "copy_example", "copy_vocab",
    "cpu_has_bf16_units", "diffusion_loss", "encode_records", "end_weights", "example_columns", "example_spans",
    "generation_defaults", "global_pairing", "hole_rows", "init_weights", "lr_at", "make_batch", "mask_distances",
    "model_config", "name_sides", "next_token_head", "pair_example", "phase_configs", "phases_record",
    "previous_token_head", "recipe_fields", "record_people", "render_prompt", "response_sides", "save_pretrained",
    "smoothing_at", "span_rows", "start_model", "step_precision", "then_values", "tokenizer_texts", "train",
    "training_records", "window_heads",
]
