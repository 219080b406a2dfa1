"""ParallelBench: task registry, official-file loader, seeded generators, metrics and the runner.

    from dllm.eval import BenchConfig, load_official, run_bench, tasks
    rows = run_bench(BenchConfig(tasks="waiting_line/copy", limit=5))
"""
from . import tasks
from .data import load_generated, load_official
from .runner import BenchConfig, ResultsFile, config_from_dict, run_bench
from .tasks import TASKS, Task, get_task, select_tasks

__all__ = ["BenchConfig", "ResultsFile", "TASKS", "Task", "config_from_dict", "get_task", "load_generated",
           "load_official", "run_bench", "select_tasks", "tasks"]
