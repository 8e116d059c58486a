"""Tasks: each owns its data, its prompt rendering and its reward spec.

Importing this package registers the built-in tasks; ``rg:<type>`` names any reasoning-gym
type (see :mod:`tempering.tasks.reasoning_gym`); ``code`` and ``code:<kind>`` are procedural
Python problems (:mod:`tempering.tasks.code`); ``repo``, repositories with an issue to fix,
generated or read from records (:mod:`tempering.tasks.repo`). ``sft_records`` reads ``temper
sft``'s records (chat or prompt/completion) the way ``dataset`` reads a task's.

Not here: scoring (a task names rewards; ``tempering.rewards`` scores them), which task comes
next (``tempering.scheduler``), or playing a problem as an episode (``tempering.envs``).
"""

from tempering.tasks import arithmetic, code, dataset  # noqa: F401  (register the built-in tasks)
from tempering.tasks.base import TASKS, Task, build_task, register_task

__all__ = ["TASKS", "Task", "build_task", "register_task"]
