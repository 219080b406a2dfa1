"""ParallelBench: task registry, official-file loader, seeded generators, metrics and the runner.

    from dllm.eval import tasks, load_official, run_bench
"""
from .tasks import TASKS, Task, get_task, select_tasks  # noqa: F401
