"""Tasks: each owns its data, its prompt rendering and its reward spec.

Importing this package registers the built-in tasks.
"""

from tempering.tasks.base import TASKS, Task, build_task, register_task
from tempering.tasks import arithmetic  # noqa: F401  (registers the built-in tasks)

__all__ = ["TASKS", "Task", "build_task", "register_task"]
